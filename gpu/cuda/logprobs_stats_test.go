//go:build cgo

package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
)

// TestLogitsBackwardStats holds LogitsBackward with the row statistics
// LogProbs left (the train step's head) to the same call without them,
// bit for bit: temperatures of 1 and not, entropies tempered or not, in
// the forward or not, rows with and without an entropy gradient (a
// forward without entropies leaves statistics that rows with one cannot
// use: those are read again), the 16-byte and the scalar kernels. It then
// changes row 0's saved log-sum-exp and checks that the backward's result
// for that row alone changes where it can use them (they are read, not
// computed again) and does not where it cannot. LogProbs takes cuBLASLt's
// product and k_lp_fwd here (RLPIPE_CUDA_LP_STORE=0), whose statistics are
// those k_lp_bwd8 computes; TestLogProbsHeadStore checks the one-kernel
// form's.
func TestLogitsBackwardStats(t *testing.T) {
	withStore(t, true)
	e := newEnv(t)
	for _, dt := range []gpu.DType{gpu.BF16, gpu.F32} {
		for _, cfg := range []struct {
			temp               float32
			tempered, fwd, bwd bool
			v                  int
		}{{1, false, true, true, 1000}, {1, false, true, false, 1000}, {0.7, false, true, true, 1000}, {0.7, true, true, true, 20008},
			{1.3, false, false, false, 1000}, {1, false, false, true, 1000}, {0.7, true, true, true, 1003}} {
			c, h, v := 37, 64, cfg.v
			name := fmt.Sprintf("%v T=%v tempered=%v entropy fwd=%v bwd=%v v=%d", dt, cfg.temp, cfg.tempered, cfg.fwd, cfg.bwd, v)
			e.off = 0
			gh, _ := e.in(dt, 1, c, h)
			gw, _ := e.in(dt, 0.3, v, h)
			gtg, _ := e.ids(e.randIDs(c, v))
			gdlp, _ := e.in(gpu.F32, 1, c)
			var gde gpu.Tensor
			if cfg.bwd {
				gde, _ = e.in(gpu.F32, 1, c)
				gz, _ := gde.Flat(3, 6)
				if err := e.g.Zero(gz); err != nil { // rows without an entropy gradient
					t.Fatal(err)
				}
			}
			st, _ := e.out(gpu.F32, c, gpu.LogProbsStatsCols)
			// run does LogProbs and LogitsBackward, with st when stats,
			// and returns dh and dw (accumulated from zero).
			run := func(stats bool, tweak func()) (gpu.Tensor, gpu.Tensor) {
				glog, _ := e.out(gpu.F32, c, v)
				glp, _ := e.out(gpu.F32, c)
				var gent gpu.Tensor
				if cfg.fwd {
					gent, _ = e.out(gpu.F32, c)
				}
				s := gpu.Tensor{}
				if stats {
					s = st
				}
				if err := e.g.LogProbs(glp, gent, gh, gw, gtg, cfg.temp, cfg.tempered, glog, s); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if tweak != nil {
					tweak()
				}
				gdh, _ := e.out(dt, c, h)
				gdw, _ := e.out(gpu.F32, v, h)
				if err := e.g.Zero(gdw); err != nil {
					t.Fatal(err)
				}
				if err := e.g.LogitsBackward(gdh, gdw, gdlp, gde, gh, gw, gtg, cfg.temp, cfg.tempered, glog, s); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return gdh, gdw
			}
			dh0, dw0 := run(false, nil)
			dh1, dw1 := run(true, nil)
			e.sameBits(name+": dh with the statistics against without", dh1, dh0)
			e.sameBits(name+": dw with the statistics against without", dw1, dw0)
			// Row 0's saved log-sum-exp one higher: its gradients change.
			dh2, _ := run(true, func() {
				raw := make([]byte, st.Bytes())
				if err := e.g.DownloadBytes(raw, st); err != nil {
					t.Fatal(err)
				}
				lse := math.Float64frombits(binary.LittleEndian.Uint64(raw))
				binary.LittleEndian.PutUint64(raw, math.Float64bits(lse+1))
				if err := e.g.UploadBytes(st, raw); err != nil {
					t.Fatal(err)
				}
			})
			a, b := make([]byte, dh2.Bytes()), make([]byte, dh0.Bytes())
			if err := e.g.DownloadBytes(a, dh2); err != nil {
				t.Fatal(err)
			}
			if err := e.g.DownloadBytes(b, dh0); err != nil {
				t.Fatal(err)
			}
			// Row 0 has an entropy gradient when bwd: a forward without
			// entropies left it nothing it can use.
			row, usable := h*dt.Size(), cfg.fwd || !cfg.bwd
			if usable && bytes.Equal(a[:row], b[:row]) {
				t.Errorf("%s: row 0's dh did not change with its saved statistics: they were not read", name)
			}
			if !usable && !bytes.Equal(a[:row], b[:row]) {
				t.Errorf("%s: row 0's dh changed with saved statistics it cannot use", name)
			}
			if !bytes.Equal(a[row:], b[row:]) {
				t.Errorf("%s: rows past 0 changed with row 0's saved statistics", name)
			}
		}
	}
}
