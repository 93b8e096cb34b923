#include "ops/layernorm.h"

#include <omp.h>
#include <stdlib.h>

#include "kernels/convert.h"
#include "kernels/norm.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/gradient.h"
#include "ops/pointwise.h"

/* Rows per partial sum of the parameter gradients (fixes their order). */
#define CHUNK 64

/* A row's sums run in LANES double accumulators, element d in lane
 * d % LANES, combined by a fixed tree: the loops vectorize without
 * reassociation, and every instruction set adds in the same order. */
#define LANES 16

static inline double lanes_total(double *acc) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++)
            acc[k] += acc[k + w];
    return acc[0];
}

/* Every tensor of a call is on dev, the input's device. */
static ft_status check_rows(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *ref, int64_t D,
                            int64_t *R, ft_device dev) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, "input", true));
    if (ref)
        FT_TRY(ft_check_shape_as(op, arg, t, ref));
    if (!ft_tensor_is_contiguous(t))
        return ft_fail(FT_ERR_SHAPE, "%s: %s must be contiguous", op, arg);
    int64_t n = ft_tensor_numel(t);
    if (D < 1 || n % D || (t->ndim > 0 && t->shape[t->ndim - 1] > D))
        return ft_fail(FT_ERR_SHAPE, "%s: %s's trailing dimensions do not make up the normalized size %lld", op,
                       arg, (long long)D);
    *R = n / D;
    return FT_OK;
}

/* One row: its statistics (shifted sums in double keep the variance
 * accurate) and its normalized values. Compiled for AVX-512, AVX2 and plain
 * x86-64, picked at run time. */
FT_VEC_CLONES static void forward_row(float *y, float *mean, float *rstd, const float *x, const float *w,
                                      const float *b, int64_t D, double eps) {
    double s[LANES] = {0}, q[LANES] = {0}, v[LANES] = {0}, shift = x[0];
    for (int64_t d0 = 0; d0 < D; d0 += LANES) {
        int n = D - d0 < LANES ? (int)(D - d0) : LANES;
        if (n < LANES) /* the last, partial block adds zeros in its empty lanes */
            for (int k = 0; k < LANES; k++)
                v[k] = k < n ? (double)x[d0 + k] - shift : 0.0;
        else
            for (int k = 0; k < LANES; k++)
                v[k] = (double)x[d0 + k] - shift;
        for (int k = 0; k < LANES; k++)
            s[k] += v[k];
        for (int k = 0; k < LANES; k++)
            q[k] += v[k] * v[k];
    }
    float mu, rs;
    ft_norm_stats(lanes_total(s), lanes_total(q), (double)D, shift, eps, &mu, &rs);
    for (int64_t d = 0; d < D; d++)
        y[d] = ft_ln_value(x[d], mu, rs, w ? w[d] : 1.0f, b ? b[d] : 0.0f);
    if (mean)
        *mean = mu;
    if (rstd)
        *rstd = rs;
}

/* One row of the backward: its input gradient into dx (NULL: none; added
 * to it with acc; dx may be dy itself, each element being read before it is
 * written), and its
 * terms of the parameter gradients added to pw and pb (NULL: none), all in
 * one pass after the row's sums. */
FT_VEC_CLONES static void backward_row(float *dx, double *pw, double *pb, const float *x, const float *dy,
                                       const float *w, float mean, float rstd, int64_t D, bool acc) {
    float ma = 0.0f, mc = 0.0f;
    if (dx) {
        double a[LANES] = {0}, c[LANES] = {0}; /* sums of g = dy * w and of g * xhat */
        float g[LANES] = {0}, xh[LANES] = {0};
        for (int64_t d0 = 0; d0 < D; d0 += LANES) {
            int n = D - d0 < LANES ? (int)(D - d0) : LANES;
            if (n < LANES) { /* the last, partial block adds zeros in its empty lanes */
                for (int k = 0; k < LANES; k++) {
                    g[k] = k >= n ? 0.0f : w ? dy[d0 + k] * w[d0 + k] : dy[d0 + k];
                    xh[k] = k < n ? ft_norm_xhat(x[d0 + k], mean, rstd) : 0.0f;
                }
            } else {
                for (int k = 0; k < LANES; k++) {
                    g[k] = w ? dy[d0 + k] * w[d0 + k] : dy[d0 + k];
                    xh[k] = ft_norm_xhat(x[d0 + k], mean, rstd);
                }
            }
            for (int k = 0; k < LANES; k++)
                a[k] += g[k];
            for (int k = 0; k < LANES; k++)
                c[k] += (double)g[k] * xh[k];
        }
        ma = (float)(lanes_total(a) / (double)D);
        mc = (float)(lanes_total(c) / (double)D);
    }
    for (int64_t d = 0; d < D; d++) {
        float dyd = dy[d], xd = ft_norm_xhat(x[d], mean, rstd);
        if (pw) {
            pw[d] += (double)dyd * xd;
            pb[d] += dyd;
        }
        if (dx) {
            float v = ft_norm_dx(dyd, w ? w[d] : 1.0f, xd, rstd, ma, mc);
            dx[d] = acc ? dx[d] + v : v;
        }
    }
}

ft_status ft_layernorm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                               const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                               int64_t norm_size, double eps) {
    const char *op = "layer_norm";
    ft_device dev = ft_op_device(inp);
    int64_t R, D = norm_size;
    FT_TRY(check_rows(op, "input", inp, NULL, D, &R, dev));
    FT_TRY(check_rows(op, "out", out, inp, D, &R, dev));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_vector(op, "weight", weight, D, dev));
    FT_TRY(ft_check_vector(op, "bias", bias, D, dev));
    FT_TRY(ft_check_vector(op, "save_mean", save_mean, R, dev));
    FT_TRY(ft_check_vector(op, "save_rstd", save_rstd, R, dev));
    if (!(eps > 0))
        return ft_fail(FT_ERR_VALUE, "%s: eps must be positive", op);
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, layernorm_forward, out, save_mean, save_rstd, inp, weight, bias, D, eps);
    const void *x = ft_tensor_data(inp);
    void *y = ft_tensor_data(out);
    bool x16 = inp->dtype == FT_BFLOAT16, y16 = out->dtype == FT_BFLOAT16;
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    const float *b = bias ? (const float *)ft_tensor_data(bias) : NULL;
    float *mean = save_mean ? (float *)ft_tensor_data(save_mean) : NULL;
    float *rstd = save_rstd ? (float *)ft_tensor_data(save_rstd) : NULL;
    /* bfloat16 rows go through float buffers, a row at a time */
    float *bufs = x16 || y16 ? malloc((size_t)omp_get_max_threads() * (size_t)(2 * D) * sizeof *bufs) : NULL;
    if ((x16 || y16) && !bufs)
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
#pragma omp parallel for schedule(static) if (R * D > 32768)
    for (int64_t r = 0; r < R; r++) {
        float *buf = bufs ? bufs + omp_get_thread_num() * 2 * D : NULL, *yr = ft_floats_at(y, y16, r * D, buf);
        forward_row(yr, mean ? mean + r : NULL, rstd ? rstd + r : NULL, ft_floats_in(x, x16, r * D, D, buf + D), w,
                    b, D, eps);
        ft_floats_out(y, y16, r * D, D, yr);
    }
    free(bufs);
    return FT_OK;
}

ft_status ft_layernorm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *weight,
                                const ft_tensor *save_mean, const ft_tensor *save_rstd, int64_t norm_size,
                                ft_grad_acc acc) {
    const char *op = "layer_norm_backward";
    ft_device dev = ft_op_device(inp);
    int64_t R, D = norm_size;
    FT_TRY(check_rows(op, "input", inp, NULL, D, &R, dev));
    FT_TRY(check_rows(op, "grad_output", dout, inp, D, &R, dev));
    if (dinp) {
        FT_TRY(check_rows(op, "grad_input", dinp, inp, D, &R, dev));
        FT_TRY(ft_check_output(op, "grad_input", dinp));
    }
    FT_TRY(ft_check_vector(op, "weight", weight, D, dev));
    FT_TRY(ft_check_vector(op, "grad_weight", dweight, D, dev));
    FT_TRY(ft_check_vector(op, "grad_bias", dbias, D, dev));
    if (!save_mean || !save_rstd)
        return ft_fail(FT_ERR_VALUE, "%s: save_mean and save_rstd are required", op);
    FT_TRY(ft_check_vector(op, "save_mean", save_mean, R, dev));
    FT_TRY(ft_check_vector(op, "save_rstd", save_rstd, R, dev));
    if (dinp && acc.inp && dinp->storage == dout->storage && dinp->offset == dout->offset)
        return ft_fail(FT_ERR_VALUE, "%s: grad_input cannot accumulate into grad_output itself", op);
    if (dev.type == FT_DEV_CUDA) { /* the backend writes: accumulation is staged */
        ft_grad_out gx = {0}, gw = {0}, gb = {0}; /* each ended, begun or not */
        const ft_tensor *dx_to, *dw_to, *db_to;
        FT_TRY(ft_grad_out_begin_float(&gx, dinp, acc.inp, &dx_to));
        ft_status s = ft_grad_out_begin(&gw, dweight, acc.weight, &dw_to);
        if (s == FT_OK)
            s = ft_grad_out_begin(&gb, dbias, acc.bias, &db_to);
        if (s == FT_OK)
            s = FT_CUDA_CALL(op, layernorm_backward, dx_to, dw_to, db_to, dout, inp, weight, save_mean, save_rstd, D);
        return ft_grad_out_end(&gb, ft_grad_out_end(&gw, ft_grad_out_end(&gx, s)));
    }
    const void *x = ft_tensor_data(inp), *dy = ft_tensor_data(dout);
    bool x16 = inp->dtype == FT_BFLOAT16, dy16 = dout->dtype == FT_BFLOAT16, dx16 = dinp && dinp->dtype == FT_BFLOAT16;
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    const float *mean = (const float *)ft_tensor_data(save_mean), *rstd = (const float *)ft_tensor_data(save_rstd);
    /* Rows in chunks of CHUNK, each chunk's parameter sums apart: the order
     * of every sum is fixed, whatever the thread count. */
    int64_t nchunks = (R + CHUNK - 1) / CHUNK;
    bool params = dweight || dbias;
    double *part = params ? calloc((size_t)(nchunks ? nchunks : 1) * (size_t)D * 2, sizeof *part) : NULL;
    bool low = x16 || dy16 || dx16; /* rows through float buffers */
    float *bufs = low ? malloc((size_t)omp_get_max_threads() * (size_t)(3 * D) * sizeof *bufs) : NULL;
    if ((params && !part) || (low && !bufs)) {
        free(part);
        free(bufs);
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
    }
    void *dx = dinp ? ft_tensor_data(dinp) : NULL;
#pragma omp parallel for schedule(static) if (R * D > 32768)
    for (int64_t k = 0; k < nchunks; k++) {
        double *pw = part ? part + k * 2 * D : NULL, *pb = part ? part + k * 2 * D + D : NULL;
        int64_t end = (k + 1) * CHUNK < R ? (k + 1) * CHUNK : R;
        float *buf = bufs ? bufs + omp_get_thread_num() * 3 * D : NULL;
        for (int64_t r = k * CHUNK; r < end; r++) {
            /* dy is read into its buffer before dx is written: dx may be dy */
            const float *xr = ft_floats_in(x, x16, r * D, D, buf), *dyr = ft_floats_in(dy, dy16, r * D, D, buf + D);
            float *dxr = !dx ? NULL
                         : acc.inp ? (float *)ft_floats_in(dx, dx16, r * D, D, buf + 2 * D)
                                   : ft_floats_at(dx, dx16, r * D, buf + 2 * D);
            backward_row(dxr, pw, pb, xr, dyr, w, mean[r], rstd[r], D, acc.inp);
            if (dx)
                ft_floats_out(dx, dx16, r * D, D, dxr);
        }
    }
    free(bufs);
    for (int64_t d = 0; params && d < D; d++) {
        double sw = 0, sb = 0;
        for (int64_t k = 0; k < nchunks; k++) {
            sw += part[k * 2 * D + d];
            sb += part[k * 2 * D + D + d];
        }
        if (dweight) {
            float *o = (float *)ft_tensor_data(dweight) + d;
            *o = acc.weight ? *o + (float)sw : (float)sw;
        }
        if (dbias) {
            float *o = (float *)ft_tensor_data(dbias) + d;
            *o = acc.bias ? *o + (float)sb : (float)sb;
        }
    }
    free(part);
    return FT_OK;
}
