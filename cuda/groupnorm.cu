/* Group normalization on CUDA: the CUDA side of ops/groupnorm.c, with its
 * per-element arithmetic (kernels/norm.h).
 *
 * Legend: N batch, C channels, S spatial size, G groups, Cg = C / G; a
 * tensor is (N, C, S) contiguous or channels-last (the entry point accepts
 * nothing else, and out, dout, dinp share inp's layout).
 *
 * No atomics: every sum is a block's fixed tree over a fixed share of the
 * values per thread (forward: one block per (n, g); backward: one block per
 * (n, c), then one per (n, g) over its channels' sums in channel order), and
 * the parameter gradients add the per-sample sums in n order, one thread
 * per channel. Every run gives the same bits; only the order of the double
 * additions differs from the CPU's.
 *
 * inp, out, dout and dinp may each be float32 or a 16-bit float
 * (ft_cuda_kind); the statistics and parameters are float32. Values are
 * loaded as float, the arithmetic is the float32 kernels', and each result
 * is rounded once (an accumulating dinp: its old value plus the gradient,
 * then rounded), so a 16-bit result is the float32 result on the same
 * values, rounded. */
#include "backend.h"
#include "blocksum.h"
#include "kernels/norm.h"
#include "ops/cuda_ops.h"

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

typedef struct {
    int64_t N, C, S, G, Cg;
    bool cl; /* channels-last */
    int8_t kx, ky, kdy, kdx; /* storage of inp, out, dout, dinp */

    /* The offset of element i (0 <= i < Cg S, in memory order) of group (n, g); *c its channel. */
    __device__ int64_t at(int64_t n, int64_t g, int64_t i, int64_t *c) const {
        if (cl) {
            int64_t s = i / Cg, k = i - s * Cg;
            *c = g * Cg + k;
            return (n * S + s) * C + *c;
        }
        *c = g * Cg + i / S;
        return (n * C + g * Cg) * S + i;
    }
    /* The offset of (n, c, s). */
    __device__ int64_t at_nc(int64_t n, int64_t c, int64_t s) const {
        return cl ? (n * S + s) * C + c : (n * C + c) * S + s;
    }
} gn_geom;

/* The storage kinds of the float tensors an op passes (NULL: unused). */
static gn_geom geom_of(const ft_tensor *inp, int64_t groups, const ft_tensor *out, const ft_tensor *dout,
                       const ft_tensor *dinp) {
    gn_geom d = {};
    d.kx = ft_cuda_kind(inp->dtype);
    d.ky = out ? ft_cuda_kind(out->dtype) : FT_CUDA_F32;
    d.kdy = dout ? ft_cuda_kind(dout->dtype) : FT_CUDA_F32;
    d.kdx = dinp ? ft_cuda_kind(dinp->dtype) : FT_CUDA_F32;
    d.N = inp->shape[0], d.C = inp->shape[1], d.S = 1;
    for (int k = 2; k < inp->ndim; k++)
        d.S *= inp->shape[k];
    d.G = groups, d.Cg = d.C / groups;
    /* with C or S of 1 both layouts give the same offsets */
    d.cl = inp->ndim == 4 && d.C > 1 && d.S > 1 && inp->strides[1] == 1;
    return d;
}

/* One block per (n, g): the shifted sums of the group, its statistics, then
 * its outputs (out may be inp: every value is summed before any is written). */
__global__ void __launch_bounds__(THREADS) gn_forward(gn_geom d, const char *x, const float *w, const float *b,
                                                      char *y, float *mean, float *rstd, double eps) {
    __shared__ double sh[2 * WARPS];
    int64_t M = d.Cg * d.S, c;
    for (int64_t item = blockIdx.x; item < d.N * d.G; item += gridDim.x) {
        int64_t n = item / d.G, g = item - n * d.G;
        double shift = ft_cuda_load_f(x, d.at(n, g, 0, &c), d.kx), s = 0, q = 0;
        for (int64_t i = threadIdx.x; i < M; i += THREADS) {
            double v = (double)ft_cuda_load_f(x, d.at(n, g, i, &c), d.kx) - shift;
            s += v;
            q += v * v;
        }
        ft_block_sum2<WARPS>(s, q, sh);
        float mu, rs;
        ft_norm_stats(s, q, (double)M, shift, eps, &mu, &rs);
        for (int64_t i = threadIdx.x; i < M; i += THREADS) {
            int64_t off = d.at(n, g, i, &c);
            float sc = ft_norm_scale(rs, w ? w[c] : 1.0f);
            ft_cuda_store_f(y, off, d.ky,
                            ft_norm_apply(ft_cuda_load_f(x, off, d.kx), sc, ft_norm_shift(mu, sc, b ? b[c] : 0.0f)));
        }
        if (threadIdx.x == 0 && mean)
            mean[item] = mu;
        if (threadIdx.x == 0 && rstd)
            rstd[item] = rs;
    }
}

/* One block per (n, c): pa[n C + c] = the sum of dy, pb[n C + c] that of dy (x - mean). */
__global__ void __launch_bounds__(THREADS) gn_channel_sums(gn_geom d, const char *x, const char *dy,
                                                           const float *mean, double *pa, double *pb) {
    __shared__ double sh[2 * WARPS];
    for (int64_t item = blockIdx.x; item < d.N * d.C; item += gridDim.x) {
        int64_t n = item / d.C, c = item - n * d.C;
        double mu = mean[n * d.G + c / d.Cg], a = 0, b = 0;
        for (int64_t s = threadIdx.x; s < d.S; s += THREADS) {
            int64_t off = d.at_nc(n, c, s);
            double g = ft_cuda_load_f(dy, off, d.kdy);
            a += g;
            b += g * ((double)ft_cuda_load_f(x, off, d.kx) - mu);
        }
        ft_block_sum2<WARPS>(a, b, sh);
        if (threadIdx.x == 0) {
            pa[item] = a;
            pb[item] = b;
        }
    }
}

/* One block per (n, g): the group's means of dy w and dy w xhat from its
 * channels' sums, then dx (written, or added with acc; dx may be dy). */
__global__ void __launch_bounds__(THREADS) gn_backward_dx(gn_geom d, const char *x, const char *dy, const float *w,
                                                          const float *mean, const float *rstd, const double *pa,
                                                          const double *pb, char *dx, bool acc) {
    __shared__ double sh[2 * WARPS];
    int64_t M = d.Cg * d.S, c;
    for (int64_t item = blockIdx.x; item < d.N * d.G; item += gridDim.x) {
        int64_t n = item / d.G, g = item - n * d.G;
        double ta = 0, tb = 0;
        for (int64_t k = threadIdx.x; k < d.Cg; k += THREADS) {
            int64_t nc = n * d.C + g * d.Cg + k;
            double wc = w ? w[g * d.Cg + k] : 1.0;
            ta += wc * pa[nc];
            tb += wc * pb[nc];
        }
        ft_block_sum2<WARPS>(ta, tb, sh);
        float mu = mean[item], rs = rstd[item];
        float ma = (float)(ta / (double)M), mc = (float)(tb * rs / (double)M);
        for (int64_t i = threadIdx.x; i < M; i += THREADS) {
            int64_t off = d.at(n, g, i, &c);
            float v = ft_norm_dx(ft_cuda_load_f(dy, off, d.kdy), w ? w[c] : 1.0f,
                                 ft_norm_xhat(ft_cuda_load_f(x, off, d.kx), mu, rs), rs, ma, mc);
            ft_cuda_store_f(dx, off, d.kdx, acc ? ft_cuda_load_f(dx, off, d.kdx) + v : v);
        }
    }
}

/* One thread per channel: the parameter gradients, summed over n in order. */
__global__ void __launch_bounds__(THREADS) gn_params(gn_geom d, const double *pa, const double *pb, const float *rstd,
                                                     float *dw, float *db, bool acc_w, bool acc_b) {
    for (int64_t c = (int64_t)blockIdx.x * THREADS + threadIdx.x; c < d.C; c += (int64_t)gridDim.x * THREADS) {
        double sw = 0, sb = 0;
        for (int64_t n = 0; n < d.N; n++) {
            sb += pa[n * d.C + c];
            sw += pb[n * d.C + c] * rstd[n * d.G + c / d.Cg];
        }
        if (dw)
            dw[c] = acc_w ? dw[c] + (float)sw : (float)sw;
        if (db)
            db[c] = acc_b ? db[c] + (float)sb : (float)sb;
    }
}

static const float *fdata(const ft_tensor *t) { return t ? (const float *)ft_tensor_data(t) : NULL; }
static float *fout(const ft_tensor *t) { return t ? (float *)ft_tensor_data(t) : NULL; }
/* A tensor of any float storage, read or written through its kind. */
static const char *bytes(const ft_tensor *t) { return (const char *)ft_tensor_data(t); }
static char *bytes_out(const ft_tensor *t) { return t ? (char *)ft_tensor_data(t) : NULL; }

static ft_status zero_floats(const ft_tensor *t, int64_t n) {
    return ft_cuda_check(cudaMemsetAsync(ft_tensor_data(t), 0, (size_t)n * sizeof(float), FT_CUDA_STREAM),
                         "cudaMemsetAsync");
}

static ft_status group_norm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                                    const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                                    int64_t groups, double eps) {
    FT_TRY(ft_cuda_use_device(inp));
    gn_geom d = geom_of(inp, groups, out, NULL, NULL);
    gn_forward<<<ft_cuda_blocks(d.N * d.G, 1), THREADS, 0, FT_CUDA_STREAM>>>(
        d, bytes(inp), fdata(weight), fdata(bias), bytes_out(out), fout(save_mean), fout(save_rstd), eps);
    return ft_cuda_launched("gn_forward");
}

static ft_status group_norm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                     const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *save_mean,
                                     const ft_tensor *save_rstd, const ft_tensor *weight, int64_t groups,
                                     ft_grad_acc acc) {
    FT_TRY(ft_cuda_use_device(inp));
    gn_geom d = geom_of(inp, groups, NULL, dout, dinp);
    int64_t NC = d.N * d.C;
    if (NC == 0 || d.S == 0) { /* no values: the parameter gradients are sums of nothing */
        if (dweight && !acc.weight)
            FT_TRY(zero_floats(dweight, d.C));
        if (dbias && !acc.bias)
            FT_TRY(zero_floats(dbias, d.C));
        return FT_OK;
    }
    ft_cuda_scratch scratch;
    FT_TRY(ft_cuda_scratch_alloc(&scratch, (size_t)NC * 2 * sizeof(double), ft_tensor_device(inp).index));
    double *pa = (double *)scratch.ptr, *pb = pa + NC;
    const char *x = bytes(inp), *dy = bytes(dout);
    const float *w = fdata(weight);
    const float *mean = fdata(save_mean), *rstd = fdata(save_rstd);
    gn_channel_sums<<<ft_cuda_blocks(NC, 1), THREADS, 0, FT_CUDA_STREAM>>>(d, x, dy, mean, pa, pb);
    ft_status st = ft_cuda_launched("gn_channel_sums");
    /* the parameters first: they do not read dy, which a dinp that is dout overwrites */
    if (st == FT_OK && (dweight || dbias)) {
        gn_params<<<ft_cuda_blocks(d.C, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
            d, pa, pb, rstd, fout(dweight), fout(dbias), acc.weight, acc.bias);
        st = ft_cuda_launched("gn_params");
    }
    if (st == FT_OK && dinp) {
        gn_backward_dx<<<ft_cuda_blocks(d.N * d.G, 1), THREADS, 0, FT_CUDA_STREAM>>>(d, x, dy, w, mean, rstd, pa, pb,
                                                                                   bytes_out(dinp), acc.inp);
        st = ft_cuda_launched("gn_backward_dx");
    }
    ft_cuda_scratch_free(&scratch);
    return st;
}

} // namespace

void ft_cuda_register_groupnorm(struct ft_cuda_ops *ops) {
    ops->group_norm_forward = group_norm_forward;
    ops->group_norm_backward = group_norm_backward;
}
