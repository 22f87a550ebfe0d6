package stages

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// autoLayers is the decoder layer count of autoSpec's model.
const autoLayers = 7

// autoChunkIDs are autoSpec's stages with a chunk_tokens parameter.
var autoChunkIDs = []string{"ref", "old", "train"}

// autoPol holds the recompute policies an autoSpec writes: rc as
// policies.recompute, ew as policies.recompute_elementwise ("" leaves a
// key out: auto).
type autoPol struct{ rc, ew string }

// written is the policies that write out l element-wise and k recomputed
// layers (layers 0 to l-1 and 0 to k-1).
func written(l, k int) autoPol {
	return autoPol{fmt.Sprintf("layer.index < %d", k), fmt.Sprintf("layer.index < %d", l)}
}

// autoSpec writes the tiny job with a 7-layer model and 4096-token
// micro-batches, the recompute policies pol and the stages' chunk_tokens
// as chunks ("" leaves it out: auto), and apply_fsdp2's options written
// false, then makes the edits (pairs of old and new text, as variant),
// and resolves it for planning on a GPU of budget bytes.
func autoSpec(t *testing.T, budget int64, pol autoPol, chunks map[string]string, edits ...string) *Job {
	t.Helper()
	dir := t.TempDir()
	cfg := strings.Replace(readFile(t, filepath.Join("testdata", "tiny", "config.json")), `"num_hidden_layers": 2`, fmt.Sprintf(`"num_hidden_layers": %d`, autoLayers), 1)
	if err := os.MkdirAll(filepath.Join(dir, "tiny"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tiny", "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	with := func(id string) string {
		if c := chunks[id]; c != "" {
			return ", chunk_tokens: " + c
		}
		return ""
	}
	policies := ""
	if pol.rc != "" {
		policies += fmt.Sprintf("  recompute: '%s'\n", pol.rc)
	}
	if pol.ew != "" {
		policies += fmt.Sprintf("  recompute_elementwise: '%s'\n", pol.ew)
	}
	if policies != "" {
		policies = "policies:\n" + policies
	}
	src := fmt.Sprintf(`version: 1
name: auto
models:
  actor: {path: tiny}
  ref: {copy_of: actor}
data:
  rollouts: rollouts.jsonl
  global_batch_size: 4
  max_tokens_per_gpu: 4096
  max_seq_len: 8
train:
  steps: 1
%sstages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard_actor, uses: apply_fsdp2, needs: load, with: {model: actor, gather_once: false, accumulate_grads_on_device: false, overlap_reduce: false}}
    - {id: shard_ref, uses: apply_fsdp2, needs: load, with: {model: ref, gather_once: false, replicate: false}}
  step:
    - {id: pack, uses: pack}
    - {id: ref, uses: ref_logprob, needs: pack, with: {model: ref%s}}
    - {id: old, uses: actor_logprob, needs: pack, with: {model: actor%s}}
    - {id: train, uses: train, needs: [ref, old], with: {kl: k3, kl_coef: 0.1%s}}
`, policies, with("ref"), with("old"), with("train"))
	src = edit(t, "the job", src, edits...)
	path := filepath.Join(dir, "auto.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := spec.Load(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	j, err := Resolve(s, GPU{Name: "test", Bytes: budget, Source: "test"}, CheckPlan)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	return j
}

// autoTotal plans the job as written (no auto) and returns its device
// total.
func autoTotal(t *testing.T, pol autoPol, chunks map[string]string) int64 {
	t.Helper()
	p, err := Plan(autoSpec(t, 1<<40, pol, chunks))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Auto) != 0 {
		t.Fatalf("a spec with nothing auto made choices: %+v", p.Auto)
	}
	return p.DeviceTotal()
}

// TestPlanAuto checks what Plan chooses under policies.recompute and
// recompute_elementwise auto and chunk_tokens auto against plans of the
// same job written out: the fewest element-wise layers (layers 0 to l-1)
// whose job fits; if none, every layer element-wise and the fewest
// recomputed layers (layers 0 to k-1); then for each stage in order the
// largest chunk (1024 doubled, up to the 4096 rows of a micro-batch) that
// still fits; and that the plan of the choices is the plan of the
// written-out spec, byte for byte.
func TestPlanAuto(t *testing.T) {
	start := map[string]string{"ref": "1024", "old": "1024", "train": "1024"}
	ewTotals := make([]int64, autoLayers+1) // by element-wise layers, none recomputed
	rcTotals := make([]int64, autoLayers+1) // by recomputed layers, the others element-wise
	least := 0
	for n := range ewTotals {
		ewTotals[n] = autoTotal(t, written(n, 0), start)
		rcTotals[n] = autoTotal(t, written(autoLayers, n), start)
		if rcTotals[n] < rcTotals[least] {
			least = n
		}
	}
	if ewTotals[3] >= ewTotals[1] || rcTotals[3] >= rcTotals[1] || rcTotals[1] >= ewTotals[autoLayers] {
		t.Fatalf("element-wise or recomputed layers save nothing: %v, %v", ewTotals, rcTotals)
	}
	// fewest is what auto must choose for a budget: the fewest
	// element-wise layers whose total fits, else every layer element-wise
	// and the fewest recomputed layers, else the count of the least total.
	fewest := func(budget int64) (l, k int, fits bool) {
		for l, tot := range ewTotals {
			if tot <= budget {
				return l, 0, true
			}
		}
		for k, tot := range rcTotals {
			if tot <= budget {
				return autoLayers, k, true
			}
		}
		return autoLayers, least, false
	}
	cases := []struct {
		name   string
		budget int64
	}{
		{"everything fits", 1 << 40},
		{"exactly 3 element-wise", ewTotals[3]},
		{"just under 3 element-wise", ewTotals[3] - 1},
		{"every layer element-wise", ewTotals[autoLayers]},
		{"exactly 3 recomputed", rcTotals[3]},
		{"just under 3 recomputed", rcTotals[3] - 1},
		{"just over 1 recomputed", rcTotals[1] + 1},
		{"the last layers", min(rcTotals[autoLayers-1], rcTotals[autoLayers])},
		{"nothing fits", rcTotals[least] - 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantL, wantK, fits := fewest(c.budget)
			j := autoSpec(t, c.budget, autoPol{}, nil)
			p, err := Plan(j)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Fits(c.budget); got != fits {
				t.Fatalf("fits = %v, want %v (total %d, budget %d)", got, fits, p.DeviceTotal(), c.budget)
			}
			if l, k := j.auto.lean["actor"], j.auto.recompute["actor"]; l != wantL || k != wantK {
				t.Fatalf("%d element-wise and %d recomputed layers, want %d and %d", l, k, wantL, wantK)
			}
			if len(p.Auto) != 2+len(autoChunkIDs) || p.Auto[0].Key != "policies.recompute" || p.Auto[0].Subject != "model actor" ||
				p.Auto[1].Key != "policies.recompute_elementwise" || p.Auto[1].Subject != "model actor" {
				t.Fatalf("choices = %+v", p.Auto)
			}
			// The recomputed layers are the first k: only they plan the
			// recomputed forward's buffers. The element-wise layers among
			// the others keep no SwiGLU output.
			for i := range autoLayers {
				rc := p.Buffer(fmt.Sprintf("train.rc.layer%d.gate", i)) != nil
				act := p.Buffer(fmt.Sprintf("train.saved.layer%d.act", i)) != nil
				if rc != (i < wantK) || act != (i >= wantK && i >= wantL) {
					t.Errorf("layer %d: recompute buffers %v, saved act %v; want %v, %v", i, rc, act, i < wantK, i >= wantK && i >= wantL)
				}
			}
			// Each chunk is the largest that fits given the chunks before
			// it (and the start for those after).
			chosen := map[string]string{}
			for _, id := range autoChunkIDs {
				chosen[id] = fmt.Sprint(j.auto.chunks[id])
			}
			pol := written(wantL, wantK)
			for i, id := range autoChunkIDs {
				n := j.auto.chunks[id]
				if n < 1024 || n > 4096 || n&(n-1) != 0 {
					t.Fatalf("stage %s: chunk %d, want 1024, 2048 or 4096", id, n)
				}
				if n == 4096 || !fits {
					continue
				}
				next := map[string]string{}
				for k, id2 := range autoChunkIDs {
					switch {
					case k < i:
						next[id2] = chosen[id2]
					case k == i:
						next[id2] = fmt.Sprint(2 * n)
					default:
						next[id2] = "1024"
					}
				}
				if tot := autoTotal(t, pol, next); tot <= c.budget {
					t.Errorf("stage %s: chunk %d chosen, but %d fits too (%d of %d bytes)", id, n, 2*n, tot, c.budget)
				}
			}
			switch {
			case fits && wantK > 0 && wantK < autoLayers:
				if !strings.Contains(p.Auto[0].Why, fmt.Sprintf("%d would need %s", wantK-1, plan.GiB(rcTotals[wantK-1]))) {
					t.Errorf("why = %q, want the total with one recomputed layer fewer", p.Auto[0].Why)
				}
			case fits && wantK == 0 && wantL > 0:
				if !strings.Contains(p.Auto[1].Why, fmt.Sprintf("%d would need %s", wantL-1, plan.GiB(ewTotals[wantL-1]))) {
					t.Errorf("why = %q, want the total with one element-wise layer fewer", p.Auto[1].Why)
				}
			}
			// The plan of the choices is the plan of the spec written out.
			want := autoTotal(t, pol, chosen)
			if p.DeviceTotal() != want || p.PeakBytes != autoPeak(t, pol, chosen) {
				t.Errorf("auto plan total %d, written-out %d", p.DeviceTotal(), want)
			}
		})
	}
}

func autoPeak(t *testing.T, pol autoPol, chunks map[string]string) int64 {
	t.Helper()
	p, err := Plan(autoSpec(t, 1<<40, pol, chunks))
	if err != nil {
		t.Fatal(err)
	}
	return p.PeakBytes
}

// TestRunUnplanned checks that a job whose auto choices were never made
// is refused rather than run with some default.
func TestRunUnplanned(t *testing.T) {
	j := autoSpec(t, 1<<40, autoPol{}, nil)
	if _, err := Run(t.Context(), j, &plan.Plan{}, RunOptions{}); err == nil || !strings.Contains(err.Error(), "not planned") {
		t.Fatalf("err = %v, want the job refused as not planned", err)
	}
}

// TestPlanAutoOptions checks what Plan chooses for apply_fsdp2's
// gather_once, accumulate_grads_on_device, overlap_reduce and replicate
// left to auto (the default), on the 7-layer job in micro-batches of two
// samples, where each option costs memory: a model's two where they save
// time and the job fits with both; the one of smaller plan where only one
// fits; neither where neither fits, or where they would save nothing
// (gathers on the device, one micro-batch a step or an update, one rank)
// or have not been measured (overlap_reduce with cp 2 or offloaded
// params); the frozen ref replicated, after the actor's options, where
// it fits at two ranks (then its gather_once is false, untried), and not
// where it cannot be (offloaded, cp 2);
// and that the plan of the choices is that of the options written out.
func TestPlanAutoOptions(t *testing.T) {
	const (
		actorFalse = "{model: actor, gather_once: false, accumulate_grads_on_device: false, overlap_reduce: false}"
		refFalse   = "{model: ref, gather_once: false, replicate: false}"
		huge       = 1 << 40
	)
	offload := []string{"policies:\n", "policies:\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n"}
	twoSamples := []string{"max_tokens_per_gpu: 4096", "max_tokens_per_gpu: 16"} // of 4, at most 8 tokens each
	actor := func(with string) []string { return []string{actorFalse, "{model: actor" + with + "}"} }
	ref := func(with string) []string { return []string{refFalse, "{model: ref" + with + "}"} }
	twoRanks := []string{"data:\n", "mesh:\n  gpus_per_node: 2\ndata:\n"}
	plans := func(budget int64, edits ...string) *plan.Plan {
		t.Helper()
		p, err := Plan(autoSpec(t, budget, written(0, 0), map[string]string{"ref": "16", "old": "16", "train": "16"}, edits...))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The offloaded actor's totals with the options written.
	total := func(g, a bool) int64 {
		p := plans(huge, slices.Concat(offload, twoSamples, actor(fmt.Sprintf(", gather_once: %v, accumulate_grads_on_device: %v", g, a)))...)
		if len(p.Auto) != 0 {
			t.Fatalf("a job with nothing auto made choices: %+v", p.Auto)
		}
		return p.DeviceTotal()
	}
	none, gather, acc, both := total(false, false), total(true, false), total(false, true), total(true, true)
	if !(none < gather && none < acc && max(gather, acc) < both) || gather == acc {
		t.Fatalf("totals: none %d, gather_once %d, accumulate %d, both %d: the options cost no memory, or the same", none, gather, acc, both)
	}
	gatherSmaller := gather < acc
	onDevice := "ref gather_once false: its gathers stay on the device"
	// At dp 2 on the device, the actor's gather_once and overlap_reduce
	// alone (the ref's gather_once off): the budget of the smaller, so that
	// only it fits.
	dp2 := slices.Concat(twoRanks, []string{"max_tokens_per_gpu: 4096", "max_tokens_per_gpu: 8"})
	dp2Total := func(g, r bool) int64 {
		return plans(huge, slices.Concat(dp2, actor(fmt.Sprintf(", gather_once: %v, accumulate_grads_on_device: false, overlap_reduce: %v", g, r)))...).DeviceTotal()
	}
	gather2, reduce2, both2 := dp2Total(true, false), dp2Total(false, true), dp2Total(true, true)
	if !(max(gather2, reduce2) < both2) || gather2 == reduce2 {
		t.Fatalf("dp 2 totals: gather_once %d, overlap_reduce %d, both %d: the options cost no memory, or the same", gather2, reduce2, both2)
	}
	reduceSmaller, reduceOnly := reduce2 < gather2, min(gather2, reduce2)
	cpTwo := []string{"data:\n", "mesh:\n  gpus_per_node: 2\n  cp: 2\ndata:\n"}
	auto := slices.Concat(actor(""), ref(""))
	noReplica := slices.Concat(actor(""), ref(", replicate: false")) // the actor's options alone
	// At dp 2, the ref replicated or not, every other option off.
	repTotal := func(r bool) int64 {
		return plans(huge, slices.Concat(dp2, ref(fmt.Sprintf(", replicate: %v", r)))...).DeviceTotal()
	}
	sharded, replica := repTotal(false), repTotal(true)
	if replica <= sharded {
		t.Fatalf("dp 2 totals: the ref replicated %d, sharded %d: the replica costs no memory", replica, sharded)
	}
	refAuto := slices.Concat(dp2, ref(""))
	replicated := "ref gather_once false: the model is replicated: its units are read in place, not gathered"
	for _, c := range []struct {
		name   string
		budget int64
		edits  []string
		want   []string // "model key value: why's start", in order
		total  int64    // the plan's device total; 0: not checked
	}{
		{"offloaded, room for both", huge, slices.Concat(offload, twoSamples, auto), []string{
			"actor gather_once true: its units are gathered over PCIe by old in each micro-batch of a step, train in each micro-batch of an update; with it and accumulate_grads_on_device the job needs",
			"actor accumulate_grads_on_device true: an update may have several micro-batches",
			onDevice}, both},
		{"offloaded, room for one", min(gather, acc), slices.Concat(offload, twoSamples, auto), []string{
			fmt.Sprint("actor gather_once ", gatherSmaller),
			fmt.Sprint("actor accumulate_grads_on_device ", !gatherSmaller),
			onDevice}, min(gather, acc)},
		{"offloaded, room for neither", min(gather, acc) - 1, slices.Concat(offload, twoSamples, auto), []string{
			"actor gather_once false: its units are gathered over PCIe by old in each micro-batch of a step, train in each micro-batch of an update, but with it the job would need",
			"actor accumulate_grads_on_device false: an update may have several micro-batches, whose grads would each cross to the host and be added there, but with it the job would need",
			onDevice}, none},
		{"offloaded, one micro-batch an update", huge, slices.Concat(offload, twoSamples, []string{"global_batch_size: 4", "global_batch_size: 2\n  rollout_batch_size: 4"}, auto), []string{
			"actor gather_once true: its units are gathered over PCIe by old in each micro-batch of a step;",
			"actor accumulate_grads_on_device false: an update has one micro-batch",
			onDevice}, 0},
		{"offloaded, one micro-batch a step", huge, slices.Concat(offload, auto), []string{
			"actor gather_once false: no stage computing with it may have several micro-batches",
			"actor accumulate_grads_on_device false: an update has one micro-batch",
			onDevice}, 0},
		{"on the device, one rank", huge, slices.Concat(twoSamples, auto), []string{
			"actor gather_once false: its gathers stay on the device",
			"actor overlap_reduce false: one rank: its grads are not reduced",
			onDevice}, 0},
		{"on the device, two ranks", huge, slices.Concat(dp2, auto), []string{
			"actor gather_once true: its units are gathered from 2 ranks by old in each micro-batch of a step, train in each micro-batch of an update",
			"actor overlap_reduce true: train reduce-scatters its grads over 2 ranks after each unit's backward, which the reduction would overlap; with it and gather_once the job needs",
			"ref replicate true: ref would read its units in place instead of all-gathering them from 2 ranks; with it the job needs",
			replicated}, 0},
		// The actor's options come first: the replica takes what room is
		// left.
		{"on the device, two ranks, room for the actor's options", both2, slices.Concat(dp2, auto), []string{
			"actor gather_once true",
			"actor overlap_reduce true",
			"ref replicate false: ref would read its units in place instead of all-gathering them from 2 ranks, but with it the job would need",
			"ref gather_once"}, 0},
		{"on the device, two ranks, the ref sharded", huge, slices.Concat(dp2, noReplica), []string{
			"actor gather_once true",
			"actor overlap_reduce true",
			"ref gather_once true: its units are gathered from 2 ranks by ref in each micro-batch of a step; it adds nothing to the job's peak"}, 0},
		{"on the device, two ranks, room for one", reduceOnly, slices.Concat(dp2, noReplica), []string{
			fmt.Sprint("actor gather_once ", !reduceSmaller),
			fmt.Sprint("actor overlap_reduce ", reduceSmaller),
			"ref gather_once"}, 0},
		{"two ranks, room for the replica", replica, refAuto, []string{
			"ref replicate true: ref would read its units in place instead of all-gathering them from 2 ranks; with it the job needs",
			replicated}, replica},
		{"two ranks, no room for the replica", replica - 1, refAuto, []string{
			"ref replicate false: ref would read its units in place instead of all-gathering them from 2 ranks, but with it the job would need",
			"ref gather_once"}, 0},
		// Written true, the replica is no reason for its gather_once.
		{"two ranks, the replica written", huge, slices.Concat(dp2, ref(", replicate: true")), []string{
			replicated}, 0},
		{"two ranks, the ref synced from the actor", huge, slices.Concat([]string{"    - {id: train,", "    - {id: sync, uses: update_ref, needs: train}\n    - {id: train,"}, refAuto), []string{
			"ref replicate true",
			replicated}, 0},
		{"two ranks, every model offloaded", huge, slices.Concat([]string{"policies:\n", "policies:\n  offload: 'true'\n"}, refAuto), []string{
			"ref replicate false: policies.offload puts its params in host memory",
			"ref gather_once"}, 0},
		{"params offloaded, two ranks", huge, slices.Concat([]string{"policies:\n", "policies:\n  offload: 'model.trainable'\n"}, dp2, noReplica), []string{
			"actor gather_once",
			"actor overlap_reduce false: not chosen with offloaded params",
			"ref gather_once"}, 0},
		{"on the device, two ranks, cp 2", huge, slices.Concat(cpTwo, auto), []string{
			"actor gather_once false: no stage computing with it may have several micro-batches",
			"actor overlap_reduce false: not chosen with context parallelism (mesh.cp > 1), where it has not been measured",
			"ref replicate false: mesh.cp is above 1",
			"ref gather_once false: no stage"}, 0},
		{"written", huge, slices.Concat(offload, twoSamples, actor(", gather_once: true"), ref(", gather_once: false")), []string{
			"actor accumulate_grads_on_device true"}, both},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := plans(c.budget, c.edits...)
			var got []string
			for _, ch := range p.Auto {
				got = append(got, fmt.Sprintf("%s %s %s: %s", strings.TrimPrefix(ch.Subject, "model "), ch.Key, ch.Value, ch.Why))
			}
			if len(got) != len(c.want) {
				t.Fatalf("choices %q, want %d starting %q", got, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("choice %d: %q, want it to start %q", i, got[i], w)
				}
			}
			if c.total != 0 && p.DeviceTotal() != c.total {
				t.Errorf("device total %d, want %d (the options written out)", p.DeviceTotal(), c.total)
			}
			// A choice that costs memory says how much: never "needs X of
			// B GiB (X without)" with the two figures alike.
			for _, g := range got {
				var need, budget, was float64
				if i := strings.Index(g, "the job needs "); i >= 0 {
					if n, _ := fmt.Sscanf(g[i:], "the job needs %f of %f GiB (%f ", &need, &budget, &was); n == 3 && need == was {
						t.Errorf("choice %q: the same figure with and without", g)
					}
				}
			}
		})
	}
}

// TestAutoOptionsRun runs the offloaded tiny job with apply_fsdp2's
// options left to auto, which its plan turns on for the actor, and checks
// that the run does what the plan chose: each of the actor's units
// gathered once an update by train and once a step by old_logp, and the
// update's grads summed on the device.
func TestAutoOptionsRun(t *testing.T) {
	var mu sync.Mutex
	gathers := map[string]int{} // by stage and unit
	sums := 0
	gatherIssued = func(stage string, u *Unit) {
		mu.Lock()
		defer mu.Unlock()
		gathers[stage+" "+u.Name]++
	}
	gradAccumulated = func(*Unit, bool) {
		mu.Lock()
		defer mu.Unlock()
		sums++
	}
	defer func() { gatherIssued, gradAccumulated = nil, nil }()
	s := tinyVariant(t, "  recompute: 'layer.index % 2 == 0'\n", "  recompute: 'layer.index % 2 == 0'\n  offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'\n")
	out := runParsed(t, s, nil, nil, RunOptions{})
	var chose []string
	for _, c := range out.p.Auto {
		chose = append(chose, c.Subject+" "+c.Key+" "+c.Value)
	}
	if want := []string{"model actor gather_once true", "model actor accumulate_grads_on_device true", "model ref gather_once false"}; !slices.Equal(chose, want) {
		t.Fatalf("plan chose %q, want %q", chose, want)
	}
	updates := 0
	for _, sr := range out.steps {
		updates += len(sr.Stats.Updates)
	}
	for _, u := range []string{"embed", "layer0", "layer1", "head"} {
		if n := gathers["train "+u]; n != updates {
			t.Errorf("train gathered %s %d times in %d updates, want once an update", u, n, updates)
		}
		if n := gathers["old_logp "+u]; n != len(out.steps) {
			t.Errorf("old_logp gathered %s %d times in %d steps, want once a step", u, n, len(out.steps))
		}
	}
	if sums == 0 {
		t.Error("no reduction summed into the device's grads")
	}
}
