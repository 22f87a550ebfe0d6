package stages

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
// as chunks ("" leaves it out: auto), and resolves it for planning on a
// GPU of budget bytes.
func autoSpec(t *testing.T, budget int64, pol autoPol, chunks map[string]string) *Job {
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
    - {id: shard_actor, uses: apply_fsdp2, needs: load, with: {model: actor}}
    - {id: shard_ref, uses: apply_fsdp2, needs: load, with: {model: ref}}
  step:
    - {id: pack, uses: pack}
    - {id: ref, uses: ref_logprob, needs: pack, with: {model: ref%s}}
    - {id: old, uses: actor_logprob, needs: pack, with: {model: actor%s}}
    - {id: train, uses: train, needs: [ref, old], with: {kl: k3, kl_coef: 0.1%s}}
`, policies, with("ref"), with("old"), with("train"))
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
