/* 2-d pooling on CUDA: the CUDA side of ops/pool.c, with its windows
 * (kernels/pool.h) and its results bit for bit.
 *
 * Legend: N batch, C channels, H W input size, P Q output size.
 *
 * Forward: one thread per output goes through its window in the CPU's order
 * (rows, then columns), so it finds the CPU's maximum and position (NaN
 * wins, ties keep the first) and adds the CPU's float sum.
 *
 * Average backward is a gather: one thread per input element adds the
 * shares of the outputs whose windows hold it, starting from 0 (or dinp)
 * and in the order in which the CPU's scatter adds them (output rows, then
 * columns); no atomics, and the CPU's bits.
 *
 * Max backward has no windows to gather over (it gets only the indices,
 * which may point anywhere in the plane), so it scatters like the CPU: one
 * warp per (n, c) plane takes 32 outputs at a time; the lanes whose outputs
 * point at one input element form a group, and the first of the group adds
 * the group's gradients to it in output order. That is the CPU's order of
 * additions again. Float atomics would add them in whatever order the
 * threads arrive, different bits from run to run.
 *
 * Every kernel reads and writes float32 or 16-bit floats (ft_cuda_kind),
 * computing in float and rounding once. The max backward adds into its
 * elements over many steps, so a 16-bit dinp gets a float32 plane of
 * scratch per warp: the warp loads dinp into it (or zeroes it), adds there
 * in the order above, and rounds each element once at the end, giving the
 * float32 result on the same values, rounded.
 *
 * Tensors have any strides. Threads are numbered channels innermost when the
 * tensor they walk is channels-last (NHWC) and columns innermost otherwise,
 * so that neighbouring threads touch neighbouring memory. */
#include <math.h>

#include "backend.h"
#include "kernels/pool.h"
#include "ops/cuda_ops.h"

namespace {

constexpr int THREADS = 256;
constexpr unsigned FULL_MASK = 0xffffffffu;

/* A pooling's sizes and windows. */
typedef struct {
    int64_t N, C, H, W, P, Q;
    bool adaptive;
    int64_t k[2], stride[2], pad[2], dil[2]; /* fixed windows, (h, w) */
    int64_t divisor_override;
    bool count_include_pad;
} pool_geom;

/* in (N, C, H, W) pooled into out (N, C, P, Q); p NULL for adaptive windows. */
static pool_geom geom_of(const ft_tensor *in, const ft_tensor *out, const ft_pool2d_params *p) {
    pool_geom g = {};
    g.N = in->shape[0], g.C = in->shape[1], g.H = in->shape[2], g.W = in->shape[3];
    g.P = out->shape[2], g.Q = out->shape[3];
    g.adaptive = !p;
    if (p) {
        for (int d = 0; d < 2; d++) {
            g.k[d] = p->kernel[d], g.stride[d] = p->stride[d], g.pad[d] = p->padding[d];
            g.dil[d] = p->dilation[d];
        }
        g.divisor_override = p->divisor_override;
        g.count_include_pad = p->count_include_pad;
    }
    return g;
}

/* Window o along dimension dim (0: rows, 1: columns). */
static inline FT_HD ft_pool_span window(const pool_geom &g, int dim, int64_t o) {
    int64_t in = dim ? g.W : g.H;
    if (g.adaptive)
        return ft_pool_adaptive_span(o, dim ? g.Q : g.P, in);
    return ft_pool_fixed_span(o, in, g.k[dim], g.stride[dim], g.pad[dim], g.dil[dim]);
}

/* The outputs [*o0, *o1] along dim whose windows can hold input element i
 * (a superset of them: each still has to be tested against its window). */
static inline FT_HD void covering(const pool_geom &g, int dim, int64_t i, int64_t *o0, int64_t *o1) {
    int64_t n = dim ? g.Q : g.P, in = dim ? g.W : g.H, lo, hi;
    if (g.adaptive) {
        /* floor(o in / n) <= i < ceil((o + 1) in / n) */
        lo = i * n / in;
        hi = ((i + 1) * n - 1) / in;
    } else {
        /* o stride - pad <= i <= o stride - pad + (k - 1) dil */
        int64_t s = g.stride[dim], reach = (g.k[dim] - 1) * g.dil[dim];
        lo = ft_floor_div(i + g.pad[dim] - reach + s - 1, s);
        hi = ft_floor_div(i + g.pad[dim], s);
    }
    *o0 = lo > 0 ? lo : 0;
    *o1 = hi < n - 1 ? hi : n - 1;
}

/* A 4-d tensor's strides. */
typedef struct {
    int64_t n, c, h, w;
} strides4;

static strides4 strides_of(const ft_tensor *t) {
    strides4 s = {t->strides[0], t->strides[1], t->strides[2], t->strides[3]};
    return s;
}

/* Channels innermost in memory (NHWC), as ops/pool.c decides. */
static bool channels_last(const ft_tensor *t) { return t->shape[1] > 1 && t->strides[1] == 1; }

/* Element i of an (N, C, A, B) iteration: channels innermost when cl, else B innermost. */
typedef struct {
    int64_t n, c, a, b;
} index4;

static inline FT_HD index4 unravel(int64_t i, int64_t C, int64_t A, int64_t B, bool cl) {
    index4 e;
    if (cl) {
        e.c = i % C, i /= C;
        e.b = i % B, i /= B;
        e.a = i % A, e.n = i / A;
    } else {
        e.b = i % B, i /= B;
        e.a = i % A, i /= A;
        e.c = i % C, e.n = i / C;
    }
    return e;
}

/* ---- forward ------------------------------------------------------------- */

template <typename Idx> struct pool_fwd {
    pool_geom g;
    bool max, cl;
    const char *x; /* float32 or 16-bit (kx), as y (ky) */
    int8_t kx, ky;
    strides4 xs;
    char *y;
    strides4 ys;
    Idx *ind; /* max pooling's positions h * W + w, or NULL */
    strides4 is;
};

/* Output i: as the CPU's fwd_one. */
template <typename Idx> static inline FT_HD void pool_forward_one(const pool_fwd<Idx> &a, int64_t i) {
    const pool_geom &g = a.g;
    index4 o = unravel(i, g.C, g.P, g.Q, a.cl);
    ft_pool_span r = window(g, 0, o.a), q = window(g, 1, o.b);
    int64_t x = o.n * a.xs.n + o.c * a.xs.c, y = o.n * a.ys.n + o.c * a.ys.c + o.a * a.ys.h + o.b * a.ys.w;
    bool empty = r.lo >= r.hi || q.lo >= q.hi;
    if (a.max) {
        float m = -INFINITY;
        int64_t at = empty ? -1 : r.lo * g.W + q.lo;
        for (int64_t h = r.lo; h < r.hi; h += r.step)
            for (int64_t w = q.lo; w < q.hi; w += q.step) {
                float v = ft_cuda_load_f(a.x, x + h * a.xs.h + w * a.xs.w, a.kx);
                if (v > m || v != v)
                    m = v, at = h * g.W + w;
            }
        ft_cuda_store_f(a.y, y, a.ky, m);
        if (a.ind)
            a.ind[o.n * a.is.n + o.c * a.is.c + o.a * a.is.h + o.b * a.is.w] = (Idx)at;
    } else {
        float sum = 0.0f;
        for (int64_t h = r.lo; h < r.hi; h++)
            for (int64_t w = q.lo; w < q.hi; w++)
                sum += ft_cuda_load_f(a.x, x + h * a.xs.h + w * a.xs.w, a.kx);
        ft_cuda_store_f(a.y, y, a.ky,
                        empty ? 0.0f : sum / ft_pool_divisor(r, q, g.divisor_override, g.count_include_pad));
    }
}

template <typename Idx> __global__ void __launch_bounds__(THREADS) pool_forward_kernel(pool_fwd<Idx> a, int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS)
        pool_forward_one(a, i);
}

template <typename Idx>
static void queue_forward(const pool_geom &g, bool max, const ft_tensor *out, const ft_tensor *ind,
                          const ft_tensor *inp, int64_t total) {
    pool_fwd<Idx> a;
    a.g = g, a.max = max, a.cl = channels_last(inp);
    a.x = (const char *)ft_tensor_data(inp), a.xs = strides_of(inp), a.kx = ft_cuda_kind(inp->dtype);
    a.y = (char *)ft_tensor_data(out), a.ys = strides_of(out), a.ky = ft_cuda_kind(out->dtype);
    a.ind = ind ? (Idx *)ft_tensor_data(ind) : NULL;
    a.is = ind ? strides_of(ind) : strides4{};
    pool_forward_kernel<Idx><<<ft_cuda_blocks(total, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(a, total);
}

static ft_status forward(const ft_tensor *out, const ft_tensor *ind, const ft_tensor *inp,
                         const ft_pool2d_params *p, bool max) {
    FT_TRY(ft_cuda_use_device(inp));
    pool_geom g = geom_of(inp, out, p);
    int64_t total = g.N * g.C * g.P * g.Q;
    if (total == 0)
        return FT_OK;
    if (ind && ind->dtype == FT_INT32)
        queue_forward<int32_t>(g, max, out, ind, inp, total);
    else
        queue_forward<int64_t>(g, max, out, ind, inp, total);
    return ft_cuda_launched("pool_forward_kernel");
}

static ft_status max_pool2d_forward(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp,
                                    const ft_pool2d_params *p) {
    return forward(out, indices, inp, p, true);
}

static ft_status avg_pool2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_pool2d_params *p) {
    return forward(out, NULL, inp, p, false);
}

static ft_status adaptive_avg_pool2d_forward(const ft_tensor *out, const ft_tensor *inp) {
    return forward(out, NULL, inp, NULL, false);
}

static ft_status adaptive_max_pool2d_forward(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp) {
    return forward(out, indices, inp, NULL, true);
}

/* ---- average backward: gather -------------------------------------------- */

typedef struct {
    pool_geom g;
    bool accumulate, cl;
    char *d; /* dinp, float32 or 16-bit (kd), summed in float and rounded once */
    strides4 ds;
    const char *dy; /* dout (kdy) */
    strides4 dys;
    int8_t kd, kdy;
} avg_bwd;

/* Input element i: what the CPU's scatter adds to it, in its order. */
static inline FT_HD void avg_backward_one(const avg_bwd &a, int64_t i) {
    const pool_geom &g = a.g;
    index4 e = unravel(i, g.C, g.H, g.W, a.cl);
    int64_t d = e.n * a.ds.n + e.c * a.ds.c + e.a * a.ds.h + e.b * a.ds.w, dy = e.n * a.dys.n + e.c * a.dys.c;
    float acc = a.accumulate ? ft_cuda_load_f(a.d, d, a.kd) : 0.0f;
    int64_t oh0, oh1, ow0, ow1;
    covering(g, 0, e.a, &oh0, &oh1);
    covering(g, 1, e.b, &ow0, &ow1);
    for (int64_t oh = oh0; oh <= oh1; oh++) {
        ft_pool_span r = window(g, 0, oh);
        if (e.a < r.lo || e.a >= r.hi)
            continue;
        for (int64_t ow = ow0; ow <= ow1; ow++) {
            ft_pool_span q = window(g, 1, ow);
            if (e.b < q.lo || e.b >= q.hi)
                continue;
            acc += ft_cuda_load_f(a.dy, dy + oh * a.dys.h + ow * a.dys.w, a.kdy) /
                   ft_pool_divisor(r, q, g.divisor_override, g.count_include_pad);
        }
    }
    ft_cuda_store_f(a.d, d, a.kd, acc);
}

__global__ void __launch_bounds__(THREADS) avg_backward_kernel(avg_bwd a, int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS)
        avg_backward_one(a, i);
}

static ft_status avg_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_pool2d_params *p,
                              bool accumulate) {
    FT_TRY(ft_cuda_use_device(dinp));
    avg_bwd a;
    a.g = geom_of(dinp, dout, p);
    a.accumulate = accumulate, a.cl = channels_last(dinp);
    a.d = (char *)ft_tensor_data(dinp), a.ds = strides_of(dinp), a.kd = ft_cuda_kind(dinp->dtype);
    a.dy = (const char *)ft_tensor_data(dout), a.dys = strides_of(dout), a.kdy = ft_cuda_kind(dout->dtype);
    int64_t total = a.g.N * a.g.C * a.g.H * a.g.W;
    if (total == 0)
        return FT_OK;
    avg_backward_kernel<<<ft_cuda_blocks(total, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(a, total);
    return ft_cuda_launched("avg_backward_kernel");
}

static ft_status avg_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_pool2d_params *p,
                                     bool accumulate) {
    return avg_backward(dinp, dout, p, accumulate);
}

static ft_status adaptive_avg_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, bool accumulate) {
    return avg_backward(dinp, dout, NULL, accumulate);
}

/* ---- max backward: ordered scatter --------------------------------------- */

template <typename Idx> struct max_bwd {
    int64_t N, C, H, W, P, Q;
    bool accumulate;
    char *d; /* dinp (kd) */
    strides4 ds;
    const char *dy; /* dout (kdy) */
    strides4 dys;
    int8_t kd, kdy;
    const Idx *ind;
    strides4 is;
    /* a 16-bit dinp's sums: (warps, H W) floats, a plane per warp of the
     * grid; NULL when dinp is float32 and takes the sums itself */
    float *work;
    /* [0] != 0 when an index is outside [-1, H W); [1] the largest such
     * index (by signed order, stored with its sign bit flipped) */
    unsigned long long *bad;
};

/* One warp per plane; see the top of the file. */
template <typename Idx> __global__ void __launch_bounds__(THREADS) max_backward_kernel(max_bwd<Idx> a) {
    __shared__ float vals[THREADS];
    int lane = threadIdx.x % 32;
    float *warp_vals = vals + (threadIdx.x - lane);
    int64_t warp = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / 32, warps = (int64_t)gridDim.x * (THREADS / 32);
    int64_t HW = a.H * a.W, PQ = a.P * a.Q;
    /* where the sums run: dinp's plane, or the warp's plane of work (dense) */
    int64_t fh = a.work ? a.W : a.ds.h, fw = a.work ? 1 : a.ds.w;
    for (int64_t plane = warp; plane < a.N * a.C; plane += warps) {
        int64_t n = plane / a.C, c = plane % a.C;
        int64_t d = n * a.ds.n + c * a.ds.c, dy = n * a.dys.n + c * a.dys.c;
        float *f = a.work ? a.work + warp * HW : (float *)a.d + d;
        const Idx *ind = a.ind + n * a.is.n + c * a.is.c;
        if (a.work || !a.accumulate)
            for (int64_t e = lane; e < HW; e += 32) {
                int64_t h = e / a.W, w = e % a.W;
                f[h * fh + w * fw] = a.accumulate ? ft_cuda_load_f(a.d, d + h * a.ds.h + w * a.ds.w, a.kd) : 0.0f;
            }
        __syncwarp(); /* the starting values are stored before any lane adds to them */
        for (int64_t o0 = 0; o0 < PQ; o0 += 32) {
            int64_t o = o0 + lane, at = -1;
            float v = 0.0f;
            if (o < PQ) {
                int64_t oh = o / a.Q, ow = o % a.Q;
                at = (int64_t)ind[oh * a.is.h + ow * a.is.w];
                v = ft_cuda_load_f(a.dy, dy + oh * a.dys.h + ow * a.dys.w, a.kdy);
                if (at < -1 || at >= HW) {
                    atomicOr(&a.bad[0], 1ull);
                    atomicMax(&a.bad[1], (unsigned long long)at ^ (1ull << 63));
                }
            }
            bool valid = o < PQ && at >= 0 && at < HW;
            unsigned group = __match_any_sync(FULL_MASK, at) & __ballot_sync(FULL_MASK, valid);
            warp_vals[lane] = v;
            __syncwarp(); /* the group's values are in shared memory for its first lane */
            if (valid && __ffs(group) - 1 == lane) {
                float *p = f + at / a.W * fh + at % a.W * fw;
                float sum = *p;
                for (unsigned m = group; m; m &= m - 1)
                    sum += warp_vals[__ffs(m) - 1];
                *p = sum;
            }
            __syncwarp(); /* the sums are stored before the next outputs add to them, and vals is free */
        }
        /* each lane rounds the elements it started, so the next plane's start needs no barrier */
        if (a.work)
            for (int64_t e = lane; e < HW; e += 32)
                ft_cuda_store_f(a.d, d + e / a.W * a.ds.h + e % a.W * a.ds.w, a.kd, f[e]);
    }
}

/* The blocks of the max backward: a warp per plane, up to ft_cuda_blocks' limit. */
static unsigned max_backward_blocks(const ft_tensor *dinp) {
    return ft_cuda_blocks(dinp->shape[0] * dinp->shape[1], THREADS / 32);
}

template <typename Idx>
static ft_status queue_max_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *ind,
                                    bool accumulate, unsigned long long *bad, float *work) {
    max_bwd<Idx> a;
    a.N = dinp->shape[0], a.C = dinp->shape[1], a.H = dinp->shape[2], a.W = dinp->shape[3];
    a.P = dout->shape[2], a.Q = dout->shape[3];
    a.accumulate = accumulate;
    a.d = (char *)ft_tensor_data(dinp), a.ds = strides_of(dinp), a.kd = ft_cuda_kind(dinp->dtype);
    a.dy = (const char *)ft_tensor_data(dout), a.dys = strides_of(dout), a.kdy = ft_cuda_kind(dout->dtype);
    a.ind = (const Idx *)ft_tensor_data(ind), a.is = strides_of(ind);
    a.work = work;
    a.bad = bad;
    max_backward_kernel<Idx><<<max_backward_blocks(dinp), THREADS, 0, FT_CUDA_STREAM>>>(a);
    return ft_cuda_launched("max_backward_kernel");
}

/* Both max poolings scatter by their saved indices; `op` names the one in errors. */
static ft_status max_backward(const char *op, const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                              bool accumulate) {
    FT_TRY(ft_cuda_use_device(dinp));
    int64_t H = dinp->shape[2], W = dinp->shape[3];
    if (dinp->shape[0] * dinp->shape[1] * H * W == 0)
        return FT_OK;
    /* the flag, then a 16-bit dinp's planes of sums: never more than a float32 copy of dinp */
    int64_t warps = (int64_t)max_backward_blocks(dinp) * (THREADS / 32), planes = dinp->shape[0] * dinp->shape[1];
    size_t work = ft_cuda_kind(dinp->dtype) == FT_CUDA_F32 ? 0 : (size_t)(warps < planes ? warps : planes) * H * W;
    ft_cuda_scratch scratch;
    FT_TRY(ft_cuda_scratch_alloc(&scratch, 2 * sizeof(unsigned long long) + work * sizeof(float),
                                 ft_tensor_device(dinp).index));
    unsigned long long *bad = (unsigned long long *)scratch.ptr, found[2] = {0, 0};
    float *sums = work ? (float *)(bad + 2) : NULL;
    ft_status st = ft_cuda_check(cudaMemsetAsync(bad, 0, 2 * sizeof *bad, FT_CUDA_STREAM), "cudaMemsetAsync");
    if (st == FT_OK)
        st = indices->dtype == FT_INT32 ? queue_max_backward<int32_t>(dinp, dout, indices, accumulate, bad, sums)
                                        : queue_max_backward<int64_t>(dinp, dout, indices, accumulate, bad, sums);
    /* The CPU fails on an index outside the plane; so must this, which needs the flag back. */
    if (st == FT_OK)
        st = ft_cuda_check(cudaMemcpy(found, bad, sizeof found, cudaMemcpyDeviceToHost), "cudaMemcpy");
    ft_cuda_scratch_free(&scratch);
    if (st == FT_OK && found[0])
        return ft_cuda_fail(FT_ERR_INDEX, "%s: indices holds %lld, outside [0, %lld) for a %lld x %lld input", op,
                            (long long)(found[1] ^ (1ull << 63)), (long long)(H * W), (long long)H, (long long)W);
    return st;
}

static ft_status max_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                     bool accumulate) {
    return max_backward("max_pool2d_backward", dinp, dout, indices, accumulate);
}

static ft_status adaptive_max_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                              bool accumulate) {
    return max_backward("adaptive_max_pool2d_backward", dinp, dout, indices, accumulate);
}

} // namespace

void ft_cuda_register_pool(struct ft_cuda_ops *ops) {
    ops->max_pool2d_forward = max_pool2d_forward;
    ops->max_pool2d_backward = max_pool2d_backward;
    ops->avg_pool2d_forward = avg_pool2d_forward;
    ops->avg_pool2d_backward = avg_pool2d_backward;
    ops->adaptive_avg_pool2d_forward = adaptive_avg_pool2d_forward;
    ops->adaptive_avg_pool2d_backward = adaptive_avg_pool2d_backward;
    ops->adaptive_max_pool2d_forward = adaptive_max_pool2d_forward;
    ops->adaptive_max_pool2d_backward = adaptive_max_pool2d_backward;
}
