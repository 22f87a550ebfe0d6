package stages

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// noSyncRef is the tiny dp-2 job without its update_ref stage, so that
// its ref can be replicated, with the ref's replicate written as v (""
// leaves it to auto).
func noSyncRef(t *testing.T, v string) *spec.Spec {
	t.Helper()
	with := "{model: ref}"
	if v != "" {
		with = "{model: ref, replicate: " + v + "}"
	}
	return variant(t, filepath.Join("..", "examples", "tiny-dp2.yaml"),
		"    - id: sync_ref\n      uses: update_ref\n      needs: train\n      when: step % 6 == 0\n", "",
		"      with: {model: ref}", "      with: "+with)
}

// syncedRef is the tiny dp-2 job with update_ref after every step and the
// ref's replicate written as v.
func syncedRef(t *testing.T, v string) *spec.Spec {
	t.Helper()
	return variant(t, filepath.Join("..", "examples", "tiny-dp2.yaml"),
		"      needs: train\n      when: step % 6 == 0\n", "      needs: train\n",
		"      with: {model: ref}", "      with: {model: ref, replicate: "+v+"}")
}

// TestReplicate runs the tiny job on two ranks with its frozen ref
// replicated and sharded: the same metrics to the bit, the ref's units
// read in place when replicated, as on one rank (gathered from the other
// rank every step when sharded), the
// plan's peak the arenas' high-water mark, the replica's extra bytes in
// the plan, auto choosing it with true's plan, and the checkpointed
// replica exported as the sharded ref is.
func TestReplicate(t *testing.T) {
	var mu sync.Mutex
	gathers := map[string]int{}
	gatherIssued = func(stage string, u *Unit) {
		mu.Lock()
		defer mu.Unlock()
		gathers[stage]++
	}
	defer func() { gatherIssued = nil }()
	short := func(s *spec.Spec) { s.Train.Steps = 2 }
	run := func(v string) (runOut, int) {
		mu.Lock()
		clear(gathers)
		mu.Unlock()
		out := runParsed(t, noSyncRef(t, v), short, nil, RunOptions{})
		return out, gathers["ref_logp"]
	}
	sharded, gs := run("false")
	replica, gr := run("true")
	auto, ga := run("")
	// On one rank the units are read in place; what ref_logp still
	// "gathers" there is local (the fused q/k/v projection's copy).
	mu.Lock()
	clear(gathers)
	mu.Unlock()
	runParsed(t, noSyncRef(t, "false"), func(s *spec.Spec) { short(s); s.Mesh.GPUsPerNode, s.Mesh.DP = 1, 1 }, nil, RunOptions{})
	one := gathers["ref_logp"]
	if gr != one || ga != one || gs <= one {
		t.Errorf("ref_logp issued %d gathers sharded, %d replicated, %d auto, %d on one rank; want the replica's as one rank's, fewer than sharded", gs, gr, ga, one)
	}
	if replica.plan <= sharded.plan {
		t.Errorf("plan peak %d replicated, %d sharded: the replica holds the whole ref", replica.plan, sharded.plan)
	}
	if auto.plan != replica.plan {
		t.Errorf("auto's plan peak %d, replicate true's %d", auto.plan, replica.plan)
	}
	var chose []string
	for _, c := range auto.p.Auto {
		if c.Key == "replicate" {
			chose = append(chose, c.Subject+" "+c.Value)
		}
	}
	if len(chose) != 1 || chose[0] != "model ref true" {
		t.Errorf("auto chose replicate %q, want model ref true", chose)
	}
	sameAsSharded(t, sharded, replica, auto)

	// The replica checkpointed on every rank exports as the sharded ref.
	export := func(v string) string {
		dir := t.TempDir()
		s := noSyncRef(t, v)
		short(s)
		j := resolveSpec(t, s)
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		ckpt := filepath.Join(dir, "ckpt")
		if _, err := Run(context.Background(), j, p, RunOptions{AfterStep: func(r *Rank, sr StepResult) error {
			if sr.Step == 2 {
				return r.SaveShards(ckpt)
			}
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
		if _, err := ExportCheckpoint(j, "ref", ckpt, filepath.Join(dir, "ref"), ExportOptions{DType: "fp32"}); err != nil {
			t.Fatalf("replicate %s: exporting the ref: %v", v, err)
		}
		return readFile(t, filepath.Join(dir, "ref", "model.safetensors"))
	}
	if export("true") != export("false") {
		t.Error("the replicated ref exports other weights than the sharded one")
	}
}

// TestReplicateRefused checks that validation refuses replicate: true
// where a model cannot be replicated, naming the key and why.
func TestReplicateRefused(t *testing.T) {
	path := filepath.Join("..", "examples", "tiny-dp2.yaml")
	for _, c := range []struct {
		name  string
		edits []string
		want  string
	}{
		{"trained", []string{"      with: {model: actor}\n    - id: shard_ref", "      with: {model: actor, replicate: true}\n    - id: shard_ref"},
			`model "actor" cannot be replicated: a train stage trains it`},
		{"offloaded", []string{"      with: {model: ref}", "      with: {model: ref, replicate: true}",
			"    - id: sync_ref\n      uses: update_ref\n      needs: train\n      when: step % 6 == 0\n", "",
			"policies:\n", "policies:\n  offload: 'true'\n"},
			`model "ref" cannot be replicated: policies.offload puts its params in host memory`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Resolve(variant(t, path, c.edits...), testGPU, CheckRun)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "replicate") {
				t.Fatalf("resolve: %v, want %q", err, c.want)
			}
			if !strings.Contains(err.Error(), "tiny-dp2.yaml:") {
				t.Errorf("the error has no position in the spec: %v", err)
			}
		})
	}
}

// TestReplicateUpdateRef runs the tiny job on two ranks with update_ref
// after every step, the ref replicated and sharded: update_ref gathers
// the actor into the replica, so every step's metrics (whose KL reads the
// ref the step before wrote: exactly 0) are the same to the bit, with
// plan = high-water.
func TestReplicateUpdateRef(t *testing.T) {
	run := func(v string) runOut {
		return runParsed(t, syncedRef(t, v), func(s *spec.Spec) { s.Train.Steps = 3 }, nil, RunOptions{})
	}
	sharded, replica := run("false"), run("true")
	opIndex(t, replica.p, "sync_ref", "gather actor into the replica ref")
	sameAsSharded(t, sharded, replica)
	// Synced after every step, the ref computes what the actor does at the
	// next step's start: a KL of exactly 0, where a stale replica (the
	// initial weights) would give more from step 2.
	for _, sr := range replica.steps {
		if kl := sr.Stats.Values["kl_loss"]; kl != 0 {
			t.Errorf("step %d: kl_loss %v with the ref synced every step, want 0", sr.Step, kl)
		}
	}
}

// sameAsSharded checks that every replicated run has the sharded run's
// metrics and grad norms to the bit, and each run (sharded too) its plan's
// peak as every rank's arena high-water mark.
func sameAsSharded(t *testing.T, sharded runOut, replicated ...runOut) {
	t.Helper()
	for _, o := range replicated {
		for i, sr := range o.steps {
			b := sharded.steps[i]
			for _, k := range []string{"loss", "kl_loss", "entropy_loss", "adv_logp"} {
				if sr.Stats.Values[k] != b.Stats.Values[k] {
					t.Errorf("step %d: %s %.10g replicated, %.10g sharded", sr.Step, k, sr.Stats.Values[k], b.Stats.Values[k])
				}
			}
			if sr.Stats.GradNorm != b.Stats.GradNorm {
				t.Errorf("step %d: grad norm %.10g replicated, %.10g sharded", sr.Step, sr.Stats.GradNorm, b.Stats.GradNorm)
			}
		}
	}
	for _, o := range append(replicated, sharded) {
		for r, hw := range o.peak {
			if hw != o.plan {
				t.Errorf("rank %d: arena high-water %d, plan peak %d", r, hw, o.plan)
			}
		}
	}
}

// TestReplicateResume resumes the tiny job (its ref synced from the actor
// every step) at step 3 from a checkpoint of step 2 written with the ref
// replicated into a run that shards it, and the other way round: the ref
// is read across the layouts (every rank's shard files assembled, or a
// replica file sliced), and step 3's metrics are those of the run that was
// not interrupted, to the bit. The synced ref differs from the one setup
// loads (step 2 trains at a learning rate above 0), so a ref not read
// from the checkpoint would show in step 3's KL.
func TestReplicateResume(t *testing.T) {
	for _, c := range []struct{ wrote, runs string }{{"true", "false"}, {"false", "true"}} {
		t.Run("written "+c.wrote+", run "+c.runs, func(t *testing.T) {
			ckpt := filepath.Join(t.TempDir(), "ckpt")
			runParsed(t, syncedRef(t, c.wrote), func(s *spec.Spec) { s.Train.Steps = 2 }, nil, RunOptions{AfterStep: func(r *Rank, sr StepResult) error {
				if sr.Step == 2 {
					return r.SaveShards(ckpt)
				}
				return nil
			}})
			three := func(s *spec.Spec) { s.Train.Steps = 3 }
			whole := runParsed(t, syncedRef(t, c.runs), three, nil, RunOptions{})
			resumed := runParsed(t, syncedRef(t, c.runs), three, nil, RunOptions{FirstStep: 3, Resume: func(r *Rank) error { return r.LoadShards(ckpt) }})
			if len(resumed.steps) != 1 || resumed.steps[0].Step != 3 {
				t.Fatalf("the resumed run ran steps %+v, want step 3", resumed.steps)
			}
			got, want := resumed.steps[0], whole.steps[2]
			for _, k := range []string{"loss", "kl_loss", "entropy_loss", "adv_logp"} {
				if got.Stats.Values[k] != want.Stats.Values[k] {
					t.Errorf("step 3: %s %.10g resumed, %.10g uninterrupted", k, got.Stats.Values[k], want.Stats.Values[k])
				}
			}
			if got.Stats.GradNorm != want.Stats.GradNorm {
				t.Errorf("step 3: grad norm %.10g resumed, %.10g uninterrupted", got.Stats.GradNorm, want.Stats.GradNorm)
			}
		})
	}
}

// TestReplicateOwnCheckpoint runs the tiny job on two ranks with a ref
// that is not a copy of the actor but read from its own checkpoint (the
// same files), replicated and sharded: replicated, each rank reads the
// whole checkpoint into its replica and its setup progress counts all of
// it; sharded, the ranks' shares add up to it; the metrics agree to the
// bit.
func TestReplicateOwnCheckpoint(t *testing.T) {
	run := func(v string) (runOut, map[int]SetupEvent) {
		var mu sync.Mutex
		last := map[int]SetupEvent{} // by rank: shard_ref's finished event
		s := variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"),
			"  ref:\n    copy_of: actor", "  ref:\n    path: models/tiny-qwen2",
			"    - id: shard_ref\n      uses: apply_fsdp2\n      needs: load\n      with: {model: ref}",
			"    - id: load_ref\n      uses: load_hf\n      with: {model: ref}\n    - id: shard_ref\n      uses: apply_fsdp2\n      needs: load_ref\n      with: {model: ref, replicate: "+v+"}")
		out := runParsed(t, s, func(s *spec.Spec) { s.Mesh.GPUsPerNode, s.Mesh.DP, s.Train.Steps = 2, 2, 2 }, nil, RunOptions{Progress: func(ev SetupEvent) {
			if ev.Stage == "shard_ref" && ev.Kind == SetupFinished {
				mu.Lock()
				last[ev.Rank] = ev
				mu.Unlock()
			}
		}})
		return out, last
	}
	sharded, sh := run("false")
	replica, rep := run("true")
	sameAsSharded(t, sharded, replica)
	whole := sh[0].Bytes + sh[1].Bytes
	for rank, ev := range rep {
		if ev.Bytes != whole || ev.TotalBytes != whole || ev.Tensors != ev.TotalTensors {
			t.Errorf("rank %d: the replica's load reported %d of %d bytes (%d of %d tensors), want the whole checkpoint's %d", rank, ev.Bytes, ev.TotalBytes, ev.Tensors, ev.TotalTensors, whole)
		}
	}
	if len(rep) != 2 || whole == 0 || sh[0].Bytes == whole {
		t.Errorf("shard_ref finished on %d ranks; the shards' bytes %d and %d", len(rep), sh[0].Bytes, sh[1].Bytes)
	}
}
