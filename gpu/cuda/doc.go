// Package cuda is the NVIDIA GPU implementation of gpu.Backend.
//
// Nothing of CUDA is needed to build it (gcc only): at run time it dlopens
// libcuda.so.1 (driver API), libnvrtc and libcublasLt, resolves the symbols
// it needs into tables and calls them through small C trampolines
// (rlcuda.c). Libraries are searched in $RLPIPE_CUDA_LIB_DIR,
// $LD_LIBRARY_PATH, the dynamic loader's default path, the usual toolkit and
// driver directories, and the lib folders of NVIDIA's Python wheels.
//
// Kernels are the embedded kernels/*.cu sources, compiled by NVRTC for the
// device's architecture (sm_XY) with exact float math (no fast math, no FMA
// contraction, so float32 expressions round as in gpu/cpu) and cached on disk
// by (source, options, architecture, NVRTC version) under
// $RLPIPE_CACHE_DIR/kernels or os.UserCacheDir()/rlpipe/kernels.
//
// All CUDA calls of a backend run on one goroutine locked to an OS thread,
// which keeps the device's primary context current; an op is one closure
// sent to it, usually one cgo crossing per kernel launch or matrix product.
// Ops are asynchronous on the view's stream (Backend.On).
//
// Matrix products go through cuBLASLt with float32 compute
// (CUBLAS_COMPUTE_32F: TF32 is never used) when A and B share a dtype and C
// has that dtype or F32; other combinations use a SIMT fallback kernel. The
// cuBLASLt workspace (32 MiB, the "cublas.workspace" of the memory plan) is
// part of one internal device allocation made by New, together with a 4-byte
// device error flag; each stream also owns a 4 MiB buffer for reduction
// partials (the memory plan's backend reserve counts both). No op allocates
// memory.
//
// Attention on bf16/f16 with head dims 64 and 128 is a FlashAttention-2-style
// tensor-core kernel (mma.sync), forward and a deterministic backward; other
// cases use exact CUDA-core kernels. Elementwise and row kernels have 8-wide
// variants (16-byte loads) used when sizes and alignment allow, with the same
// per-element arithmetic as the scalar ones; RLPIPE_CUDA_SCALAR=1 turns them
// off. Reductions accumulate in float64 in a fixed order, so results do not
// depend on timing.
package cuda
