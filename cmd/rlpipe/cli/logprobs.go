package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
	"github.com/rlpipe/rlpipe/stages/rl"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

func cmdLogprobs(ctx context.Context, env *cli, args []string) int {
	fs := newFlagSet("logprobs", `Usage: rlpipe logprobs [flags] MODEL_DIR DATA.jsonl

Computes, with rlpipe's own forward, the per-token log-probs and entropies of
every response token of the rollout file's samples under the HF checkpoint
MODEL_DIR, and writes one JSON object per sample (--out, default stdout):

  {"index": i, "line": L, "logp": [...], "entropy": [...],
   "rollout_log_probs": [...], "mismatch_abs": m, "mismatch_k3": k}

rollout_log_probs and the two mismatch values appear when the file has the
rollout engine's log-probs. Then the summary on stderr (and --summary as
JSON) measures the rollout/train mismatch over the loss-masked tokens, with
x = l_rlpipe − l_rollout: mean |x|, max |x|, mean k3 = exp(−x) − 1 + x, and
the fraction of tokens with exp(x) > --tis-cap (what truncated importance
sampling would clip); and the mean entropy over all response tokens.

`)
	temperature := fs.Float64("temperature", 1, "the rollout temperature: log-probs of softmax(z/T)")
	precision := fs.String("precision", "bf16", "compute dtype of every layer: bf16 or fp32")
	backend := backendFlag(fs)
	g := gpuFlag(fs)
	out := fs.String("out", "", "write the per-sample JSONL here instead of stdout")
	summary := fs.String("summary", "", "also write the summary as JSON to this file")
	maxTokens := fs.Int("max-tokens", 0, "tokens of one packed micro-batch (default: the longest sample, at least 4096)")
	batch := fs.Int("batch", 256, "samples per forward pass over the file")
	chunk := fs.Int("chunk-tokens", stages.DefaultChunkTokens, "rows whose logits are materialised at once")
	tisCap := fs.Float64("tis-cap", rl.DefaultTISCap, "the importance-weight cap whose exceedance the summary counts")
	if code, ok := parseFlags(fs, env, args, "MODEL_DIR", "DATA.jsonl"); !ok {
		return code
	}
	switch {
	case !(*temperature > 0) || math.IsInf(*temperature, 0):
		return env.usageError("--temperature: %v must be positive", *temperature)
	case *precision != "bf16" && *precision != "fp32":
		return env.usageError("--precision: %q is not bf16 or fp32", *precision)
	case *batch < 1 || *batch > spec.MaxRolloutSamples:
		return env.usageError("--batch: %d is not in [1, %d]", *batch, spec.MaxRolloutSamples)
	case *maxTokens < 0 || *maxTokens > spec.MaxTokens:
		return env.usageError("--max-tokens: %d is not in [0, %d]", *maxTokens, spec.MaxTokens)
	case *chunk < 1:
		return env.usageError("--chunk-tokens: %d must be positive", *chunk)
	case !(*tisCap >= 1):
		return env.usageError("--tis-cap: %v must be at least 1", *tisCap)
	}
	if err := checkRunFlags(*g, *backend, 0, ""); err != nil {
		return env.usageError("%v", err)
	}
	modelDir, dataPath := fs.Arg(0), fs.Arg(1)
	samples, err := rollout.Read(dataPath)
	if err != nil {
		return env.report(err)
	}
	longest := 0
	for _, s := range samples {
		longest = max(longest, len(s.Tokens))
	}
	budget := *maxTokens
	if budget == 0 {
		budget = max(longest, 4096)
	}
	if longest > budget {
		return env.usageError("--max-tokens: %d is below the longest sample's %d tokens", budget, longest)
	}
	l, err := logprobsJob(modelDir, dataPath, *temperature, *precision, *chunk, min(*batch, len(samples)), budget, (len(samples)+*batch-1) / *batch, *g)
	if err != nil {
		return env.report(err)
	}
	if err := rollout.CheckVocab(samples, l.job.Models["model"].Config.VocabSize); err != nil {
		return env.report(fmt.Errorf("%s: %w", dataPath, err))
	}
	// Every sample is its own group: the groups play no part here.
	d := &stages.Data{Samples: samples}
	for start := 0; start < len(samples); start += *batch {
		var idx []int
		for i := start; i < min(start+*batch, len(samples)); i++ {
			d.Samples[i].Group = i
			idx = append(idx, i)
		}
		d.Batches = append(d.Batches, idx)
	}
	l.job.Data = d
	choice, err := chooseBackend(*backend, l.spec, nil)
	if err != nil {
		return env.report(err)
	}
	p, err := stages.Plan(l.job)
	if err != nil {
		return env.report(err)
	}
	if !p.Fits(l.job.GPU.Bytes) {
		return env.report(fmt.Errorf("the plan needs %s GiB per device and %s has %s GiB; lower --max-tokens or --batch", plan.GiB(p.DeviceTotal()), l.job.GPU.Name, plan.GiB(l.job.GPU.Bytes)))
	}
	w := io.Writer(env.stdout)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return env.report(err)
		}
		defer f.Close()
		w = f
	}
	bw := bufio.NewWriter(w)
	var sum mismatchSum
	opts := stages.RunOptions{Backend: choice.newBackend, Comms: choice.comms, CPComms: choice.cpComms, AfterStep: func(r *stages.Rank, sr stages.StepResult) error {
		if r.ID != 0 {
			return nil
		}
		b, lp, ent, err := logprobsOf(r)
		if err != nil {
			return err
		}
		return writeLogprobs(bw, b, lp, ent, *tisCap, &sum)
	}}
	if _, err := stages.Run(ctx, l.job, p, opts); err != nil {
		return env.report(err)
	}
	if err := bw.Flush(); err != nil {
		return env.report(err)
	}
	res := sum.result(*tisCap)
	fmt.Fprintf(env.stderr, "%d samples, %d response tokens (%s, %s, T=%g)\n", len(samples), res.Tokens, filepath.Base(filepath.Clean(modelDir)), choice.name, *temperature)
	if res.RolloutTokens > 0 {
		fmt.Fprintf(env.stderr, "mismatch over %d loss-masked tokens, x = l_rlpipe - l_rollout:\n  mean |x|  %.6g\n  max |x|   %.6g\n  mean k3   %.6g\n  exp(x) > %g  %.4g of tokens\n",
			res.RolloutTokens, res.MeanAbs, res.MaxAbs, res.MeanK3, *tisCap, res.OverCap)
	} else {
		fmt.Fprintln(env.stderr, "the file has no rollout_log_probs: no mismatch to measure")
	}
	fmt.Fprintf(env.stderr, "mean entropy %.6g\n", res.MeanEntropy)
	if *summary != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*summary, append(b, '\n'), 0o644); err != nil {
			return env.report(err)
		}
	}
	return exitOK
}

// logprobsJob builds the job of rlpipe logprobs: the model loaded and
// sharded on one rank, then per step a pack of batch samples and an
// actor_logprob stage with entropies. Its spec is written here, as a user
// would write it, so the job goes through the same checks as any other.
func logprobsJob(modelDir, dataPath string, temperature float64, precision string, chunk, batch, budget, steps int, gpuValue string) (*loaded, error) {
	abs, err := filepath.Abs(modelDir)
	if err != nil {
		return nil, err
	}
	data, err := filepath.Abs(dataPath)
	if err != nil {
		return nil, err
	}
	src := fmt.Sprintf(`version: 1
name: logprobs
models:
  model: {role: actor, path: %q}
data: {rollouts: %q, global_batch_size: %d, samples_per_prompt: 1, max_tokens_per_gpu: %d, max_seq_len: %d, temperature: %v}
train: {steps: %d}
policies: {precision: '"%s"', recompute: 'false'}
stages:
  setup:
    - {id: load, uses: load_hf, with: {model: model}}
    - {id: shard, uses: apply_fsdp2, with: {model: model}}
  step:
    - {id: pack, uses: pack}
    - {id: logprobs, uses: actor_logprob, with: {model: model, entropy: true, chunk_tokens: %d}}
`, abs, data, batch, budget, budget, temperature, steps, precision, chunk)
	s, err := spec.Parse("rlpipe-logprobs.yaml", []byte(src))
	if err != nil {
		return nil, err
	}
	dev, err := resolveGPU(gpuValue, s)
	if err != nil {
		return nil, err
	}
	j, err := stages.Resolve(s, dev, stages.CheckRunOwnData)
	if err != nil {
		return nil, err
	}
	return &loaded{spec: s, job: j}, nil
}

// logprobsOf returns the step's batch and the logprobs stage's outputs.
func logprobsOf(r *stages.Rank) (*stages.Batch, *stages.TokenValues, *stages.TokenValues, error) {
	b, lp, ent := r.Output("pack", "batch"), r.Output("logprobs", "logp"), r.Output("logprobs", "entropy")
	bb, ok1 := b.(*stages.Batch)
	l, ok2 := lp.(*stages.TokenValues)
	e, ok3 := ent.(*stages.TokenValues)
	if !ok1 || !ok2 || !ok3 {
		return nil, nil, nil, fmt.Errorf("logprobs: the step wrote no batch, log-probs or entropies")
	}
	return bb, l, e, nil
}

// mismatchSum accumulates the summary over the file's loss-masked tokens.
type mismatchSum struct {
	tokens, rolloutTokens, over int
	entropy, abs, k3, maxAbs    float64
}

// mismatchResult is the summary rlpipe logprobs prints.
type mismatchResult struct {
	Tokens        int     `json:"response_tokens"`
	RolloutTokens int     `json:"rollout_tokens"`
	MeanAbs       float64 `json:"mean_abs"`
	MaxAbs        float64 `json:"max_abs"`
	MeanK3        float64 `json:"mean_k3"`
	TISCap        float64 `json:"tis_cap"`
	OverCap       float64 `json:"over_cap_fraction"`
	MeanEntropy   float64 `json:"mean_entropy"`
}

func (s *mismatchSum) result(cap float64) mismatchResult {
	r := mismatchResult{Tokens: s.tokens, RolloutTokens: s.rolloutTokens, MaxAbs: s.maxAbs, TISCap: cap}
	if s.tokens > 0 {
		r.MeanEntropy = s.entropy / float64(s.tokens)
	}
	if s.rolloutTokens > 0 {
		n := float64(s.rolloutTokens)
		r.MeanAbs, r.MeanK3, r.OverCap = s.abs/n, s.k3/n, float64(s.over)/n
	}
	return r
}

// sampleLine is one line of rlpipe logprobs' output.
type sampleLine struct {
	Index           int       `json:"index"`
	Line            int       `json:"line"`
	LogP            []float32 `json:"logp"`
	Entropy         []float32 `json:"entropy"`
	RolloutLogProbs []float32 `json:"rollout_log_probs,omitempty"`
	MismatchAbs     *float64  `json:"mismatch_abs,omitempty"`
	MismatchK3      *float64  `json:"mismatch_k3,omitempty"`
}

// writeLogprobs writes a line per sample of the batch, in file order, and
// adds its loss-masked tokens to the summary.
func writeLogprobs(w io.Writer, b *stages.Batch, lp, ent *stages.TokenValues, cap float64, sum *mismatchSum) error {
	enc := json.NewEncoder(w)
	for k, s := range b.Samples {
		lo, hi := b.RespOff[k], b.RespOff[k+1]
		line := sampleLine{Index: s.Index, Line: s.Line, LogP: lp.Values[lo:hi], Entropy: ent.Values[lo:hi], RolloutLogProbs: s.RolloutLogProbs}
		var abs, k3, masked float64
		for t := range hi - lo {
			sum.tokens++
			sum.entropy += float64(line.Entropy[t])
			if s.LossMask[t] == 0 || s.RolloutLogProbs == nil {
				continue
			}
			x := float64(line.LogP[t]) - float64(s.RolloutLogProbs[t])
			masked++
			abs += math.Abs(x)
			k3 += math.Exp(-x) - 1 + x
			sum.rolloutTokens++
			sum.abs += math.Abs(x)
			sum.k3 += math.Exp(-x) - 1 + x
			sum.maxAbs = max(sum.maxAbs, math.Abs(x))
			if math.Exp(x) > cap {
				sum.over++
			}
		}
		if s.RolloutLogProbs != nil && masked > 0 {
			a, k := abs/masked, k3/masked
			line.MismatchAbs, line.MismatchK3 = &a, &k
		}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return nil
}
