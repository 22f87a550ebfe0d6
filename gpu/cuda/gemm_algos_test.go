//go:build cgo

package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// BenchmarkGemmAlgos times, for each matrix product of a Qwen2.5-1.5B
// train step on 16384 tokens (the forward, the backward's input and weight
// gradients, and the log-prob head on a chunk of 2048 rows), the cuBLASLt
// heuristic's first candidate (pick0, the one Gemm uses) and the ones it
// ranks below it (pick1..pick7), to show what timing the candidates
// would gain over taking the first:
//
//	go test -run '^$' -bench GemmAlgos -benchtime 10x ./gpu/cuda
//
// RLPIPE_BENCH_GEMM_DIMS="H,I,KV" times another model's products (hidden
// size, MLP size, k/v width): "2048,11008,256" for Qwen2.5-3B;
// RLPIPE_BENCH_GEMM_CHUNK=C the head's on chunks of C rows (2048). The
// operands hold one value (0.01), unless RLPIPE_BENCH_GEMM_SCRAMBLED=1
// fills the two factors with varied ones: a product of such values draws more power,
// and on a GPU held by its power limit runs slower. A pick the heuristic
// does not offer skips. Without a driver it skips.
func BenchmarkGemmAlgos(bb *testing.B) {
	b := backend(bb)
	const T, V = 16384, 151936
	H, I, KV, C := 1536, 8960, 256, 2048
	if d := os.Getenv("RLPIPE_BENCH_GEMM_DIMS"); d != "" {
		if _, err := fmt.Sscanf(d, "%d,%d,%d", &H, &I, &KV); err != nil {
			bb.Fatalf("RLPIPE_BENCH_GEMM_DIMS=%q: want H,I,KV: %v", d, err)
		}
	}
	if d := os.Getenv("RLPIPE_BENCH_GEMM_CHUNK"); d != "" {
		if _, err := fmt.Sscanf(d, "%d", &C); err != nil || C <= 0 {
			bb.Fatalf("RLPIPE_BENCH_GEMM_CHUNK=%q: want a positive row count (%v)", d, err)
		}
	}
	varied := os.Getenv("RLPIPE_BENCH_GEMM_SCRAMBLED") == "1"
	QKV := H + 2*KV
	type shape struct {
		name               string
		cdt                gpu.DType
		cr, cc, ar, ac, br int
		bc                 int
		transA, transB     bool
		beta               float32
	}
	bf := gpu.BF16
	shapes := []shape{
		{"qkv fwd", bf, T, QKV, T, H, QKV, H, false, true, 0},
		{"q,o fwd", bf, T, H, T, H, H, H, false, true, 0},
		{"k,v fwd", bf, T, KV, T, H, KV, H, false, true, 0},
		{"gate,up fwd", bf, T, I, T, H, I, H, false, true, 0},
		{"down fwd", bf, T, H, T, I, H, I, false, true, 0},
		{"down dW", bf, H, I, T, H, T, I, true, false, 1},
		{"down dX", bf, T, I, T, H, H, I, false, false, 0},
		{"gate,up dW", bf, I, H, T, I, T, H, true, false, 1},
		{"gate,up dX", bf, T, H, T, I, I, H, false, false, 1},
		{"q,o dW", bf, H, H, T, H, T, H, true, false, 1},
		{"q,o dX", bf, T, H, T, H, H, H, false, false, 0},
		{"k,v dW", bf, KV, H, T, KV, T, H, true, false, 1},
		{"k,v dX", bf, T, H, T, KV, KV, H, false, false, 1},
		{"head logits f32", gpu.F32, C, V, C, H, V, H, false, true, 0},
		{"head dW", bf, V, H, C, V, C, H, true, false, 1},
		{"head dX", bf, C, H, C, V, V, H, false, false, 0},
	}
	var most int64 = 3 << 30
	for _, s := range shapes {
		sz := int64(s.cr)*int64(s.cc)*int64(s.cdt.Size()) + 2*(int64(s.ar)*int64(s.ac)+int64(s.br)*int64(s.bc)) + 3*256
		most = max(most, sz)
	}
	mem, err := b.Alloc(most)
	if err != nil {
		bb.Fatal(err)
	}
	defer b.Free(mem)
	ten := func(off int64, dt gpu.DType, r, c int, operand bool) (gpu.Tensor, int64) {
		x, err := gpu.NewTensor(mem, off, dt, r, c)
		if err != nil {
			bb.Fatal(err)
		}
		if varied && operand {
			err = b.Upload(x, scrambled(x.Numel(), 0.05))
		} else {
			err = b.Fill(x, 0.01)
		}
		if err != nil {
			bb.Fatal(err)
		}
		return x, off + (x.Bytes()+255)/256*256
	}
	defer func() { ltPick = -1 }()
	for _, s := range shapes {
		cm, off := ten(0, s.cdt, s.cr, s.cc, false)
		am, off := ten(off, bf, s.ar, s.ac, true)
		bm, _ := ten(off, bf, s.br, s.bc, true)
		k := s.ac
		if s.transA {
			k = s.ar
		}
		flops := 2 * float64(s.cr) * float64(s.cc) * float64(k)
		for pick := range 8 {
			bb.Run(fmt.Sprintf("%s %dx%dx%d/pick%d", s.name, s.cr, s.cc, k, pick), func(sb *testing.B) {
				ltPick = pick
				err := b.Gemm(cm, am, bm, s.transA, s.transB, 1, s.beta)
				if err == nil {
					err = b.Sync()
				}
				if err != nil {
					if pick > 0 && ltOffered <= pick {
						sb.Skipf("the heuristic offers %d candidates", ltOffered)
					}
					sb.Fatal(err)
				}
				sb.ResetTimer()
				for range sb.N {
					if err := b.Gemm(cm, am, bm, s.transA, s.transB, 1, s.beta); err != nil {
						sb.Fatal(err)
					}
				}
				if err := b.Sync(); err != nil {
					sb.Fatal(err)
				}
				sb.StopTimer()
				sb.ReportMetric(flops/(sb.Elapsed().Seconds()/float64(sb.N))/1e12, "TFLOP/s")
			})
		}
	}
}
