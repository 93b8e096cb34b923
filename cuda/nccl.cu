/* NCCL communicators for data parallelism between GPUs (core/cuda.h): one
 * per program, made from an id that rank 0 creates and MPI broadcasts. */
#include <nccl.h>
#include <string.h>

#include "backend.h"

static_assert(FT_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "core/cuda.h's NCCL id size");

static ft_status check(ncclResult_t r, const char *what) {
    return r == ncclSuccess ? FT_OK : ft_cuda_fail(FT_ERR_CUDA, "%s failed: %s", what, ncclGetErrorString(r));
}

ft_status ft_cuda_nccl_unique_id(void *id) {
    ncclUniqueId u;
    FT_TRY(check(ncclGetUniqueId(&u), "ncclGetUniqueId"));
    memcpy(id, u.internal, NCCL_UNIQUE_ID_BYTES);
    return FT_OK;
}

ft_status ft_cuda_nccl_init(void **comm, const void *id, int rank, int size, int device) {
    FT_TRY(ft_cuda_check(cudaSetDevice(device), "cudaSetDevice"));
    ncclUniqueId u;
    memcpy(u.internal, id, NCCL_UNIQUE_ID_BYTES);
    ncclComm_t c;
    FT_TRY(check(ncclCommInitRank(&c, size, u, rank), "ncclCommInitRank"));
    *comm = c;
    return FT_OK;
}

/* Counts beyond size_t never occur (n elements of float32 exist in memory). */
ft_status ft_cuda_nccl_allreduce_sum_f32(void *comm, float *buf, int64_t n, int device) {
    FT_TRY(ft_cuda_check(cudaSetDevice(device), "cudaSetDevice"));
    return check(ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, (ncclComm_t)comm, FT_CUDA_STREAM),
                 "ncclAllReduce");
}

ft_status ft_cuda_nccl_destroy(void *comm) { return check(ncclCommDestroy((ncclComm_t)comm), "ncclCommDestroy"); }
