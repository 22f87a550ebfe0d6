//go:build cgo

package libnccl

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/nccl"
)

// benchLayers are the decoder layers whose collectives
// BenchmarkCollectives times: Qwen2.5-1.5B's and 3B's.
var benchLayers = []struct {
	name string
	cfg  model.Config
}{
	{"1.5B", model.Config{Family: model.FamilyQwen2, HiddenSize: 1536, IntermediateSize: 8960, NumLayers: 1, NumHeads: 12,
		NumKVHeads: 2, HeadDim: 128, VocabSize: 151936, TieWordEmbeddings: true, AttentionBias: true}},
	{"3B", model.Config{Family: model.FamilyQwen2, HiddenSize: 2048, IntermediateSize: 11008, NumLayers: 1, NumHeads: 16,
		NumKVHeads: 2, HeadDim: 128, VocabSize: 151936, TieWordEmbeddings: true, AttentionBias: true}},
}

// BenchmarkCollectives times one decoder layer's collectives over the
// machine's GPUs (RLPIPE_BENCH_NCCL_RANKS of them, all by default; two at
// least): its float32 grads reduce-scattered and its bf16 params
// all-gathered, each as the train stage issues them (one NCCL group of a
// call per parameter, the parameters at their gathered offsets) and as
// one call on the same bytes laid out rank by rank (as FSDP2 issues
// them). It reports the time a collective and NCCL's bus bandwidth
// (bytes a rank sends or receives, (n−1)/n of the gathered buffer, over
// the time).
func BenchmarkCollectives(bb *testing.B) {
	n := 0
	if s := os.Getenv("RLPIPE_BENCH_NCCL_RANKS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 2 {
			bb.Fatalf("RLPIPE_BENCH_NCCL_RANKS=%q: want a count of 2 or more", s)
		}
	} else if info, err := cuda.Versions(); err == nil {
		n = len(info.Devices)
	}
	bs := cudaBackends(bb, max(n, 2))
	gbs := make([]gpu.Backend, len(bs))
	for i, b := range bs {
		gbs[i] = b
	}
	cs, err := NewComms(gbs)
	if err != nil {
		bb.Fatal(err)
	}
	bb.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	for _, l := range benchLayers {
		slots := l.cfg.Layout(l.cfg.Units()[1], len(bs))
		elems := model.LayoutElems(slots)
		mems := make([]gpu.Memory, len(bs))
		for r, b := range bs {
			if mems[r], err = b.Alloc(elems * 4 * 2); err != nil {
				bb.Fatal(err)
			}
			bb.Cleanup(func() { b.Free(mems[r]) })
		}
		for _, c := range []struct {
			name    string
			dt      gpu.DType
			gather  bool
			grouped bool
		}{
			{"reduce-scatter f32 per parameter", gpu.F32, false, true},
			{"reduce-scatter f32 flat", gpu.F32, false, false},
			{"all-gather bf16 per parameter", gpu.BF16, true, true},
			{"all-gather bf16 flat", gpu.BF16, true, false},
		} {
			bb.Run(fmt.Sprintf("%s %s/%d ranks", l.name, c.name, len(bs)), func(bb *testing.B) {
				ops := make([]func() error, len(bs))
				for r := range bs {
					var err error
					if ops[r], err = layerCollective(context.Background(), cs[r], mems[r], slots, elems, len(bs), c.dt, c.gather, c.grouped); err != nil {
						bb.Fatal(err)
					}
				}
				run := func(iters int) error {
					errs := make([]error, len(bs))
					var wg sync.WaitGroup
					for r := range bs {
						wg.Go(func() {
							for range iters {
								if errs[r] = ops[r](); errs[r] != nil {
									return
								}
							}
							errs[r] = bs[r].Sync()
						})
					}
					wg.Wait()
					for r, err := range errs {
						if err != nil {
							return fmt.Errorf("rank %d: %w", r, err)
						}
					}
					return nil
				}
				if err := run(3); err != nil { // NCCL connects on first use
					bb.Fatal(err)
				}
				bb.ResetTimer()
				t0 := time.Now()
				if err := run(bb.N); err != nil {
					bb.Fatal(err)
				}
				per := time.Since(t0).Seconds() / float64(bb.N)
				moved := float64(elems*int64(c.dt.Size())) * float64(len(bs)-1) / float64(len(bs))
				bb.ReportMetric(per*1e6, "µs/op")
				bb.ReportMetric(moved/per/1e9, "busGB/s")
			})
		}
	}
}

// layerCollective returns one rank's collective of BenchmarkCollectives on
// mem: a reduce-scatter (or, with gather, an all-gather) of the gathered
// layout of slots (elems elements of dt) and the rank's slice of it,
// grouped per slot or as one call.
func layerCollective(ctx context.Context, c nccl.Comm, mem gpu.Memory, slots []model.Slot, elems int64, world int, dt gpu.DType, gather, grouped bool) (func() error, error) {
	full, err := gpu.NewTensor(mem, 0, dt, int(elems))
	if err != nil {
		return nil, err
	}
	part, err := gpu.NewTensor(mem, elems*int64(dt.Size()), dt, int(elems)/world)
	if err != nil {
		return nil, err
	}
	if !grouped {
		if gather {
			return func() error { return c.AllGather(ctx, full, part) }, nil
		}
		return func() error { return c.ReduceScatter(ctx, part, full, nccl.Avg) }, nil
	}
	var fulls, parts []gpu.Tensor
	var sliceOff int64
	for _, s := range slots {
		f, err := full.Flat(int(s.Offset), int(s.Offset+s.PaddedElems()))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		p, err := part.Flat(int(sliceOff), int(sliceOff+s.ShardElems()))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		sliceOff += s.ShardElems()
		fulls, parts = append(fulls, f), append(parts, p)
	}
	g := c.(*cudaComm)
	if gather {
		return func() error { return g.AllGatherGroup(ctx, fulls, parts) }, nil
	}
	return func() error { return g.ReduceScatterGroup(ctx, parts, fulls, nccl.Avg) }, nil
}
