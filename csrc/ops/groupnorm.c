#include "ops/groupnorm.h"

#include <stdlib.h>

#include "kernels/norm.h"
#include "ops/check.h"
#include "ops/chunks.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

/* Sums run in LANES double accumulators (element k of a run in lane
 * k % LANES), combined by a fixed tree: the loops vectorize without
 * reassociation, and every instruction set adds in the same order. */
#define LANES 16
/* Elements below which an op runs on one thread. */
#define PARALLEL_WORK 32768

static inline double lanes_total(double *acc) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++)
            acc[k] += acc[k + w];
    return acc[0];
}

typedef struct {
    int64_t N, C, S, G, Cg;
    bool cl; /* channels-last: element (n, c, s) at (n S + s) C + c; else at (n C + c) S + s */
} gn_dims;

/* Whether t's strides are those of a dense layout with these strides
 * (dimensions of size 1 may have any). */
static bool strides_are(const ft_tensor *t, const int64_t *want) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->strides[d] != want[d])
            return false;
    return true;
}

static ft_status gn_dims_of(const char *op, const ft_tensor *inp, int64_t groups, gn_dims *d) {
    if (inp->ndim < 2)
        return ft_fail(FT_ERR_SHAPE, "%s: input must have at least 2 dimensions (N, C, *), got %d", op, inp->ndim);
    d->N = inp->shape[0], d->C = inp->shape[1], d->S = 1;
    for (int k = 2; k < inp->ndim; k++)
        d->S *= inp->shape[k];
    if (groups < 1 || d->C % groups)
        return ft_fail(FT_ERR_VALUE, "%s: the number of channels (%lld) must be divisible by num_groups, got "
                                     "num_groups=%lld",
                       op, (long long)d->C, (long long)groups);
    d->G = groups, d->Cg = d->C / groups;
    d->cl = false;
    if (ft_tensor_is_contiguous(inp))
        return FT_OK;
    if (inp->ndim == 4) {
        int64_t C = d->C, H = inp->shape[2], W = inp->shape[3];
        if (strides_are(inp, (int64_t[]){H * W * C, 1, W * C, C})) {
            d->cl = true;
            return FT_OK;
        }
    }
    return ft_fail(FT_ERR_SHAPE, "%s: input must be contiguous (N, C, *) or channels-last (N, C, H, W); call "
                                 ".contiguous() first",
                   op);
}

/* A tensor of the input's shape and memory layout (out, dout, dinp). */
static ft_status check_like_inp(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *inp,
                                ft_device dev) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, "input", true));
    FT_TRY(ft_check_shape_as(op, arg, t, inp));
    if (!strides_are(t, inp->strides))
        return ft_fail(FT_ERR_SHAPE, "%s: %s must have the input's memory layout (both contiguous or both "
                                     "channels-last)",
                       op, arg);
    return FT_OK;
}

/* bfloat16 on the CPU: chunks of samples in float32 (ops/chunks.h); the
 * statistics (N G) travel as (N, G). The CUDA kernels read and write 16-bit
 * floats themselves. */
typedef struct {
    const ft_tensor *weight, *bias, *dweight, *dbias;
    int64_t groups;
    double eps;
    ft_grad_acc acc;
} gn_call;

static ft_tensor per_sample(const ft_tensor *t, int64_t N) {
    ft_tensor v = *t;
    v.ndim = 2;
    v.shape[0] = N, v.shape[1] = N ? ft_tensor_numel(t) / N : 0;
    v.strides[0] = v.shape[1], v.strides[1] = 1;
    return v;
}

static ft_tensor flat(const ft_tensor *t) {
    ft_tensor v = *t;
    v.ndim = 1;
    v.shape[0] = t->shape[0] * t->shape[1];
    v.strides[0] = 1;
    return v;
}

static ft_status float_forward(const ft_tensor *const *ts, int64_t first, const void *ctx) {
    const gn_call *c = ctx;
    ft_tensor m = ts[1] ? flat(ts[1]) : (ft_tensor){0}, r = ts[2] ? flat(ts[2]) : (ft_tensor){0};
    return ft_group_norm_forward(ts[0], ts[1] ? &m : NULL, ts[2] ? &r : NULL, ts[3], c->weight, c->bias, c->groups,
                                 c->eps);
}

static ft_status float_backward(const ft_tensor *const *ts, int64_t first, const void *ctx) {
    const gn_call *c = ctx;
    ft_tensor m = flat(ts[3]), r = flat(ts[4]);
    ft_grad_acc acc = c->acc;
    acc.weight |= first > 0; /* the parameter gradients sum over the chunks */
    acc.bias |= first > 0;
    return ft_group_norm_backward(ts[0], c->dweight, c->dbias, ts[1], ts[2], &m, &r, c->weight, c->groups, acc);
}

/* Adds the n values of run x, less shift, and their squares into the lanes. */
static inline void add_run(const float *x, int64_t n, double shift, double *s, double *q) {
    int64_t i0 = 0;
    for (; i0 + LANES <= n; i0 += LANES) /* whole blocks: a branch-free body that vectorizes */
        for (int k = 0; k < LANES; k++) {
            double v = (double)x[i0 + k] - shift;
            s[k] += v;
            q[k] += v * v;
        }
    for (int k = 0; i0 + k < n; k++) {
        double v = (double)x[i0 + k] - shift;
        s[k] += v;
        q[k] += v * v;
    }
}

/* Group (n, g): its statistics from sums shifted by its first value (in
 * double: the variance stays accurate for a large mean), then its outputs.
 * Compiled for AVX-512, AVX2 and plain x86-64, picked at run time. */
FT_VEC_CLONES static void forward_group(const gn_dims *d, float *y, float *mean_out, float *rstd_out, const float *x,
                                        const float *w, const float *b, int64_t n, int64_t g, double eps) {
    int64_t C = d->C, S = d->S, Cg = d->Cg, c0 = g * Cg;
    const float *xn = x + n * C * S;
    float *yn = y + n * C * S;
    double s[LANES] = {0}, q[LANES] = {0};
    double shift = d->cl ? xn[c0] : xn[c0 * S];
    if (d->cl)
        for (int64_t p = 0; p < S; p++)
            add_run(xn + p * C + c0, Cg, shift, s, q);
    else
        add_run(xn + c0 * S, Cg * S, shift, s, q);
    float mu, rs;
    ft_norm_stats(lanes_total(s), lanes_total(q), (double)(Cg * S), shift, eps, &mu, &rs);
    if (d->cl) {
        for (int64_t p = 0; p < S; p++) {
            const float *xr = xn + p * C + c0;
            float *yr = yn + p * C + c0;
            for (int64_t c = 0; c < Cg; c++) {
                float sc = ft_norm_scale(rs, w ? w[c0 + c] : 1.0f);
                yr[c] = ft_norm_apply(xr[c], sc, ft_norm_shift(mu, sc, b ? b[c0 + c] : 0.0f));
            }
        }
    } else {
        for (int64_t c = c0; c < c0 + Cg; c++) {
            float sc = ft_norm_scale(rs, w ? w[c] : 1.0f), sh = ft_norm_shift(mu, sc, b ? b[c] : 0.0f);
            const float *xr = xn + c * S;
            float *yr = yn + c * S;
            for (int64_t p = 0; p < S; p++)
                yr[p] = ft_norm_apply(xr[p], sc, sh);
        }
    }
    if (mean_out)
        mean_out[n * d->G + g] = mu;
    if (rstd_out)
        rstd_out[n * d->G + g] = rs;
}

ft_status ft_group_norm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                                const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                                int64_t groups, double eps) {
    const char *op = "group_norm";
    ft_device dev = ft_op_device(inp);
    gn_dims d;
    FT_TRY(ft_check_float_on(op, "input", inp, dev, "input", true));
    FT_TRY(gn_dims_of(op, inp, groups, &d));
    FT_TRY(check_like_inp(op, "out", out, inp, dev));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "input", inp));
    FT_TRY(ft_check_vector(op, "weight", weight, d.C, dev));
    FT_TRY(ft_check_vector(op, "bias", bias, d.C, dev));
    FT_TRY(ft_check_vector(op, "save_mean", save_mean, d.N * d.G, dev));
    FT_TRY(ft_check_vector(op, "save_rstd", save_rstd, d.N * d.G, dev));
    if (save_mean)
        FT_TRY(ft_check_output(op, "save_mean", save_mean));
    if (save_rstd)
        FT_TRY(ft_check_output(op, "save_rstd", save_rstd));
    if (!(eps > 0))
        return ft_fail(FT_ERR_VALUE, "%s: eps must be positive, got %g", op, eps);
    if (d.N * d.C * d.S == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, group_norm_forward, out, save_mean, save_rstd, inp, weight, bias, groups, eps);
    ft_tensor m = save_mean ? per_sample(save_mean, d.N) : (ft_tensor){0};
    ft_tensor r = save_rstd ? per_sample(save_rstd, d.N) : (ft_tensor){0};
    ft_chunk_arg args[4] = {{out, true, false}, {save_mean ? &m : NULL, true, false},
                            {save_rstd ? &r : NULL, true, false}, {inp, false, false}};
    if (ft_chunks_needed(args, 4))
        return ft_by_float_chunks(args, 4, float_forward, &(gn_call){weight, bias, NULL, NULL, groups, eps, {0}});
    const float *x = (const float *)ft_tensor_data(inp);
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    const float *b = bias ? (const float *)ft_tensor_data(bias) : NULL;
    float *y = (float *)ft_tensor_data(out);
    float *mean = save_mean ? (float *)ft_tensor_data(save_mean) : NULL;
    float *rstd = save_rstd ? (float *)ft_tensor_data(save_rstd) : NULL;
    int64_t items = d.N * d.G;
#pragma omp parallel for schedule(static) if (d.N * d.C * d.S > PARALLEL_WORK)
    for (int64_t i = 0; i < items; i++)
        forward_group(&d, y, mean, rstd, x, w, b, i / d.G, i % d.G, eps);
    return FT_OK;
}

/* Group (n, g) of the backward: the sums of dy and dy (x - mean) of each of
 * its channels into pa, pb[n C + c] (double, each channel's in a fixed
 * order), then, with dx, its input gradients (written, or added with acc;
 * dx may be dy itself: every element is read before it is written). */
FT_VEC_CLONES static void backward_group(const gn_dims *d, float *dx, double *pa, double *pb, const float *x,
                                         const float *dy, const float *w, float mu, float rs, int64_t n, int64_t g,
                                         bool acc) {
    int64_t C = d->C, S = d->S, Cg = d->Cg, c0 = g * Cg;
    const float *xn = x + n * C * S, *gn = dy + n * C * S;
    double *a = pa + n * C + c0, *bb = pb + n * C + c0;
    if (d->cl) {
        for (int64_t c = 0; c < Cg; c++)
            a[c] = bb[c] = 0.0;
        for (int64_t p = 0; p < S; p++) {
            const float *xr = xn + p * C + c0, *gr = gn + p * C + c0;
            for (int64_t c = 0; c < Cg; c++) {
                a[c] += gr[c];
                bb[c] += (double)gr[c] * ((double)xr[c] - mu);
            }
        }
    } else {
        for (int64_t c = 0; c < Cg; c++) {
            const float *xr = xn + (c0 + c) * S, *gr = gn + (c0 + c) * S;
            double sa[LANES] = {0}, sb[LANES] = {0};
            int64_t p0 = 0;
            for (; p0 + LANES <= S; p0 += LANES)
                for (int k = 0; k < LANES; k++) {
                    double u = gr[p0 + k];
                    sa[k] += u;
                    sb[k] += u * ((double)xr[p0 + k] - mu);
                }
            for (int k = 0; p0 + k < S; k++) {
                double u = gr[p0 + k];
                sa[k] += u;
                sb[k] += u * ((double)xr[p0 + k] - mu);
            }
            a[c] = lanes_total(sa);
            bb[c] = lanes_total(sb);
        }
    }
    if (!dx)
        return;
    double ta = 0, tb = 0;
    for (int64_t c = 0; c < Cg; c++) {
        double wc = w ? w[c0 + c] : 1.0;
        ta += wc * a[c];
        tb += wc * bb[c];
    }
    double M = (double)(Cg * S);
    float ma = (float)(ta / M), mc = (float)(tb * rs / M);
    float *dxn = dx + n * C * S;
    if (d->cl) {
        for (int64_t p = 0; p < S; p++) {
            const float *xr = xn + p * C + c0, *gr = gn + p * C + c0;
            float *o = dxn + p * C + c0;
            for (int64_t c = 0; c < Cg; c++) {
                float v = ft_norm_dx(gr[c], w ? w[c0 + c] : 1.0f, ft_norm_xhat(xr[c], mu, rs), rs, ma, mc);
                o[c] = acc ? o[c] + v : v;
            }
        }
    } else {
        for (int64_t c = c0; c < c0 + Cg; c++) {
            const float *xr = xn + c * S, *gr = gn + c * S;
            float *o = dxn + c * S, wc = w ? w[c] : 1.0f;
            for (int64_t p = 0; p < S; p++) {
                float v = ft_norm_dx(gr[p], wc, ft_norm_xhat(xr[p], mu, rs), rs, ma, mc);
                o[p] = acc ? o[p] + v : v;
            }
        }
    }
}

ft_status ft_group_norm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                 const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *save_mean,
                                 const ft_tensor *save_rstd, const ft_tensor *weight, int64_t groups,
                                 ft_grad_acc acc) {
    const char *op = "group_norm_backward";
    ft_device dev = ft_op_device(inp);
    gn_dims d;
    FT_TRY(ft_check_float_on(op, "input", inp, dev, "input", true));
    FT_TRY(gn_dims_of(op, inp, groups, &d));
    FT_TRY(check_like_inp(op, "grad_output", dout, inp, dev));
    if (dinp) {
        FT_TRY(check_like_inp(op, "grad_input", dinp, inp, dev));
        FT_TRY(ft_check_output(op, "grad_input", dinp));
        FT_TRY(ft_check_alias(op, "grad_input", dinp, "grad_output", dout));
        FT_TRY(ft_check_alias(op, "grad_input", dinp, "input", inp));
        if (acc.inp && ft_same_view(dinp, dout))
            return ft_fail(FT_ERR_VALUE, "%s: grad_input cannot accumulate into grad_output itself", op);
    }
    FT_TRY(ft_check_vector(op, "weight", weight, d.C, dev));
    FT_TRY(ft_check_vector(op, "grad_weight", dweight, d.C, dev));
    FT_TRY(ft_check_vector(op, "grad_bias", dbias, d.C, dev));
    if (dweight)
        FT_TRY(ft_check_output(op, "grad_weight", dweight));
    if (dbias)
        FT_TRY(ft_check_output(op, "grad_bias", dbias));
    if (!save_mean || !save_rstd)
        return ft_fail(FT_ERR_VALUE, "%s: save_mean and save_rstd of the forward are required", op);
    FT_TRY(ft_check_vector(op, "save_mean", save_mean, d.N * d.G, dev));
    FT_TRY(ft_check_vector(op, "save_rstd", save_rstd, d.N * d.G, dev));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, group_norm_backward, dinp, dweight, dbias, dout, inp, save_mean, save_rstd, weight,
                         groups, acc);
    ft_tensor m = per_sample(save_mean, d.N), r = per_sample(save_rstd, d.N);
    ft_chunk_arg args[5] = {{dinp, true, acc.inp}, {dout, false, false}, {inp, false, false}, {&m, false, false},
                            {&r, false, false}};
    if (ft_chunks_needed(args, 5))
        return ft_by_float_chunks(args, 5, float_backward,
                                  &(gn_call){weight, NULL, dweight, dbias, groups, 0.0, acc});
    bool params = dweight || dbias;
    int64_t NC = d.N * d.C;
    /* Per (n, c) sums: their combination over n runs in n order after the
     * parallel loop, whatever the thread count. */
    double *part = NC && d.S ? malloc((size_t)NC * 2 * sizeof *part) : NULL;
    if (NC && d.S && !part)
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
    const float *x = (const float *)ft_tensor_data(inp), *dy = (const float *)ft_tensor_data(dout);
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    const float *mean = (const float *)ft_tensor_data(save_mean), *rstd = (const float *)ft_tensor_data(save_rstd);
    float *dx = dinp ? (float *)ft_tensor_data(dinp) : NULL;
    if (part) {
        int64_t items = d.N * d.G;
#pragma omp parallel for schedule(static) if (NC * d.S > PARALLEL_WORK)
        for (int64_t i = 0; i < items; i++)
            backward_group(&d, dx, part, part + NC, x, dy, w, mean[i], rstd[i], i / d.G, i % d.G, acc.inp);
    }
    for (int64_t c = 0; params && c < d.C; c++) {
        double sw = 0, sb = 0;
        for (int64_t n = 0; n < d.N && part; n++) {
            sb += part[n * d.C + c];
            sw += part[NC + n * d.C + c] * rstd[n * d.G + c / d.Cg];
        }
        if (dweight) {
            float *o = (float *)ft_tensor_data(dweight) + c;
            *o = acc.weight ? *o + (float)sw : (float)sw;
        }
        if (dbias) {
            float *o = (float *)ft_tensor_data(dbias) + c;
            *o = acc.bias ? *o + (float)sb : (float)sb;
        }
    }
    free(part);
    return FT_OK;
}
