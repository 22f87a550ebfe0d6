// rlcuda.c holds the dlsym tables and the trampolines of package cuda. No
// CUDA header or library is needed to build it: the libraries are opened
// at run time (package dl) and every call goes through a resolved pointer.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "rlcuda.h"

// Symbol tables: names resolved with dlsym into the matching pointer slots.
// The trampolines below call through these pointers.
enum {
	CU_Init, CU_DriverGetVersion, CU_DeviceGetCount, CU_DeviceGet, CU_DeviceGetName,
	CU_DeviceGetAttribute, CU_DeviceTotalMem, CU_PrimaryCtxRetain, CU_PrimaryCtxRelease,
	CU_CtxSetCurrent, CU_CtxSynchronize, CU_MemAlloc, CU_MemFree, CU_MemAllocHost,
	CU_MemFreeHost, CU_MemGetInfo, CU_MemcpyHtoDAsync, CU_MemcpyDtoHAsync, CU_MemcpyAsync,
	CU_StreamCreate, CU_StreamCreateWithPriority, CU_StreamDestroy, CU_StreamSynchronize, CU_StreamWaitEvent,
	CU_EventCreate, CU_EventRecord, CU_EventSynchronize, CU_EventQuery, CU_EventDestroy, CU_EventElapsedTime,
	CU_ModuleLoadData, CU_ModuleUnload, CU_ModuleGetFunction, CU_FuncSetAttribute, CU_FuncGetAttribute,
	CU_LaunchKernel, CU_GetErrorName, CU_GetErrorString, CU_OccupancyMaxActiveBlocks, CU_N
};
static const char* rl_cu_names[CU_N] = {
	"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
	"cuDeviceGetAttribute", "cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
	"cuCtxSetCurrent", "cuCtxSynchronize", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocHost_v2",
	"cuMemFreeHost", "cuMemGetInfo_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyAsync",
	"cuStreamCreate", "cuStreamCreateWithPriority", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent",
	"cuEventCreate", "cuEventRecord", "cuEventSynchronize", "cuEventQuery", "cuEventDestroy_v2", "cuEventElapsedTime",
	"cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction", "cuFuncSetAttribute", "cuFuncGetAttribute",
	"cuLaunchKernel", "cuGetErrorName", "cuGetErrorString", "cuOccupancyMaxActiveBlocksPerMultiprocessor",
};
static void* rl_cu[CU_N];
// cuTensorMapEncodeTiled (CUDA 12 drivers) is looked up too but not
// required: without it the kernels that read through tensor maps are not
// launched (cuTensorMapEncodeTiled_ returns CUDA_ERROR_NOT_SUPPORTED).
static void* rl_cu_tmap;

enum {
	NV_Version, NV_CreateProgram, NV_CompileProgram, NV_GetProgramLogSize, NV_GetProgramLog,
	NV_GetCUBINSize, NV_GetCUBIN, NV_GetPTXSize, NV_GetPTX, NV_DestroyProgram, NV_GetErrorString, NV_N
};
static const char* rl_nv_names[NV_N] = {
	"nvrtcVersion", "nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
	"nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcGetPTXSize", "nvrtcGetPTX", "nvrtcDestroyProgram", "nvrtcGetErrorString",
};
static void* rl_nv[NV_N];

enum {
	LT_Create, LT_Destroy, LT_GetVersion, LT_DescCreate, LT_DescDestroy, LT_DescSet,
	LT_LayoutCreate, LT_LayoutDestroy, LT_PrefCreate, LT_PrefDestroy, LT_PrefSet,
	LT_Heuristic, LT_Matmul, LT_StatusString, LT_N
};
static const char* rl_lt_names[LT_N] = {
	"cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
	"cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
	"cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
	"cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul", "cublasLtGetStatusString",
};
static void* rl_lt[LT_N];

// rl_resolve fills table lib (0 driver, 1 NVRTC, 2 cuBLASLt) from handle h.
// It returns -1 on success or the index of the first missing symbol.
int rl_resolve(int lib, void* h) {
	const char** names; void** tbl; int n;
	switch (lib) {
	case 0: names = rl_cu_names; tbl = rl_cu; n = CU_N; break;
	case 1: names = rl_nv_names; tbl = rl_nv; n = NV_N; break;
	default: names = rl_lt_names; tbl = rl_lt; n = LT_N; break;
	}
	for (int i = 0; i < n; i++) {
		tbl[i] = dlsym(h, names[i]);
		if (tbl[i] == NULL) return i;
	}
	if (lib == 0) rl_cu_tmap = dlsym(h, "cuTensorMapEncodeTiled");
	return -1;
}
const char* rl_symname(int lib, int i) {
	switch (lib) {
	case 0: return rl_cu_names[i];
	case 1: return rl_nv_names[i];
	default: return rl_lt_names[i];
	}
}

// Driver API trampolines.
#define CUF(i, sig) ((CUresult(*)sig)rl_cu[i])
CUresult cuInit_(unsigned f) { return CUF(CU_Init, (unsigned))(f); }
CUresult cuDriverGetVersion_(int* v) { return CUF(CU_DriverGetVersion, (int*))(v); }
CUresult cuDeviceGetCount_(int* n) { return CUF(CU_DeviceGetCount, (int*))(n); }
CUresult cuDeviceGet_(CUdevice* d, int i) { return CUF(CU_DeviceGet, (CUdevice*, int))(d, i); }
CUresult cuDeviceGetName_(char* s, int n, CUdevice d) { return CUF(CU_DeviceGetName, (char*, int, CUdevice))(s, n, d); }
CUresult cuDeviceGetAttribute_(int* v, int a, CUdevice d) { return CUF(CU_DeviceGetAttribute, (int*, int, CUdevice))(v, a, d); }
CUresult cuDeviceTotalMem_(size_t* b, CUdevice d) { return CUF(CU_DeviceTotalMem, (size_t*, CUdevice))(b, d); }
CUresult cuDevicePrimaryCtxRetain_(uint64_t* c, CUdevice d) { CUcontext x = 0; CUresult r = CUF(CU_PrimaryCtxRetain, (CUcontext*, CUdevice))(&x, d); *c = (uint64_t)x; return r; }
CUresult cuDevicePrimaryCtxRelease_(CUdevice d) { return CUF(CU_PrimaryCtxRelease, (CUdevice))(d); }
CUresult cuCtxSetCurrent_(uint64_t c) { return CUF(CU_CtxSetCurrent, (CUcontext))((CUcontext)c); }
CUresult cuCtxSynchronize_(void) { return CUF(CU_CtxSynchronize, (void))(); }
CUresult cuMemAlloc_(CUdeviceptr* p, size_t n) { return CUF(CU_MemAlloc, (CUdeviceptr*, size_t))(p, n); }
CUresult cuMemFree_(CUdeviceptr p) { return CUF(CU_MemFree, (CUdeviceptr))(p); }
CUresult cuMemAllocHost_(void** p, size_t n) { return CUF(CU_MemAllocHost, (void**, size_t))(p, n); }
CUresult cuMemFreeHost_(void* p) { return CUF(CU_MemFreeHost, (void*))(p); }
CUresult cuMemGetInfo_(size_t* f, size_t* t) { return CUF(CU_MemGetInfo, (size_t*, size_t*))(f, t); }
CUresult cuMemcpyHtoDAsync_(CUdeviceptr d, const void* s, size_t n, uint64_t st) { return CUF(CU_MemcpyHtoDAsync, (CUdeviceptr, const void*, size_t, CUstream))(d, s, n, (CUstream)st); }
CUresult cuMemcpyDtoHAsync_(void* d, CUdeviceptr s, size_t n, uint64_t st) { return CUF(CU_MemcpyDtoHAsync, (void*, CUdeviceptr, size_t, CUstream))(d, s, n, (CUstream)st); }
CUresult cuMemcpyAsync_(CUdeviceptr d, CUdeviceptr s, size_t n, uint64_t st) { return CUF(CU_MemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))(d, s, n, (CUstream)st); }
CUresult cuStreamCreate_(uint64_t* s, unsigned f) { CUstream x = 0; CUresult r = CUF(CU_StreamCreate, (CUstream*, unsigned))(&x, f); *s = (uint64_t)x; return r; }
CUresult cuStreamCreateWithPriority_(uint64_t* s, unsigned f, int p) { CUstream x = 0; CUresult r = CUF(CU_StreamCreateWithPriority, (CUstream*, unsigned, int))(&x, f, p); *s = (uint64_t)x; return r; }
CUresult cuStreamDestroy_(uint64_t s) { return CUF(CU_StreamDestroy, (CUstream))((CUstream)s); }
CUresult cuStreamSynchronize_(uint64_t s) { return CUF(CU_StreamSynchronize, (CUstream))((CUstream)s); }
CUresult cuStreamWaitEvent_(uint64_t s, uint64_t e) { return CUF(CU_StreamWaitEvent, (CUstream, CUevent, unsigned))((CUstream)s, (CUevent)e, 0); }
CUresult cuEventCreate_(uint64_t* e, unsigned f) { CUevent x = 0; CUresult r = CUF(CU_EventCreate, (CUevent*, unsigned))(&x, f); *e = (uint64_t)x; return r; }
CUresult cuEventRecord_(uint64_t e, uint64_t s) { return CUF(CU_EventRecord, (CUevent, CUstream))((CUevent)e, (CUstream)s); }
CUresult cuEventSynchronize_(uint64_t e) { return CUF(CU_EventSynchronize, (CUevent))((CUevent)e); }
CUresult cuEventQuery_(uint64_t e) { return CUF(CU_EventQuery, (CUevent))((CUevent)e); }
CUresult cuEventDestroy_(uint64_t e) { return CUF(CU_EventDestroy, (CUevent))((CUevent)e); }
CUresult cuEventElapsedTime_(float* ms, uint64_t start, uint64_t end) { return CUF(CU_EventElapsedTime, (float*, CUevent, CUevent))(ms, (CUevent)start, (CUevent)end); }
CUresult cuModuleLoadData_(uint64_t* m, const void* img) { CUmodule x = 0; CUresult r = CUF(CU_ModuleLoadData, (CUmodule*, const void*))(&x, img); *m = (uint64_t)x; return r; }
CUresult cuModuleUnload_(uint64_t m) { return CUF(CU_ModuleUnload, (CUmodule))((CUmodule)m); }
CUresult cuModuleGetFunction_(uint64_t* f, uint64_t m, const char* name) { CUfunction x = 0; CUresult r = CUF(CU_ModuleGetFunction, (CUfunction*, CUmodule, const char*))(&x, (CUmodule)m, name); *f = (uint64_t)x; return r; }
CUresult cuFuncSetAttribute_(uint64_t f, int a, int v) { return CUF(CU_FuncSetAttribute, (CUfunction, int, int))((CUfunction)f, a, v); }
CUresult cuFuncGetAttribute_(int* v, int a, uint64_t f) { return CUF(CU_FuncGetAttribute, (int*, int, CUfunction))(v, a, (CUfunction)f); }
CUresult cuOccupancy_(int* n, uint64_t f, int threads, size_t smem) { return CUF(CU_OccupancyMaxActiveBlocks, (int*, CUfunction, int, size_t))(n, (CUfunction)f, threads, smem); }
int rl_has_tmap(void) { return rl_cu_tmap != NULL; }
CUresult cuTensorMapEncodeTiled_(void* map, int dt, unsigned rank, uint64_t addr, const uint64_t* dims, const uint64_t* strides,
                                 const unsigned* box, const unsigned* estr, int interleave, int swizzle, int l2, int oob) {
	if (rl_cu_tmap == NULL) return 801; // CUDA_ERROR_NOT_SUPPORTED
	return ((CUresult(*)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const unsigned*, const unsigned*, int, int, int, int))rl_cu_tmap)(
		map, dt, rank, (void*)addr, dims, strides, box, estr, interleave, swizzle, l2, oob);
}
const char* cuErrorName_(CUresult r) {
	const char* s = NULL;
	if (rl_cu[CU_GetErrorName] == NULL || CUF(CU_GetErrorName, (CUresult, const char**))(r, &s) != 0) return NULL;
	return s;
}
const char* cuErrorString_(CUresult r) {
	const char* s = NULL;
	if (rl_cu[CU_GetErrorString] == NULL || CUF(CU_GetErrorString, (CUresult, const char**))(r, &s) != 0) return NULL;
	return s;
}

// rl_launch launches f with the kernel parameters at args+offs[i] (nargs of
// them, at most 64).
CUresult rl_launch(uint64_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned shmem, uint64_t stream, char* args, const int* offs, int nargs) {
	void* params[64];
	if (nargs > 64) return 1;
	for (int i = 0; i < nargs; i++) params[i] = args + offs[i];
	return CUF(CU_LaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**))(
		(CUfunction)f, gx, gy, gz, bx, by, bz, shmem, (CUstream)stream, params, NULL);
}

// NVRTC trampolines.
#define NVF(i, sig) ((nvrtcResult(*)sig)rl_nv[i])
nvrtcResult nvrtcVersion_(int* a, int* b) { return NVF(NV_Version, (int*, int*))(a, b); }
nvrtcResult nvrtcCreateProgram_(uint64_t* p, const char* src, const char* name) {
	nvrtcProgram x = 0;
	nvrtcResult r = NVF(NV_CreateProgram, (nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*))(&x, src, name, 0, NULL, NULL);
	*p = (uint64_t)x;
	return r;
}
nvrtcResult nvrtcCompileProgram_(uint64_t p, int n, char** opts) { return NVF(NV_CompileProgram, (nvrtcProgram, int, const char* const*))((nvrtcProgram)p, n, (const char* const*)opts); }
nvrtcResult nvrtcGetProgramLogSize_(uint64_t p, size_t* n) { return NVF(NV_GetProgramLogSize, (nvrtcProgram, size_t*))((nvrtcProgram)p, n); }
nvrtcResult nvrtcGetProgramLog_(uint64_t p, char* s) { return NVF(NV_GetProgramLog, (nvrtcProgram, char*))((nvrtcProgram)p, s); }
nvrtcResult nvrtcGetCUBINSize_(uint64_t p, size_t* n) { return NVF(NV_GetCUBINSize, (nvrtcProgram, size_t*))((nvrtcProgram)p, n); }
nvrtcResult nvrtcGetCUBIN_(uint64_t p, char* s) { return NVF(NV_GetCUBIN, (nvrtcProgram, char*))((nvrtcProgram)p, s); }
nvrtcResult nvrtcGetPTXSize_(uint64_t p, size_t* n) { return NVF(NV_GetPTXSize, (nvrtcProgram, size_t*))((nvrtcProgram)p, n); }
nvrtcResult nvrtcGetPTX_(uint64_t p, char* s) { return NVF(NV_GetPTX, (nvrtcProgram, char*))((nvrtcProgram)p, s); }
nvrtcResult nvrtcDestroyProgram_(uint64_t p) { nvrtcProgram x = (nvrtcProgram)p; return NVF(NV_DestroyProgram, (nvrtcProgram*))(&x); }
const char* nvrtcErrorText(nvrtcResult r) { return ((const char*(*)(nvrtcResult))rl_nv[NV_GetErrorString])(r); }

// cuBLASLt.
#define LTF(i, sig) ((cublasStatus_t(*)sig)rl_lt[i])
cublasStatus_t ltCreate_(uint64_t* h) { cublasLtHandle_t x = 0; cublasStatus_t r = LTF(LT_Create, (cublasLtHandle_t*))(&x); *h = (uint64_t)x; return r; }
cublasStatus_t ltDestroy_(uint64_t h) { return LTF(LT_Destroy, (cublasLtHandle_t))((cublasLtHandle_t)h); }
size_t ltVersion_(void) { return ((size_t(*)(void))rl_lt[LT_GetVersion])(); }
const char* ltStatusText(cublasStatus_t s) { return ((const char*(*)(cublasStatus_t))rl_lt[LT_StatusString])(s); }

// rl_lt_matmul runs the call in one crossing: descriptors, heuristic (when
// no algorithm is given; the chosen one is written back) and the matmul.
// *stage names the failing step.
cublasStatus_t rl_lt_matmul(rlLtCall* c, int* stage) {
	cublasLtMatmulDesc_t desc = 0;
	cublasLtMatrixLayout_t la = 0, lb = 0, lc = 0;
	cublasLtMatmulPreference_t pref = 0;
	cublasStatus_t st;
	*stage = 0;
	st = LTF(LT_DescCreate, (cublasLtMatmulDesc_t*, int, int))(&desc, c->computeType, c->scaleType);
	if (st) goto done;
	*stage = 1;
	st = LTF(LT_DescSet, (cublasLtMatmulDesc_t, int, const void*, size_t))(desc, 3, &c->transa, sizeof(int32_t));
	if (st) goto done;
	st = LTF(LT_DescSet, (cublasLtMatmulDesc_t, int, const void*, size_t))(desc, 4, &c->transb, sizeof(int32_t));
	if (st) goto done;
	*stage = 2;
	st = LTF(LT_LayoutCreate, (cublasLtMatrixLayout_t*, int, uint64_t, uint64_t, int64_t))(&la, c->atype, c->arows, c->acols, c->lda);
	if (st) goto done;
	st = LTF(LT_LayoutCreate, (cublasLtMatrixLayout_t*, int, uint64_t, uint64_t, int64_t))(&lb, c->btype, c->brows, c->bcols, c->ldb);
	if (st) goto done;
	st = LTF(LT_LayoutCreate, (cublasLtMatrixLayout_t*, int, uint64_t, uint64_t, int64_t))(&lc, c->ctype, c->m, c->n, c->ldc);
	if (st) goto done;
	if (!c->haveAlgo) {
		*stage = 3;
		st = LTF(LT_PrefCreate, (cublasLtMatmulPreference_t*))(&pref);
		if (st) goto done;
		st = LTF(LT_PrefSet, (cublasLtMatmulPreference_t, int, const void*, size_t))(pref, 1, &c->wsSize, sizeof(uint64_t));
		if (st) goto done;
		st = LTF(LT_PrefSet, (cublasLtMatmulPreference_t, int, const void*, size_t))(pref, 5, &c->alignA, sizeof(uint32_t));
		if (st) goto done;
		st = LTF(LT_PrefSet, (cublasLtMatmulPreference_t, int, const void*, size_t))(pref, 6, &c->alignB, sizeof(uint32_t));
		if (st) goto done;
		st = LTF(LT_PrefSet, (cublasLtMatmulPreference_t, int, const void*, size_t))(pref, 7, &c->alignC, sizeof(uint32_t));
		if (st) goto done;
		uint32_t alignD = c->d ? c->alignD : c->alignC;
		st = LTF(LT_PrefSet, (cublasLtMatmulPreference_t, int, const void*, size_t))(pref, 8, &alignD, sizeof(uint32_t));
		if (st) goto done;
		*stage = 4;
		rlLtHeuristic res[16];
		int got = 0, idx = c->pick > 0 && c->pick < 16 ? c->pick : 0;
		memset(res, 0, sizeof res);
		st = LTF(LT_Heuristic, (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
			cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int, rlLtHeuristic*, int*))(
			(cublasLtHandle_t)c->handle, desc, la, lb, lc, lc, pref, idx + 1, res, &got);
		if (st) goto done;
		c->got = got;
		if (got <= idx) { st = 15; goto done; } // CUBLAS_STATUS_NOT_SUPPORTED
		c->algo = res[idx].algo;
		c->haveAlgo = 1;
	}
	*stage = 5;
	st = LTF(LT_Matmul, (cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*, cublasLtMatrixLayout_t,
		const void*, cublasLtMatrixLayout_t, const void*, const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t,
		const rlLtAlgo*, void*, size_t, CUstream))(
		(cublasLtHandle_t)c->handle, desc, &c->alpha, (const void*)c->a, la, (const void*)c->b, lb, &c->beta,
		(const void*)c->c, lc, (void*)(c->d ? c->d : c->c), lc, &c->algo, (void*)c->workspace, (size_t)c->wsSize, (CUstream)c->stream);
done:
	if (pref) LTF(LT_PrefDestroy, (cublasLtMatmulPreference_t))(pref);
	if (lc) LTF(LT_LayoutDestroy, (cublasLtMatrixLayout_t))(lc);
	if (lb) LTF(LT_LayoutDestroy, (cublasLtMatrixLayout_t))(lb);
	if (la) LTF(LT_LayoutDestroy, (cublasLtMatrixLayout_t))(la);
	if (desc) LTF(LT_DescDestroy, (cublasLtMatmulDesc_t))(desc);
	return st;
}
