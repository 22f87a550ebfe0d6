# Writes a diagnostic form of gpu/cuda/kernels/gemm.cu's k_gemm_dswiglu
# (the form with its g and u rows in shared-memory chunks) to stdout:
# noepi issues no chunk copies and does no epilogue work (the epilogue
# waits for the staged tile and releases it), which times the products on
# the ring of DS_ST buffers with the staging hand-over alone.
import sys
v = sys.argv[1]
s = open(sys.argv[2]).read()
a = s.index('__device__ __forceinline__ void gemm_dswiglu(')
b = s.index('extern "C" __global__ void __launch_bounds__(512, 1) k_gemm_dswiglu_bf16')
k = s[a:b]
if v == 'noepi':
    i0 = k.index('        if (issuer)\n')
    i1 = k.index('        mb_wait(staged, i & 1);')
    k = k[:i0] + k[i1:]
    x0 = k.index('        for (int c = 0; c < NCH; c++, cc++) {')
    x1 = k.index('        warp_arrive(drained);')
    k = k[:x0] + k[x1:]
sys.stdout.write(s[:a] + k + s[b:])
