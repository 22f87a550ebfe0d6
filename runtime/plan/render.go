package plan

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Header describes the job a plan belongs to, for the report's first lines.
type Header struct {
	Job       string `json:"name"`
	GPUName   string `json:"gpu"`
	GPUBytes  int64  `json:"gpu_bytes"`
	GPUSource string `json:"gpu_source"`
	Ranks     int    `json:"ranks"`
	DP        int    `json:"dp"`
	CP        int    `json:"cp,omitempty"`           // context parallelism; 0 or 1: none
	Tokens    int    `json:"tokens_per_micro_batch"` // micro-batch token budget per GPU
	// Updates is the number of optimizer updates a training step makes
	// (ppo_epochs × mini-batches); the plan holds one, reused by all.
	Updates int `json:"updates_per_step"`
	// RanksPerHost is the ranks a host runs (mesh.gpus_per_node).
	RanksPerHost int `json:"ranks_per_host"`
	// HostBytes is a host's RAM, when known (0: not checked), and
	// HostSource where the figure came from.
	HostBytes  int64  `json:"host_bytes,omitempty"`
	HostSource string `json:"host_source,omitempty"`
}

// Fits reports whether the device total fits in the GPU's memory.
func (p *Plan) Fits(gpuBytes int64) bool { return p.DeviceTotal() <= gpuBytes }

// GiB formats bytes as GiB with two decimals, or "-" for zero.
func GiB(n int64) string { return unit{"GiB", 1 << 30}.format(n) }

// unit is the scale a report prints its byte figures in.
type unit struct {
	name  string
	bytes float64
}

func (u unit) format(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n)/u.bytes)
}

// unitFor picks GiB, or MiB for plans whose peak is under 1 GiB.
func unitFor(peak int64) unit {
	if peak < 1<<30 {
		return unit{"MiB", 1 << 20}
	}
	return unit{"GiB", 1 << 30}
}

// Render writes the per-GPU budget table a person reads at a glance: one row
// per stage with the bytes in use at the stage's peak op by category, the
// overall peak marked, then the arena, the reserves and FITS / DOES NOT FIT.
func (p *Plan) Render(w io.Writer, h Header) error {
	cp := ""
	if h.CP > 1 {
		cp = fmt.Sprintf(" × cp %d (each sequence split over %d ranks)", h.CP, h.CP)
	}
	fmt.Fprintf(w, "%s: %d rank(s), dp %d%s, %d tokens per micro-batch per GPU, %d optimizer update(s) per step\n", h.Job, h.Ranks, h.DP, cp, h.Tokens, h.Updates)
	u := unitFor(p.PeakBytes)
	fmt.Fprintf(w, "GPU: %s, %s GiB (%s)\n", h.GPUName, GiB(h.GPUBytes), h.GPUSource)
	for _, c := range p.Auto {
		fmt.Fprintf(w, "auto: %s of %s: %s (%s)\n", c.Key, c.Subject, c.Value, c.Why)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "per-GPU device memory in use at each stage's peak op (%s)\n", u.name)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// Print only the categories some stage uses.
	var kinds []Kind
	for _, k := range Kinds {
		for _, s := range p.Budget {
			if s.ByKind[k] > 0 {
				kinds = append(kinds, k)
				break
			}
		}
	}
	cols := []string{"stage", "kind", "peak op"}
	for _, k := range kinds {
		cols = append(cols, short[k])
	}
	cols = append(cols, "total", "host", "")
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	for _, s := range p.Budget {
		row := []string{s.Stage, s.Kind, s.PeakOp}
		for _, k := range kinds {
			row = append(row, u.format(s.ByKind[k]))
		}
		mark := ""
		if s.Stage == p.PeakStage {
			mark = "<- peak"
		}
		row = append(row, u.format(s.PeakBytes), u.format(s.HostBytes), mark)
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "peak in use     %8s %s  (stage %s)\n", u.format(p.PeakBytes), u.name, p.PeakStage)
	fmt.Fprintf(w, "arena           %8s %s  (%d buffers at fixed offsets)\n", u.format(p.DeviceArena), u.name, p.deviceBuffers())
	for _, r := range p.Reserves {
		fmt.Fprintf(w, "reserve         %8s %s  %s: %s\n", u.format(r.Bytes), u.name, r.Name, r.Note)
	}
	if p.ResidentArena > 0 {
		fmt.Fprintf(w, "resident        %8s %s  device buffers of the stages that may run while the trainer sleeps\n", u.format(p.ResidentArena), u.name)
	}
	total := p.DeviceTotal()
	fmt.Fprintf(w, "device total    %8s %s  of %s GiB\n", u.format(total), u.name, GiB(h.GPUBytes))
	fmt.Fprintf(w, "host pinned     %8s %s  per rank\n", u.format(p.HostArena), u.name)
	if len(p.HostBuffers) > 0 {
		var parts []string
		for _, hb := range p.HostBuffers {
			parts = append(parts, fmt.Sprintf("%s %s (%s)", hb.Name, u.format(hb.Bytes), hb.Note))
		}
		fmt.Fprintf(w, "host buffers    %8s %s  per rank (rank 0: %s), the largest of: %s\n", u.format(p.HostBuffersPeak(false)), u.name, u.format(p.HostBuffersPeak(true)), strings.Join(parts, "; "))
	}
	if c := p.Context; c != nil {
		fmt.Fprintf(w, "ring attention  %8s %s  forward, %s backward, per rank: the K/V blocks in flight during a layer's attention (cp %d; a rank holds %d rows of a micro-batch)\n",
			u.format(c.RingForward), u.name, u.format(c.RingBackward), c.CP, c.Rows)
	}
	parts := "pinned + buffers"
	if p.HostProcess > 0 {
		fmt.Fprintf(w, "host process    %8s %s  per rank: the process's own memory (code, CUDA driver, NCCL, Go runtime; estimate)\n", u.format(p.HostProcess), u.name)
		parts += " + process"
	}
	perHost := p.HostPerNode(h.RanksPerHost)
	switch {
	case h.HostBytes > 0:
		fmt.Fprintf(w, "host per node   %8s %s  %d rank(s) × (%s), of %s GiB RAM (%s)\n", u.format(perHost), u.name, max(h.RanksPerHost, 1), parts, GiB(h.HostBytes), h.HostSource)
	default:
		fmt.Fprintf(w, "host per node   %8s %s  %d rank(s) × (%s); RAM not checked (set mesh.host_memory or pass --host-memory)\n", u.format(perHost), u.name, max(h.RanksPerHost, 1), parts)
	}
	if len(p.Sleeps) > 0 {
		var kept, released []string
		for _, r := range p.Reserves {
			if r.Released {
				released = append(released, r.Name)
			} else {
				kept = append(kept, r.Name)
			}
		}
		if p.ResidentArena > 0 {
			kept = append([]string{"resident"}, kept...)
		}
		fmt.Fprintf(w, "asleep device   %8s %s  while the trainer sleeps: %s; released: %s\n", u.format(p.AsleepDeviceBytes()), u.name, orNone(kept), strings.Join(append([]string{"arena"}, released...), ", "))
		for _, s := range p.Sleeps {
			fmt.Fprintf(w, "asleep host     %8s %s  pinned copy of %d device buffers at stage %s (in host pinned)\n", u.format(s.Bytes), u.name, len(s.Saved), s.Stage)
		}
	}
	hostOK := h.HostBytes <= 0 || p.FitsHost(h.RanksPerHost, h.HostBytes)
	switch {
	case !p.Fits(h.GPUBytes):
		fmt.Fprintf(w, "DOES NOT FIT: %s GiB over per GPU\n", GiB(total-h.GPUBytes))
	case !hostOK:
		fmt.Fprintf(w, "DOES NOT FIT: %s GiB over the host's RAM\n", GiB(perHost-h.HostBytes))
	default:
		fmt.Fprintf(w, "FITS: %s GiB free per GPU\n", GiB(h.GPUBytes-total))
	}
	return nil
}

// short are the column titles of the categories.
var short = map[Kind]string{Params: "params", Gathered: "gather", Grads: "grads", Optimizer: "optim",
	Activations: "activ", Logits: "logits", Comm: "comm", IO: "io"}

func (p *Plan) deviceBuffers() int {
	n := 0
	for _, b := range p.Buffers {
		if !b.Host && !b.Resident && b.Bytes > 0 {
			n++
		}
	}
	return n
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, " + ")
}
