// Package plan holds the per-device memory plan: the buffers every stage
// declares, their lifetimes over the job's op timeline, and the offset of each
// buffer in one arena per device. The plan is the allocation: the runtime
// allocates one arena of Plan.ArenaBytes and hands out exactly these offsets.
package plan

import (
	"fmt"
	"sort"
)

// Kind is the category a buffer is accounted under.
type Kind string

// Buffer categories, in the column order `rlpipe plan` prints them.
const (
	Params      Kind = "params"      // sharded fp32 master parameters
	Gathered    Kind = "gathered"    // unsharded compute copies of one FSDP unit
	Grads       Kind = "grads"       // sharded fp32 grads and unsharded transient grads
	Optimizer   Kind = "optimizer"   // AdamW m and v
	Activations Kind = "activations" // saved and transient activations
	Logits      Kind = "logits"      // one token chunk of fp32 logits
	Comm        Kind = "comm"        // collective send/receive and host<->device staging
	IO          Kind = "io"          // packed micro-batch inputs and per-token outputs
	// SleepCopy is the pinned host copy of the device state while the trainer
	// sleeps (see Builder.MarkSleep); it is not a device category.
	SleepCopy Kind = "saved"
)

// Kinds lists every category in display order.
var Kinds = []Kind{Params, Gathered, Grads, Optimizer, Activations, Logits, Comm, IO}

// Align is the byte alignment of every buffer offset and size in an arena.
const Align = 256

// AlignUp rounds n up to a multiple of Align.
func AlignUp(n int64) int64 { return (n + Align - 1) / Align * Align }

// Buffer is one planned allocation. Start and End are op indices on the job
// timeline; the buffer is live for every op in [Start, End].
type Buffer struct {
	Name  string `json:"name"`
	Kind  Kind   `json:"kind"`
	Bytes int64  `json:"bytes"` // aligned size
	Host  bool   `json:"host,omitempty"`
	// Resident marks a device buffer kept on the device while the trainer
	// sleeps: it lives in the resident arena, not the main one.
	Resident bool   `json:"resident,omitempty"`
	Stage    string `json:"stage"`
	Start    int    `json:"start"`
	End      int    `json:"end"`
	Offset   int64  `json:"offset"`
}

// Op is one step of a stage's op sequence.
type Op struct {
	Index int    `json:"index"`
	Stage string `json:"stage"`
	Name  string `json:"name"`
}

// StageSpan is the op range of one stage on the timeline.
type StageSpan struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Phase string `json:"phase"`
	First int    `json:"first_op"`
	Last  int    `json:"last_op"`
}

// Reserve is device memory outside the arena that the plan accounts for
// (CUDA context, library handles, communicator buffers).
type Reserve struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	Note  string `json:"note"`
	// Released marks memory the backend gives back while the trainer
	// sleeps (its own workspaces).
	Released bool `json:"released_asleep,omitempty"`
}

// Builder collects stages, ops and buffers in timeline order.
type Builder struct {
	ops      []Op
	stages   []StageSpan
	bufs     []*Buffer
	reserves []Reserve
	open     bool
	persist  []*Buffer // buffers that live until the end of the job
	sleeps   []int     // ops after which the device arena is released
}

// NewBuilder returns an empty builder.
func NewBuilder() *Builder { return &Builder{} }

// BeginStage opens a stage; ops and buffers declared until EndStage belong to it.
func (b *Builder) BeginStage(id, kind, phase string) {
	if b.open {
		b.EndStage()
	}
	b.stages = append(b.stages, StageSpan{ID: id, Kind: kind, Phase: phase, First: len(b.ops), Last: len(b.ops) - 1})
	b.open = true
}

// EndStage closes the current stage. A stage that declared no op gets one
// "noop" op so that it has a place on the timeline.
func (b *Builder) EndStage() {
	if !b.open {
		return
	}
	s := &b.stages[len(b.stages)-1]
	if s.Last < s.First {
		b.Op("noop")
	}
	b.open = false
}

// Op appends an op to the current stage and returns its timeline index.
func (b *Builder) Op(name string) int {
	if !b.open {
		b.BeginStage("job", "job", "")
	}
	s := &b.stages[len(b.stages)-1]
	i := len(b.ops)
	b.ops = append(b.ops, Op{Index: i, Stage: s.ID, Name: name})
	s.Last = i
	return i
}

// Now is the index of the last op appended.
func (b *Builder) Now() int { return len(b.ops) - 1 }

// currentStage returns the id of the open stage.
func (b *Builder) currentStage() string {
	if len(b.stages) == 0 {
		return ""
	}
	return b.stages[len(b.stages)-1].ID
}

// Alloc declares a device buffer live over ops [start, end]. Zero-byte
// buffers are recorded with zero size.
func (b *Builder) Alloc(name string, kind Kind, bytes int64, start, end int) *Buffer {
	return b.add(name, kind, bytes, false, start, end)
}

// AllocHost declares a pinned host buffer live over ops [start, end].
func (b *Builder) AllocHost(name string, kind Kind, bytes int64, start, end int) *Buffer {
	return b.add(name, kind, bytes, true, start, end)
}

// Persistent declares a buffer that lives from op start to the end of the job.
func (b *Builder) Persistent(name string, kind Kind, bytes int64, host bool, start int) *Buffer {
	buf := b.add(name, kind, bytes, host, start, -1)
	b.persist = append(b.persist, buf)
	return buf
}

func (b *Builder) add(name string, kind Kind, bytes int64, host bool, start, end int) *Buffer {
	if bytes < 0 {
		bytes = 0
	}
	buf := &Buffer{Name: name, Kind: kind, Bytes: AlignUp(bytes), Host: host, Stage: b.currentStage(), Start: start, End: end}
	b.bufs = append(b.bufs, buf)
	return buf
}

// Resident declares a device buffer kept on the device while the trainer
// sleeps, live over ops [start, end]: it is placed in the resident arena.
func (b *Builder) Resident(name string, kind Kind, bytes int64, start, end int) *Buffer {
	buf := b.add(name, kind, bytes, false, start, end)
	buf.Resident = true
	return buf
}

// MarkSleep marks the last op as a sleep: after it, the main device arena
// and the released reserves are given back until a wake. Every device
// buffer live across it is copied to the pinned host area Finish plans.
// Which later ops may run asleep is the caller's to know: it declares
// their device buffers with Resident.
func (b *Builder) MarkSleep() { b.sleeps = append(b.sleeps, b.Now()) }

// AddReserve records device memory outside the arena.
func (b *Builder) AddReserve(r Reserve) { b.reserves = append(b.reserves, r) }

// Finish closes the timeline, assigns arena offsets and computes the per-stage
// budget. It fails when a buffer's lifetime is malformed.
func (b *Builder) Finish() (*Plan, error) {
	b.EndStage()
	last := len(b.ops) - 1
	for _, buf := range b.persist {
		buf.End = last
	}
	names := map[string]bool{}
	for _, buf := range b.bufs {
		if names[buf.Name] {
			return nil, fmt.Errorf("plan: buffer %q declared twice", buf.Name)
		}
		names[buf.Name] = true
		if buf.Start < 0 || buf.End < buf.Start || buf.End > last {
			return nil, fmt.Errorf("plan: buffer %q has lifetime [%d, %d] outside the timeline [0, %d]", buf.Name, buf.Start, buf.End, last)
		}
	}
	p := &Plan{Ops: b.ops, Stages: b.stages, Buffers: b.bufs, Reserves: b.reserves}
	var area *Buffer
	if len(b.sleeps) > 0 {
		var err error
		if area, err = b.planSleeps(p); err != nil {
			return nil, err
		}
		p.Buffers = append(p.Buffers, area)
	}
	p.DeviceArena = assign(pick(p.Buffers, func(x *Buffer) bool { return !x.Host && !x.Resident }))
	p.ResidentArena = assign(pick(p.Buffers, func(x *Buffer) bool { return x.Resident }))
	p.HostArena = assign(pick(p.Buffers, func(x *Buffer) bool { return x.Host }))
	for i := range p.Sleeps {
		for k := range p.Sleeps[i].Saved {
			p.Sleeps[i].Saved[k].HostOffset += area.Offset
		}
	}
	p.setDeviceOffsets()
	p.summarize()
	return p, nil
}

// pick returns the buffers of all that keep says, with bytes.
func pick(all []*Buffer, keep func(*Buffer) bool) []*Buffer {
	var out []*Buffer
	for _, b := range all {
		if keep(b) && b.Bytes > 0 {
			out = append(out, b)
		}
	}
	return out
}

// assign gives every buffer an offset so that buffers whose lifetimes overlap
// never overlap in memory, and returns the arena size. Buffers are placed
// one at a time, each in the lowest-waste gap between already placed
// buffers that are live at the same time (best fit). Three orders are
// tried and the smallest arena kept (ties: the first): largest first,
// among buffers of one size earlier start first; largest first, later
// end first (many same-sized buffers that end together, an update's grads
// a unit each, pack into the gaps of the activations they outlive in one
// order or the other); and largest area first, bytes times the ops a
// buffer is live (buffers that live long, such as grads kept a unit
// longer for a reduction beside the next unit's backward, placed before
// the short-lived ones that fit around them). The search stops at the
// first order whose arena is the bytes live at the busiest op (livePeak),
// which no order can beat.
func assign(bufs []*Buffer) int64 {
	byStart := func(a, b *Buffer) bool {
		if a.Start != b.Start {
			return a.Start < b.Start
		}
		return a.Name < b.Name
	}
	bySize := func(tie func(a, b *Buffer) bool) func(a, b *Buffer) bool {
		return func(a, b *Buffer) bool {
			if a.Bytes != b.Bytes {
				return a.Bytes > b.Bytes
			}
			return tie(a, b)
		}
	}
	byArea := func(a, b *Buffer) bool {
		if x, y := a.Bytes*int64(a.End-a.Start+1), b.Bytes*int64(b.End-b.Start+1); x != y {
			return x > y
		}
		return bySize(byStart)(a, b)
	}
	orders := []func(a, b *Buffer) bool{
		bySize(byStart),
		bySize(func(a, b *Buffer) bool {
			if a.End != b.End {
				return a.End > b.End
			}
			return byStart(a, b)
		}),
		byArea,
	}
	least := livePeak(bufs) // no arena is smaller: an order that reaches it ends the search
	var arena int64 = -1
	offsets := make([]int64, len(bufs))
	for _, less := range orders {
		if n := assignOrdered(bufs, less); arena < 0 || n < arena {
			arena = n
			for i, b := range bufs {
				offsets[i] = b.Offset
			}
		}
		if arena <= least {
			break
		}
	}
	for i, b := range bufs {
		b.Offset = offsets[i]
	}
	return arena
}

// livePeak returns the most bytes of bufs live at one op.
func livePeak(bufs []*Buffer) int64 {
	type edge struct {
		at    int
		bytes int64
	}
	edges := make([]edge, 0, 2*len(bufs))
	for _, b := range bufs {
		edges = append(edges, edge{b.Start, b.Bytes}, edge{b.End + 1, -b.Bytes})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].bytes < edges[j].bytes // ends before starts at one op
	})
	var live, peak int64
	for _, e := range edges {
		live += e.bytes
		peak = max(peak, live)
	}
	return peak
}

// assignOrdered places bufs in the order less gives, each in the
// best-fitting gap (see assign), and returns the arena size.
func assignOrdered(bufs []*Buffer, less func(a, b *Buffer) bool) int64 {
	order := append([]*Buffer(nil), bufs...)
	sort.SliceStable(order, func(i, j int) bool { return less(order[i], order[j]) })
	var placed []*Buffer
	var arena int64
	for _, buf := range order {
		var live []*Buffer
		for _, q := range placed {
			if q.Start <= buf.End && buf.Start <= q.End {
				live = append(live, q)
			}
		}
		sort.Slice(live, func(i, j int) bool { return live[i].Offset < live[j].Offset })
		best, bestWaste := int64(-1), int64(-1)
		var cursor int64
		for _, q := range live {
			if gap := q.Offset - cursor; gap >= buf.Bytes {
				if waste := gap - buf.Bytes; bestWaste < 0 || waste < bestWaste {
					best, bestWaste = cursor, waste
				}
			}
			if end := q.Offset + q.Bytes; end > cursor {
				cursor = end
			}
		}
		if best < 0 {
			best = cursor
		}
		buf.Offset = best
		placed = append(placed, buf)
		if end := best + buf.Bytes; end > arena {
			arena = end
		}
	}
	return arena
}

// Plan is the memory plan of one device (every rank of a dp mesh has the same
// plan: shards are sized for the largest rank).
type Plan struct {
	Ops         []Op        `json:"ops"`
	Stages      []StageSpan `json:"stages"`
	Buffers     []*Buffer   `json:"buffers"`
	Reserves    []Reserve   `json:"reserves"`
	DeviceArena int64       `json:"device_arena_bytes"`
	// ResidentArena holds the resident buffers: the device memory of the
	// stages that may run while the trainer sleeps.
	ResidentArena int64 `json:"resident_arena_bytes,omitempty"`
	// Sleeps are the points where the trainer gives the device back, and
	// what each copies to the pinned host area.
	Sleeps    []SleepPoint `json:"sleeps,omitempty"`
	HostArena int64        `json:"host_pinned_bytes"`
	// HostBuffers are the host (not pinned) buffers a rank's process
	// needs outside the arena (see HostUse).
	HostBuffers []HostUse `json:"host_buffers,omitempty"`
	// HostProcess is the host memory a rank's process takes beyond its
	// pinned arena and host buffers (code, the CUDA driver, NCCL, the Go
	// runtime): an estimate per rank.
	HostProcess int64 `json:"host_process_bytes,omitempty"`
	// Context is set with mesh.cp > 1.
	Context *ContextUse `json:"context_parallel,omitempty"`
	// Auto are the decisions planning made where the spec says auto.
	Auto      []Choice      `json:"auto,omitempty"`
	Budget    []StageBudget `json:"budget"`
	PeakStage string        `json:"peak_stage"`
	PeakBytes int64         `json:"peak_bytes"` // peak of device bytes in use, over all ops
}

// StageBudget is the device budget of one stage at its peak op.
type StageBudget struct {
	Stage     string         `json:"stage"`
	Kind      string         `json:"kind"`
	Phase     string         `json:"phase"`
	PeakOp    string         `json:"peak_op"`
	PeakBytes int64          `json:"peak_bytes"`
	ByKind    map[Kind]int64 `json:"by_kind"`
	HostBytes int64          `json:"host_bytes"` // pinned host bytes live at any op of the stage (max)
}

// LiveBytes returns device (or host) bytes in use at op i, by kind.
func (p *Plan) LiveBytes(i int, host bool) (int64, map[Kind]int64) {
	by := map[Kind]int64{}
	var total int64
	for _, b := range p.Buffers {
		if b.Host == host && b.Start <= i && i <= b.End {
			by[b.Kind] += b.Bytes
			total += b.Bytes
		}
	}
	return total, by
}

func (p *Plan) summarize() {
	p.Budget = nil
	p.PeakBytes, p.PeakStage = -1, ""
	for _, s := range p.Stages {
		sb := StageBudget{Stage: s.ID, Kind: s.Kind, Phase: s.Phase, PeakBytes: -1}
		for i := s.First; i <= s.Last; i++ {
			total, by := p.LiveBytes(i, false)
			if total > sb.PeakBytes {
				sb.PeakBytes, sb.ByKind, sb.PeakOp = total, by, p.Ops[i].Name
			}
			if h, _ := p.LiveBytes(i, true); h > sb.HostBytes {
				sb.HostBytes = h
			}
		}
		if sb.PeakBytes > p.PeakBytes {
			p.PeakBytes, p.PeakStage = sb.PeakBytes, s.ID
		}
		p.Budget = append(p.Budget, sb)
	}
	if p.PeakBytes < 0 {
		p.PeakBytes = 0
	}
}

// ReserveBytes is the sum of the reserves.
func (p *Plan) ReserveBytes() int64 {
	var n int64
	for _, r := range p.Reserves {
		n += r.Bytes
	}
	return n
}

// DeviceTotal is what the device must hold: the arena plus the reserves.
func (p *Plan) DeviceTotal() int64 { return p.DeviceArena + p.ResidentArena + p.ReserveBytes() }

// AsleepDeviceBytes is the device memory the plan keeps while the trainer
// sleeps: the resident arena and the reserves that are not released.
func (p *Plan) AsleepDeviceBytes() int64 {
	n := p.ResidentArena
	for _, r := range p.Reserves {
		if !r.Released {
			n += r.Bytes
		}
	}
	return n
}

// SavedBytes is the size of the pinned host area that holds the device
// state while the trainer sleeps (the largest of the sleeps' copies).
func (p *Plan) SavedBytes() int64 {
	var n int64
	for _, s := range p.Sleeps {
		n = max(n, s.Bytes)
	}
	return n
}

// Buffer returns the named buffer, or nil.
func (p *Plan) Buffer(name string) *Buffer {
	for _, b := range p.Buffers {
		if b.Name == name {
			return b
		}
	}
	return nil
}

// Choice is a decision the spec left to planning (policies.recompute auto,
// chunk_tokens auto): what it is about, what was chosen and why.
type Choice struct {
	Key     string `json:"key"`     // the spec key, e.g. "policies.recompute"
	Subject string `json:"subject"` // what it applies to, e.g. "model actor"
	Value   string `json:"value"`
	Why     string `json:"why"`
}
