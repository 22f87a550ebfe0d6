//go:build cgo

package cuda

/*
#include "rlcuda.h"
*/
import "C"

import (
	"fmt"
	"os"
	"unsafe"
)

// The warp-specialised forward (k_ws_fwd_*, kernels/attention.cu): a
// producer warpgroup, one thread of which has the TMA load the tiles, and
// two consumers (384 threads, one CTA an SM) owning wgBM query rows, with
// wsStages buffers of wsBN-key K and V tiles.
const (
	wsBN      = 128 // WS_BN
	wsStages  = 3   // WS_STAGES
	wsThreads = 3 * 128
)

// attnFwdWS makes the Hopper forward run the warp-specialised kernel
// (RLPIPE_CUDA_FWD_WS=0 runs k_wg_fwd_* instead), and attnFwdPingpong has
// its two consumers take turns to issue their products
// (RLPIPE_CUDA_FWD_PINGPONG=0 turns that off). Both are on by default: on
// the H100 the pair ran the 1.5B shapes' attention forward 1.36× faster
// than k_wg_fwd_* (docs/performance.md).
var (
	attnFwdWS       = os.Getenv("RLPIPE_CUDA_FWD_WS") != "0"
	attnFwdPingpong = os.Getenv("RLPIPE_CUDA_FWD_PINGPONG") != "0"
)

// noTMAEnv is the environment that keeps the attention kernels from the
// TMA (for a driver without tensor maps).
const noTMAEnv = "RLPIPE_CUDA_FWD_WS=0 RLPIPE_CUDA_BWD_TMA=0"

// attnBwdTMA has the Hopper backward's dk/dv pass load its Q and dout
// tiles through the TMA (k_ws_dkv_*) instead of its producer warpgroup's
// cp.async copies (k_wg_dkv_*), and its dq pass its K and V tiles
// (k_ws_dq_* instead of k_wg_dq_*); RLPIPE_CUDA_BWD_TMA=0 turns it off.
var attnBwdTMA = os.Getenv("RLPIPE_CUDA_BWD_TMA") != "0"

// dqTMA turns l, the k_wg_dq_<sfx> launch of tcLaunch for a's batch, into
// the k_ws_dq_<sfx> one: the tensor maps of k and v (64-row boxes) after
// its arguments.
func (b *Backend) dqTMA(l *launch, sfx string, a attnArgs) error {
	ms, err := tensorMaps(b.d, tmapKey{a.k, a.t, a.hkv, a.d, faBN}, tmapKey{a.v, a.t, a.hkv, a.d, faBN})
	if err != nil {
		return err
	}
	l.name = "k_ws_dq_" + sfx
	l.args.put(ms[0][:]).put(ms[1][:])
	return nil
}

// dkvTMA turns l, the k_wg_dkv_<sfx> launch of tcLaunch for a's batch with
// dout at device address dout, into the k_ws_dkv_<sfx> one: the tensor
// maps of q and dout (64-row boxes) after its arguments.
func (b *Backend) dkvTMA(l *launch, sfx string, a attnArgs, dout uint64) error {
	ms, err := tensorMaps(b.d, tmapKey{a.q, a.t, a.hq, a.d, faBN}, tmapKey{dout, a.t, a.hq, a.d, faBN})
	if err != nil {
		return err
	}
	l.name = "k_ws_dkv_" + sfx
	l.args.put(ms[0][:]).put(ms[1][:])
	return nil
}

// CUtensorMap encodings (cuda.h's enums).
const (
	tmapUint16     = 1 // CU_TENSOR_MAP_DATA_TYPE_UINT16: 16-bit elements, copied as they are
	tmapSwizzle128 = 3 // CU_TENSOR_MAP_SWIZZLE_128B
	tmapL2Promo128 = 2 // CU_TENSOR_MAP_L2_PROMOTION_L2_128B
)

// tmapKey identifies a tensor map: a [t, heads, d] tensor of 16-bit
// elements at addr read in boxes of rows tokens.
type tmapKey struct {
	addr              uint64
	t, heads, d, rows int
}

// tmapCacheMax bounds the device's cache of encoded tensor maps (the
// arena's tensors come back at the same addresses every step).
const tmapCacheMax = 4096

// tensorMaps returns the CUtensorMaps of keys (tensorMap), from the
// device's cache or encoded on its worker, whose thread has the context
// current.
func tensorMaps(dev *device, keys ...tmapKey) ([][128]byte, error) {
	out := make([][128]byte, len(keys))
	err := dev.do(func() error {
		if dev.tmaps == nil || len(dev.tmaps) > tmapCacheMax {
			dev.tmaps = map[tmapKey][128]byte{}
		}
		for i, k := range keys {
			m, ok := dev.tmaps[k]
			if !ok {
				var err error
				if m, err = tensorMap(k); err != nil {
					return err
				}
				dev.tmaps[k] = m
			}
			out[i] = m
		}
		return nil
	})
	return out, err
}

// tensorMap encodes the CUtensorMap of k's tensor, read in boxes of 64
// elements × 1 head × k.rows tokens with the 128-byte swizzle (one atom of
// the wgmma tiles of kernels/attention.cu); tokens past k.t read as zeros.
// It must run on the device's worker.
func tensorMap(k tmapKey) ([128]byte, error) {
	var out [128]byte
	// The driver wants the map 64-byte aligned.
	buf := make([]byte, 128+64)
	off := (64 - int(uintptr(unsafe.Pointer(&buf[0]))%64)) % 64
	dims := [3]C.uint64_t{C.uint64_t(k.d), C.uint64_t(k.heads), C.uint64_t(k.t)}
	strides := [2]C.uint64_t{C.uint64_t(2 * k.d), C.uint64_t(2 * k.d * k.heads)}
	box := [3]C.unsigned{64, 1, C.unsigned(k.rows)}
	estr := [3]C.unsigned{1, 1, 1}
	if err := cuErr("cuTensorMapEncodeTiled", C.cuTensorMapEncodeTiled_(unsafe.Pointer(&buf[off]), tmapUint16, 3,
		C.uint64_t(k.addr), &dims[0], &strides[0], &box[0], &estr[0], 0, tmapSwizzle128, tmapL2Promo128, 0)); err != nil {
		return out, fmt.Errorf("tensor map of [%d,%d,%d] at %#x (%s runs attention without the TMA): %w",
			k.t, k.heads, k.d, k.addr, noTMAEnv, err)
	}
	copy(out[:], buf[off:off+128])
	return out, nil
}

// wsLaunch returns the launches of the warp-specialised forward
// (k_ws_fwd_<sfx>) for a's batch, writing out and lse at device addresses
// oa and la, with k_attn_order's block order at ord.
func (b *Backend) wsLaunch(sfx string, a attnArgs, oa, la uint64, scale float32, ord uint64) ([]launch, error) {
	ms, err := tensorMaps(b.d, tmapKey{a.q, a.t, a.hq, a.d, wgBM}, tmapKey{a.k, a.t, a.hkv, a.d, wsBN},
		tmapKey{a.v, a.t, a.hkv, a.d, wsBN})
	if err != nil {
		return nil, err
	}
	pp := 0
	if attnFwdPingpong {
		pp = 1
	}
	nb := (a.t + wgBM - 1) / wgBM
	l := launch{name: "k_ws_fwd_" + sfx, gx: uint32(nb * a.hq), gy: 1, gz: 1, bx: wsThreads, by: 1, bz: 1,
		smem: wsSmem(a.d),
		args: new(kargs).u64(oa).u64(la).put(ms[0][:]).put(ms[1][:]).put(ms[2][:]).u64(a.cu).i32(a.ns1).i32(a.t).i32(a.hq).
			i32(a.hkv).f32(scale).u64(ord).i32(pp)}
	return []launch{orderLaunch(a, wgBM, nb, false, ord), l}, nil
}

// wsSpansLaunch returns the launch of the warp-specialised span forward
// (k_ws_spans_fwd_<sfx>, one CTA per 128 query rows and head) for a's
// spans, writing out and lse at device addresses oa and la.
func (b *Backend) wsSpansLaunch(sfx string, a spanArgs, oa, la uint64, scale float32) (launch, error) {
	ms, err := tensorMaps(b.d, tmapKey{a.q, a.tq, a.hq, a.d, wgBM}, tmapKey{a.k, a.tk, a.hkv, a.d, wsBN},
		tmapKey{a.v, a.tk, a.hkv, a.d, wsBN})
	if err != nil {
		return launch{}, err
	}
	pp := 0
	if attnFwdPingpong {
		pp = 1
	}
	nb := (a.tq + wgBM - 1) / wgBM
	return launch{name: "k_ws_spans_fwd_" + sfx, gx: uint32(nb * a.hq), gy: 1, gz: 1, bx: wsThreads, by: 1, bz: 1,
		smem: wsSmem(a.d),
		args: new(kargs).u64(oa).u64(la).put(ms[0][:]).put(ms[1][:]).put(ms[2][:]).u64(a.r.qk).i32(a.tq).i32(a.tk).
			i32(a.hq).i32(a.hkv).f32(scale).i32(pp)}, nil
}

// wsSmem returns the dynamic shared memory of k_ws_fwd_* at head dim d:
// Q, the K and V buffers, a "full" and an "empty" mbarrier per buffer, and
// 1 KB to align the tiles to 1024 bytes.
func wsSmem(d int) int { return wgBM*d*2 + 2*wsStages*wsBN*d*2 + 2*wsStages*8 + 1024 }
