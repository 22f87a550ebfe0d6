package stages

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/rl"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// stepRun is what a run of the real step shows a test: every micro-batch's
// loss, the step results of rank 0, and the log-prob stages' outputs.
type stepRun struct {
	events []lossEvent
	steps  []StepResult
	old    map[int]*TokenValues // by step
	ref    map[int]*TokenValues
	batch  map[int]*Batch
	job    *Job
}

// runStep runs s (with the job's train stage observed) on dp loopback ranks.
func runStep(t *testing.T, s *spec.Spec, dp int) *stepRun {
	t.Helper()
	s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
	out := &stepRun{old: map[int]*TokenValues{}, ref: map[int]*TokenValues{}, batch: map[int]*Batch{}}
	var mu sync.Mutex
	runParsed(t, s, nil, func(j *Job) {
		out.job = j
		j.Stages["train"].(*Train).observe = func(e lossEvent) {
			mu.Lock()
			out.events = append(out.events, e)
			mu.Unlock()
		}
	}, RunOptions{AfterStep: func(r *Rank, sr StepResult) error {
		if r.ID == 0 {
			out.steps = append(out.steps, sr)
			out.old[sr.Step] = r.values["old_logp.logp"].(*TokenValues)
			out.ref[sr.Step] = r.values["ref_logp.logp"].(*TokenValues)
			out.batch[sr.Step] = r.values["pack.batch"].(*Batch)
		}
		return nil
	}})
	return out
}

// byUpdate groups the events by update index.
func (r *stepRun) byUpdate() map[int][]lossEvent {
	m := map[int][]lossEvent{}
	for _, e := range r.events {
		m[e.up.Index] = append(m[e.up.Index], e)
	}
	return m
}

// tinyVariant is the embedded default with a rollout batch of 16 prompt
// groups (128 samples, two mini-batches of 64), no LR warm-up (so the
// first update changes the weights) and the given extra edits.
func tinyVariant(t *testing.T, edits ...string) *spec.Spec {
	base := []string{
		"  global_batch_size: 64\n", "  global_batch_size: 64\n  rollout_batch_size: 16\n",
		"  warmup_steps: 2\n", "",
		"  steps: 12\n", "  steps: 2\n",
	}
	return variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), append(base, edits...)...)
}

// TestRealStep runs two steps of two mini-batch updates each, on 1 and 2
// ranks, and checks the step against what RL-MATH.md says: the ratio is
// exactly 1 in a step's first update and not in its second; l_old and
// l_ref are the log-prob stages' values of the step's start; the
// advantages are the group-normalised rewards of the rollout batch; every
// micro-batch's loss, metrics and dL/dl match a float64 reference; the
// logged update metrics are the sums over micro-batches and ranks; the two
// mini-batches cover the rollout batch once; and the LR schedule counts
// updates.
func TestRealStep(t *testing.T) {
	for _, dp := range []int{1, 2} {
		r := runStep(t, tinyVariant(t), dp)
		sp := r.job.Spec
		if got := sp.UpdatesPerStep(); got != 2 {
			t.Fatalf("updates per step %d, want 2", got)
		}
		ups := r.byUpdate()
		if len(ups) != 4 {
			t.Fatalf("dp %d: %d updates over 2 steps, want 4", dp, len(ups))
		}
		tr := r.job.Stages["train"].(*Train)
		sched := schedule(sp.Train)
		for _, sr := range r.steps {
			if len(sr.Stats.Updates) != 2 {
				t.Fatalf("dp %d step %d: %d updates recorded, want 2", dp, sr.Step, len(sr.Stats.Updates))
			}
			b := r.batch[sr.Step]
			adv := refAdvantages(b)
			covered := map[int]int{}
			for k, us := range sr.Stats.Updates {
				idx := (sr.Step-1)*2 + k
				if us.Index != idx || us.Epoch != 1 || us.MiniBatch != k+1 {
					t.Errorf("dp %d step %d: update %d is %+v", dp, sr.Step, k, us)
				}
				if want := sched.At(idx); us.LR != want {
					t.Errorf("dp %d update %d: lr %v, want the schedule's %v at update %d", dp, idx, us.LR, want, idx)
				}
				var sum map[string]float64
				ratioOne := true
				for _, e := range ups[idx] {
					if e.up.norm.Samples != sp.Data.GlobalBatchSize || e.up.norm.DP != dp {
						t.Fatalf("update %d normalised by %+v", idx, e.up.norm)
					}
					for j, i := range e.pk.SampleIndex {
						covered[i]++
						if e.in.Advantages[j] != adv[i] && math.Abs(e.in.Advantages[j]-adv[i]) > 1e-12 {
							t.Errorf("update %d sample %d: advantage %v, want %v", idx, i, e.in.Advantages[j], adv[i])
						}
					}
					// l_old and l_ref are the log-prob stages' values.
					if want, _ := r.old[sr.Step].Gather(b, e.pk); !slices.Equal(e.in.OldLogP, want) {
						t.Errorf("update %d: l_old is not actor_logprob's output", idx)
					}
					if want, _ := r.ref[sr.Step].Gather(b, e.pk); !slices.Equal(e.in.RefLogP, want) {
						t.Errorf("update %d: l_ref is not ref_logprob's output", idx)
					}
					for k2 := range e.in.LogP {
						if e.in.LogP[k2] != e.in.OldLogP[k2] {
							ratioOne = false
						}
					}
					checkLossReference(t, tr, e)
					for name, v := range e.out.Metrics.Values() {
						if sum == nil {
							sum = map[string]float64{}
						}
						sum[name] += v
					}
				}
				for name, v := range sum {
					if got := us.Values[name]; math.Abs(got-v) > 1e-6*math.Max(math.Abs(v), 1) {
						t.Errorf("dp %d update %d: logged %s %v, the micro-batches sum to %v", dp, idx, name, got, v)
					}
				}
				switch k {
				case 0:
					if !ratioOne || us.Values["ppo_kl"] != 0 || us.Values["pg_clipfrac"] != 0 {
						t.Errorf("dp %d step %d: the first update's ratio is not exactly 1 (ppo_kl %v, clipfrac %v)", dp, sr.Step, us.Values["ppo_kl"], us.Values["pg_clipfrac"])
					}
				case 1:
					if ratioOne || math.Abs(us.Values["ratio"]-1) < 1e-6 || us.Values["ppo_kl"] == 0 {
						t.Errorf("dp %d step %d: the second update's ratio is 1 (ratio %v, ppo_kl %v)", dp, sr.Step, us.Values["ratio"], us.Values["ppo_kl"])
					}
				}
			}
			for i := range b.Samples {
				if covered[i] != 1 {
					t.Fatalf("dp %d step %d: sample %d trained %d times in one epoch", dp, sr.Step, i, covered[i])
				}
			}
			if len(covered) != 128 {
				t.Errorf("dp %d step %d: %d samples trained, want the rollout batch's 128", dp, sr.Step, len(covered))
			}
		}
	}
}

// refAdvantages recomputes the GRPO advantages of the batch in float64:
// (r − mean_g) / (std_g + 1e-6), std unbiased.
func refAdvantages(b *Batch) []float64 {
	groups := map[int][]int{}
	for i, s := range b.Samples {
		groups[s.Group] = append(groups[s.Group], i)
	}
	out := make([]float64, len(b.Samples))
	for _, members := range groups {
		var mean, ss float64
		for _, i := range members {
			mean += b.Samples[i].Reward
		}
		mean /= float64(len(members))
		for _, i := range members {
			d := b.Samples[i].Reward - mean
			ss += d * d
		}
		std := math.Sqrt(ss / float64(len(members)-1))
		for _, i := range members {
			out[i] = (b.Samples[i].Reward - mean) / (std + 1e-6)
		}
	}
	return out
}

// checkLossReference recomputes one micro-batch's loss contribution and
// dL/dl in float64 from RL-MATH.md (ppo clip, low_var_kl, entropy bonus,
// sample_mean over the mini-batch's B samples, gradient times dp) and
// compares them with what the train stage computed.
func checkLossReference(t *testing.T, tr *Train, e lossEvent) {
	t.Helper()
	lo, hi := 1-tr.EpsClip, 1+tr.EpsClipHigh
	B, dp := float64(e.up.norm.Samples), float64(e.up.norm.DP)
	var loss float64
	grad := make([]float64, len(e.in.LogP))
	off := 0
	for i, n := range e.in.Lengths {
		var msum float64
		for tk := off; tk < off+n; tk++ {
			msum += float64(e.in.Mask[tk])
		}
		D := math.Max(msum, 1)
		a := e.in.Advantages[i]
		for tk := off; tk < off+n; tk++ {
			m := float64(e.in.Mask[tk])
			if m == 0 {
				continue
			}
			w := m / (D * B)
			l, old, ref := float64(e.in.LogP[tk]), float64(e.in.OldLogP[tk]), float64(e.in.RefLogP[tk])
			rho := math.Exp(l - old)
			pg1, pg2 := -rho*a, -math.Min(math.Max(rho, lo), hi)*a
			pg, dpg := pg1, -a*rho
			if pg2 > pg1 {
				pg, dpg = pg2, 0
				if rho >= lo && rho <= hi {
					dpg = -a * rho
				}
			}
			x := l - ref
			kl := math.Exp(-x) - 1 + x
			dkl := 1 - math.Exp(-x)
			if kl > 10 {
				kl, dkl = 10, 0
			}
			loss += w*pg - tr.EntropyCoef*w*float64(e.in.Entropy[tk]) + tr.KLCoef*w*kl
			grad[tk] = dp * w * (dpg + tr.KLCoef*dkl)
		}
		off += n
	}
	if d := math.Abs(e.out.Loss - loss); d > 1e-9*math.Max(math.Abs(loss), 1e-3) {
		t.Errorf("update %d: micro-batch loss %v, float64 reference %v", e.up.Index, e.out.Loss, loss)
	}
	for tk, g := range grad {
		if d := math.Abs(float64(e.out.DLogP[tk]) - g); d > 1e-6*math.Max(math.Abs(g), 1e-6) {
			t.Fatalf("update %d token %d: dL/dl %v, float64 reference %v", e.up.Index, tk, e.out.DLogP[tk], g)
		}
	}
}

// TestRealStepClips crafts a clip range so narrow that any change of the
// policy leaves it: the second update of a step must clip tokens, the
// first none.
func TestRealStepClips(t *testing.T) {
	r := runStep(t, tinyVariant(t, "eps_clip: 0.2\n        eps_clip_high: 0.28", "eps_clip: 0.001\n        eps_clip_high: 0.001"), 1)
	for _, sr := range r.steps {
		first, second := sr.Stats.Updates[0].Values, sr.Stats.Updates[1].Values
		if first["pg_clipfrac"] != 0 || !(second["pg_clipfrac"] > 0) {
			t.Errorf("step %d: pg_clipfrac %v then %v; want 0 then > 0", sr.Step, first["pg_clipfrac"], second["pg_clipfrac"])
		}
	}
}

// TestEpochsShuffle runs two PPO epochs over a shuffled rollout batch:
// every epoch visits every sample once, in another order than rollout
// order and than the other epoch; the same seed gives the same run, and
// shuffle_groups keeps every mini-batch made of whole groups.
func TestEpochsShuffle(t *testing.T) {
	edits := []string{"  checkpoint_every: 6\n", "  checkpoint_every: 6\n  ppo_epochs: 2\n  shuffle: true\n  seed: 7\n"}
	r := runStep(t, tinyVariant(t, edits...), 1)
	again := runStep(t, tinyVariant(t, edits...), 1)
	other := runStep(t, tinyVariant(t, "  checkpoint_every: 6\n", "  checkpoint_every: 6\n  ppo_epochs: 2\n  shuffle: true\n  seed: 8\n"), 1)
	grouped := runStep(t, tinyVariant(t, "  checkpoint_every: 6\n", "  checkpoint_every: 6\n  ppo_epochs: 2\n  shuffle: true\n  shuffle_groups: true\n"), 1)
	if n := len(r.steps[0].Stats.Updates); n != 4 {
		t.Fatalf("%d updates per step, want 2 epochs × 2 mini-batches", n)
	}
	samples := func(run *stepRun, step, update int) []int {
		var out []int
		for _, e := range run.events {
			if e.step == step && e.up.Index == (step-1)*4+update {
				out = e.up.Samples
			}
		}
		return out
	}
	for step := 1; step <= 2; step++ {
		var epochs [2][]int
		for u := range 4 {
			epochs[u/2] = append(epochs[u/2], samples(r, step, u)...)
		}
		for e, order := range epochs {
			sorted := slices.Clone(order)
			sort.Ints(sorted)
			for i, v := range sorted {
				if v != i {
					t.Fatalf("step %d epoch %d visits %v, not every sample once", step, e+1, order)
				}
			}
			if slices.Equal(order, sorted) {
				t.Errorf("step %d epoch %d: shuffle kept rollout order", step, e+1)
			}
		}
		if slices.Equal(epochs[0], epochs[1]) {
			t.Errorf("step %d: both epochs visit the samples in the same order", step)
		}
		for u := range 4 {
			if !slices.Equal(samples(r, step, u), samples(again, step, u)) {
				t.Errorf("step %d update %d: the same seed gave another mini-batch", step, u)
			}
			groups := map[int]int{}
			for _, i := range samples(grouped, step, u) {
				groups[grouped.batch[step].Samples[i].Group]++
			}
			for g, n := range groups {
				if n != 8 {
					t.Errorf("shuffle_groups: step %d update %d holds %d samples of group %d, want 8", step, u, n, g)
				}
			}
		}
		if slices.Equal(samples(r, step, 0), samples(other, step, 0)) {
			t.Errorf("step %d: seeds 7 and 8 gave the same first mini-batch", step)
		}
	}
	if !reflect.DeepEqual(r.steps[1].Stats.Values, again.steps[1].Stats.Values) {
		t.Errorf("the same seed gave other metrics: %v vs %v", r.steps[1].Stats.Values, again.steps[1].Stats.Values)
	}
}

// TestTokenMeanTISMask runs token_mean aggregation with TIS in mask mode on
// 2 ranks, on the tiny rollouts given rollout log-probs of -6 for every
// token (so exp(l_old − l_rollout) exceeds the cap 2 on some tokens and not
// on others): every micro-batch's normalisers must be the whole
// mini-batch's token counts N and N', recomputed here in float64 from the
// samples, the old log-probs and the TIS rule; the masked tokens must leave
// N' below N; and the update's logged TIS and mismatch metrics must be
// there.
func TestTokenMeanTISMask(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(mustAbs(t, filepath.Join("..", "examples", "models")), filepath.Join(dir, "models")); err != nil {
		t.Fatal(err)
	}
	samples, err := rollout.Read(filepath.Join("..", "examples", "data", "tiny-rollouts.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	const roLogP = -6
	for i := range samples {
		samples[i].RolloutLogProbs = make([]float32, samples[i].ResponseLength)
		for k := range samples[i].RolloutLogProbs {
			samples[i].RolloutLogProbs[k] = roLogP
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := rollout.Write(filepath.Join(dir, "data", "tiny-rollouts.jsonl"), samples); err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(readFile(t, filepath.Join("..", "examples", "tiny-grpo.yaml")), "        entropy_coef: 0.001", "        entropy_coef: 0.001\n        aggregation: token_mean\n        tis: mask", 1)
	path := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Train.Steps = 2
	r := runStep(t, s, 2)
	capC := rl.DefaultTISCap
	masked := 0
	for idx, evs := range r.byUpdate() {
		step := idx + 1
		b, old := r.batch[step], r.old[step]
		var n, np float64
		for _, i := range evs[0].up.Samples {
			for k, m := range b.Samples[i].LossMask {
				l := float64(old.Values[b.RespOff[i]+k])
				n += float64(m)
				if math.Exp(l-roLogP) <= capC {
					np += float64(m)
				} else if m > 0 {
					masked++
				}
			}
		}
		for _, e := range evs {
			if e.up.norm.Tokens != n || e.up.norm.PGTokens != np {
				t.Errorf("update %d rank %d: normalisers N %v N' %v, want the mini-batch's %v and %v", idx, e.rank, e.up.norm.Tokens, e.up.norm.PGTokens, n, np)
			}
		}
		v := r.steps[idx].Stats.Updates[0].Values
		for _, name := range []string{"tis_weight", "tis_clipfrac", "mismatch_abs", "mismatch_k3"} {
			if _, ok := v[name]; !ok {
				t.Errorf("update %d logs no %s: %v", idx, name, v)
			}
		}
		if !(v["tis_clipfrac"] > 0 && v["tis_clipfrac"] < 1) {
			t.Errorf("update %d: tis_clipfrac %v, want some tokens masked and some kept", idx, v["tis_clipfrac"])
		}
	}
	if masked == 0 {
		t.Error("no token exceeds the cap: the test data does not exercise the mask")
	}
}
