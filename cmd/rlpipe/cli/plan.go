package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/stages"
)

func cmdValidate(_ context.Context, env *cli, args []string) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "Usage: rlpipe validate [--gpu G] SPEC.yaml\n\nChecks the spec, its models' config.json and safetensors headers, the stage\nDAG and every stage's parameters; prints every problem with file:line:col.\n\n")
		fs.PrintDefaults()
	}
	g := gpuFlag(fs)
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	l, err := load(fs.Arg(0), *g)
	if err != nil {
		return env.report(err)
	}
	fmt.Fprintf(env.stdout, "%s: ok (%d models, %d setup + %d step stages)\n", fs.Arg(0), len(l.spec.Models), len(l.spec.Setup), len(l.spec.Step))
	return exitOK
}

func cmdPlan(_ context.Context, env *cli, args []string) int {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "Usage: rlpipe plan [--gpu G] [--json] SPEC.yaml\n\nPrints the per-GPU memory budget of every stage: the bytes each stage has in\nuse at its peak op, by category, the arena that `rlpipe run` allocates and\nwhether the job fits. Exit code %d when it does not fit.\n\n", exitNoFit)
		fs.PrintDefaults()
	}
	g := gpuFlag(fs)
	asJSON := fs.Bool("json", false, "print the whole plan (ops, buffers with offsets and lifetimes, budget) as JSON")
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	l, err := load(fs.Arg(0), *g)
	if err != nil {
		return env.report(err)
	}
	p, err := stages.Plan(l.job)
	if err != nil {
		return env.report(err)
	}
	h := header(l)
	if *asJSON {
		out := struct {
			Header plan.Header `json:"job"`
			Fits   bool        `json:"fits"`
			Total  int64       `json:"device_total_bytes"`
			*plan.Plan
		}{h, p.Fits(h.GPUBytes), p.DeviceTotal(), p}
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return env.report(err)
		}
	} else if err := p.Render(env.stdout, h); err != nil {
		return env.report(err)
	}
	if !p.Fits(h.GPUBytes) {
		return exitNoFit
	}
	return exitOK
}

func header(l *loaded) plan.Header {
	tokens := l.spec.Data.MaxTokensPerGPU
	for id, s := range l.job.Stages {
		if p, ok := s.(*stages.Pack); ok {
			_ = id
			tokens = p.Tokens(l.spec)
		}
	}
	return plan.Header{Job: l.spec.Name, GPUName: l.job.GPU.Name, GPUBytes: l.job.GPU.Bytes, GPUSource: l.job.GPU.Source,
		Ranks: l.spec.Mesh.WorldSize(), DP: l.spec.Mesh.DP, Tokens: tokens}
}

func cmdGraph(_ context.Context, env *cli, args []string) int {
	fs := flag.NewFlagSet("graph", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "Usage: rlpipe graph [--json | --dot] SPEC.yaml\n\nPrints the stage DAG: setup and step phases in execution order.\n\n")
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print the graph as JSON")
	asDot := fs.Bool("dot", false, "print the graph in Graphviz dot")
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	if fs.NArg() != 1 || (*asJSON && *asDot) {
		fs.Usage()
		return exitUsage
	}
	l, err := loadGraph(fs.Arg(0))
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

func cmdStages(_ context.Context, env *cli, _ []string) int {
	for _, k := range stages.Kinds() {
		fmt.Fprintf(env.stdout, "%-14s %-6s %s\n", k.Name, k.Phase, k.Doc)
	}
	return exitOK
}
