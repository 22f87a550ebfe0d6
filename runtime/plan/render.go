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
	Tokens    int    `json:"tokens_per_micro_batch"` // micro-batch token budget per GPU
}

// Fits reports whether the device total fits in the GPU's memory.
func (p *Plan) Fits(gpuBytes int64) bool { return p.DeviceTotal() <= gpuBytes }

// GiB formats bytes as GiB with two decimals, or "-" for zero.
func GiB(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n)/(1<<30))
}

// Render writes the per-GPU budget table a person reads at a glance: one row
// per stage with the bytes in use at the stage's peak op by category, the
// overall peak marked, then the arena, the reserves and FITS / DOES NOT FIT.
func (p *Plan) Render(w io.Writer, h Header) error {
	fmt.Fprintf(w, "%s: %d rank(s), dp %d, %d tokens per micro-batch per GPU\n", h.Job, h.Ranks, h.DP, h.Tokens)
	fmt.Fprintf(w, "GPU: %s, %s GiB (%s)\n\n", h.GPUName, GiB(h.GPUBytes), h.GPUSource)
	fmt.Fprintln(w, "per-GPU device memory in use at each stage's peak op (GiB)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	cols := []string{"stage", "kind", "peak op"}
	for _, k := range Kinds {
		cols = append(cols, short[k])
	}
	cols = append(cols, "total", "host", "")
	fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t")
	for _, s := range p.Budget {
		if s.Kind == "runtime" {
			continue
		}
		row := []string{s.Stage, s.Kind, s.PeakOp}
		for _, k := range Kinds {
			row = append(row, GiB(s.ByKind[k]))
		}
		mark := ""
		if s.Stage == p.PeakStage {
			mark = "<- peak"
		}
		row = append(row, GiB(s.PeakBytes), GiB(s.HostBytes), mark)
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "peak in use     %8s GiB  (stage %s)\n", GiB(p.PeakBytes), p.PeakStage)
	fmt.Fprintf(w, "arena           %8s GiB  (%d buffers at fixed offsets)\n", GiB(p.DeviceArena), p.deviceBuffers())
	for _, r := range p.Reserves {
		fmt.Fprintf(w, "reserve         %8s GiB  %s: %s\n", GiB(r.Bytes), r.Name, r.Note)
	}
	total := p.DeviceTotal()
	fmt.Fprintf(w, "device total    %8s GiB  of %s GiB\n", GiB(total), GiB(h.GPUBytes))
	fmt.Fprintf(w, "host pinned     %8s GiB  per rank\n", GiB(p.HostArena))
	if p.Fits(h.GPUBytes) {
		fmt.Fprintf(w, "FITS: %s GiB free per GPU\n", GiB(h.GPUBytes-total))
	} else {
		fmt.Fprintf(w, "DOES NOT FIT: %s GiB over per GPU\n", GiB(total-h.GPUBytes))
	}
	return nil
}

// short are the column titles of the categories.
var short = map[Kind]string{Params: "params", Gathered: "gather", Grads: "grads", Optimizer: "optim",
	Activations: "activ", Logits: "logits", Comm: "comm", IO: "io", Workspace: "wksp"}

func (p *Plan) deviceBuffers() int {
	n := 0
	for _, b := range p.Buffers {
		if !b.Host && b.Bytes > 0 {
			n++
		}
	}
	return n
}
