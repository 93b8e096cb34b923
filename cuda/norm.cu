/* Batch normalization, layer normalization and the bias gradient on CUDA:
 * the CUDA side of ops/batchnorm.c, ops/layernorm.c and ft_bias_grad
 * (ops/reduce.c), with the same arithmetic.
 *
 * Legend: N batch, C channels, S = H * W, M = N * S values per channel of
 * batch norm; R rows and D the normalized size of layer norm.
 *
 * Statistics are sums in double, as on the CPU, of the same terms (x minus a
 * shift, its square, ...), reduced in a fixed order with no atomics, so
 * every run gives the same bits: each block adds a fixed part of the values
 * (RUN_PER_PART consecutive values of one channel, or ROWS_PER_PART rows of
 * 32 columns) in a fixed tree, then one block per channel adds the parts in
 * order. Only the order of the double additions differs from the CPU's.
 *
 * The arithmetic around the sums (the statistics, scale and shift,
 * normalize, the input gradients) is the CPU's own, kernels/norm.h, so given
 * the same sums it gives the CPU's bits. */
#include "backend.h"
#include "blocksum.h"
#include "kernels/norm.h"
#include "ops/cuda_ops.h"

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
/* The share of a reduction one block adds up. */
constexpr int RUN_PER_PART = 4096;
constexpr int ROWS_PER_PART = 256;
/* Layer norm rows of up to this many values get a warp each, longer ones a block. */
constexpr int LN_WARP_MAX = 1024;

/* a / b for a, b >= 0, in 32 bits when both fit: a 64-bit division is a long
 * software sequence on the GPU, and this one is in the index math of every
 * element. */
static inline FT_HD int64_t udiv(int64_t a, int64_t b) {
    return ((a | b) >> 32) == 0 ? (int64_t)((uint32_t)a / (uint32_t)b) : a / b;
}

static int64_t numel(const ft_tensor *t) {
    int64_t n = 1;
    for (int k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

/* ---- fixed-order sums ---------------------------------------------------- */

/* Parts of sums over runs: run c is values i = 0 .. len - 1 of channel c
 * (f.add(i, c, a, b) adds value i's terms); part p of run c is the sum over
 * i in [p RUN_PER_PART, (p + 1) RUN_PER_PART), into pa/pb[p * runs + c].
 * For values that lie along memory (NCHW planes). Blocks of THREADS. */
template <class F>
__global__ void __launch_bounds__(THREADS) run_parts(F f, int64_t len, int64_t runs, double *pa, double *pb) {
    __shared__ double sh[2 * WARPS];
    int64_t p = blockIdx.x, i0 = p * RUN_PER_PART, i1 = i0 + RUN_PER_PART < len ? i0 + RUN_PER_PART : len;
    for (int64_t c = blockIdx.y; c < runs; c += gridDim.y) {
        double a = 0, b = 0;
        for (int64_t i = i0 + threadIdx.x; i < i1; i += THREADS)
            f.add(i, c, a, b);
        ft_block_sum2<WARPS>(a, b, sh);
        if (threadIdx.x == 0) {
            pa[p * runs + c] = a;
            pb[p * runs + c] = b;
        }
    }
}

/* Parts of column sums of a (len, cols) matrix (f.add(r, j, a, b) adds
 * element (r, j)'s terms); part p of column j is the sum over rows
 * [p ROWS_PER_PART, (p + 1) ROWS_PER_PART), into pa/pb[p * cols + j]. For
 * columns that lie along memory (channels-last, layer norm's parameters).
 * Blocks of 32 x 8 threads: x runs over 32 neighbouring columns, y over
 * every 8th row; the 8 sums of a column are then added in order. */
template <class F>
__global__ void __launch_bounds__(THREADS) col_parts(F f, int64_t len, int64_t cols, double *pa, double *pb) {
    __shared__ double sa[8][32], sb[8][32];
    int64_t p = blockIdx.x, r0 = p * ROWS_PER_PART, r1 = r0 + ROWS_PER_PART < len ? r0 + ROWS_PER_PART : len;
    for (int64_t j0 = (int64_t)blockIdx.y * 32; j0 < cols; j0 += (int64_t)gridDim.y * 32) {
        int64_t j = j0 + threadIdx.x;
        double a = 0, b = 0;
        if (j < cols)
            for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
                f.add(r, j, a, b);
        sa[threadIdx.y][threadIdx.x] = a;
        sb[threadIdx.y][threadIdx.x] = b;
        __syncthreads();
        if (threadIdx.y == 0 && j < cols) {
            for (int y = 1; y < 8; y++) {
                a += sa[y][threadIdx.x];
                b += sb[y][threadIdx.x];
            }
            pa[p * cols + j] = a;
            pb[p * cols + j] = b;
        }
        __syncthreads(); /* sa, sb are free for the next columns */
    }
}

/* ta/tb[c] = the sum of the parts of sum c, in part order. One block per sum. */
__global__ void __launch_bounds__(THREADS) add_parts(const double *pa, const double *pb, int64_t parts, int64_t n,
                                                     double *ta, double *tb) {
    __shared__ double sh[2 * WARPS];
    for (int64_t c = blockIdx.x; c < n; c += gridDim.x) {
        double a = 0, b = 0;
        for (int64_t p = threadIdx.x; p < parts; p += THREADS) {
            a += pa[p * n + c];
            b += pb[p * n + c];
        }
        ft_block_sum2<WARPS>(a, b, sh);
        if (threadIdx.x == 0) {
            ta[c] = a;
            tb[c] = b;
        }
    }
}

/* n pairs of sums, each over len values: over runs (run_parts) or columns (col_parts). */
typedef struct {
    bool runs;
    int64_t len, n, parts;
} sums_plan;

static sums_plan plan_sums(bool runs, int64_t len, int64_t n) {
    int64_t per = runs ? RUN_PER_PART : ROWS_PER_PART, parts = (len + per - 1) / per;
    sums_plan s = {runs, len, n, parts > 1 ? parts : 1};
    return s;
}

/* The doubles of scratch the sums take: the parts, and the totals when there are several parts. */
static size_t sums_doubles(const sums_plan &s) { return (size_t)(2 * s.n * (s.parts + (s.parts > 1))); }

/* Queues the sums of f's terms; *ta and *tb (n each) point into buf
 * (sums_doubles(s) of them) and are ready for the kernels queued next. */
template <class F>
static ft_status queue_sums(const sums_plan &s, F f, double *buf, const double **ta, const double **tb) {
    if (s.parts > INT32_MAX)
        return ft_cuda_fail(FT_ERR_VALUE, "a reduction over %lld values is too large", (long long)s.len);
    double *pa = buf, *pb = buf + s.parts * s.n;
    if (s.runs) {
        dim3 grid((unsigned)s.parts, (unsigned)(s.n < 65535 ? s.n : 65535));
        run_parts<<<grid, THREADS, 0, FT_CUDA_STREAM>>>(f, s.len, s.n, pa, pb);
    } else {
        int64_t tiles = (s.n + 31) / 32;
        dim3 grid((unsigned)s.parts, (unsigned)(tiles < 65535 ? tiles : 65535));
        col_parts<<<grid, dim3(32, 8), 0, FT_CUDA_STREAM>>>(f, s.len, s.n, pa, pb);
    }
    FT_TRY(ft_cuda_launched(s.runs ? "run_parts" : "col_parts"));
    if (s.parts == 1) {
        *ta = pa, *tb = pb;
        return FT_OK;
    }
    double *sa = pb + s.parts * s.n, *sb = sa + s.n;
    add_parts<<<ft_cuda_blocks(s.n, 1), THREADS, 0, FT_CUDA_STREAM>>>(pa, pb, s.parts, s.n, sa, sb);
    *ta = sa, *tb = sb;
    return ft_cuda_launched("add_parts");
}

/* oa[c * sa] = (float)ta[c] and ob[c * sb] = (float)tb[c], for the outputs given (not NULL). */
__global__ void __launch_bounds__(THREADS) store_sums(const double *ta, const double *tb, int64_t n, float *oa,
                                                      int64_t sa, float *ob, int64_t sb) {
    for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < n; c += (int64_t)gridDim.x * THREADS) {
        if (oa)
            oa[c * sa] = (float)ta[c];
        if (ob)
            ob[c * sb] = (float)tb[c];
    }
}

/* ---- batch norm ---------------------------------------------------------- */

/* A batch norm call's tensors as (N, C, S), all in the input's memory
 * layout (the entry point accepts dense NCHW or channels-last only), so one
 * offset addresses every tensor; each float32 or a 16-bit float (its kind),
 * computed on in float as the float32 kernels do, so that a 16-bit result is
 * the float32 one rounded once. */
typedef struct {
    const char *x, *y, *dy; /* dy NULL: the forward's sums; y: the output, for a fused activation */
    const char *center;     /* the values subtracted before the sums: center[c * center_step] */
    int8_t kx, ky, kdy, kcenter;
    int64_t center_step;
    ft_act act;
    int64_t C, S;
    bool cl; /* channels-last */

    /* the offset of value m (= n S + s) of channel c */
    FT_HD int64_t offset(int64_t m, int64_t c) const {
        if (cl)
            return m * C + c;
        int64_t n = udiv(m, S);
        return (n * C + c) * S + (m - n * S);
    }
    FT_HD int64_t channel(int64_t i) const {
        int64_t q = cl ? i : udiv(i, S);
        return q - udiv(q, C) * C;
    }
    /* dy through the fused activation's derivative, taken from the output */
    FT_HD float dz(int64_t i) const {
        float g = ft_cuda_load_f(dy, i, kdy);
        return act.kind == FT_ACT_NONE ? g : g * ft_act_grad_from_output(act, ft_cuda_load_f(y, i, ky));
    }
    FT_HD float xv(int64_t i) const { return ft_cuda_load_f(x, i, kx); }
    /* forward: v = x - center and v^2; backward: dz and dz (x - center) */
    FT_HD void add(int64_t m, int64_t c, double &a, double &b) const {
        int64_t i = offset(m, c);
        double v = (double)xv(i) - (double)ft_cuda_load_f(center, c * center_step, kcenter);
        if (!dy) {
            a += v;
            b += v * v;
            return;
        }
        double g = dz(i);
        a += g;
        b += g * v;
    }
} bn_view;

/* The input as a bn_view; the forward's center is the first value of each channel. */
static bn_view bn_view_of(const ft_tensor *inp, ft_act act) {
    bn_view v = {};
    v.x = (const char *)ft_tensor_data(inp);
    v.kx = ft_cuda_kind(inp->dtype);
    v.C = inp->shape[1];
    v.S = inp->ndim == 4 ? inp->shape[2] * inp->shape[3] : 1;
    /* Dense in one of the two layouts, so with C > 1 and S > 1 the channel
     * stride tells them apart; with either of them 1 both give the same
     * offsets. */
    v.cl = inp->ndim == 2 || v.S == 1 || (v.C > 1 && inp->strides[1] == 1);
    v.center = v.x;
    v.kcenter = v.kx;
    v.center_step = v.cl ? 1 : v.S;
    v.act = act;
    return v;
}

/* The statistics and per-channel scale and shift of the forward:
 * training from the sums of x - x[0, c] (ta, tb), eval from the running
 * statistics; as the CPU's ft_batchnorm_forward. */
typedef struct {
    const double *ta, *tb; /* training */
    const char *x;         /* the centers, x[c * center_step], of kind kx */
    int8_t kx;
    int64_t center_step;
    const float *w, *b;
    float *rm, *rv;
    float *mean, *invstd, *scale, *shift;
    int64_t C, M;
    double eps, momentum;
    bool training;
} bn_stats;

static inline FT_HD void bn_stats_one(const bn_stats &s, int64_t c) {
    float mu, is;
    if (s.training) {
        double var = ft_norm_stats(s.ta[c], s.tb[c], (double)s.M, ft_cuda_load_f(s.x, c * s.center_step, s.kx), s.eps,
                                   &mu, &is);
        if (s.rm)
            ft_bn_running(&s.rm[c], &s.rv[c], mu, var, s.M, s.momentum);
    } else {
        mu = s.rm[c];
        is = ft_norm_rstd(s.rv[c], s.eps);
    }
    s.mean[c] = mu;
    s.invstd[c] = is;
    float scale = ft_norm_scale(is, s.w ? s.w[c] : 1.0f);
    s.scale[c] = scale;
    s.shift[c] = ft_norm_shift(mu, scale, s.b ? s.b[c] : 0.0f);
}

__global__ void __launch_bounds__(THREADS) bn_stats_kernel(bn_stats s) {
    for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < s.C; c += (int64_t)gridDim.x * THREADS)
        bn_stats_one(s, c);
}

/* out (of kind ko) = act(x * scale + shift) */
static inline FT_HD void bn_normalize_one(const bn_view &v, char *out, int8_t ko, const float *scale,
                                          const float *shift, int64_t i) {
    int64_t c = v.channel(i);
    ft_cuda_store_f(out, i, ko, ft_act_forward(v.act, ft_norm_apply(v.xv(i), scale[c], shift[c])));
}

__global__ void __launch_bounds__(THREADS) bn_normalize(bn_view v, char *out, int8_t ko, const float *scale,
                                                        const float *shift, int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS)
        bn_normalize_one(v, out, ko, scale, shift, i);
}

static ft_status bn_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                            const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                            const ft_tensor *running_mean, const ft_tensor *running_var,
                            const ft_batchnorm_params *p) {
    FT_TRY(ft_cuda_use_device(inp));
    bn_view v = bn_view_of(inp, p->act);
    int64_t C = v.C, M = inp->shape[0] * v.S;
    if (C == 0)
        return FT_OK;
    sums_plan plan = plan_sums(!v.cl, M, C);
    size_t nd = p->training ? sums_doubles(plan) : 0;
    ft_cuda_scratch scratch;
    FT_TRY(ft_cuda_scratch_alloc(&scratch, nd * sizeof(double) + 2 * (size_t)C * sizeof(float),
                                 ft_tensor_device(inp).index));
    double *buf = (double *)scratch.ptr;
    bn_stats s = {};
    s.scale = (float *)(buf + nd);
    s.shift = s.scale + C;
    ft_status st = p->training ? queue_sums(plan, v, buf, &s.ta, &s.tb) : FT_OK;
    if (st == FT_OK) {
        s.x = v.x;
        s.kx = v.kx;
        s.center_step = v.center_step;
        s.w = weight ? (const float *)ft_tensor_data(weight) : NULL;
        s.b = bias ? (const float *)ft_tensor_data(bias) : NULL;
        s.rm = running_mean ? (float *)ft_tensor_data(running_mean) : NULL;
        s.rv = running_var ? (float *)ft_tensor_data(running_var) : NULL;
        s.mean = (float *)ft_tensor_data(save_mean);
        s.invstd = (float *)ft_tensor_data(save_invstd);
        s.C = C, s.M = M, s.eps = p->eps, s.momentum = p->momentum, s.training = p->training;
        bn_stats_kernel<<<ft_cuda_blocks(C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(s);
        st = ft_cuda_launched("bn_stats_kernel");
    }
    if (st == FT_OK && M > 0) {
        bn_normalize<<<ft_cuda_blocks(M * C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
            v, (char *)ft_tensor_data(out), ft_cuda_kind(out->dtype), s.scale, s.shift, M * C);
        st = ft_cuda_launched("bn_normalize");
    }
    ft_cuda_scratch_free(&scratch);
    return st;
}

/* The parameter gradients and the per-channel factors of dx from the sums of
 * dz (ta) and dz (x - mean) (tb); as the CPU's ft_batchnorm_backward. */
typedef struct {
    const double *ta, *tb;
    const float *w, *invstd;
    float *dw, *db;
    float *k; /* (3, C): w invstd, and in training the mean of dz and of dz xhat times invstd */
    int64_t C, M;
    bool training;
} bn_grads;

static inline FT_HD void bn_grads_one(const bn_grads &g, int64_t c) {
    ft_bn_grad r = ft_bn_grads(g.ta[c], g.tb[c], g.w ? g.w[c] : 1.0f, g.invstd[c], g.M, g.training);
    if (g.dw)
        g.dw[c] = r.dweight;
    if (g.db)
        g.db[c] = r.dbias;
    g.k[c] = r.k0;
    g.k[g.C + c] = r.k1;
    g.k[2 * g.C + c] = r.k2;
}

__global__ void __launch_bounds__(THREADS) bn_grads_kernel(bn_grads g) {
    for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < g.C; c += (int64_t)gridDim.x * THREADS)
        bn_grads_one(g, c);
}

static inline FT_HD void bn_dx_one(const bn_view &v, char *dx, int8_t kdx, const float *mean, const float *k,
                                   int64_t i) {
    int64_t c = v.channel(i);
    ft_cuda_store_f(dx, i, kdx, ft_bn_dx(v.dz(i), v.xv(i), mean[c], k[c], k[v.C + c], k[2 * v.C + c]));
}

__global__ void __launch_bounds__(THREADS) bn_dx(bn_view v, char *dx, int8_t kdx, const float *mean, const float *k,
                                                 int64_t total) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS)
        bn_dx_one(v, dx, kdx, mean, k, i);
}

static ft_status bn_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                             const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *out,
                             const ft_tensor *weight, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                             const ft_batchnorm_params *p) {
    FT_TRY(ft_cuda_use_device(inp));
    bn_view v = bn_view_of(inp, p->act);
    int64_t C = v.C, M = inp->shape[0] * v.S;
    if (C == 0)
        return FT_OK;
    v.y = out ? (const char *)ft_tensor_data(out) : NULL;
    v.ky = out ? ft_cuda_kind(out->dtype) : FT_CUDA_F32;
    v.dy = (const char *)ft_tensor_data(dout);
    v.kdy = ft_cuda_kind(dout->dtype);
    v.center = (const char *)ft_tensor_data(save_mean);
    v.kcenter = FT_CUDA_F32;
    v.center_step = 1;
    sums_plan plan = plan_sums(!v.cl, M, C);
    size_t nd = sums_doubles(plan);
    ft_cuda_scratch scratch;
    FT_TRY(ft_cuda_scratch_alloc(&scratch, nd * sizeof(double) + 3 * (size_t)C * sizeof(float),
                                 ft_tensor_device(inp).index));
    double *buf = (double *)scratch.ptr;
    bn_grads g = {};
    g.k = (float *)(buf + nd);
    /* The sums read dout before dx, which may be dout itself, overwrites it. */
    ft_status st = queue_sums(plan, v, buf, &g.ta, &g.tb);
    if (st == FT_OK) {
        g.w = weight ? (const float *)ft_tensor_data(weight) : NULL;
        g.invstd = (const float *)ft_tensor_data(save_invstd);
        g.dw = dweight ? (float *)ft_tensor_data(dweight) : NULL;
        g.db = dbias ? (float *)ft_tensor_data(dbias) : NULL;
        g.C = C, g.M = M, g.training = p->training;
        bn_grads_kernel<<<ft_cuda_blocks(C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(g);
        st = ft_cuda_launched("bn_grads_kernel");
    }
    if (st == FT_OK && dinp && M > 0) {
        bn_dx<<<ft_cuda_blocks(M * C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
            v, (char *)ft_tensor_data(dinp), ft_cuda_kind(dinp->dtype), (const float *)v.center, g.k, M * C);
        st = ft_cuda_launched("bn_dx");
    }
    ft_cuda_scratch_free(&scratch);
    return st;
}

/* ---- layer norm ---------------------------------------------------------- */

/* The sum of (a, b) over a team of T threads (a warp, or the block), in every thread. */
template <int T> static __device__ void team_sum2(double &a, double &b, double *sh) {
    if constexpr (T == 32)
        ft_warp_sum2(a, b);
    else
        ft_block_sum2<WARPS>(a, b, sh);
}

/* One team of T threads per row of D values: the row's shifted sums in
 * double (centered on its first value), then its normalized values; as the
 * CPU's forward_row. x and y are float32 or 16-bit (their kinds kx, ky),
 * computed on in float. */
template <int T>
__global__ void __launch_bounds__(THREADS) ln_forward_rows(const char *x, int8_t kx, const float *w, const float *b,
                                                           char *y, int8_t ky, float *mean, float *rstd, int64_t R,
                                                           int64_t D, double eps) {
    __shared__ double sh[2 * WARPS];
    constexpr int TEAMS = THREADS / T;
    int lane = threadIdx.x % T;
    for (int64_t r = (int64_t)blockIdx.x * TEAMS + threadIdx.x / T; r < R; r += (int64_t)gridDim.x * TEAMS) {
        int64_t o = r * D;
        double shift = ft_cuda_load_f(x, o, kx), s = 0, q = 0;
        for (int64_t d = lane; d < D; d += T) {
            double v = ft_cuda_load_f(x, o + d, kx) - shift;
            s += v;
            q += v * v;
        }
        team_sum2<T>(s, q, sh);
        float mu, rs;
        ft_norm_stats(s, q, (double)D, shift, eps, &mu, &rs);
        for (int64_t d = lane; d < D; d += T)
            ft_cuda_store_f(y, o + d, ky,
                            ft_ln_value(ft_cuda_load_f(x, o + d, kx), mu, rs, w ? w[d] : 1.0f, b ? b[d] : 0.0f));
        if (lane == 0 && mean)
            mean[r] = mu;
        if (lane == 0 && rstd)
            rstd[r] = rs;
    }
}

/* One team per row: the sums of g and g xhat in double, then dx; as the CPU's backward_row. */
template <int T>
__global__ void __launch_bounds__(THREADS) ln_backward_rows(const char *x, int8_t kx, const char *dy, int8_t kdy,
                                                            const float *w, const float *mean, const float *rstd,
                                                            char *dx, int8_t kdx, int64_t R, int64_t D) {
    __shared__ double sh[2 * WARPS];
    constexpr int TEAMS = THREADS / T;
    int lane = threadIdx.x % T;
    for (int64_t r = (int64_t)blockIdx.x * TEAMS + threadIdx.x / T; r < R; r += (int64_t)gridDim.x * TEAMS) {
        int64_t o = r * D;
        float mu = mean[r], rs = rstd[r];
        double a = 0, c = 0;
        for (int64_t d = lane; d < D; d += T) {
            float gd = ft_cuda_load_f(dy, o + d, kdy);
            float g = w ? gd * w[d] : gd, xh = ft_norm_xhat(ft_cuda_load_f(x, o + d, kx), mu, rs);
            a += g;
            c += (double)g * xh;
        }
        team_sum2<T>(a, c, sh);
        float ma = (float)(a / (double)D), mc = (float)(c / (double)D);
        for (int64_t d = lane; d < D; d += T)
            ft_cuda_store_f(dx, o + d, kdx,
                            ft_norm_dx(ft_cuda_load_f(dy, o + d, kdy), w ? w[d] : 1.0f,
                                       ft_norm_xhat(ft_cuda_load_f(x, o + d, kx), mu, rs), rs, ma, mc));
    }
}

/* The terms of layer norm's parameter gradients at (r, d): dy xhat and dy. */
typedef struct {
    const char *x, *dy;
    int8_t kx, kdy;
    const float *mean, *rstd;
    int64_t D;

    FT_HD void add(int64_t r, int64_t d, double &a, double &b) const {
        int64_t i = r * D + d;
        float g = ft_cuda_load_f(dy, i, kdy);
        a += (double)g * ft_norm_xhat(ft_cuda_load_f(x, i, kx), mean[r], rstd[r]);
        b += g;
    }
} ln_param_view;

static ft_status ln_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                            const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias, int64_t D,
                            double eps) {
    FT_TRY(ft_cuda_use_device(inp));
    int64_t R = numel(inp) / D;
    if (R == 0)
        return FT_OK;
    const char *x = (const char *)ft_tensor_data(inp);
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    const float *b = bias ? (const float *)ft_tensor_data(bias) : NULL;
    char *y = (char *)ft_tensor_data(out);
    int8_t kx = ft_cuda_kind(inp->dtype), ky = ft_cuda_kind(out->dtype);
    float *mean = save_mean ? (float *)ft_tensor_data(save_mean) : NULL;
    float *rstd = save_rstd ? (float *)ft_tensor_data(save_rstd) : NULL;
    if (D <= LN_WARP_MAX)
        ln_forward_rows<32><<<ft_cuda_blocks(R, WARPS), THREADS, 0, FT_CUDA_STREAM>>>(x, kx, w, b, y, ky, mean, rstd,
                                                                                     R, D, eps);
    else
        ln_forward_rows<THREADS><<<ft_cuda_blocks(R, 1), THREADS, 0, FT_CUDA_STREAM>>>(x, kx, w, b, y, ky, mean, rstd,
                                                                                      R, D, eps);
    return ft_cuda_launched("ln_forward_rows");
}

static ft_status ln_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                             const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *weight,
                             const ft_tensor *save_mean, const ft_tensor *save_rstd, int64_t D) {
    FT_TRY(ft_cuda_use_device(inp));
    int64_t R = numel(inp) / D;
    const char *x = (const char *)ft_tensor_data(inp), *dy = (const char *)ft_tensor_data(dout);
    int8_t kx = ft_cuda_kind(inp->dtype), kdy = ft_cuda_kind(dout->dtype);
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    const float *mean = (const float *)ft_tensor_data(save_mean), *rstd = (const float *)ft_tensor_data(save_rstd);
    /* The parameter sums first: a dinp that is dout overwrites it. */
    if (dweight || dbias) {
        sums_plan plan = plan_sums(false, R, D);
        ft_cuda_scratch scratch;
        FT_TRY(ft_cuda_scratch_alloc(&scratch, sums_doubles(plan) * sizeof(double), ft_tensor_device(inp).index));
        ln_param_view v = {x, dy, kx, kdy, mean, rstd, D};
        const double *ta = NULL, *tb = NULL;
        ft_status st = queue_sums(plan, v, (double *)scratch.ptr, &ta, &tb);
        if (st == FT_OK) {
            store_sums<<<ft_cuda_blocks(D, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
                ta, tb, D, dweight ? (float *)ft_tensor_data(dweight) : NULL, 1,
                dbias ? (float *)ft_tensor_data(dbias) : NULL, 1);
            st = ft_cuda_launched("store_sums");
        }
        ft_cuda_scratch_free(&scratch);
        FT_TRY(st);
    }
    if (dinp && R > 0) {
        char *dx = (char *)ft_tensor_data(dinp);
        int8_t kdx = ft_cuda_kind(dinp->dtype);
        if (D <= LN_WARP_MAX)
            ln_backward_rows<32><<<ft_cuda_blocks(R, WARPS), THREADS, 0, FT_CUDA_STREAM>>>(x, kx, dy, kdy, w, mean,
                                                                                           rstd, dx, kdx, R, D);
        else
            ln_backward_rows<THREADS><<<ft_cuda_blocks(R, 1), THREADS, 0, FT_CUDA_STREAM>>>(x, kx, dy, kdy, w, mean,
                                                                                           rstd, dx, kdx, R, D);
        FT_TRY(ft_cuda_launched("ln_backward_rows"));
    }
    return FT_OK;
}

/* ---- bias gradient ------------------------------------------------------- */

/* dout (N, C) or (N, C, H, W) in any strides, float32, bfloat16 or float16
 * (T); value m = (n H + h) W + w of channel c. */
template <typename T> struct bias_view {
    const T *g;
    int64_t sn, sc, sh, sw, H, W;

    __device__ void add(int64_t m, int64_t c, double &a, double &) const {
        int64_t hw = H * W, n = udiv(m, hw), r = m - n * hw, h = udiv(r, W);
        a += ft_cuda_io<T>::load(g + n * sn + h * sh + (r - h * W) * sw + c * sc);
    }
};

template <typename T> static ft_status bias_sums(const sums_plan &plan, const ft_tensor *dout, double *buf,
                                                 const double **ta, const double **tb) {
    bool four = dout->ndim == 4;
    bias_view<T> v = {(const T *)ft_tensor_data(dout), dout->strides[0], dout->strides[1],
                      four ? dout->strides[2] : 0, four ? dout->strides[3] : 0,
                      four ? dout->shape[2] : 1, four ? dout->shape[3] : 1};
    return queue_sums(plan, v, buf, ta, tb);
}

static ft_status bias_grad(const ft_tensor *db, const ft_tensor *dout) {
    FT_TRY(ft_cuda_use_device(dout));
    int64_t C = dout->shape[1], rows = numel(dout) / (C ? C : 1);
    if (C == 0)
        return FT_OK;
    /* columns when the channels lie along memory, else one run per channel */
    sums_plan plan = plan_sums(!(C > 1 && dout->strides[1] == 1), rows, C);
    ft_cuda_scratch scratch;
    FT_TRY(ft_cuda_scratch_alloc(&scratch, sums_doubles(plan) * sizeof(double), ft_tensor_device(dout).index));
    const double *ta = NULL, *tb = NULL;
    double *buf = (double *)scratch.ptr;
    ft_status st = dout->dtype == FT_BFLOAT16  ? bias_sums<uint16_t>(plan, dout, buf, &ta, &tb)
                   : dout->dtype == FT_FLOAT16 ? bias_sums<ft_cuda_half>(plan, dout, buf, &ta, &tb)
                                               : bias_sums<float>(plan, dout, buf, &ta, &tb);
    if (st == FT_OK) {
        store_sums<<<ft_cuda_blocks(C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(ta, NULL, C,
                                                                               (float *)ft_tensor_data(db),
                                                                               db->strides[0], NULL, 0);
        st = ft_cuda_launched("store_sums");
    }
    ft_cuda_scratch_free(&scratch);
    return st;
}

} // namespace

void ft_cuda_register_norm(struct ft_cuda_ops *ops) {
    ops->batchnorm_forward = bn_forward;
    ops->batchnorm_backward = bn_backward;
    ops->layernorm_forward = ln_forward;
    ops->layernorm_backward = ln_backward;
    ops->bias_grad = bias_grad;
}
