package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

func cmdValidate(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("validate", fmt.Sprintf("Usage: rlpipe validate [--gpu G] [--json] SPEC.yaml\n\nChecks everything rlpipe run checks before it starts, in one pass: the spec,\nits models' config.json and weights, the stages' parameters, the DAG and its\ndata edges, every policy over every model and layer, every when over the\nrun's steps, and the rollout file. Prints every problem with file:line:col\nand exits %d when there is one.\n\n", exitInvalid))
	g := gpuFlag(fs)
	asJSON := fs.Bool("json", false, `print the result as JSON on stdout: {"ok": true, ...}, or {"ok": false, "errors": [{"file", "line", "col", "message"}, ...]}`)
	if code, ok := parseFlags(fs, env, args, "SPEC.yaml"); !ok {
		return code
	}
	if err := checkGPUFlag(*g); err != nil {
		return env.usageError("%v", err)
	}
	path := fs.Arg(0)
	l, err := load(path, *g, stages.CheckRun)
	switch {
	case *asJSON:
		return env.validateJSON(path, l, err)
	case err != nil:
		return env.report(err)
	}
	fmt.Fprintf(env.stdout, "%s: ok (%d models, %d setup + %d step stages)\n", path, len(l.spec.Models), len(l.spec.Setup), len(l.spec.Step))
	return exitOK
}

func cmdPlan(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("plan", fmt.Sprintf("Usage: rlpipe plan [--gpu G] [--host-memory B] [--json] [--html FILE] [--longest [--longest-step N]] SPEC.yaml\n\nPrints the per-GPU memory budget of every stage: the bytes each stage has in\nuse at its peak op, by category, the arena that `rlpipe run` allocates and\nwhether the job fits. It checks what validate checks, except that the\nmodels need only config.json and the rollout file need not exist yet.\nWith --html it also writes the memory timeline, one self-contained HTML\npage: the bytes in use at every op, stacked by category, the peak and the\nbudget marked. With --longest it searches for the longest samples the job\nfits: it sets data.max_seq_len to multiples of --longest-step tokens and\ndata.max_tokens_per_gpu to the rows such a sample puts on each mesh.cp\nrank (one sample a micro-batch), prints the plan of the longest that\nfits and a LONGEST line naming it and why the next does not. Exit code %d\nwhen the job (with --longest: the shortest length tried) does not fit.\n\n", exitNoFit))
	g := gpuFlag(fs)
	asJSON := fs.Bool("json", false, "print the whole plan (ops, buffers with offsets and lifetimes, budget) as JSON")
	htmlOut := fs.String("html", "", "also write the memory timeline (bytes in use at every op, by category) as a self-contained HTML page to this file")
	hostMem := fs.String("host-memory", "", "a node's RAM (bytes, or like 2TiB), to check the pinned and host buffers of its ranks against (default: the spec's mesh.host_memory)")
	findLong := fs.Bool("longest", false, "search for the longest samples that fit, and plan those")
	step := fs.Int("longest-step", 1024, "with --longest, the lengths tried are multiples of this many tokens")
	if code, ok := parseFlags(fs, env, args, "SPEC.yaml"); !ok {
		return code
	}
	if err := checkGPUFlag(*g); err != nil {
		return env.usageError("%v", err)
	}
	if *step < 1 || *step > spec.MaxTokens {
		return env.usageError("--longest-step: %d is not between 1 and %d", *step, spec.MaxTokens)
	}
	var flagRAM int64
	if *hostMem != "" {
		n, err := gpu.ParseBytes(*hostMem, "--host-memory")
		if err != nil {
			return env.usageError("%v", err)
		}
		flagRAM = n
	}
	// planHeader is the header of l's plan, with the node's RAM to check
	// the host memory against (0: not checked).
	planHeader := func(l *loaded) (plan.Header, int64) {
		h, ram := header(l), flagRAM
		switch {
		case ram > 0:
			h.HostBytes, h.HostSource = ram, "--host-memory"
		case l.spec.Mesh.HostMemory > 0:
			ram = l.spec.Mesh.HostMemory
			h.HostBytes, h.HostSource = ram, "spec mesh.host_memory"
		}
		return h, ram
	}
	fitsOf := func(l *loaded, p *plan.Plan) bool {
		h, ram := planHeader(l)
		return p.Fits(h.GPUBytes) && (ram == 0 || p.FitsHost(h.RanksPerHost, ram))
	}
	var (
		l    *loaded
		p    *plan.Plan
		long *longest
	)
	if *findLong {
		best, r, err := findLongest(fs.Arg(0), *g, *step, fitsOf)
		if err != nil {
			return env.report(err)
		}
		long = &r
		if best.p == nil {
			// Not even the shortest length could be planned: say why.
			fmt.Fprintf(env.stderr, "rlpipe plan --longest: samples of %d tokens: %s\n", r.Step, best.why)
			return exitNoFit
		}
		l, p = best.l, best.p
	} else {
		var err error
		if l, err = load(fs.Arg(0), *g, stages.CheckPlan); err != nil {
			return env.report(err)
		}
		if p, err = stages.Plan(l.job); err != nil {
			return env.report(err)
		}
	}
	h, _ := planHeader(l)
	fits := fitsOf(l, p) // with --longest: the longest that fits, or the shortest tried
	if *htmlOut != "" {
		if err := model.WriteFileAtomic(*htmlOut, 0o644, func(w io.Writer) error { return p.WriteTimeline(w, h) }); err != nil {
			return env.report(err)
		}
		// stdout may be the JSON a program reads: say it on stderr.
		fmt.Fprintf(env.stderr, "rlpipe: memory timeline written to %s\n", *htmlOut)
	}
	if *asJSON {
		out := struct {
			Header  plan.Header `json:"job"`
			Fits    bool        `json:"fits"`
			Total   int64       `json:"device_total_bytes"`
			Longest *longest    `json:"longest,omitempty"`
			*plan.Plan
		}{h, fits, p.DeviceTotal(), long, p}
		if err := writeJSON(env.stdout, out); err != nil {
			return env.report(err)
		}
	} else {
		if err := p.Render(env.stdout, h); err != nil {
			return env.report(err)
		}
		if long != nil {
			long.write(env.stdout, h.GPUBytes)
		}
	}
	if !fits {
		return exitNoFit
	}
	return exitOK
}

// header describes the job above the plan. Its token budget is the
// largest of the pack stages' (data.max_tokens_per_gpu without one).
func header(l *loaded) plan.Header {
	tokens := 0
	for _, st := range l.job.Order {
		if p, ok := l.job.Stages[st.ID].(*stages.Pack); ok {
			tokens = max(tokens, p.Tokens(l.spec))
		}
	}
	if tokens == 0 {
		tokens = l.spec.Data.MaxTokensPerGPU
	}
	return plan.Header{Job: l.spec.Name, GPUName: l.job.GPU.Name, GPUBytes: l.job.GPU.Bytes, GPUSource: l.job.GPU.Source,
		Ranks: l.spec.Mesh.WorldSize(), DP: l.spec.Mesh.DP, CP: l.spec.Mesh.CP, Tokens: tokens, Updates: l.spec.UpdatesPerStep(), RanksPerHost: l.spec.Mesh.GPUsPerNode}
}

func cmdGraph(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("graph", "Usage: rlpipe graph [--json | --dot] SPEC.yaml\n\nPrints the stage DAG: setup and step phases in execution order, then the\ndata edges (producer.output -> consumer.input, and their type) and the order\nthat reads of a model's weights as at the step's start impose.\n\n")
	asJSON := fs.Bool("json", false, "print the graph as JSON")
	asDot := fs.Bool("dot", false, "print the graph in Graphviz dot")
	if code, ok := parseFlags(fs, env, args, "SPEC.yaml"); !ok {
		return code
	}
	if *asJSON && *asDot {
		return env.argError(fs, "--json and --dot exclude each other")
	}
	s, err := spec.Load(fs.Arg(0))
	if err != nil {
		return env.report(err)
	}
	l, err := stages.Graph(s)
	if err != nil {
		return env.report(err)
	}
	switch {
	case *asJSON:
		b, err := l.JSON()
		if err != nil {
			return env.report(err)
		}
		fmt.Fprintln(env.stdout, string(b))
	case *asDot:
		fmt.Fprint(env.stdout, l.DOT())
	default:
		fmt.Fprint(env.stdout, l.Text())
	}
	return exitOK
}

func cmdStages(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("stages", "Usage: rlpipe stages\n\nLists the registered stage kinds: name, phase (setup or step) and what each does.\n")
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	for _, k := range stages.Kinds() {
		fmt.Fprintf(env.stdout, "%-14s %-6s %s\n", k.Name, k.Phase, k.Doc)
	}
	return exitOK
}
