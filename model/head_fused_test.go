package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
)

// lpFusedBackend is the CPU backend with a LogProbsFused that runs LogProbs
// (the same bits) and then fills the workspace with NaN, as the fused op
// leaves no logits there; or refuses (refuse) or fails (fail). It counts
// its calls.
type lpFusedBackend struct {
	gpu.Backend
	refuse, fail bool
	calls        int
}

func (b *lpFusedBackend) LogProbsFused(logp, h, w, targets gpu.Tensor, temperature float32, scratch gpu.Tensor) error {
	b.calls++
	switch {
	case b.refuse:
		return fmt.Errorf("test: %w", gpu.ErrNotFused)
	case b.fail:
		return errors.New("test: the fused head failed")
	}
	if err := b.LogProbs(logp, gpu.Tensor{}, h, w, targets, temperature, false, scratch, gpu.Tensor{}); err != nil {
		return err
	}
	return b.Fill(scratch, float32(math.NaN()))
}

// HeadForward takes LogProbsFused for every chunk when no entropy is asked
// for, with the log-probs LogProbs gives; with entropies, or where the
// backend refuses, it takes LogProbs; a failing fused op fails it. HeadStep
// never takes it (its LogitsBackward reads the logits LogProbs leaves).
func TestHeadForwardFused(t *testing.T) {
	const n, h, v, chunk = 11, 16, 40, 4
	r := rand.New(rand.NewPCG(5, 6))
	rnd := func(k int, scale float64) []float32 {
		x := make([]float32, k)
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		return x
	}
	norm, lm, rowsData := rnd(h, 0.1), rnd(v*h, 0.5), rnd(n*h, 1)
	for i := range norm {
		norm[i]++
	}
	targets := make([]int32, n)
	for i := range targets {
		targets[i] = int32(r.IntN(v))
	}
	c := &Config{RMSNormEps: 1e-6, VocabSize: v, HiddenSize: h}
	forward := func(b gpu.Backend, withEnt bool) ([]float32, error) {
		a := newTestArena(t, b, 1<<20)
		w := HeadWeights{Norm: a.f32(norm), LMHead: a.f32(lm)}
		w.LMHead.Shape = []int{v, h}
		rows := a.f32(rowsData)
		rows.Shape = []int{n, h}
		logp := a.tensor(gpu.F32, n)
		var ent gpu.Tensor
		if withEnt {
			ent = a.tensor(gpu.F32, n)
		}
		err := c.HeadForward(b, w, rows, a.tensor(gpu.F32, n, h), a.tensor(gpu.F32, n), a.i32(targets), logp, ent,
			a.tensor(gpu.F32, chunk, v), chunk, Sampling{Temperature: 0.8})
		return a.down(logp), err
	}
	want, err := forward(cpu.New(), false)
	if err != nil {
		t.Fatal(err)
	}
	chunks := (n + chunk - 1) / chunk
	for _, tc := range []struct {
		name            string
		refuse, withEnt bool
		calls           int
	}{
		{"fused", false, false, chunks},
		{"with entropy", false, true, 0},
		{"refused", true, false, chunks},
	} {
		b := &lpFusedBackend{Backend: cpu.New(), refuse: tc.refuse}
		got, err := forward(b, tc.withEnt)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if b.calls != tc.calls {
			t.Errorf("%s: %d LogProbsFused calls, want %d", tc.name, b.calls, tc.calls)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: log-probs %v, want LogProbs' %v", tc.name, got, want)
		}
	}
	b := &lpFusedBackend{Backend: cpu.New(), fail: true}
	if _, err := forward(b, false); err == nil || errors.Is(err, gpu.ErrNotFused) {
		t.Errorf("a failing LogProbsFused: head forward error %v, want the op's", err)
	}
	// HeadStep reads the logits LogProbs leaves in the workspace: a fused
	// op there would leave NaN (this backend's) and fail TestHeadStep's
	// equality; here it must not be called at all.
	sb := &lpFusedBackend{Backend: cpu.New()}
	headStepCase(t, sb, gpu.F32, false, n, h, v, chunk)
	if sb.calls != 1*chunks {
		// HeadStep's half of headStepCase takes no fused op; its
		// HeadForward half takes one a chunk.
		t.Errorf("HeadForward+HeadBackward and HeadStep: %d LogProbsFused calls, want %d (HeadForward's only)", sb.calls, chunks)
	}
}
