#include "ops/upsample.h"

#include <float.h>
#include <stdlib.h>

#include "kernels/interp.h"
#include "ops/check.h"
#include "ops/chunks.h"
#include "ops/cuda_ops.h"

/* Elements below which an op runs on one thread. */
#define PARALLEL_WORK 32768

static ft_status check_4d(const char *op, const char *arg, const ft_tensor *t, ft_device dev, const char *ref) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, ref, true));
    return ft_check_ndim(op, arg, t, 4, "(N, C, H, W)");
}

/* bfloat16 on the CPU: chunks of samples in float32 (ops/chunks.h). */
typedef struct {
    int64_t sh, sw;
    const ft_bilinear2d_params *bilinear; /* NULL: nearest */
    bool accumulate;
} up_call;

static ft_status float_forward(const ft_tensor *const *ts, int64_t first, const void *ctx) {
    const up_call *c = ctx;
    return c->bilinear ? ft_upsample_bilinear2d_forward(ts[0], ts[1], c->bilinear)
                       : ft_upsample_nearest2d_forward(ts[0], ts[1], c->sh, c->sw);
}

static ft_status float_backward(const ft_tensor *const *ts, int64_t first, const void *ctx) {
    const up_call *c = ctx;
    return c->bilinear ? ft_upsample_bilinear2d_backward(ts[0], ts[1], c->bilinear, c->accumulate)
                       : ft_upsample_nearest2d_backward(ts[0], ts[1], c->sh, c->sw, c->accumulate);
}

static ft_status check_scales(const char *op, int64_t sh, int64_t sw) {
    if (sh < 1 || sw < 1 || sh > INT32_MAX || sw > INT32_MAX)
        return ft_fail(FT_ERR_VALUE, "%s: the scale factors must be positive integers, got (%lld, %lld)", op,
                       (long long)sh, (long long)sw);
    return FT_OK;
}

/* Whether a loop over t should take the channels innermost (channels-last memory). */
static bool channels_inner(const ft_tensor *t) { return t->shape[1] > 1 && t->strides[1] == 1; }

/* y (big) and x (small) as the forward's out and inp, or the backward's dout and dinp. */
typedef struct {
    int64_t N, C, H, W, sh, sw;
    int64_t xs[4], ys[4];
} up_job;

static up_job job_of(const ft_tensor *small, const ft_tensor *big, int64_t sh, int64_t sw) {
    up_job j = {small->shape[0], small->shape[1], small->shape[2], small->shape[3], sh, sw, {0}, {0}};
    for (int d = 0; d < 4; d++)
        j.xs[d] = small->strides[d], j.ys[d] = big->strides[d];
    return j;
}

/* The sh x sw block of y whose top-left element is yb, rows then columns. */
static inline float block_sum(const up_job *j, const float *yb) {
    float s = 0.0f;
    for (int64_t a = 0; a < j->sh; a++)
        for (int64_t b = 0; b < j->sw; b++)
            s += yb[a * j->ys[2] + b * j->ys[3]];
    return s;
}

ft_status ft_upsample_nearest2d_forward(const ft_tensor *out, const ft_tensor *inp, int64_t scale_h,
                                        int64_t scale_w) {
    const char *op = "upsample_nearest2d";
    ft_device dev = ft_op_device(inp);
    FT_TRY(check_4d(op, "input", inp, dev, "input"));
    FT_TRY(check_4d(op, "out", out, dev, "input"));
    FT_TRY(check_scales(op, scale_h, scale_w));
    int64_t shape[4] = {inp->shape[0], inp->shape[1], inp->shape[2] * scale_h, inp->shape[3] * scale_w};
    FT_TRY(ft_check_shape(op, "out", out, 4, shape));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "input", inp));
    if (ft_tensor_numel(out) == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA) /* its kernels read and write 16-bit floats themselves */
        FT_CUDA_DISPATCH(op, upsample_nearest2d_forward, out, inp, scale_h, scale_w);
    ft_chunk_arg args[2] = {{out, true, false}, {inp, false, false}};
    if (ft_chunks_needed(args, 2))
        return ft_by_float_chunks(args, 2, float_forward, &(up_call){scale_h, scale_w, NULL, false});
    up_job j = job_of(inp, out, scale_h, scale_w);
    const float *x = (const float *)ft_tensor_data(inp);
    float *y = (float *)ft_tensor_data(out);
    int64_t P = shape[2], Q = shape[3];
    if (channels_inner(out)) {
        /* one output row (n, i) per item, channels innermost */
#pragma omp parallel for schedule(static) if (ft_tensor_numel(out) > PARALLEL_WORK)
        for (int64_t r = 0; r < j.N * P; r++) {
            int64_t n = r / P, i = r % P;
            const float *xr = x + n * j.xs[0] + (i / j.sh) * j.xs[2];
            float *yr = y + n * j.ys[0] + i * j.ys[2];
            for (int64_t q = 0; q < Q; q++) {
                const float *xp = xr + (q / j.sw) * j.xs[3];
                float *yp = yr + q * j.ys[3];
                for (int64_t c = 0; c < j.C; c++)
                    yp[c * j.ys[1]] = xp[c * j.xs[1]];
            }
        }
    } else {
        /* one output row (n, c, i) per item, columns innermost */
#pragma omp parallel for schedule(static) if (ft_tensor_numel(out) > PARALLEL_WORK)
        for (int64_t r = 0; r < j.N * j.C * P; r++) {
            int64_t i = r % P, nc = r / P, n = nc / j.C, c = nc % j.C;
            const float *xr = x + n * j.xs[0] + c * j.xs[1] + (i / j.sh) * j.xs[2];
            float *yr = y + n * j.ys[0] + c * j.ys[1] + i * j.ys[2];
            for (int64_t w = 0; w < j.W; w++) {
                float v = xr[w * j.xs[3]];
                for (int64_t b = 0; b < j.sw; b++)
                    yr[(w * j.sw + b) * j.ys[3]] = v;
            }
        }
    }
    return FT_OK;
}

ft_status ft_upsample_nearest2d_backward(const ft_tensor *dinp, const ft_tensor *dout, int64_t scale_h,
                                         int64_t scale_w, bool accumulate) {
    const char *op = "upsample_nearest2d_backward";
    ft_device dev = ft_op_device(dout);
    FT_TRY(check_4d(op, "grad_output", dout, dev, "grad_output"));
    FT_TRY(check_4d(op, "grad_input", dinp, dev, "grad_output"));
    FT_TRY(check_scales(op, scale_h, scale_w));
    int64_t shape[4] = {dinp->shape[0], dinp->shape[1], dinp->shape[2] * scale_h, dinp->shape[3] * scale_w};
    FT_TRY(ft_check_shape(op, "grad_output", dout, 4, shape));
    FT_TRY(ft_check_output(op, "grad_input", dinp));
    FT_TRY(ft_check_alias(op, "grad_input", dinp, "grad_output", dout));
    if (ft_tensor_numel(dinp) == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, upsample_nearest2d_backward, dinp, dout, scale_h, scale_w, accumulate);
    ft_chunk_arg args[2] = {{dinp, true, accumulate}, {dout, false, false}};
    if (ft_chunks_needed(args, 2))
        return ft_by_float_chunks(args, 2, float_backward, &(up_call){scale_h, scale_w, NULL, accumulate});
    up_job j = job_of(dinp, dout, scale_h, scale_w);
    const float *g = (const float *)ft_tensor_data(dout);
    float *dx = (float *)ft_tensor_data(dinp);
    if (channels_inner(dinp)) {
        /* one input row (n, h) per item, channels innermost */
#pragma omp parallel for schedule(static) if (ft_tensor_numel(dout) > PARALLEL_WORK)
        for (int64_t r = 0; r < j.N * j.H; r++) {
            int64_t n = r / j.H, h = r % j.H;
            for (int64_t w = 0; w < j.W; w++) {
                const float *gb = g + n * j.ys[0] + h * j.sh * j.ys[2] + w * j.sw * j.ys[3];
                float *o = dx + n * j.xs[0] + h * j.xs[2] + w * j.xs[3];
                for (int64_t c = 0; c < j.C; c++) {
                    float s = block_sum(&j, gb + c * j.ys[1]);
                    o[c * j.xs[1]] = accumulate ? o[c * j.xs[1]] + s : s;
                }
            }
        }
    } else {
        /* one input row (n, c, h) per item, columns innermost */
#pragma omp parallel for schedule(static) if (ft_tensor_numel(dout) > PARALLEL_WORK)
        for (int64_t r = 0; r < j.N * j.C * j.H; r++) {
            int64_t h = r % j.H, nc = r / j.H, n = nc / j.C, c = nc % j.C;
            const float *gb = g + n * j.ys[0] + c * j.ys[1] + h * j.sh * j.ys[2];
            float *o = dx + n * j.xs[0] + c * j.xs[1] + h * j.xs[2];
            for (int64_t w = 0; w < j.W; w++) {
                float s = block_sum(&j, gb + w * j.sw * j.ys[3]);
                o[w * j.xs[3]] = accumulate ? o[w * j.xs[3]] + s : s;
            }
        }
    }
    return FT_OK;
}

/* ---- bilinear ---- */

static ft_status check_bilinear(const char *op, const ft_tensor *small, const ft_tensor *big,
                                const ft_bilinear2d_params *p) {
    for (int d = 0; d < 2; d++) { /* (a factor's reciprocal must be a finite float: it places the samples) */
        double f = d ? p->scale_w : p->scale_h;
        if (!(f == 0.0 || (f > 0.0 && f < INFINITY && 1.0 / f < FLT_MAX)))
            return ft_fail(FT_ERR_VALUE, "%s: the scale factors must be finite, positive and above 1/FLT_MAX, or 0 "
                                         "(none), got (%g, %g)", op, p->scale_h, p->scale_w);
    }
    if (big->shape[0] != small->shape[0] || big->shape[1] != small->shape[1])
        return ft_fail(FT_ERR_SHAPE, "%s: the output's batch and channels (%lld, %lld) are not the input's (%lld, %lld)",
                       op, (long long)big->shape[0], (long long)big->shape[1], (long long)small->shape[0],
                       (long long)small->shape[1]);
    if ((small->shape[2] == 0 || small->shape[3] == 0) && ft_tensor_numel(big) > 0)
        return ft_fail(FT_ERR_SHAPE, "%s: an empty input image cannot be resampled to %lld x %lld", op,
                       (long long)big->shape[2], (long long)big->shape[3]);
    return FT_OK;
}

/* One axis: input size I, output size O, and its coordinate scale. */
typedef struct {
    int64_t in, out;
    float scale;
} lerp_axis;

static lerp_axis axis_of(int64_t in, int64_t out, double scale_factor, bool align_corners) {
    return (lerp_axis){in, out, ft_lerp_scale(in, out, scale_factor, align_corners)};
}

ft_status ft_upsample_bilinear2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_bilinear2d_params *p) {
    const char *op = "upsample_bilinear2d";
    ft_device dev = ft_op_device(inp);
    FT_TRY(check_4d(op, "input", inp, dev, "input"));
    FT_TRY(check_4d(op, "out", out, dev, "input"));
    FT_TRY(check_bilinear(op, inp, out, p));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_apart(op, "out", out, "input", inp));
    if (ft_tensor_numel(out) == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, upsample_bilinear2d_forward, out, inp, p);
    ft_chunk_arg args[2] = {{out, true, false}, {inp, false, false}};
    if (ft_chunks_needed(args, 2))
        return ft_by_float_chunks(args, 2, float_forward, &(up_call){0, 0, p, false});
    bool ac = p->align_corners;
    lerp_axis ah = axis_of(inp->shape[2], out->shape[2], p->scale_h, ac);
    lerp_axis aw = axis_of(inp->shape[3], out->shape[3], p->scale_w, ac);
    int64_t N = out->shape[0], C = out->shape[1], P = ah.out, Q = aw.out;
    const int64_t *xs = inp->strides, *ys = out->strides;
    ft_lerp_tap *cols = malloc((size_t)Q * sizeof *cols);
    if (!cols)
        return ft_fail(FT_ERR_NOMEM, "%s: out of host memory", op);
    for (int64_t q = 0; q < Q; q++)
        cols[q] = ft_lerp_at(q, aw.in, aw.scale, ac);
    const float *x = (const float *)ft_tensor_data(inp);
    float *y = (float *)ft_tensor_data(out);
    bool cl = channels_inner(out);
    /* one output row (n, c, p) per item, or (n, p) with the channels innermost */
#pragma omp parallel for schedule(static) if (ft_tensor_numel(out) > PARALLEL_WORK)
    for (int64_t r = 0; r < (cl ? N * P : N * C * P); r++) {
        int64_t i = r % P, n = cl ? r / P : r / P / C, c0 = cl ? 0 : r / P % C, c1 = cl ? C : c0 + 1;
        ft_lerp_tap th = ft_lerp_at(i, ah.in, ah.scale, ac);
        for (int64_t q = 0; q < Q; q++) {
            ft_lerp_tap tw = cols[q];
            for (int64_t c = c0; c < c1; c++) {
                const float *xb = x + n * xs[0] + c * xs[1];
                const float *r0 = xb + th.i0 * xs[2], *r1 = xb + th.i1 * xs[2];
                float top = tw.l0 * r0[tw.i0 * xs[3]] + tw.l1 * r0[tw.i1 * xs[3]];
                float bottom = tw.l0 * r1[tw.i0 * xs[3]] + tw.l1 * r1[tw.i1 * xs[3]];
                y[n * ys[0] + c * ys[1] + i * ys[2] + q * ys[3]] = th.l0 * top + th.l1 * bottom;
            }
        }
    }
    free(cols);
    return FT_OK;
}

ft_status ft_upsample_bilinear2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_bilinear2d_params *p,
                                          bool accumulate) {
    const char *op = "upsample_bilinear2d_backward";
    ft_device dev = ft_op_device(dout);
    FT_TRY(check_4d(op, "grad_output", dout, dev, "grad_output"));
    FT_TRY(check_4d(op, "grad_input", dinp, dev, "grad_output"));
    FT_TRY(check_bilinear(op, dinp, dout, p));
    FT_TRY(ft_check_output(op, "grad_input", dinp));
    FT_TRY(ft_check_apart(op, "grad_input", dinp, "grad_output", dout));
    if (ft_tensor_numel(dinp) == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, upsample_bilinear2d_backward, dinp, dout, p, accumulate);
    ft_chunk_arg args[2] = {{dinp, true, accumulate}, {dout, false, false}};
    if (ft_chunks_needed(args, 2))
        return ft_by_float_chunks(args, 2, float_backward, &(up_call){0, 0, p, accumulate});
    bool ac = p->align_corners;
    lerp_axis ah = axis_of(dinp->shape[2], dout->shape[2], p->scale_h, ac);
    lerp_axis aw = axis_of(dinp->shape[3], dout->shape[3], p->scale_w, ac);
    int64_t N = dinp->shape[0], C = dinp->shape[1], H = ah.in, W = aw.in, Q = aw.out;
    const int64_t *xs = dinp->strides, *ys = dout->strides;
    /* the columns' taps, and the outputs reading each input column */
    ft_lerp_tap *cols = malloc((size_t)Q * sizeof *cols);
    int64_t *readers = malloc((size_t)W * 2 * sizeof *readers);
    if (!cols || !readers) {
        free(cols), free(readers);
        return ft_fail(FT_ERR_NOMEM, "%s: out of host memory", op);
    }
    for (int64_t q = 0; q < Q; q++)
        cols[q] = ft_lerp_at(q, W, aw.scale, ac);
    for (int64_t w = 0; w < W; w++)
        ft_lerp_readers(w, W, Q, aw.scale, ac, &readers[2 * w], &readers[2 * w + 1]);
    const float *g = (const float *)ft_tensor_data(dout);
    float *dx = (float *)ft_tensor_data(dinp);
    bool cl = channels_inner(dinp);
    /* one input row (n, c, h) per item, or (n, h) with the channels innermost */
#pragma omp parallel for schedule(static) if (ft_tensor_numel(dout) > PARALLEL_WORK)
    for (int64_t r = 0; r < (cl ? N * H : N * C * H); r++) {
        int64_t h = r % H, n = cl ? r / H : r / H / C, c0 = cl ? 0 : r / H % C, c1 = cl ? C : c0 + 1, plo, phi;
        ft_lerp_readers(h, H, ah.out, ah.scale, ac, &plo, &phi);
        for (int64_t w = 0; w < W; w++)
            for (int64_t c = c0; c < c1; c++) {
                const float *gb = g + n * ys[0] + c * ys[1];
                float s = 0.0f;
                for (int64_t i = plo; i < phi; i++) {
                    float row = 0.0f;
                    for (int64_t q = readers[2 * w]; q < readers[2 * w + 1]; q++)
                        row += ft_lerp_weight(cols[q], w) * gb[i * ys[2] + q * ys[3]];
                    s += ft_lerp_weight(ft_lerp_at(i, H, ah.scale, ac), h) * row;
                }
                float *o = dx + n * xs[0] + c * xs[1] + h * xs[2] + w * xs[3];
                *o = accumulate ? *o + s : s;
            }
    }
    free(cols);
    free(readers);
    return FT_OK;
}
