package stages

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines"
	"github.com/rlpipe/rlpipe/stages/reward"
	"github.com/rlpipe/rlpipe/stages/rollout"
	"go.yaml.in/yaml/v3"
)

func init() {
	Register(Kind{Name: "generate", Phase: spec.Step,
		Doc: "sample samples_per_prompt responses to the step's prompts from an engine (local, sglang, openai) and score them with a reward",
		New: func() Stage {
			return &Generate{Model: "actor", TopP: 1, Concurrency: 64, TimeoutS: 600, Retries: 3, ChunkTokens: DefaultChunkTokens}
		}})
}

var _ Stage = (*Generate)(nil)

// The engines a generate stage can sample from.
const (
	EngineLocal  = "local"  // rlpipe's own forward: tiny models, tests, the embedded default
	EngineSGLang = "sglang" // SGLang's native /generate
	EngineOpenAI = "openai" // the OpenAI-compatible /v1/completions (vLLM and others)
)

// Generate produces the step's rollout batch: for each of the step's
// prompts it samples data.samples_per_prompt responses at the rollout
// temperature (data.temperature) from an engine, with the engine's
// per-token log-probs, and scores them with a reward. Its output
// "rollouts" feeds pack, as the rollout file does otherwise.
type Generate struct {
	Engine string `yaml:"engine"`
	// URL is the engine's base URL (sglang, openai).
	URL string `yaml:"url"`
	// ServedModel is the model name the openai engine serves.
	ServedModel string `yaml:"served_model"`
	// Model is the model the local engine samples from (its weights as
	// the step starts).
	Model        string  `yaml:"model"`
	MaxNewTokens int     `yaml:"max_new_tokens"`
	TopP         float64 `yaml:"top_p"`
	TopK         int     `yaml:"top_k"` // 0: off
	// StopTokenIDs end a response (the token is kept, as engines do),
	// besides the model's eos_token_id unless IgnoreEOS.
	StopTokenIDs []int `yaml:"stop_token_ids"`
	IgnoreEOS    bool  `yaml:"ignore_eos"`
	// Concurrency, TimeoutS and Retries bound the HTTP engines' requests.
	Concurrency int     `yaml:"concurrency"`
	TimeoutS    float64 `yaml:"timeout_s"`
	Retries     int     `yaml:"retries"`
	// ChunkTokens is the local engine's rows of logits at once.
	ChunkTokens int           `yaml:"chunk_tokens"`
	Reward      reward.Config `yaml:"reward"`
	// Prompts names the stage that feeds the prompts input, where more
	// than one could (the prompts file feeds it otherwise).
	Prompts string `yaml:"prompts"`

	scorer reward.Scorer
	client engines.Client
}

// Ports declares the prompts input, the sampling model's weights for the
// local engine (as they are when the step starts), and the rollouts
// output.
func (s *Generate) Ports(*spec.Spec) Ports {
	p := Ports{
		In:  []Input{{Port: Port{Name: "prompts", Type: TypePrompts}}},
		Out: []Port{{Name: "rollouts", Type: TypeRollouts}},
	}
	if s.Engine == EngineLocal {
		p.In = append(p.In, Input{Port: Port{Name: "weights", Type: TypeWeights(s.Model)}, AtPhaseStart: true})
	}
	return p
}

// Validate checks the engine, the sampling parameters against the data
// (the longest prompt and max_new_tokens fit data.max_seq_len) and the
// reward, which it builds.
func (s *Generate) Validate(vc *ValidateContext) spec.Errors {
	var errs spec.Errors
	sp := vc.Job.Spec
	switch s.Engine {
	case EngineLocal:
		_, e := vc.model("model", s.Model)
		errs = append(errs, e...)
		if s.ChunkTokens < 1 || s.ChunkTokens > maxTokensBound {
			errs = append(errs, vc.Errorf("chunk_tokens", "chunk_tokens must be in [1, %d], got %d", maxTokensBound, s.ChunkTokens))
		}
		if cp := sp.Mesh.CPSize(); cp > 1 {
			errs = append(errs, vc.Errorf("engine", "the local engine does not split sequences over mesh.cp (%d); generate with sglang or openai, or set cp to 1", cp))
		}
	case EngineSGLang, EngineOpenAI:
		if u, err := url.Parse(s.URL); s.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, vc.Errorf("url", "the %s engine needs url: an http or https base URL such as http://127.0.0.1:30000, got %q", s.Engine, s.URL))
			break
		}
		retries := s.Retries
		if retries == 0 {
			retries = -1 // the client reads 0 as its default; the recipe said none
		}
		c, err := newEngineClient(s.Engine, s.URL, s.ServedModel, engines.Options{Concurrency: s.Concurrency, Retries: retries,
			Timeout: time.Duration(s.TimeoutS * float64(time.Second))})
		if err != nil {
			errs = append(errs, vc.Errorf("url", "%v", err))
		}
		s.client = c
	case "":
		errs = append(errs, vc.Errorf("engine", "engine is required: %s, %s or %s", EngineLocal, EngineSGLang, EngineOpenAI))
	default:
		errs = append(errs, vc.Errorf("engine", "unknown engine %q (%s, %s or %s)", s.Engine, EngineLocal, EngineSGLang, EngineOpenAI))
	}
	if s.Engine != EngineOpenAI && s.ServedModel != "" {
		errs = append(errs, vc.Errorf("served_model", "served_model is for the openai engine"))
	}
	if s.Engine != EngineLocal && s.Engine != "" && withValue(vc.Stage, "model") != nil {
		errs = append(errs, vc.Errorf("model", "model names the weights the local engine samples from; the %s engine has its own", s.Engine))
	}
	switch {
	case s.MaxNewTokens < 1:
		errs = append(errs, vc.Errorf("max_new_tokens", "max_new_tokens must be at least 1, got %d", s.MaxNewTokens))
	case s.MaxNewTokens >= sp.Data.MaxSeqLen && sp.Data.MaxSeqLen > 0:
		errs = append(errs, vc.Errorf("max_new_tokens", "max_new_tokens %d leaves no room for a prompt in data.max_seq_len %d", s.MaxNewTokens, sp.Data.MaxSeqLen))
	case vc.Job.Prompts != nil:
		longest := 0
		for _, p := range vc.Job.Prompts.Prompts {
			longest = max(longest, len(p.Tokens))
		}
		if longest+s.MaxNewTokens > sp.Data.MaxSeqLen {
			errs = append(errs, vc.Errorf("max_new_tokens", "the longest prompt (%d tokens) and max_new_tokens %d exceed data.max_seq_len %d", longest, s.MaxNewTokens, sp.Data.MaxSeqLen))
		}
		if s.Engine == EngineLocal && longest+s.MaxNewTokens+1 > sp.Data.MaxTokensPerGPU {
			errs = append(errs, vc.Errorf("max_new_tokens", "the local engine packs each sequence with one more token: the longest prompt (%d tokens) and max_new_tokens %d need data.max_tokens_per_gpu ≥ %d", longest, s.MaxNewTokens, longest+s.MaxNewTokens+1))
		}
	}
	if !(s.TopP > 0 && s.TopP <= 1) {
		errs = append(errs, vc.Errorf("top_p", "top_p must be in (0, 1], got %v", s.TopP))
	}
	if s.TopK < 0 {
		errs = append(errs, vc.Errorf("top_k", "top_k must be ≥ 0 (0: off), got %d", s.TopK))
	}
	for _, id := range s.StopTokenIDs {
		if id < 0 || id > rollout.MaxTokenID {
			errs = append(errs, vc.Errorf("stop_token_ids", "stop token id %d is outside [0, %d]", id, rollout.MaxTokenID))
		}
	}
	if s.Concurrency < 1 || s.Concurrency > 1<<16 {
		errs = append(errs, vc.Errorf("concurrency", "concurrency must be in [1, 65536], got %d", s.Concurrency))
	}
	if !(s.TimeoutS > 0) || math.IsInf(s.TimeoutS, 0) {
		errs = append(errs, vc.Errorf("timeout_s", "timeout_s must be positive, got %v", s.TimeoutS))
	}
	if s.Retries < 0 || s.Retries > 100 {
		errs = append(errs, vc.Errorf("retries", "retries must be in [0, 100], got %d", s.Retries))
	}
	scorer, err := reward.New(s.Reward)
	if err != nil {
		errs = append(errs, rewardError(vc, err))
	}
	s.scorer = scorer
	return errs
}

// rewardError positions a reward's error: an expression's at its
// character, a key's at its value, others at the reward block.
func rewardError(vc *ValidateContext, err error) *spec.Error {
	value := func(key string) *yaml.Node {
		rb := withValue(vc.Stage, "reward")
		if rb == nil || rb.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(rb.Content); i += 2 {
			if rb.Content[i].Value == key {
				return rb.Content[i+1]
			}
		}
		return nil
	}
	file := vc.Stage.UsesPos.File
	var ee *reward.ExprError
	if errors.As(err, &ee) {
		if n := value("expr"); n != nil {
			return spec.Errorf(spec.ValuePos(file, n, ee.Offset), "stage %q: reward.expr: %s", vc.Stage.ID, ee.Msg)
		}
	}
	var ce *reward.ConfigError
	if errors.As(err, &ce) && ce.Field != "" {
		if n := value(ce.Field); n != nil {
			return spec.Errorf(spec.NodePos(file, n), "stage %q: %v", vc.Stage.ID, err)
		}
	}
	return vc.Errorf("reward", "%v", err)
}

// generated is one response as an engine returned it.
type generated struct {
	tokens   []int32
	logprobs []float32
	finish   string // "stop" or "length"
}

// slot is the float32 layout of one sample in the shared buffer: length,
// finish (1 = stop), then the tokens and the log-probs.
func (s *Generate) slot() int { return 2 + 2*s.MaxNewTokens }

// Plan declares the shared buffers and, for the local engine, one
// micro-batch of the sampling forward.
func (s *Generate) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run generates the step's rollouts.
func (s *Generate) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

// program samples the responses (the local engine on every rank, each its
// share; an HTTP engine on rank 0), shares them with every rank through one
// buffer summed over the ranks (each value is written by one rank, the
// others hold 0), scores them on rank 0 and shares the rewards the same
// way, and writes the rollout batch.
func (s *Generate) program(p *prog) {
	pb, _ := p.in("prompts").(*PromptBatch)
	var st *ShardState
	if s.Engine == EngineLocal {
		st, _ = p.in("weights").(*ShardState)
	}
	if p.err != nil {
		return
	}
	sp := p.job.Spec
	B, n := sp.Data.RolloutSamples(), sp.Data.SamplesPerPrompt
	p.op("clear generated")
	shared := p.buf(p.stage.ID+".generated", plan.IO, gpu.F32, B*s.slot())
	rewards := p.buf(p.stage.ID+".rewards", plan.IO, gpu.F32, B)
	t0 := time.Now()
	mine := map[int]*generated{} // this rank's samples, by batch index
	if s.Engine == EngineLocal {
		s.sampleLocal(p, st, pb, mine)
	} else {
		p.op("generate (engine)")
		p.do(func() error {
			if p.r.ID != 0 {
				return nil
			}
			return s.sampleEngine(p, pb, mine)
		})
	}
	p.op("share generated")
	until(p.now(), shared, rewards)
	rb := &RolloutBatch{}
	var finished []string
	p.do(func() error {
		if len(pb.Prompts)*n != B {
			return fmt.Errorf("%d prompts × samples_per_prompt %d is not the rollout batch of %d samples", len(pb.Prompts), n, B)
		}
		host := make([]float32, B*s.slot())
		for k, g := range mine {
			s.put(host[k*s.slot():(k+1)*s.slot()], g)
		}
		all, err := s.share(p, shared.t, host)
		if err != nil {
			return err
		}
		rb.Samples = make([]rollout.Sample, B)
		finished = make([]string, B)
		for k := range B {
			g := s.get(all[k*s.slot() : (k+1)*s.slot()])
			pr := pb.Prompts[k/n]
			sm := &rb.Samples[k]
			sm.Tokens = append(slices.Clone(pr.Tokens), g.tokens...)
			sm.ResponseLength = len(g.tokens)
			sm.LossMask = ones(len(g.tokens))
			sm.RolloutLogProbs = g.logprobs
			sm.Group = (p.r.Step-1)*len(pb.Prompts) + k/n
			sm.Index = k
			finished[k] = g.finish
			if len(g.tokens) == 0 {
				return fmt.Errorf("sample %d (prompt %d, line %d): the engine returned an empty response", k, pr.Index, pr.Line)
			}
		}
		return nil
	})
	p.op("reward (host)")
	p.do(func() error {
		host := make([]float32, B)
		if p.r.ID == 0 {
			in := make([]reward.Sample, B)
			for k, sm := range rb.Samples {
				pr := pb.Prompts[k/n]
				in[k] = reward.Sample{Index: k, Group: sm.Group, Prompt: pr.Tokens, Response: sm.Response(), Finish: finished[k], Labels: pr.Labels}
			}
			scores, err := s.scorer.Score(p.ctx, in)
			if err != nil {
				return fmt.Errorf("reward: %w", err)
			}
			if len(scores) != B {
				return fmt.Errorf("reward: %d rewards for %d samples", len(scores), B)
			}
			for k, x := range scores {
				host[k] = float32(x)
			}
		}
		all, err := s.share(p, rewards.t, host)
		if err != nil {
			return err
		}
		groups := make([]int, B)
		rs := make([]float64, B)
		var resp, truncated float64
		for k := range rb.Samples {
			rb.Samples[k].Reward = float64(all[k])
			rs[k], groups[k] = float64(all[k]), rb.Samples[k].Group
			resp += float64(rb.Samples[k].ResponseLength)
			if finished[k] == "length" {
				truncated++
			}
		}
		st := reward.Summarize(rs, groups)
		p.report("reward_mean", st.Mean)
		p.report("reward_std", st.Std)
		p.report("reward_zero_var_groups", st.ZeroVarGroups)
		p.report("response_length_mean", resp/float64(B))
		p.report("response_truncated", truncated/float64(B))
		p.report("generate_s", time.Since(t0).Seconds())
		return nil
	})
	p.out("rollouts", rb)
}

// share uploads host into t, sums t over the ranks and returns the sum.
func (s *Generate) share(p *prog, t gpu.Tensor, host []float32) ([]float32, error) {
	r := p.r
	v, err := t.Flat(0, len(host))
	if err != nil {
		return nil, err
	}
	if err := r.B.Upload(v, host); err != nil {
		return nil, err
	}
	if r.Comm.Size() > 1 {
		if err := r.Comm.AllReduce(p.ctx, v, nccl.Sum); err != nil {
			return nil, fmt.Errorf("all-reduce: %w", err)
		}
	}
	out := make([]float32, len(host))
	return out, r.B.Download(out, v)
}

// put writes g into its slot; get reads it back. Token ids travel as
// float32, exact up to 2^24 (vocabularies are far smaller).
func (s *Generate) put(slot []float32, g *generated) {
	slot[0] = float32(len(g.tokens))
	if g.finish == "stop" {
		slot[1] = 1
	}
	for i, t := range g.tokens {
		slot[2+i] = float32(t)
		slot[2+s.MaxNewTokens+i] = g.logprobs[i]
	}
}

func (s *Generate) get(slot []float32) *generated {
	n := int(slot[0])
	g := &generated{finish: "length", tokens: make([]int32, n), logprobs: make([]float32, n)}
	if slot[1] != 0 {
		g.finish = "stop"
	}
	for i := range n {
		g.tokens[i] = int32(slot[2+i])
		g.logprobs[i] = slot[2+s.MaxNewTokens+i]
	}
	return g
}

func ones(n int) []float32 {
	m := make([]float32, n)
	for i := range m {
		m[i] = 1
	}
	return m
}

// stopSet is the token ids that end a response.
func (s *Generate) stopSet(j *Job) map[int32]bool {
	stop := map[int32]bool{}
	for _, id := range s.StopTokenIDs {
		stop[int32(id)] = true
	}
	if m := j.Models[s.Model]; !s.IgnoreEOS && m != nil && m.Config != nil {
		for _, id := range m.Config.EOSTokenIDs() {
			stop[int32(id)] = true
		}
	}
	return stop
}

// sampleEngine asks the HTTP engine for every sample of the step (rank 0).
func (s *Generate) sampleEngine(p *prog, pb *PromptBatch, mine map[int]*generated) error {
	sp := p.job.Spec
	n := sp.Data.SamplesPerPrompt
	prompts := make([][]int32, len(pb.Prompts))
	for i, pr := range pb.Prompts {
		prompts[i] = pr.Tokens
	}
	stop := s.StopTokenIDs
	if !s.IgnoreEOS {
		for id := range s.stopSet(p.job) {
			if !slices.Contains(stop, int(id)) {
				stop = append(stop, int(id))
			}
		}
		slices.Sort(stop)
	}
	params := engines.Params{MaxNewTokens: s.MaxNewTokens, Temperature: sp.Data.Temperature, TopP: s.TopP, TopK: s.TopK,
		StopTokenIDs: stop, IgnoreEOS: s.IgnoreEOS, Seed: engineSeed(sp.Train.Seed, p.r.Step)}
	out, err := s.client.Generate(p.ctx, prompts, n, params)
	if err != nil {
		return err
	}
	for i := range prompts {
		if len(out[i]) != n {
			return fmt.Errorf("the engine answered prompt %d with %d responses, want %d", i, len(out[i]), n)
		}
		for j, r := range out[i] {
			k := i*n + j
			if len(r.Tokens) > s.MaxNewTokens || len(r.LogProbs) != len(r.Tokens) {
				return fmt.Errorf("sample %d: the engine returned %d tokens and %d log-probs for max_new_tokens %d", k, len(r.Tokens), len(r.LogProbs), s.MaxNewTokens)
			}
			for t, id := range r.Tokens {
				for _, m := range p.job.loadedModels() {
					if id < 0 || int(id) >= m.Config.VocabSize {
						return fmt.Errorf("sample %d token %d: the engine returned id %d, outside the vocabulary of %d of model %q: does it serve the recipe's model?", k, t, id, m.Config.VocabSize, m.Name())
					}
				}
				if lp := float64(r.LogProbs[t]); math.IsNaN(lp) || math.IsInf(lp, 0) || lp > 1e-3 {
					return fmt.Errorf("sample %d token %d: the engine returned log-prob %v, not a finite log-probability", k, t, lp)
				}
			}
			mine[k] = &generated{tokens: r.Tokens, logprobs: r.LogProbs, finish: r.Finish}
		}
	}
	return nil
}

// engineSeed is the seed of a step's engine requests, drawn from the run's
// seed and the step: in [1, 2^30], so that request k's seed+k is a positive
// int32 and never the 0 the client reads as "unseeded".
func engineSeed(seed int64, step int) int64 {
	return 1 + int64(rollout.NewRand(seed, uint64(step), 0x67656e).Float64()*(1<<30))
}
