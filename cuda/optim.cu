/* The fused optimizer passes and the weight EMA on the device (optim/optim.h).
 *
 * Every pass runs one thread block per FT_OPTIM_BLOCK-element block of the
 * flat buffers (ft_cuda_optim's numbering), THREADS threads each, a thread
 * taking every THREADS-th element of the block so that a warp reads
 * consecutive floats. A block finds its segment by binary search over the
 * segments' first blocks, so the passes need no per-block table.
 *
 * Sums of squares follow the CPU's semantics: each term is the float value
 * (the scaled gradient rounded to float, the LAMB direction, the param)
 * squared and added in double; a thread block adds its threads' sums in a
 * fixed tree order into one partial per block, and a second pass adds the
 * partials of a segment (trust ratios) or of all blocks (the global norm)
 * in a fixed tree order again. The per-element updates are the functions of
 * kernels/optim.h that the CPU loops call. */
#include <limits.h>

#include "backend.h"
#include "kernels/optim.h"
#include "ops/cuda_ops.h"
#include "optim/optim.h"
#include "optim/state.h"
#include "optim/trust.h"

namespace {

/* Threads per thread block: 64 elements each in a full FT_OPTIM_BLOCK. */
constexpr int THREADS = 256;

/* The elements [start, start + len) of segment `seg` that one block covers. */
struct span {
    int seg;
    int64_t start, len;
};

__device__ const ft_cuda_flat_segment &flat_of(const ft_cuda_flat_segment &s) { return s; }
__device__ const ft_cuda_flat_segment &flat_of(const ft_cuda_optim_segment &s) { return s.flat; }

/* Block b lies in the last segment whose blocks start at or before it: an
 * empty segment owns no block and shares its first_block with the segment
 * after it, so the search passes over it. */
template <typename Seg> __device__ span block_span(const Seg *table, int nseg, int64_t b) {
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (flat_of(table[mid]).first_block <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const ft_cuda_flat_segment &f = flat_of(table[lo]);
    span s;
    s.seg = lo;
    s.start = (b - f.first_block) * FT_OPTIM_BLOCK;
    s.len = f.numel - s.start < FT_OPTIM_BLOCK ? f.numel - s.start : FT_OPTIM_BLOCK;
    return s;
}

/* The sum of every thread's v in a fixed tree order, returned to all
 * threads. `shared` (THREADS doubles) must serve no other sum of the block. */
__device__ double block_sum(double v, double *shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned half = THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half)
            shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    return shared[0];
}

/* partial[2b] = the sum of (grad * scale)^2 over block b, partial[2b + 1]
 * that of param^2 with `params`; both 0 where they are not computed, so that
 * the total may add every block. */
__global__ void grad_sumsq_kernel(const ft_cuda_optim_segment *table, int nseg, double *partial, float scale,
                                  bool params) {
    __shared__ double sg[THREADS], sp[THREADS];
    int64_t b = blockIdx.x;
    span s = block_span(table, nseg, b);
    const ft_cuda_flat_segment &f = table[s.seg].flat;
    double g2 = 0, p2 = 0;
    if (f.grad) {
        const float *g = f.grad + s.start, *p = f.param + s.start;
        for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
            double v = g[i] * scale; /* the product rounded to float, as the update sees it */
            g2 += v * v;
            if (params) {
                double q = p[i];
                p2 += q * q;
            }
        }
    }
    g2 = block_sum(g2, sg);
    p2 = block_sum(p2, sp);
    if (threadIdx.x == 0) {
        partial[2 * b] = g2;
        partial[2 * b + 1] = p2;
    }
}

/* *total = the sum of every partial[2b]; one block. */
__global__ void total_kernel(const double *partial, int64_t nblocks, double *total) {
    __shared__ double sh[THREADS];
    double s = 0;
    for (int64_t b = threadIdx.x; b < nblocks; b += THREADS)
        s += partial[2 * b];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        *total = s;
}

/* This block's segment when it has a grad (NULL otherwise), and its span. */
__device__ const ft_cuda_optim_segment *step_block(const ft_cuda_optim &o, span *s) {
    *s = block_span(o.table, o.nseg, blockIdx.x);
    const ft_cuda_optim_segment *seg = &o.table[s->seg];
    return seg->flat.grad ? seg : nullptr;
}

/* LAMB's moments; partial[2b] = the sum of u^2 over block b, partial[2b + 1]
 * that of param^2. */
__global__ void lamb_moments_kernel(ft_cuda_optim o, float scale, float clip) {
    __shared__ double su[THREADS], sp[THREADS];
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_lamb_coef k = seg->coef.lamb;
    const bool maximize = seg->maximize;
    int64_t at = seg->flat.offset + s.start;
    float *m = o.exp_avg + at, *v = o.exp_avg_sq + at;
    const float *p = seg->flat.param + s.start, *g = seg->flat.grad + s.start;
    double au = 0, ap = 0;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
        float gi = ft_optim_grad(g[i], scale, clip, maximize);
        float mi = ft_adam_exp_avg(m[i], gi, &k.mom), vi = ft_adam_exp_avg_sq(v[i], gi, &k.mom);
        m[i] = mi;
        v[i] = vi;
        double u = ft_lamb_direction(p[i], mi, vi, &k), q = p[i];
        au += u * u;
        ap += q * q;
    }
    au = block_sum(au, su);
    ap = block_sum(ap, sp);
    if (threadIdx.x == 0) {
        o.partial[2 * blockIdx.x] = au;
        o.partial[2 * blockIdx.x + 1] = ap;
    }
}

/* One block per segment: its lr times its trust ratio, from the partials of
 * its blocks, into its coefficients. */
__global__ void trust_kernel(ft_cuda_optim o, float clip) {
    __shared__ double sa[THREADS], sb[THREADS];
    ft_cuda_optim_segment *seg = &o.table[blockIdx.x];
    if (!seg->flat.grad)
        return;
    int64_t first = seg->flat.first_block, n = (seg->flat.numel + FT_OPTIM_BLOCK - 1) / FT_OPTIM_BLOCK;
    double a = 0, c = 0;
    for (int64_t j = threadIdx.x; j < n; j += THREADS) {
        a += o.partial[2 * (first + j)];
        c += o.partial[2 * (first + j) + 1];
    }
    a = block_sum(a, sa);
    c = block_sum(c, sb);
    if (threadIdx.x == 0) {
        bool lars = o.kind == FT_OPTIM_LARS;
        double ratio = ft_optim_trust_ratio(lars, seg->lars_exclude, a, c, clip, seg->trust_coefficient,
                                            seg->weight_decay, seg->eps);
        float lr = (float)(seg->lr * ratio);
        if (lars)
            seg->coef.lars.scaled_lr = lr;
        else
            seg->coef.lamb.lr_trust = lr;
    }
}

__global__ void sgd_kernel(ft_cuda_optim o, float scale, float clip) {
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_sgd_coef k = seg->coef.sgd;
    const bool maximize = seg->maximize;
    float *p = seg->flat.param + s.start;
    const float *g = seg->flat.grad + s.start;
    float *buf = seg->momentum ? o.momentum_buffer + seg->flat.offset + s.start : nullptr;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
        float d = ft_sgd_direction(ft_optim_grad(g[i], scale, clip, maximize), p[i], &k);
        if (buf) {
            float b = ft_sgd_momentum(buf[i], d, &k);
            buf[i] = b;
            p[i] = ft_sgd_param(p[i], ft_sgd_nesterov(d, b, &k), &k);
        } else {
            p[i] = ft_sgd_param(p[i], d, &k);
        }
    }
}

__global__ void adamw_kernel(ft_cuda_optim o, float scale, float clip) {
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_adamw_coef k = seg->coef.adamw;
    const bool maximize = seg->maximize;
    int64_t at = seg->flat.offset + s.start;
    float *p = seg->flat.param + s.start, *m = o.exp_avg + at, *v = o.exp_avg_sq + at;
    float *vmax = seg->amsgrad ? o.max_exp_avg_sq + at : nullptr;
    const float *g = seg->flat.grad + s.start;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
        float gi = ft_l2_grad(ft_optim_grad(g[i], scale, clip, maximize), p[i], k.l2);
        float mi = ft_adam_exp_avg(m[i], gi, &k.mom), vi = ft_adam_exp_avg_sq(v[i], gi, &k.mom);
        m[i] = mi;
        v[i] = vi;
        if (vmax) {
            float vm = ft_optim_max(vmax[i], vi);
            vmax[i] = vm;
            p[i] = ft_adamw_param(p[i], mi, vm, &k);
        } else {
            p[i] = ft_adamw_param(p[i], mi, vi, &k);
        }
    }
}

/* RMSprop and Adadelta: a running mean of squared gradients (square_avg) and RMSprop's grad_avg and momentum
 * buffer or Adadelta's acc_delta. */
__global__ void averages_kernel(ft_cuda_optim o, float scale, float clip) {
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_rmsprop_coef k = seg->coef.rmsprop;
    const bool maximize = seg->maximize, adadelta = o.kind == FT_OPTIM_ADADELTA;
    int64_t at = seg->flat.offset + s.start;
    float *p = seg->flat.param + s.start, *v = o.square_avg + at;
    float *a = seg->centered ? o.grad_avg + at : nullptr, *buf = seg->momentum ? o.momentum_buffer + at : nullptr;
    float *u = adadelta ? o.acc_delta + at : nullptr;
    const float *g = seg->flat.grad + s.start;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
        float gi = ft_l2_grad(ft_optim_grad(g[i], scale, clip, maximize), p[i], k.weight_decay);
        p[i] = adadelta ? ft_adadelta_param(p[i], gi, &v[i], &u[i], &k)
                        : ft_rmsprop_param(p[i], gi, &v[i], a ? &a[i] : nullptr, buf ? &buf[i] : nullptr, &k);
    }
}

/* Adagrad (its sum) and Adamax, NAdam, RAdam (exp_avg and exp_inf or exp_avg_sq). */
__global__ void moments_kernel(ft_cuda_optim o, float scale, float clip) {
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_optim_coef k = seg->coef;
    const bool maximize = seg->maximize;
    const int kind = o.kind;
    int64_t at = seg->flat.offset + s.start;
    float *p = seg->flat.param + s.start;
    float *a = (kind == FT_OPTIM_ADAGRAD ? o.sum : o.exp_avg) + at;
    float *b = kind == FT_OPTIM_ADAMAX ? o.exp_inf + at : kind == FT_OPTIM_ADAGRAD ? nullptr : o.exp_avg_sq + at;
    const float *g = seg->flat.grad + s.start;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
        float gi = ft_optim_grad(g[i], scale, clip, maximize);
        if (kind == FT_OPTIM_ADAGRAD)
            p[i] = ft_adagrad_param(p[i], ft_l2_grad(gi, p[i], k.adagrad.weight_decay), &a[i], &k.adagrad);
        else if (kind == FT_OPTIM_ADAMAX)
            p[i] = ft_adamax_param(p[i], ft_l2_grad(gi, p[i], k.moments.l2), &a[i], &b[i], &k.moments);
        else if (kind == FT_OPTIM_NADAM)
            p[i] = ft_nadam_param(p[i], ft_l2_grad(gi, p[i], k.moments.l2), &a[i], &b[i], &k.moments);
        else
            p[i] = ft_radam_param(p[i], ft_l2_grad(gi, p[i], k.moments.l2), &a[i], &b[i], &k.moments);
    }
}

/* LAMB's param update; lamb_moments_kernel has moved the moments already. */
__global__ void lamb_kernel(ft_cuda_optim o) {
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_lamb_coef k = seg->coef.lamb;
    int64_t at = seg->flat.offset + s.start;
    float *p = seg->flat.param + s.start;
    const float *m = o.exp_avg + at, *v = o.exp_avg_sq + at;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS)
        p[i] = ft_lamb_param(p[i], ft_lamb_direction(p[i], m[i], v[i], &k), &k);
}

__global__ void lars_kernel(ft_cuda_optim o, float scale, float clip) {
    span s;
    const ft_cuda_optim_segment *seg = step_block(o, &s);
    if (!seg)
        return;
    const ft_lars_coef k = seg->coef.lars;
    const bool maximize = seg->maximize;
    float *p = seg->flat.param + s.start, *vel = o.momentum_buffer + seg->flat.offset + s.start;
    const float *g = seg->flat.grad + s.start;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS) {
        float vi = ft_lars_velocity(vel[i], ft_optim_grad(g[i], scale, clip, maximize), p[i], &k);
        vel[i] = vi;
        p[i] = p[i] - vi;
    }
}

__global__ void ema_kernel(float *avg, const ft_cuda_flat_segment *table, int nseg, float weight) {
    span s = block_span(table, nseg, blockIdx.x);
    const ft_cuda_flat_segment &f = table[s.seg];
    float *a = avg + f.offset + s.start;
    const float *p = f.param + s.start;
    for (int64_t i = threadIdx.x; i < s.len; i += THREADS)
        a[i] = ft_ema_lerp(a[i], p[i], weight);
}

/* ---- entries ---- */

ft_status use_device(int device) { return ft_cuda_check(cudaSetDevice(device), "cudaSetDevice"); }

/* One thread block per flat block: the grid's x dimension takes up to 2^31 - 1. */
ft_status check_grid(int64_t nblocks, const char *what) {
    if (nblocks > INT_MAX)
        return ft_cuda_fail(FT_ERR_OVERFLOW, "%s: %lld blocks of %d elements are more than one launch takes", what,
                            (long long)nblocks, FT_OPTIM_BLOCK);
    return FT_OK;
}

ft_status optim_zero(float *x, int64_t n, int device) {
    if (n == 0)
        return FT_OK;
    FT_TRY(use_device(device));
    return ft_cuda_check(cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), FT_CUDA_STREAM), "cudaMemsetAsync");
}

/* The driver stages pageable host memory before cudaMemcpyAsync returns,
 * which is what lets the caller reuse the table at once. */
ft_status optim_upload(const ft_cuda_optim *o, const ft_cuda_optim_segment *table) {
    if (o->nseg == 0)
        return FT_OK;
    FT_TRY(use_device(o->device));
    return ft_cuda_check(cudaMemcpyAsync(o->table, table, (size_t)o->nseg * sizeof *table, cudaMemcpyHostToDevice,
                                         FT_CUDA_STREAM),
                         "cudaMemcpyAsync");
}

ft_status optim_grad_sumsq(const ft_cuda_optim *o, float grad_scale, bool params, double *sumsq) {
    *sumsq = 0;
    if (o->nblocks == 0)
        return FT_OK;
    FT_TRY(check_grid(o->nblocks, "optimizer step"));
    FT_TRY(use_device(o->device));
    grad_sumsq_kernel<<<(unsigned)o->nblocks, THREADS, 0, FT_CUDA_STREAM>>>(o->table, o->nseg, o->partial, grad_scale,
                                                                           params);
    FT_TRY(ft_cuda_launched("grad_sumsq_kernel"));
    total_kernel<<<1, THREADS, 0, FT_CUDA_STREAM>>>(o->partial, o->nblocks, o->total);
    FT_TRY(ft_cuda_launched("total_kernel"));
    /* The step needs the norm on the host: to report it, to clip, and to
     * refuse a non-finite one before anything is written. */
    FT_TRY(ft_cuda_check(cudaMemcpyAsync(sumsq, o->total, sizeof *sumsq, cudaMemcpyDeviceToHost, FT_CUDA_STREAM),
                         "cudaMemcpyAsync"));
    return ft_cuda_check(cudaStreamSynchronize(FT_CUDA_STREAM), "cudaStreamSynchronize");
}

ft_status optim_update(const ft_cuda_optim *o, float grad_scale, float clip) {
    if (o->nblocks == 0)
        return FT_OK;
    FT_TRY(check_grid(o->nblocks, "optimizer step"));
    FT_TRY(use_device(o->device));
    unsigned grid = (unsigned)o->nblocks;
    cudaStream_t st = FT_CUDA_STREAM;
    switch ((ft_optim_kind)o->kind) {
    case FT_OPTIM_SGD:
        sgd_kernel<<<grid, THREADS, 0, st>>>(*o, grad_scale, clip);
        return ft_cuda_launched("sgd_kernel");
    case FT_OPTIM_ADAMW:
    case FT_OPTIM_ADAM:
        adamw_kernel<<<grid, THREADS, 0, st>>>(*o, grad_scale, clip);
        return ft_cuda_launched("adamw_kernel");
    case FT_OPTIM_LAMB:
        lamb_moments_kernel<<<grid, THREADS, 0, st>>>(*o, grad_scale, clip);
        FT_TRY(ft_cuda_launched("lamb_moments_kernel"));
        trust_kernel<<<(unsigned)o->nseg, THREADS, 0, st>>>(*o, clip);
        FT_TRY(ft_cuda_launched("trust_kernel"));
        lamb_kernel<<<grid, THREADS, 0, st>>>(*o);
        return ft_cuda_launched("lamb_kernel");
    case FT_OPTIM_LARS:
        trust_kernel<<<(unsigned)o->nseg, THREADS, 0, st>>>(*o, clip);
        FT_TRY(ft_cuda_launched("trust_kernel"));
        lars_kernel<<<grid, THREADS, 0, st>>>(*o, grad_scale, clip);
        return ft_cuda_launched("lars_kernel");
    case FT_OPTIM_RMSPROP:
    case FT_OPTIM_ADADELTA:
        averages_kernel<<<grid, THREADS, 0, st>>>(*o, grad_scale, clip);
        return ft_cuda_launched("averages_kernel");
    case FT_OPTIM_ADAGRAD:
    case FT_OPTIM_ADAMAX:
    case FT_OPTIM_NADAM:
    case FT_OPTIM_RADAM:
        moments_kernel<<<grid, THREADS, 0, st>>>(*o, grad_scale, clip);
        return ft_cuda_launched("moments_kernel");
    }
    return ft_cuda_fail(FT_ERR_VALUE, "unknown optimizer kind %d", o->kind);
}

ft_status ema_update(float *avg, const ft_cuda_flat_segment *table, int nseg, int64_t nblocks, float weight,
                     int device) {
    if (nblocks == 0)
        return FT_OK;
    FT_TRY(check_grid(nblocks, "EMA update"));
    FT_TRY(use_device(device));
    ema_kernel<<<(unsigned)nblocks, THREADS, 0, FT_CUDA_STREAM>>>(avg, table, nseg, weight);
    return ft_cuda_launched("ema_kernel");
}

} // namespace

void ft_cuda_register_optim(struct ft_cuda_ops *ops) {
    ops->optim_zero = optim_zero;
    ops->optim_upload = optim_upload;
    ops->optim_grad_sumsq = optim_grad_sumsq;
    ops->optim_update = optim_update;
    ops->ema_update = ema_update;
}
