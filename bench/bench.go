// Package bench measures rlpipe on the workload of the PyTorch FSDP2 peer
// (bench/peer_fsdp2.py): one GRPO step of S sequences of N tokens on one
// device, split into the ref_logprob stage (forward, chunked log-probs) and
// the train stage (forward, backward, grad clip, AdamW).
//
// Run builds the job in a work directory (a spec, a random-weights
// checkpoint, synthetic rollouts) and runs it through the path `rlpipe run`
// takes: spec.Load → stages.Resolve (graph, models, rollouts) → stages.Plan
// → stages.Run. Stages are timed by bench_mark stages (see
// marks.go). Nothing is written to a run record.
package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/nvml"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// Options configure one benchmark run.
type Options struct {
	Config  string // HF config.json, or a directory holding one
	Backend string // a name from BackendNames
	Device  int    // GPU index (NVML and the backend) of rank 0; rank r runs on Device+r
	Threads int    // CPU backend workers (0: all cores)
	DP      int    // data-parallel ranks, one GPU each (0: 1); the step's sequences are split over them

	Seqs            int           // sequences per step (one GRPO group)
	TokensPerSeq    int           // tokens per sequence, prompt included
	PromptTokens    int           // prompt tokens per sequence
	Chunk           int           // log-prob chunk (chunk_tokens of both stages)
	MaxTokensPerGPU int           // micro-batch budget; 0: Seqs·TokensPerSeq (one micro-batch)
	Precision       string        // "bf16" or "fp32"
	Recompute       bool          // activation recomputation of decoder layers
	RecomputeAuto   bool          // policies.recompute auto: the plan picks the layers (Recompute is then ignored)
	Offload         bool          // the actor's params and optimizer state in pinned host memory
	OffloadRef      bool          // the ref's params in pinned host memory
	NoReshard       bool          // the actor's apply_fsdp2 with reshard_after_forward false: units stay gathered from forward to backward
	HostBF16Copy    bool          // with Offload, the actor's apply_fsdp2 with host_bf16_copy: its gathers copy a bf16 copy of the masters the host AdamW writes
	GatherOnce      spec.AutoBool // the actor's apply_fsdp2 gather_once (written unless auto): the train stage gathers each unit once an update and keeps it through the update's micro-batches
	RefGatherOnce   spec.AutoBool // the ref's apply_fsdp2 gather_once (written unless auto): the log-prob stage gathers each unit once a step
	RefReplicate    spec.AutoBool // the ref's apply_fsdp2 replicate (written unless auto): every rank holds the whole ref and gathers none of it
	AccumulateGrads spec.AutoBool // the actor's apply_fsdp2 accumulate_grads_on_device (written unless auto; true needs Offload): an update's micro-batches sum their grads on the GPU, and only the sum crosses to the host
	NoGradClip      bool          // train.grad_clip 0 instead of 1.0: no clipping (with Offload, each unit's host AdamW starts as its grads reach the host)
	OverlapReduce   spec.AutoBool // the actor's apply_fsdp2 overlap_reduce (written unless auto): grads reduce-scattered on the gather stream
	Prefetch        int           // both models' apply_fsdp2 prefetch (units gathered ahead); 1, the stage's default, is not written
	KLCoef          float64       // low_var_kl coefficient
	EntropyCoef     float64

	Warmup, Steps int     // untimed and timed steps
	BudgetS       float64 // stop after the step that ends past this many seconds of steps (0: never); at least one timed step runs
	GPU           string  // GPU memory for the plan (preset or bytes); "": NVML, then host RAM
	WorkDir       string  // where the spec and rollouts go; "": a temporary directory, removed at the end
	CacheDir      string  // where random checkpoints are kept for reuse; "": inside the work directory
	Seed          int64
	PlanOnly      bool // resolve and plan the job, run nothing (no weights are written)
	Profile       bool // time every op (syncing the backend at each op boundary) and report the last step's breakdown
	// TimelineFile, when set, records every step's timeline without
	// syncing (stages.RunOptions.Timeline), reports the last step's in
	// Result.Timeline (rank 0's waits for the side stream and its busy
	// time) and writes its spans to this file as a Chrome trace
	// (chrome://tracing, Perfetto).
	TimelineFile string
	// SyncHostOptimizer finishes the offloaded actor's host AdamW within
	// its op instead of overlapping it with the next ops
	// (stages.RunOptions.SyncHostOptimizer); the results are the same.
	SyncHostOptimizer bool

	// Progress, when set, is called with the partial result after every
	// step and once at the end (to write it out as the run goes).
	Progress func(*Result)
	Log      io.Writer // progress lines; nil: none

	// meter, when set (tests), is the energy meter the marks read, on
	// any backend, instead of NVML's on a GPU backend.
	meter energyMeter
}

// DefaultOptions is the peer's workload: 8 × 2048 tokens (64 prompt + 1984
// response), one micro-batch of 16384 tokens, chunk 2048, bf16, recompute.
func DefaultOptions() Options {
	return Options{Backend: "cpu", Seqs: 8, TokensPerSeq: 2048, PromptTokens: 64, Chunk: 2048, Precision: "bf16",
		Recompute: true, KLCoef: 0.01, Warmup: 2, Steps: 5, Seed: 1, Prefetch: 1,
		GatherOnce: spec.BoolAuto, RefGatherOnce: spec.BoolAuto, RefReplicate: spec.BoolAuto, AccumulateGrads: spec.BoolAuto, OverlapReduce: spec.BoolAuto}
}

// Timing is one measured quantity over the timed steps.
type Timing struct {
	TimesS     []float64 `json:"times_s"`
	MedianS    float64   `json:"median_s"`
	MinS       float64   `json:"min_s"`
	MeanS      float64   `json:"mean_s"`
	Tokens     int64     `json:"tokens"`       // tokens per step (prompt + response)
	TokensPerS float64   `json:"tokens_per_s"` // Tokens / MedianS
}

// Energy is rank 0's GPU's energy over the timed steps: NVML's counter
// read at the last warm-up step's end and at the last timed step's end,
// outside every timed stage (a read takes milliseconds). The counter moves
// every 100 ms on an H200 (bench/energy_probe.py), so the figure is good to
// about 0.1 s of power over Seconds: run many steps.
type Energy struct {
	Joules        float64 `json:"joules"`
	Seconds       float64 `json:"seconds"` // the wall clock between the two reads
	Steps         int     `json:"steps"`
	JoulesPerStep float64 `json:"joules_per_step"`
	Watts         float64 `json:"watts"` // Joules / Seconds
}

// median returns the median of x (not empty).
func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func (t *Timing) add(d time.Duration, tokens int64) {
	t.TimesS = append(t.TimesS, d.Seconds())
	t.Tokens = tokens
	t.MedianS = median(t.TimesS)
	t.MinS = slices.Min(t.TimesS)
	var sum float64
	for _, x := range t.TimesS {
		sum += x
	}
	t.MeanS = sum / float64(len(t.TimesS))
	if t.MedianS > 0 {
		t.TokensPerS = float64(tokens) / t.MedianS
	}
}

// ModelInfo describes the benchmarked model.
type ModelInfo struct {
	Config       string `json:"config"`
	Family       string `json:"family"`
	Params       int64  `json:"params"`
	Layers       int    `json:"layers"`
	Hidden       int    `json:"hidden"`
	Intermediate int    `json:"intermediate"`
	Heads        int    `json:"heads"`
	KVHeads      int    `json:"kv_heads"`
	Vocab        int    `json:"vocab"`
	Tied         bool   `json:"tie_word_embeddings"`
}

// Workload is what one step computes.
type Workload struct {
	Seqs                  int    `json:"seqs"`
	TokensPerSeq          int    `json:"tokens_per_seq"`
	PromptTokens          int    `json:"prompt_tokens"`
	TokensPerStep         int64  `json:"tokens_per_step"`
	ResponseTokensPerStep int64  `json:"response_tokens_per_step"`
	Chunk                 int    `json:"chunk"` // 0: chunk_tokens auto
	MaxTokensPerGPU       int    `json:"max_tokens_per_gpu"`
	DP                    int    `json:"dp"`
	Precision             string `json:"precision"`
	Recompute             bool   `json:"recompute"`
	RecomputeAuto         bool   `json:"recompute_auto"`
	// Auto are the plan's choices for what the spec left to it.
	Auto         []plan.Choice `json:"auto,omitempty"`
	Offload      bool          `json:"offload"`
	OffloadRef   bool          `json:"offload_ref"`
	NoReshard    bool          `json:"no_reshard,omitempty"`
	HostBF16Copy bool          `json:"host_bf16_copy,omitempty"`
	NoGradClip   bool          `json:"no_grad_clip,omitempty"`
	// AccumulateGrads, GatherOnce and OverlapReduce are the options as
	// written: "auto" leaves them to the plan (Auto says what it chose).
	AccumulateGrads spec.AutoBool `json:"accumulate_grads_on_device"`
	GatherOnce      spec.AutoBool `json:"gather_once"`
	RefGatherOnce   spec.AutoBool `json:"ref_gather_once"`
	RefReplicate    spec.AutoBool `json:"ref_replicate"`
	OverlapReduce   spec.AutoBool `json:"overlap_reduce"`
	// Prefetch is Options.Prefetch.
	Prefetch int `json:"prefetch"`
	// SyncHostOptimizer: the host AdamW did not overlap the next ops.
	SyncHostOptimizer bool    `json:"sync_host_optimizer,omitempty"`
	Layout            string  `json:"layout"`
	KLCoef            float64 `json:"kl_coef"`
	EntropyCoef       float64 `json:"entropy_coef"`
}

// Memory is the plan's figures and what the run measured.
type Memory struct {
	PlanPeakBytes        int64            `json:"plan_peak_bytes"`
	PlanPeakStage        string           `json:"plan_peak_stage"`
	PlanDeviceArenaBytes int64            `json:"plan_device_arena_bytes"`
	PlanReserveBytes     int64            `json:"plan_reserve_bytes"`
	PlanDeviceTotalBytes int64            `json:"plan_device_total_bytes"`
	PlanHostPinnedBytes  int64            `json:"plan_host_pinned_bytes"`
	PlanStagePeakBytes   map[string]int64 `json:"plan_stage_peak_bytes"`
	ArenaHighWaterBytes  int64            `json:"arena_high_water_bytes"`
	ArenaHighWaterOp     string           `json:"arena_high_water_op,omitempty"`
	// NVML: the device memory NVML attributes to this process (often not
	// visible inside a container, whose PIDs differ from the host's), and the
	// device's used memory before the run and at its largest after a step.
	NVMLProcessBytes    int64  `json:"nvml_process_bytes,omitempty"`
	NVMLUsedBeforeBytes int64  `json:"nvml_used_before_bytes,omitempty"`
	NVMLUsedMaxBytes    int64  `json:"nvml_used_max_bytes,omitempty"`
	NVMLNote            string `json:"nvml_note,omitempty"`
	HostPeakRSSBytes    int64  `json:"host_peak_rss_bytes,omitempty"`
}

// Result is the outcome of a benchmark run, written as JSON by rlbench.
type Result struct {
	Impl      string    `json:"impl"`   // "rlpipe"
	Status    string    `json:"status"` // running (written after each step), ok, partial (--budget-s), planned (--plan-only), failed
	Error     string    `json:"error,omitempty"`
	Config    string    `json:"config"` // as given
	Backend   string    `json:"backend"`
	Device    string    `json:"device"`
	GPU       string    `json:"gpu"`
	GPUBytes  int64     `json:"gpu_bytes"`
	Model     ModelInfo `json:"model"`
	Workload  Workload  `json:"workload"`
	Warmup    int       `json:"warmup"`
	Steps     int       `json:"steps"` // timed steps requested
	StepsDone int       `json:"steps_done"`

	RefLogprob Timing `json:"ref_logprob"`
	Train      Timing `json:"train"`
	Step       Timing `json:"step"` // the whole step (pack, marks, ref, train), wall clock after the step's barrier

	Memory Memory `json:"memory"`

	SetupS      float64            `json:"setup_s"`      // load + shard, from the job's start to the first step
	SetupStages []stages.StageTime `json:"setup_stages"` // rank 0's setup stages, each synced at its end (the rest of setup_s is the backend, the arena and the first step's start)
	CheckpointS float64            `json:"checkpoint_s"` // generating the random checkpoint (0 when cached)
	// Energy is the timed steps' energy (nil without a meter); EnergyReadS
	// is the median time of one read of the counter, and EnergyNote says
	// why there is no meter on a GPU backend.
	Energy         *Energy            `json:"energy,omitempty"`
	EnergyReadS    float64            `json:"energy_read_s,omitempty"`
	EnergyNote     string             `json:"energy_note,omitempty"`
	StageS         map[string]float64 `json:"stage_s"`             // runtime.Report durations of the last step (no device sync: launch time on an async backend)
	ProfileS       map[string]float64 `json:"profile_s,omitempty"` // with Profile: the last step's seconds per kind of op
	Timeline       *TimelineSummary   `json:"timeline,omitempty"`  // with TimelineFile: rank 0's last step
	LastMetrics    map[string]float64 `json:"last_metrics"`        // loss metrics of the last step
	CheckpointPath string             `json:"checkpoint_path"`     // the random-weights checkpoint
	SpecYAML       string             `json:"spec_yaml"`           // the job
	Started        time.Time          `json:"started"`
	GoMaxProcs     int                `json:"gomaxprocs"`
}

// timelineEvery is the steps whose timeline a run records: all of them
// with a timeline file (the last one is written), none without.
func timelineEvery(file string) int {
	if file == "" {
		return 0
	}
	return 1
}

// errBudget stops a run whose time budget is spent.
var errBudget = errors.New("bench: time budget spent")

// Run runs the benchmark. The result is returned, filled as far as the run
// got, with or without an error.
func Run(ctx context.Context, o Options) (*Result, error) {
	res := &Result{Impl: "rlpipe", Status: "running", Backend: o.Backend, Warmup: o.Warmup, Steps: o.Steps,
		Started: time.Now().UTC(), GoMaxProcs: goruntime.GOMAXPROCS(0), LastMetrics: map[string]float64{}, StageS: map[string]float64{}}
	res.Config = o.Config
	res.Workload.Offload, res.Workload.OffloadRef, res.Workload.SyncHostOptimizer = o.Offload, o.OffloadRef, o.SyncHostOptimizer
	res.Workload.NoReshard = o.NoReshard
	res.Workload.OverlapReduce = o.OverlapReduce
	err := run(ctx, o, res)
	switch {
	case (err == nil || errors.Is(err, errBudget)) && o.PlanOnly:
		res.Status = "planned"
	case err == nil || errors.Is(err, errBudget):
		res.Status = "ok"
		if res.StepsDone-o.Warmup < o.Steps {
			res.Status = "partial"
			res.Error = fmt.Sprintf("time budget of %gs spent after %d timed steps of %d", o.BudgetS, max(0, res.StepsDone-o.Warmup), o.Steps)
		}
		err = nil
	default:
		res.Status = "failed"
		res.Error = err.Error()
	}
	if o.Progress != nil {
		o.Progress(res)
	}
	return res, err
}

func (o *Options) check() error {
	switch {
	case o.Config == "":
		return errors.New("no model config")
	case o.Seqs < 1 || o.TokensPerSeq < 2 || o.PromptTokens < 1 || o.PromptTokens >= o.TokensPerSeq:
		return fmt.Errorf("workload: need seqs >= 1 and 1 <= prompt tokens (%d) < tokens per seq (%d)", o.PromptTokens, o.TokensPerSeq)
	case o.Chunk < 0:
		return errors.New("chunk must be positive, or 0 for auto")
	case o.Steps < 1 || o.Warmup < 0:
		return errors.New("need steps >= 1 and warmup >= 0")
	case o.Precision != "bf16" && o.Precision != "fp32":
		return fmt.Errorf("precision %q: want bf16 or fp32", o.Precision)
	case o.DP < 0 || o.Seqs%max(o.DP, 1) != 0:
		return fmt.Errorf("dp %d must divide seqs %d", o.DP, o.Seqs)
	}
	return nil
}

func (o *Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "rlbench: "+format+"\n", args...)
	}
}

func run(ctx context.Context, o Options, res *Result) error {
	if err := o.check(); err != nil {
		return err
	}
	reg, err := lookupBackend(o.Backend)
	if err != nil {
		return err
	}
	cfgPath := o.Config
	if fi, err := os.Stat(cfgPath); err == nil && fi.IsDir() {
		cfgPath = filepath.Join(cfgPath, model.ConfigFileName)
	}
	cfg, err := model.LoadConfig(cfgPath)
	if err != nil {
		return err
	}
	res.Model = ModelInfo{Config: cfgPath, Family: string(cfg.Family), Params: cfg.NumParams(), Layers: cfg.NumLayers, Hidden: cfg.HiddenSize,
		Intermediate: cfg.IntermediateSize, Heads: cfg.NumHeads, KVHeads: cfg.NumKVHeads, Vocab: cfg.VocabSize, Tied: cfg.TieWordEmbeddings}
	if o.TokensPerSeq > cfg.MaxPositionEmbeddings && cfg.MaxPositionEmbeddings > 0 {
		return fmt.Errorf("tokens per seq %d exceed the model's max_position_embeddings %d", o.TokensPerSeq, cfg.MaxPositionEmbeddings)
	}
	dp := max(o.DP, 1)
	mtpg := o.MaxTokensPerGPU
	if mtpg <= 0 {
		mtpg = o.Seqs / dp * o.TokensPerSeq
	}
	res.Workload = Workload{Seqs: o.Seqs, TokensPerSeq: o.TokensPerSeq, PromptTokens: o.PromptTokens,
		TokensPerStep: int64(o.Seqs * o.TokensPerSeq), ResponseTokensPerStep: int64(o.Seqs * (o.TokensPerSeq - o.PromptTokens)),
		Chunk: o.Chunk, MaxTokensPerGPU: mtpg, DP: dp, Precision: o.Precision, Recompute: o.Recompute, RecomputeAuto: o.RecomputeAuto, Offload: o.Offload, OffloadRef: o.OffloadRef, SyncHostOptimizer: o.SyncHostOptimizer,
		NoReshard: o.NoReshard, HostBF16Copy: o.HostBF16Copy, NoGradClip: o.NoGradClip, AccumulateGrads: o.AccumulateGrads, GatherOnce: o.GatherOnce, RefGatherOnce: o.RefGatherOnce, RefReplicate: o.RefReplicate, OverlapReduce: o.OverlapReduce, Prefetch: o.Prefetch,
		Layout: "packed varlen (cu_seqlens), one micro-batch per max_tokens_per_gpu", KLCoef: o.KLCoef, EntropyCoef: o.EntropyCoef}

	work := o.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "rlbench-*"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	cache := o.CacheDir
	if cache == "" {
		cache = filepath.Join(work, "checkpoints")
	}
	t0 := time.Now()
	var ckpt string
	var made bool
	if o.PlanOnly {
		// No weights: a directory with only config.json plans like a checkpoint.
		ckpt = filepath.Join(work, "config-only")
		err = writeConfigOnly(ckpt, cfg)
	} else {
		ckpt, made, err = randomCheckpoint(cache, cfg, o.Seed)
	}
	if err != nil {
		return err
	}
	switch {
	case o.PlanOnly:
	case made:
		res.CheckpointS = time.Since(t0).Seconds()
		o.logf("random checkpoint %s written in %.1fs", ckpt, res.CheckpointS)
	default:
		o.logf("random checkpoint %s reused", ckpt)
	}
	res.CheckpointPath = ckpt

	samples, err := rollout.Toy(o.Seed, 1, o.Seqs, o.PromptTokens, o.TokensPerSeq-o.PromptTokens, cfg.VocabSize)
	if err != nil {
		return err
	}
	rolloutsPath := filepath.Join(work, "rollouts.jsonl")
	if err := rollout.Write(rolloutsPath, samples); err != nil {
		return err
	}
	runID := uuid.NewString()
	rec := newRecorder(runID)
	defer dropRecorder(runID)
	total := o.Warmup + o.Steps
	yaml := specYAML(o, ckpt, rolloutsPath, runID, total, mtpg)
	res.SpecYAML = yaml
	specPath := filepath.Join(work, "spec.yaml")
	if err := os.WriteFile(specPath, []byte(yaml), 0o644); err != nil {
		return err
	}

	// The path of `rlpipe run`.
	s, err := spec.Load(specPath)
	if err != nil {
		return err
	}
	dev, err := resolveGPU(o.GPU, o.Device, o.Backend)
	if err != nil {
		return err
	}
	res.GPU, res.GPUBytes = dev.Name, dev.Bytes
	check := stages.CheckRun
	if o.PlanOnly {
		check = stages.CheckPlan // the checkpoint has no weights
	}
	j, err := stages.Resolve(s, dev, check)
	if err != nil {
		return err
	}
	p, err := stages.Plan(j)
	if err != nil {
		return err
	}
	res.Workload.Auto = p.Auto
	m := &res.Memory
	m.PlanPeakBytes, m.PlanPeakStage = p.PeakBytes, p.PeakStage
	m.PlanDeviceArenaBytes, m.PlanReserveBytes, m.PlanDeviceTotalBytes, m.PlanHostPinnedBytes = p.DeviceArena, p.ReserveBytes(), p.DeviceTotal(), p.HostArena
	m.PlanStagePeakBytes = map[string]int64{}
	for _, b := range p.Budget {
		m.PlanStagePeakBytes[b.Stage] = b.PeakBytes
	}
	if !p.Fits(dev.Bytes) {
		return fmt.Errorf("the plan needs %d bytes per device (arena %d + reserves %d) and %s has %d", p.DeviceTotal(), p.DeviceArena, p.ReserveBytes(), dev.Name, dev.Bytes)
	}
	for _, c := range p.Auto {
		o.logf("plan: %s of %s: %s (%s)", c.Key, c.Subject, c.Value, c.Why)
	}
	if o.PlanOnly {
		o.logf("plan only: peak %.2f GiB (%s), arena %.2f GiB, device total %.2f GiB, host pinned %.2f GiB",
			gib(p.PeakBytes), p.PeakStage, gib(p.DeviceArena), gib(p.DeviceTotal()), gib(p.HostArena))
		return nil
	}
	o.logf("%s on %s: plan peak %.2f GiB, arena %.2f GiB, host pinned %.2f GiB; %d warm-up + %d timed steps",
		filepath.Base(filepath.Dir(cfgPath)), o.Backend, gib(p.PeakBytes), gib(p.DeviceArena), gib(p.HostArena), o.Warmup, o.Steps)

	gpuBackend := o.Backend != "cpu"
	if gpuBackend {
		if devs, err := nvml.VisibleDevices(); err == nil && o.Device < len(devs) {
			m.NVMLUsedBeforeBytes = devs[o.Device].UsedBytes
		}
	}
	switch {
	case o.meter != nil:
		rec.meter = o.meter
	case gpuBackend:
		if em, err := openEnergy(o.Device, res); err == nil {
			rec.meter = em
			defer em.Close()
		}
	}
	var backendName string
	opts := stages.RunOptions{Steps: total, Profile: o.Profile, TimelineEvery: timelineEvery(o.TimelineFile), SyncHostOptimizer: o.SyncHostOptimizer}
	if s.Mesh.DP > 1 {
		opts.Comms = reg.comms // nil: the loopback, on host memory
	}
	opts.Backend = func(rank int) (gpu.Backend, error) {
		threads := o.Threads
		if threads <= 0 {
			threads = max(1, goruntime.GOMAXPROCS(0)/s.Mesh.DP)
		}
		b, err := reg.new(o.Device+rank, threads)
		if err == nil && rank == 0 {
			backendName = b.Name()
		}
		return b, err
	}
	start := time.Now()
	var stepsStart time.Time
	opts.AfterStep = func(r *stages.Rank, sr stages.StepResult) error {
		if r.ID != 0 {
			return nil
		}
		res.Device = backendName
		if sr.Step == 1 {
			stepsStart = time.Now().Add(-sr.Wall)
			res.SetupS = stepsStart.Sub(start).Seconds()
			res.SetupStages = r.Setup
		}
		var tokens int64
		for _, sm := range j.Data.Step(sr.Step).Samples {
			tokens += int64(len(sm.Tokens))
		}
		ref, err1 := rec.between(r.ID, sr.Step, "start", "ref")
		train, err2 := rec.between(r.ID, sr.Step, "ref", "train")
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		timed := sr.Step > o.Warmup
		if timed {
			res.RefLogprob.add(ref, tokens)
			res.Train.add(train, tokens)
			res.Step.add(sr.Wall, tokens)
			if o.Warmup > 0 { // the first read ends the last warm-up step
				e, ok, err := rec.energy(o.Warmup, sr.Step)
				if err != nil {
					return err
				}
				if ok {
					res.Energy = &e
				}
			} else if rec.meter != nil {
				res.EnergyNote = "no energy without a warm-up step, whose end is its first read"
			}
		}
		res.StepsDone = sr.Step
		clear(res.StageS)
		if sr.Report != nil {
			for _, st := range sr.Report.Stages {
				res.StageS[st.ID] = st.Duration.Seconds()
			}
		}
		if sr.Timeline != nil {
			res.Timeline = summarizeTimeline(sr.Step, sr.Timeline)
			if err := writeTrace(o.TimelineFile, sr.Step, sr.Timeline); err != nil {
				return err
			}
		}
		if sr.Profile != nil {
			res.ProfileS = map[string]float64{}
			for k, v := range sr.Profile {
				res.ProfileS[k] = v.Seconds()
			}
		}
		clear(res.LastMetrics)
		for k, v := range sr.Stats.Values {
			res.LastMetrics[k] = v
		}
		res.LastMetrics["grad_norm"] = sr.Stats.GradNorm
		res.LastMetrics["lr"] = sr.Stats.LR
		if hw, op := r.Arena.HighWater(); hw > 0 {
			m.ArenaHighWaterBytes = hw
			if op >= 0 && op < len(p.Ops) {
				m.ArenaHighWaterOp = p.Ops[op].Stage + ": " + p.Ops[op].Name
			}
		}
		if gpuBackend {
			measureNVML(m, o.Device)
		}
		m.HostPeakRSSBytes = peakRSS()
		o.logf("step %d/%d%s: ref_logprob %.3fs, train %.3fs, step %.3fs (%.0f tok/s)", sr.Step, total,
			map[bool]string{true: "", false: " (warm-up)"}[timed], ref.Seconds(), train.Seconds(), sr.Wall.Seconds(), float64(tokens)/sr.Wall.Seconds())
		if o.Progress != nil {
			o.Progress(res)
		}
		if timed && o.BudgetS > 0 && sr.Step < total && time.Since(stepsStart).Seconds() > o.BudgetS {
			return errBudget
		}
		return nil
	}
	_, err = stages.Run(ctx, j, p, opts)
	if res.Device == "" {
		res.Device = backendName
	}
	return err
}

// specYAML is the benchmark job: actor and a frozen ref copy (low_var_kl),
// pack, ref_logprob, train, with marks between the step stages.
func specYAML(o Options, ckpt, rollouts, runID string, steps, mtpg int) string {
	var b strings.Builder
	q := strconv.Quote
	fmt.Fprintf(&b, "# Written by rlbench (bench/).\nversion: 1\nname: rlbench\n")
	fmt.Fprintf(&b, "models:\n  actor:\n    path: %s\n  ref:\n    copy_of: actor\n", q(ckpt))
	fmt.Fprintf(&b, "mesh:\n  gpus_per_node: %d\n", max(o.DP, 1))
	fmt.Fprintf(&b, "data:\n  rollouts: %s\n  global_batch_size: %d\n  samples_per_prompt: %d\n  max_tokens_per_gpu: %d\n  max_seq_len: %d\n",
		q(rollouts), o.Seqs, o.Seqs, mtpg, o.TokensPerSeq)
	clip := "1.0"
	if o.NoGradClip {
		clip = "0"
	}
	fmt.Fprintf(&b, "train:\n  steps: %d\n  lr: 1e-6\n  betas: [0.9, 0.95]\n  grad_clip: %s\n", steps, clip)
	rc := fmt.Sprintf("'%t'", o.Recompute)
	if o.RecomputeAuto {
		rc = "auto"
	}
	fmt.Fprintf(&b, "policies:\n  precision: '%s'\n  recompute: %s\n", q(o.Precision), rc)
	chunk := "auto"
	if o.Chunk > 0 {
		chunk = strconv.Itoa(o.Chunk)
	}
	var off []string
	if o.Offload {
		off = append(off, `model.role == "actor"`)
	}
	if o.OffloadRef {
		off = append(off, `model.name == "ref"`)
	}
	if len(off) > 0 {
		fmt.Fprintf(&b, "  offload: '%s'\n", strings.Join(off, " || "))
	}
	if o.Offload {
		fmt.Fprintf(&b, "  offload_optimizer: 'model.role == \"actor\"'\n")
	}
	reshard := ""
	if o.NoReshard {
		reshard = ", reshard_after_forward: false"
	}
	if !o.OverlapReduce.IsAuto() {
		reshard += ", overlap_reduce: " + o.OverlapReduce.String()
	}
	if o.HostBF16Copy {
		reshard += ", host_bf16_copy: true"
	}
	if !o.AccumulateGrads.IsAuto() {
		reshard += ", accumulate_grads_on_device: " + o.AccumulateGrads.String()
	}
	if !o.GatherOnce.IsAuto() {
		reshard += ", gather_once: " + o.GatherOnce.String()
	}
	ahead := ""
	if o.Prefetch != 1 {
		ahead = fmt.Sprintf(", prefetch: %d", o.Prefetch)
	}
	refOnce := ""
	if !o.RefGatherOnce.IsAuto() {
		refOnce = ", gather_once: " + o.RefGatherOnce.String()
	}
	if !o.RefReplicate.IsAuto() {
		refOnce += ", replicate: " + o.RefReplicate.String()
	}
	fmt.Fprintf(&b, `stages:
  setup:
    - id: load
      uses: load_hf
      with: {model: actor}
    - id: shard_actor
      uses: apply_fsdp2
      needs: load
      with: {model: actor%[6]s%[7]s}
    - id: shard_ref
      uses: apply_fsdp2
      needs: load
      with: {model: ref%[7]s%[8]s}
  step:
    - id: pack
      uses: pack
    - id: mark_start
      uses: %[1]s
      needs: pack
      with: {run: %[2]s, mark: start}
    - id: ref_logp
      uses: ref_logprob
      needs: mark_start
      with: {model: ref, chunk_tokens: %[3]s}
    - id: mark_ref
      uses: %[1]s
      needs: ref_logp
      with: {run: %[2]s, mark: ref}
    - id: train
      uses: train
      needs: [pack, ref_logp, mark_ref]
      with:
        model: actor
        chunk_tokens: %[3]s
        eps_clip: 0.2
        kl: low_var_kl
        kl_coef: %[4]g
        entropy_coef: %[5]g
    - id: mark_train
      uses: %[1]s
      needs: train
      with: {run: %[2]s, mark: train}
`, markKind, q(runID), chunk, o.KLCoef, o.EntropyCoef, reshard, ahead, refOnce)
	return b.String()
}

// randomCheckpoint returns a checkpoint directory of random weights for cfg
// (model.RandomTensors, std 0.02, in the config's dtype) under cache, written
// unless a previous run left it there. made says whether it was written now.
func randomCheckpoint(cache string, cfg *model.Config, seed int64) (dir string, made bool, err error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00seed=%d std=0.02\x00", cfg.Raw, seed)
	name := strings.TrimSuffix(filepath.Base(filepath.Dir(cfg.Source)), string(filepath.Separator))
	if name == "" || name == "." {
		name = "model"
	}
	dir = filepath.Join(cache, name+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	if _, err := os.Stat(filepath.Join(dir, model.SingleFileName)); err == nil {
		return dir, false, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.MkdirTemp(cache, ".tmp-"+name+"-*")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp)
	if err := model.WriteCheckpoint(tmp, cfg, model.RandomTensors(cfg, seed, 0.02)); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, e := os.Stat(filepath.Join(dir, model.SingleFileName)); e == nil {
			return dir, false, nil // another run wrote it meanwhile
		}
		return "", false, err
	}
	return dir, true, nil
}

func writeConfigOnly(dir string, cfg *model.Config) error {
	b, err := cfg.MarshalHF()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, model.ConfigFileName), b, 0o644)
}

// resolveGPU picks the GPU memory figure for the plan as `rlpipe run` does:
// the flag, then NVML, then (for the CPU backend) host RAM.
func resolveGPU(flagValue string, device int, backend string) (stages.GPU, error) {
	if flagValue != "" {
		name, bytes, err := gpu.ParseGPU(flagValue)
		if err != nil {
			return stages.GPU{}, fmt.Errorf("--gpu: %w", err)
		}
		return stages.GPU{Name: name, Bytes: bytes, Source: "--gpu"}, nil
	}
	if backend != "cpu" {
		devs, err := nvml.VisibleDevices()
		if err == nil && device < len(devs) {
			return stages.GPU{Name: devs[device].Name, Bytes: devs[device].MemoryBytes, Source: "NVML"}, nil
		}
		if err == nil {
			err = fmt.Errorf("nvml: no GPU %d", device)
		}
		return stages.GPU{}, fmt.Errorf("GPU memory for backend %s: %w (pass --gpu)", backend, err)
	}
	mem, err := hostMemory()
	if err != nil {
		return stages.GPU{}, fmt.Errorf("host memory: %w (pass --gpu)", err)
	}
	return stages.GPU{Name: "cpu", Bytes: mem, Source: "host RAM (CPU backend)"}, nil
}

// openEnergy opens the energy meter of CUDA device ordinal for the marks
// and times a read of it (res.EnergyReadS); where there is none, it says
// why in res.EnergyNote.
func openEnergy(device int, res *Result) (*nvml.EnergyMeter, error) {
	em, err := nvml.OpenEnergy(device)
	if err != nil {
		res.EnergyNote = err.Error()
		return nil, err
	}
	reads := make([]float64, 9)
	for i := range reads {
		t := time.Now()
		if _, err := em.Joules(); err != nil {
			em.Close()
			res.EnergyNote = err.Error()
			return nil, err
		}
		reads[i] = time.Since(t).Seconds()
	}
	res.EnergyReadS = median(reads)
	return em, nil
}

func measureNVML(m *Memory, device int) {
	var notes []string
	if b, err := nvml.ProcessMemoryOf(device); err == nil {
		m.NVMLProcessBytes = max(m.NVMLProcessBytes, b)
	} else {
		notes = append(notes, "process: "+err.Error())
	}
	if devs, err := nvml.VisibleDevices(); err == nil && device < len(devs) {
		m.NVMLUsedMaxBytes = max(m.NVMLUsedMaxBytes, devs[device].UsedBytes)
	} else if err != nil {
		notes = append(notes, "devices: "+err.Error())
	}
	m.NVMLNote = strings.Join(notes, "; ")
}

// hostMemory returns MemTotal of /proc/meminfo.
func hostMemory() (int64, error) {
	return procField("/proc/meminfo", "MemTotal:")
}

// peakRSS returns VmHWM of this process (0 when unknown).
func peakRSS() int64 {
	v, _ := procField("/proc/self/status", "VmHWM:")
	return v
}

func procField(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no %s", path, key)
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }
