// rlcuda.h declares the C side of package cuda: the types it needs from the
// CUDA headers (declared here so that none is needed at build time), the
// dlsym tables and the trampolines that call through them.
#ifndef RLCUDA_H
#define RLCUDA_H
#include <stdint.h>
#include <stddef.h>

// The few driver, NVRTC and cuBLASLt types this package needs, declared here
// so that no CUDA header is needed at build time.
typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef void* CUevent;
typedef unsigned long long CUdeviceptr;
typedef void* nvrtcProgram;
typedef int nvrtcResult;
typedef int cublasStatus_t;
typedef void* cublasLtHandle_t;
typedef void* cublasLtMatmulDesc_t;
typedef void* cublasLtMatrixLayout_t;
typedef void* cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } rlLtAlgo;
typedef struct {
	rlLtAlgo algo;
	size_t workspaceSize;
	cublasStatus_t state;
	float wavesCount;
	int reserved[4];
} rlLtHeuristic;

// rlLtCall describes one row-major-agnostic cuBLASLt matmul in cuBLAS's own
// column-major terms: D(m×n) = alpha*op(A)op(B) + beta*C, where D is at d
// (C's address when d is 0) with C's layout.
typedef struct {
	uint64_t handle, a, b, c, d, workspace, stream;
	uint64_t arows, acols, brows, bcols, m, n;
	int64_t lda, ldb, ldc;
	uint64_t wsSize;
	int32_t transa, transb, atype, btype, ctype, computeType, scaleType, haveAlgo;
	uint32_t alignA, alignB, alignC, alignD;
	float alpha, beta;
	rlLtAlgo algo;
	// pick, when above 0 and no algorithm is given, takes the heuristic's
	// pick-th candidate (0 is its first choice) instead of its first; got
	// returns how many candidates it offered.
	int32_t pick, got;
} rlLtCall;

int rl_resolve(int lib, void* h);
const char* rl_symname(int lib, int i);
CUresult cuInit_(unsigned f);
CUresult cuDriverGetVersion_(int* v);
CUresult cuDeviceGetCount_(int* n);
CUresult cuDeviceGet_(CUdevice* d, int i);
CUresult cuDeviceGetName_(char* s, int n, CUdevice d);
CUresult cuDeviceGetAttribute_(int* v, int a, CUdevice d);
CUresult cuDeviceTotalMem_(size_t* b, CUdevice d);
CUresult cuDevicePrimaryCtxRetain_(uint64_t* c, CUdevice d);
CUresult cuDevicePrimaryCtxRelease_(CUdevice d);
CUresult cuCtxSetCurrent_(uint64_t c);
CUresult cuCtxSynchronize_(void);
CUresult cuMemAlloc_(CUdeviceptr* p, size_t n);
CUresult cuMemFree_(CUdeviceptr p);
CUresult cuMemAllocHost_(void** p, size_t n);
CUresult cuMemFreeHost_(void* p);
CUresult cuMemGetInfo_(size_t* f, size_t* t);
CUresult cuMemcpyHtoDAsync_(CUdeviceptr d, const void* s, size_t n, uint64_t st);
CUresult cuMemcpyDtoHAsync_(void* d, CUdeviceptr s, size_t n, uint64_t st);
CUresult cuMemcpyAsync_(CUdeviceptr d, CUdeviceptr s, size_t n, uint64_t st);
CUresult cuStreamCreate_(uint64_t* s, unsigned f);
CUresult cuStreamCreateWithPriority_(uint64_t* s, unsigned f, int p);
CUresult cuStreamDestroy_(uint64_t s);
CUresult cuStreamSynchronize_(uint64_t s);
CUresult cuStreamWaitEvent_(uint64_t s, uint64_t e);
CUresult cuEventCreate_(uint64_t* e, unsigned f);
CUresult cuEventRecord_(uint64_t e, uint64_t s);
CUresult cuEventSynchronize_(uint64_t e);
CUresult cuEventQuery_(uint64_t e);
CUresult cuEventDestroy_(uint64_t e);
CUresult cuEventElapsedTime_(float* ms, uint64_t start, uint64_t end);
CUresult cuModuleLoadData_(uint64_t* m, const void* img);
CUresult cuModuleUnload_(uint64_t m);
CUresult cuModuleGetFunction_(uint64_t* f, uint64_t m, const char* name);
CUresult cuFuncSetAttribute_(uint64_t f, int a, int v);
CUresult cuFuncGetAttribute_(int* v, int a, uint64_t f);
CUresult cuOccupancy_(int* n, uint64_t f, int threads, size_t smem);
int rl_has_tmap(void);
CUresult cuTensorMapEncodeTiled_(void* map, int dt, unsigned rank, uint64_t addr, const uint64_t* dims, const uint64_t* strides,
                                 const unsigned* box, const unsigned* estr, int interleave, int swizzle, int l2, int oob);
const char* cuErrorName_(CUresult r);
const char* cuErrorString_(CUresult r);
CUresult rl_launch(uint64_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned shmem, uint64_t stream, char* args, const int* offs, int nargs);
nvrtcResult nvrtcVersion_(int* a, int* b);
nvrtcResult nvrtcCreateProgram_(uint64_t* p, const char* src, const char* name);
nvrtcResult nvrtcCompileProgram_(uint64_t p, int n, char** opts);
nvrtcResult nvrtcGetProgramLogSize_(uint64_t p, size_t* n);
nvrtcResult nvrtcGetProgramLog_(uint64_t p, char* s);
nvrtcResult nvrtcGetCUBINSize_(uint64_t p, size_t* n);
nvrtcResult nvrtcGetCUBIN_(uint64_t p, char* s);
nvrtcResult nvrtcGetPTXSize_(uint64_t p, size_t* n);
nvrtcResult nvrtcGetPTX_(uint64_t p, char* s);
nvrtcResult nvrtcDestroyProgram_(uint64_t p);
const char* nvrtcErrorText(nvrtcResult r);
cublasStatus_t ltCreate_(uint64_t* h);
cublasStatus_t ltDestroy_(uint64_t h);
size_t ltVersion_(void);
const char* ltStatusText(cublasStatus_t s);
cublasStatus_t rl_lt_matmul(rlLtCall* c, int* stage);
#endif
