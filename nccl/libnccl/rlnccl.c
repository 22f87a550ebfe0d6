// rlnccl.c holds package libnccl's dlsym table for libnccl and the trampolines
// that call through it.
#include <dlfcn.h>
#include "rlnccl.h"

enum { N_GetVersion, N_InitAll, N_Abort, N_AllGather, N_ReduceScatter, N_AllReduce, N_Broadcast, N_ErrorString, N_GetUniqueId, N_InitRank,
	N_Send, N_Recv, N_GroupStart, N_GroupEnd, N_N };
static const char* rl_nccl_names[N_N] = {
	"ncclGetVersion", "ncclCommInitAll", "ncclCommAbort", "ncclAllGather", "ncclReduceScatter",
	"ncclAllReduce", "ncclBroadcast", "ncclGetErrorString", "ncclGetUniqueId", "ncclCommInitRank",
	"ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd",
};
static void* rl_nccl[N_N];
// rl_nccl_split is ncclCommSplit, which NCCL has since 2.18 (NULL before).
static void* rl_nccl_split;

// rl_nccl_resolve_ fills the table from handle h; it returns -1 on success or
// the index of the first missing symbol. ncclCommSplit is optional.
int rl_nccl_resolve_(void* h) {
	for (int i = 0; i < N_N; i++) {
		rl_nccl[i] = dlsym(h, rl_nccl_names[i]);
		if (rl_nccl[i] == NULL) return i;
	}
	rl_nccl_split = dlsym(h, "ncclCommSplit");
	return -1;
}
const char* rl_nccl_symname_(int i) { return rl_nccl_names[i]; }

int rl_nccl_get_version_(int* v) { return ((int (*)(int*))rl_nccl[N_GetVersion])(v); }
int rl_nccl_init_all_(uintptr_t* comms, int n, const int* devs) {
	return ((int (*)(void**, int, const int*))rl_nccl[N_InitAll])((void**)comms, n, devs);
}
// rl_nccl_id is ncclUniqueId: NCCL_UNIQUE_ID_BYTES opaque bytes, passed by value.
typedef struct { char internal[RL_NCCL_ID_BYTES]; } rl_nccl_id;
int rl_nccl_get_unique_id_(char* id) { return ((int (*)(rl_nccl_id*))rl_nccl[N_GetUniqueId])((rl_nccl_id*)id); }
int rl_nccl_init_rank_(uintptr_t* comm, int n, const char* id, int rank) {
	rl_nccl_id v;
	for (int i = 0; i < RL_NCCL_ID_BYTES; i++) v.internal[i] = id[i];
	return ((int (*)(void**, int, rl_nccl_id, int))rl_nccl[N_InitRank])((void**)comm, n, v, rank);
}
int rl_nccl_has_split_(void) { return rl_nccl_split != NULL; }
// rl_nccl_comm_split_ is ncclCommSplit(c, color, key, out, NULL): the child
// inherits c's configuration.
int rl_nccl_comm_split_(uintptr_t c, int color, int key, uintptr_t* out) {
	return ((int (*)(void*, int, int, void**, void*))rl_nccl_split)((void*)c, color, key, (void**)out, NULL);
}
int rl_nccl_abort_(uintptr_t c) { return ((int (*)(void*))rl_nccl[N_Abort])((void*)c); }
int rl_nccl_all_gather_(uintptr_t send, uintptr_t recv, size_t count, int dt, uintptr_t c, uintptr_t s) {
	return ((int (*)(const void*, void*, size_t, int, void*, void*))rl_nccl[N_AllGather])(
		(const void*)send, (void*)recv, count, dt, (void*)c, (void*)s);
}
int rl_nccl_reduce_scatter_(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, uintptr_t c, uintptr_t s) {
	return ((int (*)(const void*, void*, size_t, int, int, void*, void*))rl_nccl[N_ReduceScatter])(
		(const void*)send, (void*)recv, count, dt, op, (void*)c, (void*)s);
}
int rl_nccl_all_reduce_(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, uintptr_t c, uintptr_t s) {
	return ((int (*)(const void*, void*, size_t, int, int, void*, void*))rl_nccl[N_AllReduce])(
		(const void*)send, (void*)recv, count, dt, op, (void*)c, (void*)s);
}
int rl_nccl_broadcast_(uintptr_t send, uintptr_t recv, size_t count, int dt, int root, uintptr_t c, uintptr_t s) {
	return ((int (*)(const void*, void*, size_t, int, int, void*, void*))rl_nccl[N_Broadcast])(
		(const void*)send, (void*)recv, count, dt, root, (void*)c, (void*)s);
}
const char* rl_nccl_error_string_(int r) { return ((const char* (*)(int))rl_nccl[N_ErrorString])(r); }
// rl_nccl_all_gather_group_ all-gathers each of n buffers as one NCCL
// group, which NCCL launches as one kernel: send[i] holds count[i]
// elements of dtype dt[i], recv[i] the ranks' count[i] each.
int rl_nccl_all_gather_group_(const uintptr_t* send, const uintptr_t* recv, const size_t* count, const int* dt, int n, uintptr_t c,
                              uintptr_t s) {
	int (*start)(void) = (int (*)(void))rl_nccl[N_GroupStart];
	int (*end)(void) = (int (*)(void))rl_nccl[N_GroupEnd];
	int (*ag)(const void*, void*, size_t, int, void*, void*) = (int (*)(const void*, void*, size_t, int, void*, void*))rl_nccl[N_AllGather];
	int r = start();
	if (r != 0) return r;
	for (int i = 0; i < n && r == 0; i++) r = ag((const void*)send[i], (void*)recv[i], count[i], dt[i], (void*)c, (void*)s);
	int e = end();
	return r != 0 ? r : e;
}
// rl_nccl_reduce_scatter_group_ reduce-scatters each of n buffers with op
// as one NCCL group: recv[i] gets count[i] elements of dtype dt[i], send[i]
// holds the ranks' count[i] each.
int rl_nccl_reduce_scatter_group_(const uintptr_t* send, const uintptr_t* recv, const size_t* count, const int* dt, int op, int n,
                                  uintptr_t c, uintptr_t s) {
	int (*start)(void) = (int (*)(void))rl_nccl[N_GroupStart];
	int (*end)(void) = (int (*)(void))rl_nccl[N_GroupEnd];
	int (*rs)(const void*, void*, size_t, int, int, void*, void*) =
	    (int (*)(const void*, void*, size_t, int, int, void*, void*))rl_nccl[N_ReduceScatter];
	int r = start();
	if (r != 0) return r;
	for (int i = 0; i < n && r == 0; i++) r = rs((const void*)send[i], (void*)recv[i], count[i], dt[i], op, (void*)c, (void*)s);
	int e = end();
	return r != 0 ? r : e;
}
// rl_nccl_shift_ sends each of n buffers to rank next and receives each
// from rank prev, as one NCCL group (a ring's step): send[i] and recv[i]
// hold count[i] elements of dtype dt[i].
int rl_nccl_shift_(const uintptr_t* send, const uintptr_t* recv, const size_t* count, const int* dt, int n, int next, int prev,
                   uintptr_t c, uintptr_t s) {
	int (*start)(void) = (int (*)(void))rl_nccl[N_GroupStart];
	int (*end)(void) = (int (*)(void))rl_nccl[N_GroupEnd];
	int (*snd)(const void*, size_t, int, int, void*, void*) = (int (*)(const void*, size_t, int, int, void*, void*))rl_nccl[N_Send];
	int (*rcv)(void*, size_t, int, int, void*, void*) = (int (*)(void*, size_t, int, int, void*, void*))rl_nccl[N_Recv];
	int r = start();
	if (r != 0) return r;
	for (int i = 0; i < n && r == 0; i++) {
		r = snd((const void*)send[i], count[i], dt[i], next, (void*)c, (void*)s);
		if (r == 0) r = rcv((void*)recv[i], count[i], dt[i], prev, (void*)c, (void*)s);
	}
	int e = end();
	return r != 0 ? r : e;
}
