/* Embedding on CUDA: the CUDA side of ops/embedding.c.
 *
 * Legend: V vocabulary rows, D embedding size, T ids.
 *
 * The backward is deterministic without sorting or atomics: every element
 * (v, d) of dweight belongs to one thread, the thread of column d and of the
 * slice of vocabulary rows holding v. Each thread reads all T ids in
 * position order and adds dout[t, d] for the ids of its slice, so every
 * element's sum has the order of the positions, as on the CPU, whatever the
 * launch configuration. The lanes of a warp are 32 neighbouring columns of
 * one slice: they read the same id (one broadcast load) and neighbouring
 * floats of dout and dweight.
 *
 * One-hot rows are the rows of an identity table, written without one.
 *
 * The table and its gradient are float32; the rows (out, dout) may be
 * 16-bit floats (ft_cuda_kind): the forward rounds each value once, the
 * backward adds the rows' values into the float32 gradient as floats, as
 * the CPU does with bfloat16 rows. */
#include <stdint.h>

#include "backend.h"
#include "ops/cuda_ops.h"

namespace {

constexpr int THREADS = 256;
/* The backward's blocks: 32 columns by SLICES_PER_BLOCK vocabulary slices. */
constexpr int SLICES_PER_BLOCK = THREADS / 32;
/* Threads the backward aims for: enough to fill a device, while each still scans every id. */
constexpr int64_t BACKWARD_THREADS = 1 << 16;

/* *pos = the smallest position of an id outside [0, V) (the minimum of the
 * candidates, the same whatever order the threads arrive in). */
__global__ void __launch_bounds__(THREADS) first_bad(const int64_t *ids, int64_t T, int64_t V,
                                                     unsigned long long *pos) {
    for (int64_t t = (int64_t)blockIdx.x * THREADS + threadIdx.x; t < T; t += (int64_t)gridDim.x * THREADS)
        if (ids[t] < 0 || ids[t] >= V)
            atomicMin(pos, (unsigned long long)t);
}

__global__ void __launch_bounds__(THREADS) gather_rows(const int64_t *ids, const float *w, char *out, int8_t kout,
                                                       int64_t T, int64_t D) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < T * D; i += (int64_t)gridDim.x * THREADS) {
        int64_t t = i / D;
        ft_cuda_store_f(out, i, kout, w[ids[t] * D + (i - t * D)]);
    }
}

__global__ void __launch_bounds__(THREADS) one_hot_rows(const int64_t *ids, char *out, int8_t kout, int64_t T,
                                                         int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < T * C; i += (int64_t)gridDim.x * THREADS) {
        int64_t t = i / C;
        ft_cuda_store_f(out, i, kout, ids[t] == i - t * C ? 1.0f : 0.0f);
    }
}

/* Thread (column d, slice k) adds the rows of dout into the rows [k R, (k + 1) R) of dweight, in position order. */
__global__ void __launch_bounds__(THREADS) scatter_rows(const int64_t *ids, const char *dout, int8_t kdout, float *dw,
                                                        int64_t T, int64_t V, int64_t D, int64_t R,
                                                        int64_t padding_idx) {
    int64_t d = (int64_t)blockIdx.x * 32 + threadIdx.x % 32;
    int64_t k = (int64_t)blockIdx.y * SLICES_PER_BLOCK + threadIdx.x / 32;
    int64_t lo = k * R, hi = lo + R < V ? lo + R : V;
    if (d >= D || lo >= V)
        return;
    for (int64_t t = 0; t < T; t++) {
        int64_t v = ids[t];
        if (v >= lo && v < hi && v != padding_idx)
            dw[v * D + d] += ft_cuda_load_f(dout, t * D + d, kdout);
    }
}

static ft_status embedding_first_bad_id(const ft_tensor *ids, int64_t V, int64_t *pos, int64_t *value) {
    FT_TRY(ft_cuda_use_device(ids));
    int64_t T = 1;
    for (int k = 0; k < ids->ndim; k++)
        T *= ids->shape[k];
    const int64_t *id = (const int64_t *)ft_tensor_data(ids);
    ft_cuda_scratch scratch;
    FT_TRY(ft_cuda_scratch_alloc(&scratch, sizeof(unsigned long long), ft_tensor_device(ids).index));
    unsigned long long *found = (unsigned long long *)scratch.ptr, host = ~0ull;
    ft_status st = ft_cuda_check(cudaMemsetAsync(found, 0xff, sizeof *found, FT_CUDA_STREAM), "cudaMemsetAsync");
    if (st == FT_OK) {
        first_bad<<<ft_cuda_blocks(T, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(id, T, V, found);
        st = ft_cuda_launched("first_bad");
    }
    /* cudaMemcpy on the legacy default stream waits for the kernel */
    if (st == FT_OK)
        st = ft_cuda_check(cudaMemcpy(&host, found, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy");
    ft_cuda_scratch_free(&scratch);
    FT_TRY(st);
    *pos = host == ~0ull ? -1 : (int64_t)host;
    if (*pos >= 0)
        FT_TRY(ft_cuda_check(cudaMemcpy(value, id + *pos, sizeof *value, cudaMemcpyDeviceToHost), "cudaMemcpy"));
    return FT_OK;
}

static ft_status embedding_forward(const ft_tensor *out, const ft_tensor *ids, const ft_tensor *weight,
                                   int64_t padding_idx) {
    FT_TRY(ft_cuda_use_device(weight));
    int64_t D = weight->shape[1], T = 1;
    for (int k = 0; k < ids->ndim; k++)
        T *= ids->shape[k];
    gather_rows<<<ft_cuda_blocks(T * D, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
        (const int64_t *)ft_tensor_data(ids), (const float *)ft_tensor_data(weight), (char *)ft_tensor_data(out),
        ft_cuda_kind(out->dtype), T, D);
    return ft_cuda_launched("gather_rows");
}

static ft_status one_hot(const ft_tensor *out, const ft_tensor *ids) {
    FT_TRY(ft_cuda_use_device(out));
    int64_t C = out->shape[out->ndim - 1], T = 1;
    for (int k = 0; k < ids->ndim; k++)
        T *= ids->shape[k];
    one_hot_rows<<<ft_cuda_blocks(T * C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
        (const int64_t *)ft_tensor_data(ids), (char *)ft_tensor_data(out), ft_cuda_kind(out->dtype), T, C);
    return ft_cuda_launched("one_hot_rows");
}

static ft_status embedding_backward(const ft_tensor *dweight, const ft_tensor *dout, const ft_tensor *ids,
                                    int64_t padding_idx, bool accumulate) {
    FT_TRY(ft_cuda_use_device(dweight));
    int64_t V = dweight->shape[0], D = dweight->shape[1], T = 1;
    for (int k = 0; k < ids->ndim; k++)
        T *= ids->shape[k];
    float *dw = (float *)ft_tensor_data(dweight);
    if (!accumulate) /* rows no id names end as 0; the others are sums from 0 */
        FT_TRY(ft_cuda_check(cudaMemsetAsync(dw, 0, (size_t)(V * D) * sizeof(float), FT_CUDA_STREAM),
                             "cudaMemsetAsync"));
    if (T == 0)
        return FT_OK;
    int64_t tiles = (D + 31) / 32;
    int64_t slices = (BACKWARD_THREADS / (tiles * 32) + SLICES_PER_BLOCK - 1) / SLICES_PER_BLOCK * SLICES_PER_BLOCK;
    if (slices < SLICES_PER_BLOCK)
        slices = SLICES_PER_BLOCK;
    if (slices > V)
        slices = (V + SLICES_PER_BLOCK - 1) / SLICES_PER_BLOCK * SLICES_PER_BLOCK;
    int64_t R = (V + slices - 1) / slices;
    if (tiles > INT32_MAX || slices / SLICES_PER_BLOCK > 65535)
        return ft_cuda_fail(FT_ERR_VALUE, "embedding_backward: an embedding size of %lld is too large",
                            (long long)D);
    dim3 grid((unsigned)tiles, (unsigned)(slices / SLICES_PER_BLOCK));
    scatter_rows<<<grid, THREADS, 0, FT_CUDA_STREAM>>>((const int64_t *)ft_tensor_data(ids),
                                                       (const char *)ft_tensor_data(dout), ft_cuda_kind(dout->dtype),
                                                       dw, T, V, D, R, padding_idx);
    return ft_cuda_launched("scatter_rows");
}

} // namespace

void ft_cuda_register_embedding(struct ft_cuda_ops *ops) {
    ops->embedding_first_bad_id = embedding_first_bad_id;
    ops->embedding_forward = embedding_forward;
    ops->embedding_backward = embedding_backward;
    ops->one_hot = one_hot;
}
