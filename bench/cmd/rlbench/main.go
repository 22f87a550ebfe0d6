// Command rlbench measures rlpipe on the workload of the PyTorch FSDP2 peer
// (bench/peer_fsdp2.py) and writes the result as JSON.
//
//	go run ./bench/cmd/rlbench --config examples/models/tiny-qwen2/config.json \
//	    --tokens-per-seq 96 --prompt-tokens 16 --chunk 64 --out /tmp/tiny.json
//
// The CUDA backend is compiled in only with the cuda build tag:
//
//	go build -o .devbin/rlbench ./bench/cmd/rlbench
//	.devbin/rlbench --backend cuda --config examples/models/qwen2.5-0.5b/config.json --out r.json
//
// Exit codes: 0 ok (also when --budget-s cut the timed steps short: status
// "partial" in the JSON), 1 failed, 2 usage.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rlpipe/rlpipe/bench"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	o := bench.DefaultOptions()
	fs := flag.NewFlagSet("rlbench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: rlbench [flags]\n\nRuns one GRPO job (ref_logprob + train) on random weights and synthetic rollouts\nthrough the `rlpipe run` path and reports tokens/s per stage and memory.\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.Config, "config", "", "HF config.json of the model (or its directory)")
	fs.StringVar(&o.Backend, "backend", o.Backend, "backend: "+strings.Join(bench.BackendNames(), ", ")+"")
	fs.IntVar(&o.Device, "device", 0, "GPU index (of rank 0; rank r runs on device+r)")
	fs.IntVar(&o.DP, "dp", 1, "data-parallel ranks, one GPU each, connected by NCCL on cuda; the sequences are split over them")
	fs.IntVar(&o.Threads, "threads", 0, "CPU backend worker goroutines (0: all cores)")
	fs.IntVar(&o.Steps, "steps", o.Steps, "timed steps")
	fs.IntVar(&o.Warmup, "warmup", o.Warmup, "untimed warm-up steps before them")
	fs.IntVar(&o.Seqs, "seqs", o.Seqs, "sequences per step (one GRPO group)")
	fs.IntVar(&o.TokensPerSeq, "tokens-per-seq", o.TokensPerSeq, "tokens per sequence, prompt included")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", o.PromptTokens, "prompt tokens per sequence")
	fs.IntVar(&o.Chunk, "chunk", o.Chunk, "log-prob chunk tokens (ref_logprob and train); 0: chunk_tokens auto")
	fs.IntVar(&o.MaxTokensPerGPU, "max-tokens-per-gpu", 0, "micro-batch token budget (0: seqs × tokens-per-seq)")
	fs.StringVar(&o.Precision, "precision", o.Precision, "compute dtype: bf16 or fp32")
	fs.BoolVar(&o.Recompute, "recompute", o.Recompute, "recompute decoder layers in backward (activation checkpointing)")
	fs.BoolVar(&o.RecomputeAuto, "recompute-auto", false, "policies.recompute auto: the plan recomputes the fewest layers that fit (overrides --recompute)")
	fs.BoolVar(&o.Offload, "offload", false, "actor params and optimizer state in pinned host memory (policies.offload/offload_optimizer)")
	fs.BoolVar(&o.OffloadRef, "offload-ref", false, "ref params in pinned host memory too")
	fs.BoolVar(&o.NoReshard, "no-reshard", false, "the actor's apply_fsdp2 with reshard_after_forward false: its units stay gathered from forward to backward")
	fs.BoolVar(&o.NoGradClip, "no-grad-clip", false, "train.grad_clip 0 (no clipping) instead of 1.0; with --offload each unit's host AdamW then starts as soon as its grads reach the host")
	fs.Var(autoBoolFlag{&o.GatherOnce}, "gather-once", "the actor's apply_fsdp2 gather_once, true, false or auto (the default: the plan chooses): the train stage gathers each unit once an update, in its first micro-batch, and keeps the copies on the GPU through the update")
	fs.Var(autoBoolFlag{&o.RefReplicate}, "ref-replicate", "the ref's apply_fsdp2 replicate, true, false or auto (the default: the plan chooses): every rank holds the whole ref and reads its units in place, gathering none (dp > 1)")
	fs.Var(autoBoolFlag{&o.RefGatherOnce}, "ref-gather-once", "the ref's apply_fsdp2 gather_once, true, false or auto (the default): ref_logprob gathers each unit once a step and keeps the copies over its micro-batches")
	fs.Var(autoBoolFlag{&o.AccumulateGrads}, "accumulate-grads-on-device", "the actor's apply_fsdp2 accumulate_grads_on_device, true (needs --offload), false or auto (the default: the plan chooses): an update's micro-batches sum their grads on the GPU, and only the sum crosses to the host, in the last one")
	fs.BoolVar(&o.HostBF16Copy, "host-bf16-copy", false, "with --offload, the actor's apply_fsdp2 with host_bf16_copy: the host AdamW writes a bf16 copy of the masters, which the gathers copy to the GPU instead of the fp32 masters")
	fs.IntVar(&o.Prefetch, "prefetch", o.Prefetch, "both models' apply_fsdp2 prefetch: units gathered ahead of the one computing (0, 1 or 2)")
	fs.Var(autoBoolFlag{&o.OverlapReduce}, "overlap-reduce", "the actor's apply_fsdp2 overlap_reduce, true, false or auto (the default: the plan chooses): its grads are reduce-scattered on the gather stream, overlapping the next unit's backward (dp > 1)")
	fs.BoolVar(&o.SyncHostOptimizer, "sync-host-optimizer", false, "with --offload, finish the host AdamW within its op instead of overlapping it with the next ops (for comparisons)")
	fs.Float64Var(&o.KLCoef, "kl-coef", o.KLCoef, "low_var_kl coefficient")
	fs.Float64Var(&o.EntropyCoef, "entropy-coef", o.EntropyCoef, "entropy coefficient")
	fs.Float64Var(&o.BudgetS, "budget-s", 0, "stop after the first timed step that ends past this many seconds of stepping (0: run all steps)")
	fs.StringVar(&o.GPU, "gpu", "", "GPU memory for the plan: preset or bytes (default: NVML for a GPU backend, host RAM for cpu)")
	fs.StringVar(&o.WorkDir, "workdir", "", "directory for the spec and rollouts (default: a temporary one, removed)")
	fs.StringVar(&o.CacheDir, "cache", "", "directory keeping random checkpoints between runs (default: inside the work directory)")
	fs.Int64Var(&o.Seed, "seed", o.Seed, "seed of the weights and rollouts")
	fs.BoolVar(&o.PlanOnly, "plan-only", false, "resolve and plan the job and report the plan's memory; run nothing")
	fs.BoolVar(&o.Profile, "profile", false, "time every op, syncing the backend at each op boundary, and report the last step's seconds per kind of op (profile_s)")
	fs.StringVar(&o.TimelineFile, "timeline", "", "record every step's timeline without syncing (timed events at each op, around the side stream's gathers and reductions and the compute stream's waits for them), report the last step's waits (timeline in the JSON) and write its spans to this file as a Chrome trace")
	out := fs.String("out", "", "write the result JSON here")
	quiet := fs.Bool("q", false, "no progress lines")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if o.Config == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	if !*quiet {
		o.Log = os.Stderr
	}
	if *out != "" {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "rlbench: %v\n", err)
			return 1
		}
		o.Progress = func(r *bench.Result) {
			if err := writeJSON(*out, r); err != nil {
				fmt.Fprintf(os.Stderr, "rlbench: %v\n", err)
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.Run(ctx, o)
	fmt.Println(summary(res))
	if err != nil {
		fmt.Fprintf(os.Stderr, "rlbench: %v\n", err)
		return 1
	}
	return 0
}

func writeJSON(path string, r *bench.Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func summary(r *bench.Result) string {
	const gib = 1 << 30
	name := filepath.Base(filepath.Dir(r.Model.Config))
	off := ""
	if r.Workload.Offload {
		off = " offload"
	}
	s := fmt.Sprintf("rlpipe %s%s [%s %s] %s: ref_logprob %.0f tok/s, train %.0f tok/s (%d timed steps); plan peak %.2f GiB, arena %.2f GiB, high-water %.2f GiB",
		name, off, r.Backend, r.Device, r.Status, r.RefLogprob.TokensPerS, r.Train.TokensPerS, len(r.Train.TimesS),
		float64(r.Memory.PlanPeakBytes)/gib, float64(r.Memory.PlanDeviceArenaBytes)/gib, float64(r.Memory.ArenaHighWaterBytes)/gib)
	if r.Memory.NVMLProcessBytes > 0 {
		s += fmt.Sprintf(", NVML process %.2f GiB", float64(r.Memory.NVMLProcessBytes)/gib)
	}
	// The last step's grad_norm, so that two builds timed against each
	// other are seen to compute the same grads.
	if g, ok := r.LastMetrics["grad_norm"]; ok {
		s += fmt.Sprintf("; last grad_norm %.6g", g)
	}
	if e := r.Energy; e != nil {
		s += fmt.Sprintf("; energy %.1f J a step (ref_logprob + train), %.0f W over %d steps", e.JoulesPerStep, e.Watts, e.Steps)
	}
	if r.Error != "" {
		s += " — " + r.Error
	}
	return s
}
