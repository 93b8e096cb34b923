/* The eager tensor math on the device: elementwise ops and reductions over
 * any dtype and strides, planned and checked by the entry points
 * (ops/math.c), each element computed by the functions of kernels/math.h
 * that the CPU reference loops run too. */
#include "backend.h"
#include "kernels/math.h"
#include "ops/cuda_ops.h"

#define FT_MATH_THREADS 256

namespace {

__global__ void __launch_bounds__(FT_MATH_THREADS) map_kernel(ft_math_map m) {
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m.n; i += step)
        ft_math_map_element(&m, i);
}

/* Output o's reduction by the block: thread t takes the elements t, t + T,
 * ... in order, then the T partials meet in a fixed tree, so every run gives
 * the same bits (no atomics), and extremes keep their first position. Every
 * thread of the block gets the total. */
__device__ ft_red_acc block_reduce(const ft_math_reduction *r, ft_red_op op, int64_t o, double shift, ft_red_acc *sh) {
    sh[threadIdx.x] = ft_math_reduce_part(r, op, o, threadIdx.x, blockDim.x, shift);
    __syncthreads();
    ft_math_kind kind = ft_math_kind_of(r->compute);
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = ft_red_combine(op, kind, sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    ft_red_acc total = sh[0];
    __syncthreads(); /* sh is free for the next call */
    return total;
}

/* A block per output at a time; the variance's first pass gives the mean
 * its second pass is centred on, as on the CPU. */
__global__ void __launch_bounds__(FT_MATH_THREADS) reduce_kernel(ft_math_reduction r) {
    __shared__ ft_red_acc sh[FT_MATH_THREADS];
    bool var = r.op == FT_RED_VAR || r.op == FT_RED_STD;
    for (int64_t o = blockIdx.x; o < r.nout; o += gridDim.x) {
        double shift = var ? ft_math_reduce_mean(&r, block_reduce(&r, FT_RED_SUM, o, 0.0, sh)) : 0.0;
        ft_red_acc acc = block_reduce(&r, r.op, o, shift, sh);
        if (threadIdx.x == 0)
            ft_math_reduce_store(&r, o, acc);
    }
}

} // namespace

static ft_status math_pointwise(const ft_tensor *t, const ft_math_map *m) {
    FT_TRY(ft_cuda_use_device(t));
    map_kernel<<<ft_cuda_blocks(m->n, FT_MATH_THREADS), FT_MATH_THREADS, 0, FT_CUDA_STREAM>>>(*m);
    return ft_cuda_launched("math_pointwise kernel launch");
}

static ft_status math_reduce(const ft_tensor *t, const ft_math_reduction *r) {
    FT_TRY(ft_cuda_use_device(t));
    /* A power of two of threads, no more than the elements each output
     * reduces need (a warp at least): small reductions waste no block. */
    unsigned threads = 32;
    while (threads < FT_MATH_THREADS && threads < r->count)
        threads *= 2;
    unsigned blocks = (unsigned)(r->nout < 65536 ? r->nout : 65536);
    reduce_kernel<<<blocks, threads, 0, FT_CUDA_STREAM>>>(*r);
    return ft_cuda_launched("math_reduce kernel launch");
}

void ft_cuda_register_math(struct ft_cuda_ops *ops) {
    ops->math_pointwise = math_pointwise;
    ops->math_reduce = math_reduce;
}
