package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/nccl"
)

// ringTensor allocates a tensor on the CPU backend b holding vals (zeros
// when nil).
func ringTensor(t *testing.T, b *cpu.Backend, dt gpu.DType, vals []float32, shape ...int) gpu.Tensor {
	t.Helper()
	n := 1
	for _, d := range shape {
		n *= d
	}
	mem, err := b.Alloc(int64(n * dt.Size()))
	if err != nil {
		t.Fatal(err)
	}
	x, err := gpu.NewTensor(mem, 0, dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	if vals != nil {
		if err := b.Upload(x, vals); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

func download(t *testing.T, b *cpu.Backend, x gpu.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Numel())
	if err := b.Download(out, x); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestZigzagLayout checks the chunks a rank holds and the spans of the
// blocks it sees.
func TestZigzagLayout(t *testing.T) {
	z, err := NewZigzagLayout(1, 2, []int{8, 5})
	if err != nil {
		t.Fatal(err)
	}
	// Sequence 0: 8 rows, chunks of 2; rank 1 holds chunks 1 and 2
	// (positions 2,3 and 4,5). Sequence 1: 5 rows padded to 8, the same.
	wantPos := []int{2, 3, 4, 5, 2, 3, 4, 5}
	for i, want := range wantPos {
		if s, pos := z.Global(i); pos != want || s != i/4 {
			t.Errorf("row %d: sequence %d position %d, want %d %d", i, s, pos, i/4, want)
		}
	}
	if got := fmt.Sprint(z.Spans(0), z.Spans(1)); got != "[{0 4 0 2} {4 4 4 2}] [{2 2 0 4} {6 2 4 4}]" {
		t.Errorf("spans from ranks 0 and 1: %s", got)
	}
	if _, err := NewZigzagLayout(2, 2, nil); err == nil {
		t.Error("rank 2 of 2 accepted")
	}
}

// TestRingAttention splits packed sequences over cp ranks in zigzag order,
// runs ring attention forward and backward on each rank (goroutines, the
// CPU backend, a loopback ring) and checks every rank's out, lse, dq, dk
// and dv against attention of the whole sequences, to 1e-5 in fp32.
func TestRingAttention(t *testing.T) {
	const hq, hkv, d = 4, 2, 8
	scale := float32(1 / math.Sqrt(d))
	lengths := []int{13, 32, 6}
	for _, cp := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("cp %d", cp), func(t *testing.T) {
			// The reference: whole sequences, each padded as the layout
			// pads it (padding rows come last, so they change nothing
			// before them).
			var padded []int
			cu := []int32{0}
			for _, n := range lengths {
				p := (n + 2*cp - 1) / (2 * cp) * 2 * cp
				padded = append(padded, p)
				cu = append(cu, cu[len(cu)-1]+int32(p))
			}
			tg := int(cu[len(cu)-1])
			rng := rand.New(rand.NewPCG(1, uint64(cp)))
			rnd := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				return v
			}
			qv, kv, vv, gv := rnd(tg*hq*d), rnd(tg*hkv*d), rnd(tg*hkv*d), rnd(tg*hq*d)
			b := cpu.New()
			q, k, v := ringTensor(t, b, gpu.F32, qv, tg, hq, d), ringTensor(t, b, gpu.F32, kv, tg, hkv, d), ringTensor(t, b, gpu.F32, vv, tg, hkv, d)
			dout := ringTensor(t, b, gpu.F32, gv, tg, hq, d)
			cuT := ringTensor(t, b, gpu.I32, nil, len(cu))
			if err := b.UploadI32(cuT, cu); err != nil {
				t.Fatal(err)
			}
			out, lse := ringTensor(t, b, gpu.F32, nil, tg, hq, d), ringTensor(t, b, gpu.F32, nil, hq, tg)
			dq, dk, dv := ringTensor(t, b, gpu.F32, nil, tg, hq, d), ringTensor(t, b, gpu.F32, nil, tg, hkv, d), ringTensor(t, b, gpu.F32, nil, tg, hkv, d)
			if err := b.Attention(out, lse, q, k, v, cuT, scale); err != nil {
				t.Fatal(err)
			}
			if err := b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, cuT, scale); err != nil {
				t.Fatal(err)
			}
			ref := map[string][]float32{"out": download(t, b, out), "lse": download(t, b, lse), "dq": download(t, b, dq), "dk": download(t, b, dk), "dv": download(t, b, dv)}

			comms := nccl.NewLoopback(cp)
			errs := make([]error, cp)
			var wg sync.WaitGroup
			for r := range cp {
				wg.Go(func() { errs[r] = ringRank(t, r, cp, padded, cu, hq, hkv, d, scale, qv, kv, vv, gv, ref, comms[r]) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// ringRank is one rank of TestRingAttention: it takes its zigzag rows of
// the global inputs, runs ring attention and compares with the reference.
func ringRank(t *testing.T, r, cp int, padded []int, cu []int32, hq, hkv, d int, scale float32, qv, kv, vv, gv []float32, ref map[string][]float32, comm nccl.Comm) error {
	z, err := NewZigzagLayout(r, cp, padded)
	if err != nil {
		return err
	}
	b := cpu.NewWithThreads(1)
	tl, tg := z.Rows(), int(cu[len(cu)-1])
	rowOf := make([]int, tl) // global row of each local row
	for i := range rowOf {
		s, pos := z.Global(i)
		rowOf[i] = int(cu[s]) + pos
	}
	pick := func(src []float32, heads int) []float32 {
		out := make([]float32, 0, tl*heads*d)
		for _, g := range rowOf {
			out = append(out, src[g*heads*d:(g+1)*heads*d]...)
		}
		return out
	}
	q, k, v := ringTensor(t, b, gpu.F32, pick(qv, hq), tl, hq, d), ringTensor(t, b, gpu.F32, pick(kv, hkv), tl, hkv, d), ringTensor(t, b, gpu.F32, pick(vv, hkv), tl, hkv, d)
	dout := ringTensor(t, b, gpu.F32, pick(gv, hq), tl, hq, d)
	cuT := ringTensor(t, b, gpu.I32, nil, len(z.Start))
	if err := b.UploadI32(cuT, z.CuSeqlens()); err != nil {
		return err
	}
	kvT := func() gpu.Tensor { return ringTensor(t, b, gpu.F32, nil, tl, hkv, d) }
	sc := &RingScratch{K: kvT(), V: kvT(), K2: kvT(), V2: kvT(), DK: kvT(), DV: kvT(), DK2: kvT(), DV2: kvT(), BK: kvT(), BV: kvT(),
		Out: ringTensor(t, b, gpu.F32, nil, tl, hq, d), LSE: ringTensor(t, b, gpu.F32, nil, hq, tl), DQ: ringTensor(t, b, gpu.F32, nil, tl, hq, d)}
	out, lse := ringTensor(t, b, gpu.F32, nil, tl, hq, d), ringTensor(t, b, gpu.F32, nil, hq, tl)
	dq, dk, dv := ringTensor(t, b, gpu.F32, nil, tl, hq, d), kvT(), kvT()
	ring := nccl.HostRing{C: comm}
	ctx := context.Background()
	if err := RingAttentionForward(ctx, b, ring, z, out, lse, q, k, v, cuT, sc, scale); err != nil {
		return fmt.Errorf("rank %d: %w", r, err)
	}
	if err := RingAttentionBackward(ctx, b, ring, z, dq, dk, dv, dout, out, lse, q, k, v, cuT, sc, scale); err != nil {
		return fmt.Errorf("rank %d: %w", r, err)
	}
	got := map[string][]float32{"out": download(t, b, out), "dq": download(t, b, dq), "dk": download(t, b, dk), "dv": download(t, b, dv)}
	for name, heads := range map[string]int{"out": hq, "dq": hq, "dk": hkv, "dv": hkv} {
		want := pick(ref[name], heads)
		for i := range want {
			if diff := math.Abs(float64(got[name][i] - want[i])); diff > 1e-5*max(1, math.Abs(float64(want[i]))) {
				return fmt.Errorf("rank %d of %d: %s[%d] (row %d) = %v, whole-sequence attention gives %v", r, cp, name, i, rowOf[i/(heads*d)], got[name][i], want[i])
			}
		}
	}
	gl := download(t, b, lse)
	for h := range hq {
		for i, g := range rowOf {
			if want := ref["lse"][h*tg+g]; math.Abs(float64(gl[h*tl+i]-want)) > 1e-5*max(1, math.Abs(float64(want))) {
				return fmt.Errorf("rank %d of %d: lse[%d,%d] = %v, want %v", r, cp, h, i, gl[h*tl+i], want)
			}
		}
	}
	return nil
}

// TestLayerRingAttention runs a whole decoder layer (Qwen3: q/k norms,
// RoPE, GQA) forward and backward with its sequences split over cp ranks
// in zigzag order, attention by ring attention (Batch.Attend) and the
// rest of the layer on each rank's rows with their global positions, and
// checks each rank's outputs and input gradients against the layer on the
// whole sequences, and the ranks' weight gradients summed against the
// whole's, to 1e-4 in fp32.
func TestLayerRingAttention(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen3")
	lengths := []int{7, 12}
	for _, cp := range []int{2, 4} {
		t.Run(fmt.Sprintf("cp %d", cp), func(t *testing.T) {
			// The whole sequences, padded as the layout pads them.
			cu, pos := []int32{0}, []int32{}
			var padded []int
			for _, n := range lengths {
				p := (n + 2*cp - 1) / (2 * cp) * 2 * cp
				padded = append(padded, p)
				cu = append(cu, cu[len(cu)-1]+int32(p))
				for i := range p {
					pos = append(pos, int32(i))
				}
			}
			tg := int(cu[len(cu)-1])
			b := cpu.New()
			a := newTestArena(t, b, 64<<20)
			m := loadTestModel(t, a, dir)
			c := m.c
			h := c.HiddenSize
			rng := rand.New(rand.NewPCG(7, uint64(cp)))
			inVals, dresVals := make([]float32, tg*h), make([]float32, tg*h)
			for i := range inVals {
				inVals[i], dresVals[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64()*0.1)
			}
			whole := layerPass(t, a, m, inVals, dresVals, Batch{Positions: a.i32(pos), CuSeqlens: a.i32(cu), T: tg})

			comms := nccl.NewLoopback(cp)
			type rankRun struct {
				a       *testArena
				m       *testModel
				rowOf   []int
				in, dr  []float32
				z       ZigzagLayout
				cuT     gpu.Tensor
				posT    gpu.Tensor
				sc      *RingScratch
				results layerResult
				err     error
			}
			runs := make([]*rankRun, cp)
			for r := range cp {
				z, err := NewZigzagLayout(r, cp, padded)
				if err != nil {
					t.Fatal(err)
				}
				rb := cpu.NewWithThreads(1)
				ra := newTestArena(t, rb, 64<<20)
				rr := &rankRun{a: ra, m: loadTestModel(t, ra, dir), z: z}
				tl := z.Rows()
				lpos := make([]int32, tl)
				for i := range tl {
					s, p := z.Global(i)
					lpos[i] = int32(p)
					g := int(cu[s]) + p
					rr.rowOf = append(rr.rowOf, g)
					rr.in = append(rr.in, inVals[g*h:(g+1)*h]...)
					rr.dr = append(rr.dr, dresVals[g*h:(g+1)*h]...)
				}
				rr.posT, rr.cuT = ra.i32(lpos), ra.i32(z.CuSeqlens())
				kv := func() gpu.Tensor { return ra.tensor(gpu.F32, tl, c.NumKVHeads, c.HeadDim) }
				rr.sc = &RingScratch{K: kv(), V: kv(), K2: kv(), V2: kv(), DK: kv(), DV: kv(), DK2: kv(), DV2: kv(), BK: kv(), BV: kv(),
					Out: ra.tensor(gpu.F32, tl, c.NumHeads, c.HeadDim), LSE: ra.tensor(gpu.F32, c.NumHeads, tl), DQ: ra.tensor(gpu.F32, tl, c.NumHeads, c.HeadDim)}
				runs[r] = rr
			}
			var wg sync.WaitGroup
			for r, rr := range runs {
				wg.Go(func() {
					rb := rr.a.b.(RingBackend)
					ring := nccl.HostRing{C: comms[r]}
					ctx := context.Background()
					batch := Batch{Positions: rr.posT, CuSeqlens: rr.cuT, T: rr.z.Rows(),
						Attend: func(out, lse, q, k, v gpu.Tensor, scale float32) error {
							return RingAttentionForward(ctx, rb, ring, rr.z, out, lse, q, k, v, rr.cuT, rr.sc, scale)
						},
						AttendBackward: func(dq, dk, dv, dout, out, lse, q, k, v gpu.Tensor, scale float32) error {
							return RingAttentionBackward(ctx, rb, ring, rr.z, dq, dk, dv, dout, out, lse, q, k, v, rr.cuT, rr.sc, scale)
						}}
					rr.results, rr.err = layerPassErr(rr.a, rr.m, rr.in, rr.dr, batch)
				})
			}
			wg.Wait()
			dw := make([]float32, len(whole.dw))
			for r, rr := range runs {
				if rr.err != nil {
					t.Fatalf("rank %d: %v", r, rr.err)
				}
				for i, g := range rr.rowOf {
					for name, pair := range map[string][2][]float32{"out": {rr.results.out, whole.out}, "din": {rr.results.din, whole.din}} {
						got, want := pair[0][i*h:(i+1)*h], pair[1][g*h:(g+1)*h]
						for e := range got {
							if math.Abs(float64(got[e]-want[e])) > 1e-4*max(1, math.Abs(float64(want[e]))) {
								t.Fatalf("rank %d row %d (global %d): %s[%d] = %v, whole-sequence layer gives %v", r, i, g, name, e, got[e], want[e])
							}
						}
					}
				}
				for i, v := range rr.results.dw {
					dw[i] += v
				}
			}
			var num, den float64
			for i := range dw {
				num += float64(dw[i]-whole.dw[i]) * float64(dw[i]-whole.dw[i])
				den += float64(whole.dw[i]) * float64(whole.dw[i])
			}
			if rel := math.Sqrt(num / den); rel > 1e-4 {
				t.Errorf("weight gradients summed over the ranks differ from the whole's: relative error %.3g", rel)
			}
		})
	}
}

// layerResult is what one layer pass gives: the output rows, the gradient
// of the layer's input, and the layer's weight gradients.
type layerResult struct{ out, din, dw []float32 }

// layerPass runs layer 0 of m forward and backward on in with the
// residual gradient dres, in fp32.
func layerPass(t *testing.T, a *testArena, m *testModel, in, dres []float32, batch Batch) layerResult {
	t.Helper()
	r, err := layerPassErr(a, m, in, dres, batch)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// layerPassErr is layerPass for a goroutine: tensors are allocated from a
// before the pass and errors are returned.
func layerPassErr(a *testArena, m *testModel, inVals, dresVals []float32, batch Batch) (layerResult, error) {
	b, c := a.b, m.c
	tt, h := batch.T, c.HiddenSize
	w, err := c.LayerWeightsFrom(m.units[1], m.slots[1], m.master[1])
	if err != nil {
		return layerResult{}, err
	}
	dwBuf := a.tensor(gpu.F32, int(LayoutElems(m.slots[1])))
	if err := b.Zero(dwBuf); err != nil {
		return layerResult{}, err
	}
	dw, err := c.LayerWeightsFrom(m.units[1], m.slots[1], dwBuf)
	if err != nil {
		return layerResult{}, err
	}
	acts := newActs(a, c, tt, gpu.F32)
	gb := newGradBufs(a, c, tt, gpu.F32)
	in, out, dres := a.tensor(gpu.F32, tt, h), a.tensor(gpu.F32, tt, h), a.tensor(gpu.F32, tt, h)
	if err := b.Upload(in, inVals); err != nil {
		return layerResult{}, err
	}
	if err := b.Upload(dres, dresVals); err != nil {
		return layerResult{}, err
	}
	if err := c.LayerForward(b, w, &acts, in, out, batch); err != nil {
		return layerResult{}, err
	}
	if err := c.LayerBackward(b, w, dw, &acts, &gb, in, dres, batch); err != nil {
		return layerResult{}, err
	}
	var r layerResult
	for _, x := range []struct {
		dst *[]float32
		t   gpu.Tensor
	}{{&r.out, out}, {&r.din, dres}, {&r.dw, dwBuf}} {
		*x.dst = make([]float32, x.t.Numel())
		if err := b.Download(*x.dst, x.t); err != nil {
			return layerResult{}, err
		}
	}
	return r, nil
}
