/* What the pointwise and row kernels share: the walk over operands of one
 * shape, each with its own strides and dtype (float32 or a 16-bit float,
 * read and written through ft_cuda_load_f / ft_cuda_store_f: ops compute in
 * float whatever the storage type).
 *
 * The walk is the device side of the CPU's ft_pw_plan (ops/pointwise.c):
 * dimensions of size 1 are dropped, the rest ordered by operand 0's memory
 * layout (outermost first) so that consecutive threads touch consecutive
 * memory, and merged wherever every operand allows. Dense operands of any
 * shared layout (NCHW, NHWC, ...) thus become one flat run, where an
 * element's offsets need no division. */
#ifndef FT_CUDA_STRIDED_H
#define FT_CUDA_STRIDED_H

#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* Operand slots of a walk; slot FT_CUDA_PW_OPS of st is the C-order index. */
#define FT_CUDA_PW_OPS 6
#define FT_CUDA_PW_THREADS 256

typedef struct {
    int nout;          /* slots [0, nout) are outputs, the others inputs */
    unsigned present;  /* bit k: slot k has an operand */
    bool read_outputs; /* outputs are loaded too (accumulation) */
    int ndim;
    int64_t n;
    int64_t shape[FT_MAX_DIMS];
    int64_t st[FT_CUDA_PW_OPS + 1][FT_MAX_DIMS]; /* elements */
    char *base[FT_CUDA_PW_OPS];
    int8_t kind[FT_CUDA_PW_OPS];
} ft_cuda_pw;

/* Plans a walk over t[0..nops), all of one shape (NULL: an absent slot; the
 * first present operand orders the dimensions). With `index`, slot
 * FT_CUDA_PW_OPS gives each element's number in C order. False when there
 * are no elements. */
static inline bool ft_cuda_pw_make(ft_cuda_pw *p, const ft_tensor *const *t, int nops, int nout, bool read_outputs,
                                   bool index) {
    memset(p, 0, sizeof *p);
    p->nout = nout;
    p->read_outputs = read_outputs;
    const ft_tensor *t0 = NULL;
    for (int k = 0; k < nops; k++) {
        if (!t[k])
            continue;
        t0 = t0 ? t0 : t[k];
        p->present |= 1u << k;
        p->base[k] = ft_tensor_data(t[k]);
        p->kind[k] = ft_cuda_kind(t[k]->dtype);
    }
    int64_t cstride[FT_MAX_DIMS], c = 1;
    for (int d = t0->ndim - 1; d >= 0; d--) {
        cstride[d] = c;
        c *= t0->shape[d];
    }
    int nd = 0, order[FT_MAX_DIMS];
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 0)
            return false;
        if (t0->shape[d] > 1)
            order[nd++] = d;
    }
    /* Unlike the CPU, dropout's walk takes memory order too: coalesced
     * accesses matter more here than sharing Philox blocks between neighbours. */
    ft_sort_dims_by_stride(order, nd, t0->shape, t0->strides);
    unsigned rows = p->present | (index ? 1u << FT_CUDA_PW_OPS : 0u);
    for (int i = 0; i < nd; i++) {
        int d = order[i];
        int64_t cur[FT_CUDA_PW_OPS + 1] = {0};
        for (int k = 0; k < nops; k++)
            if (t[k])
                cur[k] = t[k]->strides[d];
        if (index)
            cur[FT_CUDA_PW_OPS] = cstride[d];
        int m = p->ndim - 1;
        bool merge = m >= 0;
        for (int k = 0; merge && k <= FT_CUDA_PW_OPS; k++)
            merge = !(rows >> k & 1u) || p->st[k][m] == cur[k] * t0->shape[d];
        if (merge) {
            p->shape[m] *= t0->shape[d];
        } else {
            m = p->ndim++;
            p->shape[m] = t0->shape[d];
        }
        for (int k = 0; k <= FT_CUDA_PW_OPS; k++)
            p->st[k][m] = cur[k];
    }
    if (p->ndim == 0) { /* one element */
        p->ndim = 1;
        p->shape[0] = 1;
    }
    p->n = 1;
    for (int d = 0; d < p->ndim; d++)
        p->n *= p->shape[d];
    return true;
}

/* off[k] = the element offset of element i in slot k (0 for absent slots). */
static inline __device__ void ft_cuda_pw_offsets(const ft_cuda_pw &p, int64_t i, int64_t *off) {
#pragma unroll
    for (int k = 0; k <= FT_CUDA_PW_OPS; k++)
        off[k] = 0;
    for (int d = p.ndim - 1; d > 0; d--) {
        int64_t q = i / p.shape[d], idx = i - q * p.shape[d];
        i = q;
#pragma unroll
        for (int k = 0; k <= FT_CUDA_PW_OPS; k++)
            off[k] += idx * p.st[k][d];
    }
#pragma unroll
    for (int k = 0; k <= FT_CUDA_PW_OPS; k++)
        off[k] += i * p.st[k][0];
}

/* Runs op(v, index) on every element: v[k] holds slot k as float (outputs
 * only with read_outputs), op sets the outputs, which are then stored. All of
 * an element's inputs are read before its outputs are written, so an output
 * may be the very same view as an input. Each thread takes E consecutive
 * elements at a time with its own copy of op (state such as a Philox block
 * carries over between them). */
template <int E, class Op>
__global__ void __launch_bounds__(FT_CUDA_PW_THREADS) ft_cuda_pw_kernel(ft_cuda_pw p, Op op) {
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q * E < p.n; q += step)
        for (int64_t i = q * E; i < q * E + E && i < p.n; i++) {
            int64_t off[FT_CUDA_PW_OPS + 1];
            ft_cuda_pw_offsets(p, i, off);
            float v[FT_CUDA_PW_OPS];
#pragma unroll
            for (int k = 0; k < FT_CUDA_PW_OPS; k++)
                if ((p.present >> k & 1u) && (k >= p.nout || p.read_outputs))
                    v[k] = ft_cuda_load_f(p.base[k], off[k], p.kind[k]);
            op(v, off[FT_CUDA_PW_OPS]);
#pragma unroll
            for (int k = 0; k < FT_CUDA_PW_OPS; k++)
                if ((p.present >> k & 1u) && k < p.nout)
                    ft_cuda_store_f(p.base[k], off[k], p.kind[k], v[k]);
        }
}

template <int E, class Op>
static inline ft_status ft_cuda_pw_run(const ft_cuda_pw &p, Op op, const char *kernel) {
    ft_cuda_pw_kernel<E, Op>
        <<<ft_cuda_blocks((p.n + E - 1) / E, FT_CUDA_PW_THREADS), FT_CUDA_PW_THREADS, 0, FT_CUDA_STREAM>>>(p, op);
    return ft_cuda_launched(kernel);
}

#endif
