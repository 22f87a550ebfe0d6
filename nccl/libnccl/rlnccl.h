// rlnccl.h declares the dlopen-based bindings of package libnccl to libnccl
// (rlnccl.c). No NCCL header or library is needed to build: communicators
// and streams travel as uintptr_t, enums as int.
#include <stddef.h>
#include <stdint.h>

int rl_nccl_resolve_(void* h);
const char* rl_nccl_symname_(int i);
int rl_nccl_get_version_(int* v);
int rl_nccl_init_all_(uintptr_t* comms, int n, const int* devs);
#define RL_NCCL_ID_BYTES 128
int rl_nccl_get_unique_id_(char* id);
int rl_nccl_init_rank_(uintptr_t* comm, int n, const char* id, int rank);
int rl_nccl_has_split_(void);
int rl_nccl_comm_split_(uintptr_t c, int color, int key, uintptr_t* out);
int rl_nccl_abort_(uintptr_t c);
int rl_nccl_all_gather_(uintptr_t send, uintptr_t recv, size_t count, int dt, uintptr_t c, uintptr_t s);
int rl_nccl_reduce_scatter_(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, uintptr_t c, uintptr_t s);
int rl_nccl_all_reduce_(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, uintptr_t c, uintptr_t s);
int rl_nccl_broadcast_(uintptr_t send, uintptr_t recv, size_t count, int dt, int root, uintptr_t c, uintptr_t s);
const char* rl_nccl_error_string_(int r);
int rl_nccl_all_gather_group_(const uintptr_t* send, const uintptr_t* recv, const size_t* count, const int* dt, int n, uintptr_t c,
                              uintptr_t s);
int rl_nccl_reduce_scatter_group_(const uintptr_t* send, const uintptr_t* recv, const size_t* count, const int* dt, int op, int n,
                                  uintptr_t c, uintptr_t s);
int rl_nccl_shift_(const uintptr_t* send, const uintptr_t* recv, const size_t* count, const int* dt, int n, int next, int prev,
                   uintptr_t c, uintptr_t s);
