package stages

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/nccl"
	rt "github.com/rlpipe/rlpipe/runtime"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// Device memory outside the arena. The CUDA context and NCCL figures are
// estimates of what the driver and libraries take (context, module images,
// cuBLASLt handle; the buffers of NCCL's channels, for each rank's two
// communicators, one for the gather stream and one for the compute stream);
// the backend reserve is what the CUDA backend allocates itself: the
// cuBLASLt workspace, the device error flag and a 4 MiB reduction scratch
// for each of its two streams. The GPU tests check the NVML-measured process
// memory against arena + reserves.
//
// HostProcessReserve is the host memory a rank's process takes beyond its
// pinned arena and host buffers: on four H200s (docs/memory.md) a process
// of one rank peaked 0.60-1.03 GiB over them, one of four ranks 2.34 GiB,
// and an H100 run 1.13 GiB. 1.25 GiB a rank covers every run measured.
const (
	CUDAContextReserve = 768 << 20
	NCCLReserve        = 1536 << 20
	BackendReserve     = 32<<20 + 4096 + 2*(4<<20)
	HostProcessReserve = 1280 << 20
)

// planOnce builds the per-device memory plan of the job as its choices
// stand: every stage in order declares its ops and buffers, then the
// builder assigns arena offsets.
func planOnce(j *Job) (*plan.Plan, error) {
	b := plan.NewBuilder()
	b.AddReserve(plan.Reserve{Name: "cuda_context", Bytes: CUDAContextReserve, Note: "CUDA context, kernel images, cuBLASLt handle (estimate)"})
	b.AddReserve(plan.Reserve{Name: "backend", Bytes: BackendReserve, Note: "cuBLASLt workspace, error flag and two streams' reduction scratch, allocated by the CUDA backend", Released: true})
	if j.Spec.Mesh.WorldSize() > 1 {
		b.AddReserve(plan.Reserve{Name: "nccl", Bytes: NCCLReserve, Note: "two NCCL communicators' buffers (estimate)"})
	}
	cp, rows := j.Spec.Mesh.CPSize(), cpRows(j)
	if cp > 1 {
		b.AddReserve(plan.Reserve{Name: "nccl_cp", Bytes: NCCLReserve, Note: "the cp group's two NCCL communicators' buffers (estimate)"})
		b.AddReserve(plan.Reserve{Name: "ring_spans", Bytes: int64(16 * rows * gpu.SpanLayouts),
			Note: fmt.Sprintf("the CUDA backend's %d span layouts of ring attention blocks (8 bytes per query and per key row)", gpu.SpanLayouts)})
	}
	if j.Graph == nil {
		return nil, fmt.Errorf("the job has no stage graph")
	}
	pc := &PlanContext{Job: j, B: b, state: &planState{values: values{}, asleep: j.asleepAfter()}}
	// The plan's rollout batch and prompts: planning reads nothing from
	// them.
	pc.state.values[SourceRollouts] = &RolloutBatch{}
	pc.state.values[SourcePrompts] = &PromptBatch{}
	for _, st := range j.Order {
		s := j.Stages[st.ID]
		if s == nil {
			return nil, fmt.Errorf("stage %q was not resolved", st.ID)
		}
		pc.Stage, pc.Node = st, j.Graph.Node(st.ID)
		b.BeginStage(st.ID, st.Uses, string(st.Phase))
		if err := s.Plan(pc); err != nil {
			return nil, fmt.Errorf("planning stage %q: %w", st.ID, err)
		}
		b.EndStage()
	}
	p, err := b.Finish()
	if err != nil {
		return nil, err
	}
	p.HostBuffers = hostBuffers(j)
	p.HostProcess = HostProcessReserve
	if cp > 1 {
		fwd, bwd := plan.RingScratch(p.Buffers)
		p.Context = &plan.ContextUse{CP: cp, Rows: rows, RingForward: fwd, RingBackward: bwd}
	}
	return p, nil
}

// cpRows is the most rows a rank holds of a micro-batch: the largest pack
// stage's budget, or data.max_tokens_per_gpu.
func cpRows(j *Job) int {
	rows := 0
	for _, s := range j.Stages {
		if pk, ok := s.(*Pack); ok {
			rows = max(rows, pk.Tokens(j.Spec))
		}
	}
	if rows == 0 {
		rows = j.Spec.Data.MaxTokensPerGPU
	}
	return rows
}

// RunOptions configure Run.
type RunOptions struct {
	// Backend returns the backend of a rank; nil means the CPU backend.
	Backend func(rank int) (gpu.Backend, error)
	// Ranks are the ranks this process runs, each as a goroutine; nil
	// means all the mesh's ranks. With fewer, the others run in other processes
	// (one process per GPU, started by a launcher) and Comms and Control
	// must join them.
	Ranks []int
	// Comms connects the ranks' backends: it gets this process's backends
	// (one per entry of Ranks, in order) and returns their communicators
	// over all the mesh's ranks (dp × cp: FSDP shards over all of them).
	// nil means the in-process loopback communicator, which needs
	// host-addressable memory (the CPU backend).
	Comms func(backends []gpu.Backend) ([]nccl.Comm, error)
	// CPComms, with mesh.cp > 1, returns for each of this process's
	// backends the communicator of its context-parallel group: the cp
	// ranks dp·cp … dp·cp+cp−1, in that order, which pass keys and values
	// round their ring (a communicator that is itself a model.Ring shifts
	// them its own way, NCCL's send and receive; others through
	// nccl.HostRing). nil means an in-process loopback per group.
	CPComms func(backends []gpu.Backend) ([]nccl.Comm, error)
	// Threads is the CPU threads a rank's CPU work uses (the CPU backend,
	// the host optimizer step); 0 means GOMAXPROCS over the ranks this
	// process runs. A process per rank sets it to its share of the host.
	Threads int
	// Control holds, for each entry of Ranks, a host-memory communicator
	// over all the mesh's ranks for what the ranks agree on outside the stages
	// (whether to stop). nil means an in-process loopback, when this
	// process runs every rank. Run does not close them.
	Control []nccl.Comm
	// FirstStep is the step to start at (1, or the step after a resumed checkpoint).
	FirstStep int
	// Steps overrides train.steps when positive; a negative Steps runs the
	// setup stages only.
	Steps int
	// Resume, when set, is called on every rank after setup to restore state.
	Resume func(r *Rank) error
	// SyncHostOptimizer makes the optimizer step that runs on the host
	// (a model whose params and optimizer state are both offloaded) finish
	// within its op, instead of going on in the background while the device
	// runs the next ops: the results are the same, only slower; for
	// comparisons.
	SyncHostOptimizer bool
	// Profile times every op (see Rank.Profile) and reports the step's
	// breakdown in StepResult.Profile.
	Profile bool
	// TimelineEvery, when above 0, records the timeline of every
	// TimelineEvery-th step without syncing (see StepTimeline) and reports
	// it in StepResult.Timeline: when each op ran, when the side stream
	// gathered and reduced, and how long the compute stream waited for it.
	TimelineEvery int
	// Export names a model whose rows every rank downloads after the last
	// step into Result.Export (for ExportHF): an export from memory, for
	// callers of this package and as the tests' reference for
	// ExportCheckpoint. rlpipe run exports from the last checkpoint instead,
	// streamed, in one process or many.
	Export string
	// AfterStep is called on every rank after each step, with every rank
	// past the step (a barrier); rank 0 typically records metrics and
	// checkpoints there. An error stops the run.
	AfterStep func(r *Rank, res StepResult) error
	// DeviceMemory, when not nil, measures the device memory a rank's
	// process uses (NVML); a sleep stage reports it as asleep_device_bytes.
	DeviceMemory func(rank int) (int64, bool)
	// Stop, when not nil, is asked (on rank 0, the answer shared) after
	// every step: once it reports true the run stops cleanly after that
	// step, which AfterStep sees with StepResult.Stop set, and Result.Last
	// tells the step.
	Stop func() bool
	// Progress, when not nil, receives every rank's setup events (see
	// SetupEvent): each setup stage's start, progress and finish, then
	// the end of the rank's setup. It is called from the ranks'
	// goroutines, concurrently, and should return quickly.
	Progress func(SetupEvent)
}

// StepResult is what one training step produced on a rank.
type StepResult struct {
	Step   int
	Wall   time.Duration
	Stats  StepStats
	Report *rt.Report
	InUse  int64 // arena bytes in use at the high-water mark so far
	Tokens int64
	// Profile is the step's time per kind of op, with RunOptions.Profile.
	Profile map[string]time.Duration
	// Timeline is the step's timeline, on the steps RunOptions.TimelineEvery
	// names.
	Timeline *StepTimeline
	// Stop is set, the same on every rank, when RunOptions.Stop asked to
	// stop and this is the run's last step although more were asked for:
	// AfterStep should checkpoint it.
	Stop bool
}

// Result is the outcome of a run.
type Result struct {
	// Ranks holds the ranks' state by rank; nil for ranks that run in
	// another process.
	Ranks  []*Rank
	Export []ShardRows // per rank run here, when RunOptions.Export is set
	// Last is the last step the run finished (FirstStep−1 when it ran
	// none); it is below the requested steps when RunOptions.Stop stopped
	// it.
	Last int

	lead int // the first rank this process runs: it sets Last
}

// Run executes the job: dp ranks, each with its own backend and arena,
// connected by a communicator (RunOptions.Comms, by default the loopback),
// run the setup stages once and the step stages for every training step,
// each step's rollout batch taken from j.Data. When it returns, it has
// closed the communicator and the backends it made (those with a Close
// method).
func Run(ctx context.Context, j *Job, p *plan.Plan, opts RunOptions) (*Result, error) {
	if j.Graph == nil {
		return nil, fmt.Errorf("the job has no stage graph")
	}
	if j.auto == nil {
		return nil, errAutoUnplanned
	}
	world := j.Spec.Mesh.WorldSize()
	steps := j.Spec.Train.Steps
	switch {
	case opts.Steps > 0:
		steps = opts.Steps
	case opts.Steps < 0:
		steps = 0 // setup only
	}
	first := max(opts.FirstStep, 1)
	local := opts.Ranks
	if local == nil {
		local = make([]int, world)
		for r := range local {
			local[r] = r
		}
	}
	for _, r := range local {
		if r < 0 || r >= world {
			return nil, fmt.Errorf("rank %d is outside the mesh's %d ranks", r, world)
		}
	}
	if len(local) < world && (opts.Comms == nil || len(opts.Control) != len(local)) {
		return nil, fmt.Errorf("this process runs %d of %d ranks and has no communicator joining the others", len(local), world)
	}
	if opts.Threads <= 0 {
		opts.Threads = max(1, runtime.GOMAXPROCS(0)/len(local))
	}
	if opts.Backend == nil {
		opts.Backend = func(int) (gpu.Backend, error) { return cpu.NewWithThreads(opts.Threads), nil }
	}
	backends := make([]gpu.Backend, len(local))
	defer func() {
		for _, b := range backends {
			if c, ok := b.(interface{ Close() error }); ok {
				c.Close()
			}
		}
	}()
	for i, r := range local {
		b, err := opts.Backend(r)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		backends[i] = b
	}
	var comms []nccl.Comm
	if opts.Comms != nil {
		cs, err := opts.Comms(backends)
		if err != nil {
			return nil, fmt.Errorf("communicator: %w", err)
		}
		if len(cs) != len(local) {
			return nil, fmt.Errorf("communicator: %d ranks for the %d this process runs", len(cs), len(local))
		}
		comms = cs
	} else {
		comms = nccl.NewLoopback(world)
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	control := opts.Control
	if control == nil {
		control = nccl.NewLoopback(world)
		defer control[0].Close()
	}
	cpComms, err := contextComms(j, local, backends, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range cpComms {
			if c != nil {
				c.Close()
			}
		}
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	res := &Result{Ranks: make([]*Rank, world), Export: make([]ShardRows, world), Last: first - 1, lead: local[0]}
	var wg sync.WaitGroup
	errs := make([]error, len(local))
	for i, r := range local {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := runRank(ctx, j, p, backends[i], comms[i], control[i], cpComms[i], r, first, steps, opts, res)
			if err != nil {
				errs[i] = err
				cancel(err)
				abort(comms[i], err)
				abort(control[i], err)
				if cpComms[i] != nil {
					abort(cpComms[i], err)
				}
			}
		}()
	}
	wg.Wait()
	// Report the root cause: the first rank error that is not a consequence
	// of another rank's failure.
	cause := context.Cause(ctx)
	for _, err := range errs {
		if err != nil && (cause == nil || errors.Is(err, cause) || !errors.Is(err, context.Canceled)) {
			return res, err
		}
	}
	if cause != nil && !errors.Is(cause, context.Canceled) {
		return res, cause
	}
	return res, errors.Join(errs...)
}

// contextComms returns the communicators of the cp groups of the ranks in
// local (nil entries when mesh.cp is 1).
func contextComms(j *Job, local []int, backends []gpu.Backend, opts RunOptions) ([]nccl.Comm, error) {
	cp, world := j.Spec.Mesh.CPSize(), j.Spec.Mesh.WorldSize()
	out := make([]nccl.Comm, len(local))
	if cp == 1 {
		return out, nil
	}
	for i, b := range backends {
		if _, ok := b.(model.RingBackend); !ok {
			return nil, fmt.Errorf("rank %d: mesh.cp %d needs ring attention (span attention and its merge), which backend %T does not have", local[i], cp, b)
		}
	}
	if opts.CPComms != nil {
		cs, err := opts.CPComms(backends)
		if err != nil {
			return nil, fmt.Errorf("context-parallel communicator: %w", err)
		}
		if len(cs) != len(local) {
			return nil, fmt.Errorf("context-parallel communicator: %d ranks for the %d this process runs", len(cs), len(local))
		}
		return cs, nil
	}
	if len(local) != world {
		return nil, fmt.Errorf("mesh.cp %d: this process runs %d of %d ranks and has no context-parallel communicator joining the others", cp, len(local), world)
	}
	for g := 0; g < world; g += cp {
		copy(out[g:g+cp], nccl.NewLoopback(cp))
	}
	return out, nil
}

// abort aborts c because of err: with the reason, where the communicator
// can carry it to other processes, else by closing it.
func abort(c nccl.Comm, err error) {
	if a, ok := c.(interface{ Abort(error) }); ok {
		a.Abort(err)
		return
	}
	c.Close()
}

func runRank(ctx context.Context, j *Job, p *plan.Plan, b gpu.Backend, comm, control, cp nccl.Comm, id, first, steps int, opts RunOptions, res *Result) error {
	g := j.Graph
	if opts.Control != nil { // ranks in other processes, which planned the job themselves
		if err := agreePlan(ctx, id, control, p); err != nil {
			return err
		}
	}
	arena, err := NewArena(b, p)
	if err != nil {
		return fmt.Errorf("rank %d: %w", id, err)
	}
	defer arena.Free(b)
	r := newRank(id, comm, b, arena)
	defer r.bg.Wait() // before the arena is freed
	r.Control = control
	if cp != nil {
		r.CP = cp
		r.Ring = nccl.HostRing{C: cp}
		if ring, ok := cp.(model.Ring); ok {
			r.Ring = ring
		}
	}
	if opts.DeviceMemory != nil {
		r.deviceMemory = func() (int64, bool) { return opts.DeviceMemory(id) }
	}
	r.Host = cpu.NewWithThreads(opts.Threads) // Run set it
	// The host AdamW that goes on in the background leaves a core to the
	// goroutine that issues the device's work.
	r.hostBackground = cpu.NewWithThreads(max(1, opts.Threads-1))
	r.syncHostOptimizer = opts.SyncHostOptimizer
	if r.Side, err = b.NewStream(); err != nil {
		return fmt.Errorf("rank %d: side stream: %w", id, err)
	}
	defer r.Side.Close()
	if r.Down, err = b.NewStream(); err != nil {
		return fmt.Errorf("rank %d: down stream: %w", id, err)
	}
	defer r.Down.Close()
	res.Ranks[id] = r
	r.setup = newSetupReporter(opts.Progress, id, j.Spec.Mesh.WorldSize())
	runStage := func(ctx context.Context, n *rt.Node) error {
		if err := arena.StartStage(n.Stage.ID); err != nil {
			return err
		}
		t0 := time.Now()
		setup := n.Stage.Phase == spec.Setup
		if setup {
			r.setup.start(n.Stage, j.Stages[n.Stage.ID])
		}
		err := j.Stages[n.Stage.ID].Run(ctx, &RunContext{Job: j, Stage: n.Stage, Node: n, Rank: r})
		if err == nil && setup {
			if err = b.Sync(); err == nil {
				r.Setup = append(r.Setup, StageTime{Stage: n.Stage.ID, Seconds: time.Since(t0).Seconds()})
				r.setup.finish(time.Since(t0).Seconds())
			}
		}
		return err
	}
	env := func(n *rt.Node) *spec.Env { return j.StepEnv(n.Stage, r.Step) }
	if _, err := rt.Execute(ctx, g, spec.Setup, env, runStage); err != nil {
		return fmt.Errorf("rank %d: setup: %w", id, err)
	}
	if opts.Resume != nil {
		if err := opts.Resume(r); err != nil {
			return fmt.Errorf("rank %d: resume: %w", id, err)
		}
	}
	r.setup.done()
	for step := first; step <= steps; step++ {
		r.Step = step
		r.tl = nil
		if opts.TimelineEvery > 0 && step%opts.TimelineEvery == 0 {
			r.tl = &timeline{}
		}
		if opts.Profile {
			r.Profile = map[string]time.Duration{}
		}
		t0 := time.Now()
		// A step reads only what its stages write this step, and reports
		// only what they report.
		r.values.clearStep(g)
		r.Stats = StepStats{}
		clear(r.reports)
		if j.Data != nil {
			r.values[SourceRollouts] = j.Data.Step(step)
		}
		if j.Prompts != nil {
			r.values[SourcePrompts] = j.Prompts.Step(step)
		}
		rep, err := rt.Execute(ctx, g, spec.Step, env, runStage)
		if err != nil {
			return fmt.Errorf("rank %d: step %d: %w", id, step, err)
		}
		if err := comm.Barrier(ctx); err != nil {
			return fmt.Errorf("rank %d: step %d: %w", id, step, err)
		}
		for k, v := range r.reports {
			if r.Stats.Values == nil {
				r.Stats.Values = map[string]float64{}
			}
			if _, ok := r.Stats.Values[k]; !ok {
				r.Stats.Values[k] = v
			}
		}
		stop, err := stopAll(ctx, id, control, opts.Stop)
		if err != nil {
			return fmt.Errorf("rank %d: after step %d: %w", id, step, err)
		}
		if stop || step == steps {
			// The run's last step ends when its host optimizer updates
			// have: they count in its wall time, and their errors in it.
			if err := r.settle(); err != nil {
				return fmt.Errorf("rank %d: step %d: %w", id, step, err)
			}
		}
		hw, _ := arena.HighWater()
		sr := StepResult{Step: step, Wall: time.Since(t0), Stats: r.Stats, Report: rep, InUse: hw, Tokens: r.Stats.Tokens, Profile: r.Profile, Stop: stop && step < steps}
		if r.tl != nil {
			if sr.Timeline, err = r.tl.collect(r.B); err != nil {
				return fmt.Errorf("rank %d: step %d: %w", id, step, err)
			}
		}
		if opts.AfterStep != nil {
			if err := opts.AfterStep(r, sr); err != nil {
				return fmt.Errorf("rank %d: after step %d: %w", id, step, err)
			}
		}
		if err := comm.Barrier(ctx); err != nil {
			return fmt.Errorf("rank %d: step %d: %w", id, step, err)
		}
		if id == res.lead {
			res.Last = step
		}
		if sr.Stop {
			break
		}
	}
	if opts.Export != "" {
		rows, err := r.ExportRows(opts.Export)
		if err != nil {
			return fmt.Errorf("rank %d: export: %w", id, err)
		}
		res.Export[id] = rows
	}
	return nil
}

// stopAll reports, the same on every rank, whether opts.Stop says to stop:
// rank 0 asks, and broadcasts its answer.
func stopAll(ctx context.Context, id int, control nccl.Comm, stop func() bool) (bool, error) {
	if stop == nil {
		return false, nil
	}
	var answer []byte
	if id == 0 {
		answer = []byte{0}
		if stop() {
			answer[0] = 1
		}
	}
	got, err := nccl.BroadcastBytes(ctx, control, 0, answer)
	if err != nil {
		return false, err
	}
	return len(got) == 1 && got[0] == 1, nil
}
