/* NCCL, loaded at run time (dlopen of libnccl.so.2, like cuBLASLt and
 * cuDNN): the library loads and trains on one GPU or none without it, and
 * only a model on several GPUs opens it. One handle per model, no global
 * state. The few declarations below are NCCL 2's stable C ABI (an opaque
 * communicator, int status and enum values, ncclUint8 = 1, ncclFloat32 = 7,
 * ncclSum = 0), so no NCCL header is needed to build. C++ (the CUDA backend
 * alone uses it). */
#ifndef MT_CUDA_NCCL_H
#define MT_CUDA_NCCL_H

#include <stddef.h>

typedef struct mt_nccl mt_nccl;
typedef void *mt_nccl_comm; /* ncclComm_t */

/* Opens NCCL; NULL with the reason in why (the library not found, a symbol
 * missing, a version before 2.18). */
mt_nccl *mt_nccl_open(char *why, size_t why_len);
void mt_nccl_close(mt_nccl *n);
/* "2.28.9" */
void mt_nccl_version(const mt_nccl *n, char *buf, size_t len);

/* One communicator per device of devices[0..n) in this process
 * (ncclCommInitAll); 0, or -1 with the reason. */
int mt_nccl_comms_init(mt_nccl *n, mt_nccl_comm *comms, int count, const int *devices, char *why, size_t why_len);
void mt_nccl_comm_destroy(mt_nccl *n, mt_nccl_comm comm);

/* Collectives of one call for all of a process's ranks: between group_begin
 * and group_end, one call per rank, each with the rank's device current. */
int mt_nccl_group_begin(mt_nccl *n);
int mt_nccl_group_end(mt_nccl *n, char *why, size_t why_len);
/* In place: rank r's recv = buf + r * count receives the sum over ranks of
 * their buf[r * count, (r + 1) * count) (fp32), on stream. */
int mt_nccl_reduce_scatter_f32(mt_nccl *n, float *buf, size_t count, int rank, mt_nccl_comm comm, void *stream,
                               char *why, size_t why_len);
/* In place: buf[r * count, (r + 1) * count) of every rank r to every rank's
 * buf (bytes), on stream. */
int mt_nccl_all_gather_u8(mt_nccl *n, void *buf, size_t count, int rank, mt_nccl_comm comm, void *stream, char *why,
                          size_t why_len);
/* An error a communicator met asynchronously (a peer gone, a timeout); 0 if none. */
int mt_nccl_async_error(mt_nccl *n, mt_nccl_comm comm, char *why, size_t why_len);

#endif
