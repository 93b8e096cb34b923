/* Row ops on the device: softmax and log_softmax along any dimension,
 * cross_entropy (softmax fused, gradient in the same pass) and mse_loss.
 *
 * A row (the D elements along the softmax dimension, the C logits of a
 * sample) is reduced exactly as the CPU reduces it (ops/softmax.c): element
 * d goes to lane d % 16, each lane adds its elements in order, then a fixed
 * tree combines the lanes. The per-element and per-row math is the CPU's own
 * (kernels/softmax.h). Two forms run that order:
 *   - rows of contiguous (or scattered) elements: the 16 lanes are the 16
 *     threads of a half warp, combined by shuffles;
 *   - rows that lie side by side in memory (softmax over the channels of
 *     NCHW, cross_entropy over (N, C, d...)): one thread per row, the 16 lanes
 *     in its registers, so that neighbouring threads read neighbouring
 *     memory.
 * Both give the CPU's floats (the build's --fmad=false keeps nvcc from
 * contracting a multiply-add that the CPU rounds twice). An element is only ever read and written by the thread of
 * its lane, so an output may be the very same view as an input (in place)
 * without any synchronisation.
 *
 * Sums over rows or elements (the losses, the mean's divisor) are taken over
 * fixed chunks (in float within a thread for mse_loss, as the CPU's lanes)
 * and combined in double by fixed trees: bitwise repeatable, and equal to
 * the CPU's sums up to rounding.
 *
 * Legend: D row length, R rows, C classes, n elements of mse_loss. */
#include <math.h>

#include "backend.h"
#include "kernels/softmax.h"
#include "ops/cuda_ops.h"
#include "strided.h"

#define L FT_ROW_LANES
#define THREADS 256
#define ROW_OPS 4
/* Rows per chunk of cross_entropy's divisor, as the CPU's. */
#define RC 16
/* A block's chunk of a sum: THREADS threads of RED_PER values each. */
#define RED_PER 16
#define RED_CHUNK (THREADS * RED_PER)

namespace {

/* ---- rows ---- */

/* The rows of a shape along one dimension: the other dimensions in C order,
 * size-1 ones dropped and neighbours merged where every operand allows. */
typedef struct {
    int nd;
    int64_t nrows;
    int64_t shape[FT_MAX_DIMS];
    int64_t st[ROW_OPS][FT_MAX_DIMS]; /* each operand's strides over them, in elements */
} rows_desc;

/* dst = src without dimension `skip` (-1: none); returns the count. */
static int drop_dim(int64_t *dst, const int64_t *src, int ndim, int skip) {
    int n = 0;
    for (int d = 0; d < ndim; d++)
        if (d != skip)
            dst[n++] = src[d];
    return n;
}

/* st[k]: operand k's strides over the nd row dimensions, NULL when absent. */
static void rows_make(rows_desc *r, int nd, const int64_t *shape, const int64_t *const *st) {
    memset(r, 0, sizeof *r);
    r->nrows = 1;
    for (int d = 0; d < nd; d++) {
        r->nrows *= shape[d];
        if (shape[d] == 1)
            continue;
        int m = r->nd - 1;
        bool merge = m >= 0;
        for (int k = 0; merge && k < ROW_OPS; k++)
            merge = !st[k] || r->st[k][m] == st[k][d] * shape[d];
        if (merge) {
            r->shape[m] *= shape[d];
        } else {
            m = r->nd++;
            r->shape[m] = shape[d];
        }
        for (int k = 0; k < ROW_OPS; k++)
            r->st[k][m] = st[k] ? st[k][d] : 0;
    }
}

static inline __host__ __device__ void rows_offsets(const rows_desc &r, int64_t row, int64_t *off) {
    for (int k = 0; k < ROW_OPS; k++)
        off[k] = 0;
    for (int d = r.nd - 1; d > 0; d--) {
        int64_t q = row / r.shape[d], idx = row - q * r.shape[d];
        row = q;
        for (int k = 0; k < ROW_OPS; k++)
            off[k] += idx * r.st[k][d];
    }
    if (r.nd > 0)
        for (int k = 0; k < ROW_OPS; k++)
            off[k] += row * r.st[k][0];
}

/* Whether rows lie side by side: the innermost row dimension has stride 1
 * in each of the first nk operands, whose elements along the row do not. */
static bool side_by_side(const rows_desc &r, int nk, const int64_t *row_stride) {
    int in = r.nd - 1;
    if (in < 0 || r.shape[in] < 2)
        return false;
    for (int k = 0; k < nk; k++)
        if (r.st[k][in] != 1 || row_stride[k] == 1)
            return false;
    return true;
}

/* ---- the two forms of a row reduction ---- */

/* The 16 threads of a half warp share a row: lane l takes elements l, l + 16, ... */
struct half_warp {
    unsigned mask;
    int lane;
    __device__ bool leader() const { return lane == 0; }
    template <class F> __device__ float sum(int64_t n, F f) const {
        float acc = 0.0f;
        for (int64_t d = lane; d < n; d += L)
            acc += f(d);
        /* lane l += lane l + w for w = 8, 4, 2, 1: ft_lanes_sum's tree, ending in lane 0 */
        for (int w = L / 2; w >= 1; w /= 2)
            acc += __shfl_down_sync(mask, acc, w, L);
        return __shfl_sync(mask, acc, 0, L);
    }
    template <class F> __device__ float max(int64_t n, F f) const {
        float acc = -INFINITY;
        for (int64_t d = lane; d < n; d += L)
            acc = ft_max_step(acc, f(d));
        /* ft_lanes_max's order, lane 0 first */
        float m = __shfl_sync(mask, acc, 0, L);
        for (int l = 1; l < L; l++)
            m = ft_max_step(m, __shfl_sync(mask, acc, l, L));
        return m;
    }
    /* f(d), read by the lane that owns d, for every lane */
    template <class F> __device__ float pick(int64_t d, F f) const {
        int owner = (int)(d % L);
        float v = lane == owner ? f(d) : 0.0f;
        return __shfl_sync(mask, v, owner, L);
    }
    template <class G> __device__ void each(int64_t n, G g) const {
        for (int64_t d = lane; d < n; d += L)
            g(d);
    }
};

/* One thread has the row, its 16 lanes in registers. */
struct one_thread {
    __device__ bool leader() const { return true; }
    template <class F> __device__ float sum(int64_t n, F f) const {
        float acc[L];
#pragma unroll
        for (int l = 0; l < L; l++)
            acc[l] = 0.0f;
        for (int64_t d0 = 0; d0 < n; d0 += L)
#pragma unroll
            for (int l = 0; l < L; l++)
                if (d0 + l < n)
                    acc[l] += f(d0 + l);
        return ft_lanes_sum(acc);
    }
    template <class F> __device__ float max(int64_t n, F f) const {
        float acc[L];
#pragma unroll
        for (int l = 0; l < L; l++)
            acc[l] = -INFINITY;
        for (int64_t d0 = 0; d0 < n; d0 += L)
#pragma unroll
            for (int l = 0; l < L; l++)
                if (d0 + l < n)
                    acc[l] = ft_max_step(acc[l], f(d0 + l));
        return ft_lanes_max(acc);
    }
    template <class F> __device__ float pick(int64_t d, F f) const { return f(d); }
    template <class G> __device__ void each(int64_t n, G g) const {
        for (int64_t d = 0; d < n; d++)
            g(d);
    }
};

/* Runs rows(lanes, row) for every row in the chosen form. */
template <bool SIDE_BY_SIDE, class Rows>
__global__ void __launch_bounds__(THREADS) rows_kernel(int64_t nrows, Rows rows) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
    if (SIDE_BY_SIDE) {
        for (int64_t row = tid; row < nrows; row += nthreads)
            rows(one_thread{}, row);
    } else {
        half_warp lanes = {0xffffu << (threadIdx.x & 16), (int)(threadIdx.x & (L - 1))};
        for (int64_t row = tid / L; row < nrows; row += nthreads / L)
            rows(lanes, row);
    }
}

template <class Rows> static ft_status run_rows(int64_t nrows, bool side_by_side, Rows rows, const char *kernel) {
    if (side_by_side)
        rows_kernel<true><<<ft_cuda_blocks(nrows, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(nrows, rows);
    else
        rows_kernel<false><<<ft_cuda_blocks(nrows * L, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(nrows, rows);
    return ft_cuda_launched(kernel);
}

/* ---- fixed-order sums in double ---- */

/* The sum of v over the block, by a fixed tree. */
static __device__ double block_sum(double v) {
    __shared__ double sh[THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    double s = sh[0];
    __syncthreads(); /* before a next call overwrites sh */
    return s;
}

/* part[c] = the sum of in over chunk c of RED_CHUNK values. */
__global__ void __launch_bounds__(THREADS) sum_chunks_kernel(const double *in, int64_t n, double *part) {
    int64_t nchunks = (n + RED_CHUNK - 1) / RED_CHUNK;
    for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        double acc = 0.0;
        for (int j = 0; j < RED_PER; j++) {
            int64_t i = c * RED_CHUNK + j * THREADS + threadIdx.x;
            if (i < n)
                acc += in[i];
        }
        double s = block_sum(acc);
        if (threadIdx.x == 0)
            part[c] = s;
    }
}

/* One block: s = the sum of in; *dst = s, and loss (a float32 or 16-bit
 * scalar) = s / (*div, or div_c without div). */
__global__ void __launch_bounds__(THREADS) sum_final_kernel(const double *in, int64_t n, double *dst, char *loss,
                                                            int8_t loss_kind, const double *div, double div_c) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += THREADS)
        acc += in[i];
    double s = block_sum(acc);
    if (threadIdx.x != 0)
        return;
    if (dst)
        *dst = s;
    if (loss)
        ft_cuda_store_f(loss, 0, loss_kind, (float)(s / (div ? *div : div_c)));
}

/* Doubles of scratch sum_doubles needs for n values. */
static int64_t sum_scratch(int64_t n) { return n > RED_CHUNK ? (n + RED_CHUNK - 1) / RED_CHUNK : 0; }

/* Queues the sum of in (n) into *dst and/or loss, as sum_final_kernel;
 * red: sum_scratch(n) doubles. */
static ft_status sum_doubles(const double *in, int64_t n, double *red, double *dst, const ft_tensor *loss,
                             const double *div, double div_c) {
    if (n > RED_CHUNK) {
        int64_t nchunks = sum_scratch(n);
        sum_chunks_kernel<<<ft_cuda_blocks(nchunks * THREADS, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(in, n, red);
        FT_TRY(ft_cuda_launched("sum_chunks kernel launch"));
        in = red;
        n = nchunks;
    }
    sum_final_kernel<<<1, THREADS, 0, FT_CUDA_STREAM>>>(in, n, dst, loss ? ft_tensor_data(loss) : NULL,
                                                        loss ? ft_cuda_kind(loss->dtype) : FT_CUDA_F32, div, div_c);
    return ft_cuda_launched("sum_final kernel launch");
}

/* ---- softmax ---- */

/* Operands: forward [out, inp], backward [dinp, dout, out]. */
typedef struct {
    rows_desc rows;
    int64_t D;
    int64_t ds[3]; /* strides along the row */
    char *base[3];
    int8_t kind[3];
    bool log, backward, accumulate;
} sm_args;

struct softmax_rows {
    sm_args a;
    template <class Lanes> __device__ void operator()(const Lanes &ln, int64_t row) const {
        int64_t off[ROW_OPS];
        rows_offsets(a.rows, row, off);
        auto at = [&](int k, int64_t d) { return ft_cuda_load_f(a.base[k], off[k] + d * a.ds[k], a.kind[k]); };
        auto put = [&](int64_t d, float v) {
            int64_t i = off[0] + d * a.ds[0];
            ft_cuda_store_f(a.base[0], i, a.kind[0], a.accumulate ? ft_cuda_load_f(a.base[0], i, a.kind[0]) + v : v);
        };
        int64_t D = a.D;
        if (!a.backward) {
            float m = ln.max(D, [&](int64_t d) { return at(1, d); });
            float s = ln.sum(D, [&](int64_t d) { return ft_softmax_exp(at(1, d), m); });
            if (a.log) {
                float ls = ft_log_softmax_log_sum(s);
                ln.each(D, [&](int64_t d) { put(d, ft_log_softmax_value(at(1, d), m, ls)); });
            } else {
                float inv = ft_softmax_inv(s);
                ln.each(D, [&](int64_t d) { put(d, ft_softmax_value(ft_softmax_exp(at(1, d), m), inv)); });
            }
        } else if (a.log) {
            float s = ln.sum(D, [&](int64_t d) { return at(1, d); });
            ln.each(D, [&](int64_t d) { put(d, ft_log_softmax_grad(at(1, d), at(2, d), s)); });
        } else {
            float dot = ln.sum(D, [&](int64_t d) { return at(1, d) * at(2, d); });
            ln.each(D, [&](int64_t d) { put(d, ft_softmax_grad(at(1, d), at(2, d), dot)); });
        }
    }
};

/* The rows of an op over t, nt operands as in sm_args, all of t[1]'s shape;
 * dim in [0, ndim), 0 for a 0-d tensor (one row of one element): the entry
 * point has resolved it. False when there is nothing to compute. */
static bool softmax_args(sm_args *a, const ft_tensor *const *t, int nt, int dim, bool log, bool backward,
                         bool accumulate) {
    const ft_tensor *ref = t[1];
    int ndim = ref->ndim, skip = ndim ? dim : -1;
    memset(a, 0, sizeof *a);
    a->D = ndim ? ref->shape[dim] : 1;
    a->log = log;
    a->backward = backward;
    a->accumulate = accumulate;
    int64_t shape[FT_MAX_DIMS], st[3][FT_MAX_DIMS];
    const int64_t *stp[ROW_OPS] = {NULL};
    int nd = drop_dim(shape, ref->shape, ndim, skip);
    for (int k = 0; k < nt; k++) {
        drop_dim(st[k], t[k]->strides, ndim, skip);
        stp[k] = st[k];
        a->ds[k] = ndim ? t[k]->strides[dim] : 1;
        a->base[k] = ft_tensor_data(t[k]);
        a->kind[k] = ft_cuda_kind(t[k]->dtype);
    }
    rows_make(&a->rows, nd, shape, stp);
    return a->D > 0 && a->rows.nrows > 0;
}

static ft_status softmax_run(const ft_tensor *const *t, int nt, int dim, bool log, bool backward, bool accumulate) {
    FT_TRY(ft_cuda_use_device(t[1]));
    sm_args a;
    if (!softmax_args(&a, t, nt, dim, log, backward, accumulate))
        return FT_OK;
    return run_rows(a.rows.nrows, side_by_side(a.rows, nt, a.ds), softmax_rows{a},
                    backward ? "softmax_backward kernel launch" : "softmax_forward kernel launch");
}

static ft_status softmax_forward(const ft_tensor *out, const ft_tensor *inp, int dim, bool log) {
    const ft_tensor *t[] = {out, inp};
    return softmax_run(t, 2, dim, log, false, false);
}

static ft_status softmax_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *out, int dim,
                                  bool accumulate, bool log) {
    const ft_tensor *t[] = {dinp, dout, out};
    return softmax_run(t, 3, dim, log, true, accumulate);
}

/* ---- cross entropy ---- */

/* Row operands: 0 logits, 1 dlogits, 2 the loss (forward) or dloss
 * (backward) per row with reduction none, 3 target. */
typedef struct {
    rows_desc rows;
    int64_t C;
    int64_t cs[2]; /* class strides of logits, dlogits */
    char *base[3]; /* logits, dlogits (NULL: no gradient), loss or dloss per row (NULL: none) */
    int8_t kind[3];
    const char *target;
    bool t32;
    const float *w; /* (C) and their sum at [C]; NULL without class weights */
    double eps;
    int64_t ignore;
    const double *divisor; /* mean: the sum of w[t] over the rows not ignored */
    const char *dloss;     /* backward with mean or sum: the scalar dloss */
    int8_t dloss_kind;
    bool loss_rows, accumulate;
    double *row_loss; /* forward with mean or sum: each row's loss */
} ce_args;

static __device__ int64_t target_at(const ce_args &a, int64_t off) {
    return a.t32 ? ((const int32_t *)a.target)[off] : ((const int64_t *)a.target)[off];
}

/* One row: its loss and, with dlogits, its gradient; the CPU's ce_row with
 * the same row math (kernels/softmax.h), in the same order. */
struct ce_rows {
    ce_args a;
    template <class Lanes> __device__ void operator()(const Lanes &ln, int64_t row) const {
        int64_t off[ROW_OPS], C = a.C;
        rows_offsets(a.rows, row, off);
        int64_t t = target_at(a, off[3]);
        auto x = [&](int64_t d) { return ft_cuda_load_f(a.base[0], off[0] + d * a.cs[0], a.kind[0]); };
        if (t == a.ignore) {
            if (a.base[1] && !a.accumulate)
                ln.each(C, [&](int64_t d) { ft_cuda_store_f(a.base[1], off[1] + d * a.cs[1], a.kind[1], 0.0f); });
            if (ln.leader() && a.loss_rows)
                ft_cuda_store_f(a.base[2], off[2], a.kind[2], 0.0f);
            if (ln.leader() && a.row_loss)
                a.row_loss[row] = 0.0;
            return;
        }
        float xt = ln.pick(t, x);
        float m = ln.max(C, x);
        float sx = 0.0f;
        if (a.eps > 0.0)
            sx = a.w ? ln.sum(C, [&](int64_t d) { return x(d) * a.w[d]; }) : ln.sum(C, x);
        float s = ln.sum(C, [&](int64_t d) { return ft_softmax_exp(x(d), m); });
        double lse = ft_ce_lse(m, s);
        double wt = a.w ? a.w[t] : 1.0;
        float W = a.w ? a.w[C] : (float)C;
        double l = ft_ce_loss(lse, xt, sx, wt, W, a.eps, C);
        if (ln.leader() && a.loss_rows)
            ft_cuda_store_f(a.base[2], off[2], a.kind[2], (float)l);
        if (ln.leader() && a.row_loss)
            a.row_loss[row] = l;
        if (!a.base[1])
            return;
        double dl = !a.loss_rows && a.base[2] ? ft_cuda_load_f(a.base[2], off[2], a.kind[2])
                    : a.dloss                 ? ft_cuda_load_f(a.dloss, 0, a.dloss_kind)
                                              : 1.0f;
        double gs = (a.divisor ? 1.0 / *a.divisor : 1.0) * dl;
        ft_ce_coef k = ft_ce_coef_of(gs, wt, W, a.eps, C, s);
        ln.each(C, [&](int64_t d) {
            float g = ft_ce_grad(ft_softmax_exp(x(d), m), a.w ? a.w[d] : 1.0f, k.a, k.b);
            if (d == t)
                g -= k.c;
            int64_t i = off[1] + d * a.cs[1];
            ft_cuda_store_f(a.base[1], i, a.kind[1], a.accumulate ? ft_cuda_load_f(a.base[1], i, a.kind[1]) + g : g);
        });
    }
};

/* One block: w (C) = the class weights as floats, w[C] = their sum. */
__global__ void __launch_bounds__(THREADS) ce_weights_kernel(float *w, const char *weight, int64_t stride,
                                                             int8_t kind, int64_t C) {
    double acc = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += THREADS) {
        float v = ft_cuda_load_f(weight, c * stride, kind);
        w[c] = v;
        acc += v;
    }
    double W = block_sum(acc);
    if (threadIdx.x == 0)
        w[C] = (float)W;
}

/* Chunks of RC rows: part[chunk] (when not NULL) = the sum of w[t] over
 * the rows not ignored; *bad = the first row whose target is out of range. */
__global__ void __launch_bounds__(THREADS) ce_prepass_kernel(ce_args a, double *part, unsigned long long *bad) {
    int64_t R = a.rows.nrows, nchunks = (R + RC - 1) / RC, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nchunks; c += step) {
        double sum = 0.0;
        for (int64_t row = c * RC; row < R && row < c * RC + RC; row++) {
            int64_t off[ROW_OPS];
            rows_offsets(a.rows, row, off);
            int64_t t = target_at(a, off[3]);
            if (t == a.ignore)
                continue;
            if (t < 0 || t >= a.C) {
                atomicMin(bad, (unsigned long long)row);
                continue;
            }
            sum += a.w ? a.w[t] : 1.0;
        }
        if (part)
            part[c] = sum;
    }
}

/* Queues the passes of cross_entropy on scratch laid out by ce_run. */
static ft_status ce_queue(const char *op, ce_args &a, const ft_tensor *loss, const ft_tensor *weight,
                          ft_reduction reduction, double *scratch, int64_t nchunks, double *red) {
    int64_t R = a.rows.nrows;
    unsigned long long *bad = (unsigned long long *)scratch;
    double *divisor = scratch + 1, *part = scratch + 2;
    FT_TRY(ft_cuda_check(cudaMemsetAsync(bad, 0xff, sizeof *bad, FT_CUDA_STREAM), "cudaMemsetAsync"));
    if (weight) {
        ce_weights_kernel<<<1, THREADS, 0, FT_CUDA_STREAM>>>((float *)a.w, ft_tensor_data(weight),
                                                             weight->strides[0], ft_cuda_kind(weight->dtype), a.C);
        FT_TRY(ft_cuda_launched("cross_entropy weights kernel launch"));
    }
    bool mean = reduction == FT_REDUCTION_MEAN;
    if (R > 0) {
        ce_prepass_kernel<<<ft_cuda_blocks(nchunks, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(a, mean ? part : NULL,
                                                                                             bad);
        FT_TRY(ft_cuda_launched("cross_entropy prepass kernel launch"));
    }
    if (mean) {
        FT_TRY(sum_doubles(part, nchunks, red, divisor, NULL, NULL, 1.0));
        a.divisor = divisor;
    }
    if (R > 0) {
        /* the targets are validated before anything is written, as on the CPU */
        unsigned long long first_bad;
        FT_TRY(ft_cuda_check(cudaMemcpy(&first_bad, bad, sizeof first_bad, cudaMemcpyDeviceToHost), "cudaMemcpy"));
        if (first_bad != ~0ull) {
            int64_t off[ROW_OPS], value;
            rows_offsets(a.rows, (int64_t)first_bad, off);
            if (a.t32) {
                int32_t v;
                FT_TRY(ft_cuda_check(cudaMemcpy(&v, (const int32_t *)a.target + off[3], sizeof v,
                                                cudaMemcpyDeviceToHost), "cudaMemcpy"));
                value = v;
            } else {
                FT_TRY(ft_cuda_check(cudaMemcpy(&value, (const int64_t *)a.target + off[3], sizeof value,
                                                cudaMemcpyDeviceToHost), "cudaMemcpy"));
            }
            return ft_cuda_fail(FT_ERR_INDEX, "%s: target %lld (sample %lld) is out of bounds for %lld classes "
                                "(and is not ignore_index %lld)", op, (long long)value, (long long)first_bad,
                                (long long)a.C, (long long)a.ignore);
        }
        FT_TRY(run_rows(R, side_by_side(a.rows, a.base[1] ? 2 : 1, a.cs), ce_rows{a}, "cross_entropy kernel launch"));
    }
    if (a.row_loss)
        return sum_doubles(a.row_loss, R, red, NULL, loss, a.divisor, 1.0);
    return FT_OK;
}

/* The rows of cross_entropy (forward: loss given, dloss NULL; backward:
 * dloss given, loss NULL), all but what lives in scratch. */
static void ce_make_args(ce_args *a, const ft_tensor *loss, const ft_tensor *dloss, const ft_tensor *dlogits,
                         const ft_tensor *logits, const ft_tensor *target, const ft_cross_entropy_params *p,
                         bool accumulate) {
    int ndim = logits->ndim, cd = ndim == 1 ? 0 : 1;
    memset(a, 0, sizeof *a);
    a->C = logits->shape[cd];
    a->eps = p->label_smoothing;
    a->ignore = p->ignore_index;
    a->accumulate = accumulate;
    a->target = ft_tensor_data(target);
    a->t32 = target->dtype == FT_INT32;
    const ft_tensor *row_t = p->reduction != FT_REDUCTION_NONE ? NULL : loss ? loss : dloss;
    a->loss_rows = loss && row_t;
    const ft_tensor *cls[2] = {logits, dlogits};
    int64_t shape[FT_MAX_DIMS], rst[2][FT_MAX_DIMS];
    const int64_t *stp[ROW_OPS] = {NULL};
    int nd = drop_dim(shape, logits->shape, ndim, cd);
    for (int k = 0; k < 2; k++)
        if (cls[k]) {
            drop_dim(rst[k], cls[k]->strides, ndim, cd);
            stp[k] = rst[k];
            a->cs[k] = cls[k]->strides[cd];
            a->base[k] = ft_tensor_data(cls[k]);
            a->kind[k] = ft_cuda_kind(cls[k]->dtype);
        }
    if (row_t) {
        stp[2] = row_t->strides;
        a->base[2] = ft_tensor_data(row_t);
        a->kind[2] = ft_cuda_kind(row_t->dtype);
    }
    stp[3] = target->strides;
    if (dloss && !row_t) {
        a->dloss = ft_tensor_data(dloss);
        a->dloss_kind = ft_cuda_kind(dloss->dtype);
    }
    rows_make(&a->rows, nd, shape, stp);
}

static ft_status ce_run(const char *op, const ft_tensor *loss, const ft_tensor *dloss, const ft_tensor *dlogits,
                        const ft_tensor *logits, const ft_tensor *target, const ft_tensor *weight,
                        const ft_cross_entropy_params *p, bool accumulate) {
    FT_TRY(ft_cuda_use_device(logits));
    ce_args a;
    ce_make_args(&a, loss, dloss, dlogits, logits, target, p, accumulate);
    /* scratch: [bad, divisor, part (nchunks, mean), row losses (R, forward
     * mean or sum), red (for the larger sum), weights (C + 1 floats)] */
    int64_t R = a.rows.nrows, nchunks = (R + RC - 1) / RC;
    bool sums = loss && p->reduction != FT_REDUCTION_NONE;
    int64_t nparts = p->reduction == FT_REDUCTION_MEAN ? nchunks : 0, nrows = sums ? R : 0;
    int64_t nred = sum_scratch(nparts > nrows ? nparts : nrows), nw = weight ? (a.C + 2) / 2 : 0;
    int64_t ndoubles = 2 + nparts + nrows + nred + nw;
    ft_cuda_scratch s = {};
    FT_TRY(ft_cuda_scratch_alloc(&s, (size_t)ndoubles * sizeof(double), ft_tensor_device(logits).index));
    double *scratch = (double *)s.ptr;
    a.row_loss = sums ? scratch + 2 + nparts : NULL;
    if (weight)
        a.w = (const float *)(scratch + 2 + nparts + nrows + nred);
    ft_status st = ce_queue(op, a, loss, weight, p->reduction, scratch, nchunks, scratch + 2 + nparts + nrows);
    ft_cuda_scratch_free(&s);
    return st;
}

static ft_status cross_entropy_forward(const ft_tensor *loss, const ft_tensor *dlogits, const ft_tensor *logits,
                                       const ft_tensor *target, const ft_tensor *weight,
                                       const ft_cross_entropy_params *p) {
    return ce_run("cross_entropy", loss, NULL, dlogits, logits, target, weight, p, false);
}

static ft_status cross_entropy_backward(const ft_tensor *dlogits, const ft_tensor *dloss, const ft_tensor *logits,
                                        const ft_tensor *target, const ft_tensor *weight,
                                        const ft_cross_entropy_params *p, bool accumulate) {
    return ce_run("cross_entropy_backward", NULL, dloss, dlogits, logits, target, weight, p, accumulate);
}

/* ---- mse ---- */

/* slots: loss, inp, target */
struct mse_none_op {
    __device__ void operator()(float *v, int64_t) const {
        float d = v[1] - v[2];
        v[0] = d * d;
    }
};

/* slots: dinp, dtarget, inp, target, dloss (reduction none). With mean or
 * sum the factor 2 dloss (/ n) comes from the scalar dloss, as the CPU
 * computes it: in double, rounded once. */
struct mse_bwd_op {
    const char *dloss; /* mean, sum */
    int8_t dloss_kind;
    bool mean, has_dinp, has_dtarget, acc_inp, acc_target;
    int64_t n;
    __device__ void operator()(float *v, int64_t) const {
        float s = 2.0f;
        if (dloss) {
            double f = 2.0 * ft_cuda_load_f(dloss, 0, dloss_kind);
            s = (float)(mean ? f / (double)n : f);
        }
        float diff = v[2] - v[3];
        if (has_dinp) {
            float g = dloss ? s * diff : s * v[4] * diff;
            v[0] = acc_inp ? v[0] + g : g;
        }
        if (has_dtarget) {
            float g = dloss ? -s * diff : -s * v[4] * diff;
            v[1] = acc_target ? v[1] + g : g;
        }
    }
};

/* part[c] = the sum of (inp - target)^2 over chunk c of RED_CHUNK elements
 * (float within a thread, double across threads). */
__global__ void __launch_bounds__(THREADS) mse_chunks_kernel(ft_cuda_pw p, double *part) {
    int64_t nchunks = (p.n + RED_CHUNK - 1) / RED_CHUNK;
    for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < RED_PER; j++) {
            int64_t i = c * RED_CHUNK + j * THREADS + threadIdx.x, off[FT_CUDA_PW_OPS + 1];
            if (i >= p.n)
                break;
            ft_cuda_pw_offsets(p, i, off);
            float d = ft_cuda_load_f(p.base[0], off[0], p.kind[0]) - ft_cuda_load_f(p.base[1], off[1], p.kind[1]);
            acc += d * d;
        }
        double s = block_sum(acc);
        if (threadIdx.x == 0)
            part[c] = s;
    }
}

static ft_status mse_loss_forward(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                                  ft_reduction reduction) {
    FT_TRY(ft_cuda_use_device(inp));
    ft_cuda_pw p;
    if (reduction == FT_REDUCTION_NONE) {
        const ft_tensor *t[] = {loss, inp, target};
        if (!ft_cuda_pw_make(&p, t, 3, 1, false, false))
            return FT_OK;
        return ft_cuda_pw_run<1>(p, mse_none_op{}, "mse_loss kernel launch");
    }
    const ft_tensor *t[] = {inp, target};
    int64_t n = ft_cuda_pw_make(&p, t, 2, 0, false, false) ? p.n : 0, nchunks = (n + RED_CHUNK - 1) / RED_CHUNK;
    ft_cuda_scratch s = {};
    FT_TRY(ft_cuda_scratch_alloc(&s, (size_t)(1 + nchunks + sum_scratch(nchunks)) * sizeof(double),
                                 ft_tensor_device(inp).index));
    double *part = (double *)s.ptr;
    ft_status st = FT_OK;
    if (nchunks > 0) {
        mse_chunks_kernel<<<ft_cuda_blocks(nchunks * THREADS, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(p, part);
        st = ft_cuda_launched("mse_loss kernel launch");
    }
    /* mean of nothing: 0 / 0, NaN as on the CPU */
    if (st == FT_OK)
        st = sum_doubles(part, nchunks, part + nchunks, NULL, loss, NULL,
                         reduction == FT_REDUCTION_MEAN ? (double)n : 1.0);
    ft_cuda_scratch_free(&s);
    return st;
}

/* At least one of dinp, dtarget. */
static ft_status mse_loss_backward(const ft_tensor *dinp, const ft_tensor *dtarget, const ft_tensor *dloss,
                                   const ft_tensor *inp, const ft_tensor *target, ft_reduction reduction,
                                   bool accumulate_inp, bool accumulate_target) {
    FT_TRY(ft_cuda_use_device(inp));
    bool none = reduction == FT_REDUCTION_NONE;
    const ft_tensor *t[] = {dinp, dtarget, inp, target, none ? dloss : NULL};
    ft_cuda_pw p;
    if (!ft_cuda_pw_make(&p, t, 5, 2, (dinp && accumulate_inp) || (dtarget && accumulate_target), false))
        return FT_OK;
    mse_bwd_op op = {none ? NULL : ft_tensor_data(dloss), ft_cuda_kind(dloss->dtype), reduction == FT_REDUCTION_MEAN,
                     dinp != NULL, dtarget != NULL, accumulate_inp, accumulate_target, p.n};
    return ft_cuda_pw_run<1>(p, op, "mse_loss_backward kernel launch");
}

/* ---- nll_loss: one thread per sample (the entry point checked the targets) ---- */

struct nll_args {
    const char *target;
    int64_t tstride;
    bool t64;
    const float *w;
    int64_t ignore;
    float *x; /* inp (forward) or dinp (backward) */
    int64_t xs0, xs1;
    float *v; /* loss (forward) or dloss (backward) */
    int64_t vs;
    int64_t N;
};

static __device__ int64_t nll_target_at(const nll_args &a, int64_t n) {
    const char *at = a.target + n * a.tstride * (a.t64 ? 8 : 4);
    return a.t64 ? *(const int64_t *)at : *(const int32_t *)at;
}

__global__ void __launch_bounds__(THREADS) nll_forward_kernel(nll_args a) {
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= a.N)
        return;
    int64_t t = nll_target_at(a, n);
    a.v[n * a.vs] = t == a.ignore ? 0.0f : -(a.w ? a.w[t] : 1.0f) * a.x[n * a.xs0 + t * a.xs1];
}

__global__ void __launch_bounds__(THREADS) nll_backward_kernel(nll_args a) {
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= a.N)
        return;
    int64_t t = nll_target_at(a, n);
    if (t != a.ignore)
        a.x[n * a.xs0 + t * a.xs1] -= (a.w ? a.w[t] : 1.0f) * a.v[n * a.vs];
}

static nll_args nll_make(const ft_tensor *x, const ft_tensor *v, const ft_tensor *target, const ft_tensor *weight,
                         int64_t ignore_index) {
    nll_args a = {};
    a.target = ft_tensor_data(target);
    a.tstride = target->strides[0];
    a.t64 = target->dtype == FT_INT64;
    a.w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    a.ignore = ignore_index;
    a.x = (float *)ft_tensor_data(x);
    a.xs0 = x->strides[0], a.xs1 = x->strides[1];
    a.v = (float *)ft_tensor_data(v);
    a.vs = v->strides[0];
    a.N = x->shape[0];
    return a;
}

static ft_status nll_loss_forward(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                                  const ft_tensor *weight, int64_t ignore_index) {
    FT_TRY(ft_cuda_use_device(inp));
    nll_args a = nll_make(inp, loss, target, weight, ignore_index);
    if (a.N == 0)
        return FT_OK;
    nll_forward_kernel<<<(unsigned)((a.N + THREADS - 1) / THREADS), THREADS>>>(a);
    return ft_cuda_launched("nll_loss kernel launch");
}

static ft_status nll_loss_backward(const ft_tensor *dinp, const ft_tensor *dloss, const ft_tensor *target,
                                   const ft_tensor *weight, int64_t ignore_index) {
    FT_TRY(ft_cuda_use_device(dinp));
    nll_args a = nll_make(dinp, dloss, target, weight, ignore_index);
    if (a.N == 0)
        return FT_OK;
    nll_backward_kernel<<<(unsigned)((a.N + THREADS - 1) / THREADS), THREADS>>>(a);
    return ft_cuda_launched("nll_loss_backward kernel launch");
}

} // namespace

void ft_cuda_register_softmax(struct ft_cuda_ops *ops) {
    ops->nll_loss_forward = nll_loss_forward;
    ops->nll_loss_backward = nll_loss_backward;
    ops->softmax_forward = softmax_forward;
    ops->softmax_backward = softmax_backward;
    ops->cross_entropy_forward = cross_entropy_forward;
    ops->cross_entropy_backward = cross_entropy_backward;
    ops->mse_loss_forward = mse_loss_forward;
    ops->mse_loss_backward = mse_loss_backward;
}
