package stages

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

// TestSetupProgress runs the setup of the embedded default on two ranks and
// checks each rank's setup events: every stage started, reported and
// finished in order, load_hf with the checkpoint's totals (on rank 0),
// apply_fsdp2 once per tensor up to the rank's totals, whose sum over the
// ranks is the checkpoint; then the end of the setup. The ref, a copy of
// the actor, reads nothing, sharded (its shards are copied) or
// replicated (gathered from the actor's shards).
func TestSetupProgress(t *testing.T) {
	for _, replicate := range []bool{false, true} {
		t.Run(fmt.Sprint("replicate ", replicate), func(t *testing.T) { checkSetupProgress(t, replicate) })
	}
}

// checkSetupProgress is TestSetupProgress with the ref replicated or not.
func checkSetupProgress(t *testing.T, replicate bool) {
	var mu sync.Mutex
	events := map[int][]SetupEvent{}
	opts := RunOptions{Steps: -1, Progress: func(ev SetupEvent) {
		mu.Lock()
		events[ev.Rank] = append(events[ev.Rank], ev)
		mu.Unlock()
	}}
	job := variant(t, filepath.Join("..", "examples", "tiny-grpo.yaml"), "      with: {model: ref}", fmt.Sprintf("      with: {model: ref, replicate: %v}", replicate))
	runParsed(t, job, func(s *spec.Spec) { s.Mesh.GPUsPerNode, s.Mesh.DP = 2, 2 }, nil, opts)
	if len(events) != 2 {
		t.Fatalf("events from %d ranks, want 2", len(events))
	}
	var ckTensors int
	var ckBytes int64
	shardBytes := map[string]int64{}
	for rank, evs := range events {
		var got []string // the sequence, progress events collapsed
		for i, ev := range evs {
			if ev.Rank != rank || ev.World != 2 {
				t.Errorf("rank %d: event %d from rank %d of %d", rank, i, ev.Rank, ev.World)
			}
			s := fmt.Sprintf("%s %s", ev.Kind, ev.Stage)
			if len(got) == 0 || got[len(got)-1] != s {
				got = append(got, s)
			}
			switch {
			case ev.Kind == SetupProgress && ev.Uses == "load_hf":
				if ev.Tensors != 0 || ev.Bytes != 0 || ev.TotalTensors == 0 || ev.TotalBytes == 0 {
					t.Errorf("rank %d: load_hf reports %+v, want the checkpoint's totals and nothing read", rank, ev)
				}
				ckTensors, ckBytes = ev.TotalTensors, ev.TotalBytes
			case ev.Kind == SetupProgress:
				if prev := evs[i-1]; prev.Kind == SetupProgress && (ev.Tensors != prev.Tensors+1 || ev.Bytes <= prev.Bytes) {
					t.Errorf("rank %d: %s progress %d tensors, %d bytes after %d, %d: want one tensor more", rank, ev.Stage, ev.Tensors, ev.Bytes, prev.Tensors, prev.Bytes)
				}
			case ev.Kind == SetupFinished && ev.Uses == "load_hf":
				if ev.Seconds <= 0 || ev.Tensors != 0 || ev.Bytes != 0 || (rank == 0) != (ev.TotalBytes > 0) {
					t.Errorf("rank %d: %s finished with %+v, want its time and the checkpoint's totals", rank, ev.Stage, ev)
				}
			case ev.Kind == SetupFinished:
				if ev.Seconds <= 0 || ev.Tensors != ev.TotalTensors || ev.Bytes != ev.TotalBytes {
					t.Errorf("rank %d: %s finished with %+v, want its time and every tensor read", rank, ev.Stage, ev)
				}
				shardBytes[ev.Model] += ev.Bytes
			}
		}
		// The ref, a copy_of the actor, is copied from the actor's shards
		// (or, replicated, gathered from them): it reads nothing and
		// reports no progress.
		want := []string{"started load", "progress load", "finished load",
			"started shard_actor", "progress shard_actor", "finished shard_actor",
			"started shard_ref", "finished shard_ref", "done "}
		if rank != 0 {
			want = slices.Delete(want, 1, 2) // the checkpoint's totals are rank 0's
		}
		if !slices.Equal(got, want) {
			t.Errorf("rank %d: events\n%q\nwant\n%q", rank, got, want)
		}
		if last := evs[len(evs)-1]; last.Seconds <= 0 {
			t.Errorf("rank %d: setup done in %v s", rank, last.Seconds)
		}
		if ev := evs[1]; ev.Model != "actor" || ev.Uses != "load_hf" {
			t.Errorf("rank %d: load reports model %q of %q", rank, ev.Model, ev.Uses)
		}
	}
	if shardBytes["actor"] != ckBytes {
		t.Errorf("the ranks read %d bytes into actor's shards, want the checkpoint's %d (%d tensors)", shardBytes["actor"], ckBytes, ckTensors)
	}
	if shardBytes["ref"] != 0 {
		t.Errorf("the ranks read %d bytes into ref's shards or replicas, want 0 (a copy of actor's)", shardBytes["ref"])
	}
}
