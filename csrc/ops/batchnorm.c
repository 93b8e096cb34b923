#include "ops/batchnorm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows per partial sum in channels-last layout (fixes the reduction order). */
#define CHUNK 256
#define PARALLEL_ELEMS 32768

/* A tensor seen as (N, C, S) with S = H * W, in one of two dense layouts. */
typedef struct {
    bool channels_last;
    int64_t N, C, S;
} layout;

static bool is_channels_last(const ft_tensor *t) {
    if (t->ndim == 2)
        return ft_tensor_is_contiguous(t);
    ft_tensor nhwc = *t;
    int perm[4] = {0, 2, 3, 1};
    for (int i = 0; i < 4; i++) {
        nhwc.shape[i] = t->shape[perm[i]];
        nhwc.strides[i] = t->strides[perm[i]];
    }
    return ft_tensor_is_contiguous(&nhwc);
}

static ft_status layout_of(layout *l, const ft_tensor *t, const char *arg) {
    if (t->ndim != 2 && t->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must be (N, C) or (N, C, H, W), got %d dimensions", arg,
                       t->ndim);
    if (t->dtype != FT_FLOAT32)
        return ft_fail(FT_ERR_DTYPE, "batch_norm: %s must be float32, got %s", arg, ft_dtype_get(t->dtype)->name);
    if (ft_tensor_device(t).type != FT_DEV_CPU)
        return ft_fail(FT_ERR_DEVICE, "batch_norm: %s is on a CUDA device; batch_norm has no CUDA implementation yet",
                       arg);
    l->N = t->shape[0];
    l->C = t->shape[1];
    l->S = t->ndim == 4 ? t->shape[2] * t->shape[3] : 1;
    l->channels_last = t->ndim == 2 || (is_channels_last(t) && !(ft_tensor_is_contiguous(t) && l->S > 1));
    if (!l->channels_last && !ft_tensor_is_contiguous(t))
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must be contiguous in NCHW or channels-last memory", arg);
    return FT_OK;
}

static ft_status same_layout(const layout *want, const ft_tensor *t, const ft_tensor *ref, const char *arg) {
    layout l;
    FT_TRY(layout_of(&l, t, arg));
    if (t->ndim != ref->ndim || memcmp(t->shape, ref->shape, (size_t)t->ndim * sizeof *t->shape) != 0)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must have the input's shape", arg);
    if (l.channels_last != want->channels_last)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must use the input's memory layout (%s)", arg,
                       want->channels_last ? "channels-last" : "NCHW");
    return FT_OK;
}

static ft_status channel_vector(const ft_tensor *t, int64_t C, const char *arg) {
    if (!t)
        return FT_OK;
    if (t->ndim != 1 || t->shape[0] != C || t->dtype != FT_FLOAT32 || t->strides[0] != 1 ||
        ft_tensor_device(t).type != FT_DEV_CPU)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must be a contiguous float32 CPU tensor of shape (%lld,)", arg,
                       (long long)C);
    return FT_OK;
}

static inline int64_t offset(const layout *l, int64_t n, int64_t c, int64_t s) {
    return l->channels_last ? (n * l->S + s) * l->C + c : (n * l->C + c) * l->S + s;
}

/* The two per-channel sums the forward (of x - shift and its square) and
 * the backward (of dz and dz * (x - mean)) need, from fixed partials: one
 * per (n, c) plane in NCHW, one per CHUNK rows in channels-last. */
typedef struct {
    const float *x, *y, *dy; /* y, dy: NULL in the forward */
    const float *center;     /* (C) */
    ft_act act;
} sums_in;

static inline void accumulate(const sums_in *in, int64_t i, float center, double *a, double *b) {
    float xc = in->x[i] - center;
    if (!in->dy) {
        *a += xc;
        *b += (double)xc * xc;
    } else {
        float dz = in->act.kind ? in->dy[i] * ft_act_grad_from_output(in->act, in->y[i]) : in->dy[i];
        *a += dz;
        *b += (double)dz * xc;
    }
}

static ft_status channel_sums(double *sa, double *sb, const layout *l, const sums_in *in) {
    int64_t C = l->C, rows = l->N * l->S;
    int64_t nparts = l->channels_last ? (rows + CHUNK - 1) / CHUNK : l->N;
    double *part = calloc((size_t)(nparts ? nparts : 1) * (size_t)C * 2, sizeof *part); /* (parts, C, 2) */
    if (!part)
        return ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory for partial sums");
    bool parallel = rows * C > PARALLEL_ELEMS;
    if (l->channels_last) {
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t k = 0; k < nparts; k++) {
            double *p = part + k * C * 2;
            int64_t end = (k + 1) * CHUNK < rows ? (k + 1) * CHUNK : rows;
            for (int64_t r = k * CHUNK; r < end; r++)
                for (int64_t c = 0; c < C; c++)
                    accumulate(in, r * C + c, in->center[c], &p[2 * c], &p[2 * c + 1]);
        }
    } else {
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t nc = 0; nc < l->N * C; nc++) {
            int64_t c = nc % C;
            double *p = part + nc * 2;
            for (int64_t s = 0; s < l->S; s++)
                accumulate(in, nc * l->S + s, in->center[c], &p[0], &p[1]);
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double a = 0, b = 0;
        for (int64_t k = 0; k < nparts; k++) {
            a += part[(k * C + c) * 2];
            b += part[(k * C + c) * 2 + 1];
        }
        sa[c] = a;
        sb[c] = b;
    }
    free(part);
    return FT_OK;
}

/* out[n, c, s] = act(x * scale[c] + shift[c]) over every element. */
static void normalize(float *out, const float *x, const float *scale, const float *shift, ft_act act,
                      const layout *l) {
    int64_t C = l->C, total = l->N * l->C * l->S;
    if (l->channels_last) {
#pragma omp parallel for schedule(static) if (total > PARALLEL_ELEMS)
        for (int64_t r = 0; r < l->N * l->S; r++)
            for (int64_t c = 0; c < C; c++)
                out[r * C + c] = ft_act_forward(act, x[r * C + c] * scale[c] + shift[c]);
    } else {
#pragma omp parallel for schedule(static) if (total > PARALLEL_ELEMS)
        for (int64_t nc = 0; nc < l->N * C; nc++) {
            float a = scale[nc % C], b = shift[nc % C];
            for (int64_t s = 0; s < l->S; s++)
                out[nc * l->S + s] = ft_act_forward(act, x[nc * l->S + s] * a + b);
        }
    }
}

ft_status ft_batchnorm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                               const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                               const ft_tensor *running_mean, const ft_tensor *running_var,
                               const ft_batchnorm_params *p) {
    layout l;
    FT_TRY(layout_of(&l, inp, "input"));
    FT_TRY(same_layout(&l, out, inp, "out"));
    FT_TRY(ft_tensor_check_writable(out, "batch_norm"));
    int64_t C = l.C, M = l.N * l.S;
    FT_TRY(channel_vector(save_mean, C, "save_mean"));
    FT_TRY(channel_vector(save_invstd, C, "save_invstd"));
    FT_TRY(channel_vector(weight, C, "weight"));
    FT_TRY(channel_vector(bias, C, "bias"));
    FT_TRY(channel_vector(running_mean, C, "running_mean"));
    FT_TRY(channel_vector(running_var, C, "running_var"));
    if (!save_mean || !save_invstd)
        return ft_fail(FT_ERR_VALUE, "batch_norm: save_mean and save_invstd are required");
    if (!(p->eps > 0) || !(p->momentum >= 0 && p->momentum <= 1))
        return ft_fail(FT_ERR_VALUE, "batch_norm: eps must be > 0 and momentum in [0, 1]");
    if (!p->training && (!running_mean || !running_var))
        return ft_fail(FT_ERR_VALUE, "batch_norm: eval mode needs running_mean and running_var");
    if (p->training && M <= 1)
        return ft_fail(FT_ERR_VALUE, "batch_norm: training needs more than 1 value per channel, got %lld",
                       (long long)M);
    float *mean = (float *)ft_tensor_data(save_mean), *invstd = (float *)ft_tensor_data(save_invstd);
    const float *x = (const float *)ft_tensor_data(inp);
    float *scale = malloc((size_t)(2 * C + 1) * sizeof *scale), *shift = scale ? scale + C : NULL;
    double *sums = malloc((size_t)(2 * C + 1) * sizeof *sums);
    ft_status s = scale && sums ? FT_OK : ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
    if (s == FT_OK && p->training) {
        /* Sums of x - x[0, c] keep the variance accurate for large means. */
        for (int64_t c = 0; c < C; c++)
            shift[c] = x[offset(&l, 0, c, 0)];
        sums_in in = {.x = x, .center = shift};
        s = channel_sums(sums, sums + C, &l, &in);
        for (int64_t c = 0; s == FT_OK && c < C; c++) {
            double m = sums[c] / (double)M, var = sums[C + c] / (double)M - m * m;
            if (var < 0)
                var = 0;
            mean[c] = (float)(shift[c] + m);
            invstd[c] = (float)(1.0 / sqrt(var + p->eps));
            if (running_mean) {
                float *rm = (float *)ft_tensor_data(running_mean), *rv = (float *)ft_tensor_data(running_var);
                rm[c] = (float)((1 - p->momentum) * rm[c] + p->momentum * mean[c]);
                rv[c] = (float)((1 - p->momentum) * rv[c] + p->momentum * var * (double)M / (double)(M - 1));
            }
        }
    } else if (s == FT_OK) {
        const float *rm = (const float *)ft_tensor_data(running_mean), *rv = (const float *)ft_tensor_data(running_var);
        for (int64_t c = 0; c < C; c++) {
            mean[c] = rm[c];
            invstd[c] = (float)(1.0 / sqrt((double)rv[c] + p->eps));
        }
    }
    if (s == FT_OK) {
        for (int64_t c = 0; c < C; c++) {
            float w = weight ? ((const float *)ft_tensor_data(weight))[c] : 1.0f;
            float b = bias ? ((const float *)ft_tensor_data(bias))[c] : 0.0f;
            scale[c] = w * invstd[c];
            shift[c] = b - mean[c] * scale[c];
        }
        normalize((float *)ft_tensor_data(out), x, scale, shift, p->act, &l);
    }
    free(scale);
    free(sums);
    return s;
}

ft_status ft_batchnorm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *out,
                                const ft_tensor *weight, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                                const ft_batchnorm_params *p) {
    layout l;
    FT_TRY(layout_of(&l, inp, "input"));
    FT_TRY(same_layout(&l, dout, inp, "grad_output"));
    if (p->act.kind != FT_ACT_NONE) {
        if (!out)
            return ft_fail(FT_ERR_VALUE, "batch_norm: the fused activation's backward needs the forward output");
        if (!ft_act_grad_uses_output(p->act))
            return ft_fail(FT_ERR_VALUE, "batch_norm: only relu, leaky relu, sigmoid and tanh can be fused");
        FT_TRY(same_layout(&l, out, inp, "out"));
    }
    if (dinp) {
        FT_TRY(same_layout(&l, dinp, inp, "grad_input"));
        FT_TRY(ft_tensor_check_writable(dinp, "batch_norm backward"));
    }
    int64_t C = l.C, M = l.N * l.S;
    FT_TRY(channel_vector(weight, C, "weight"));
    FT_TRY(channel_vector(save_mean, C, "save_mean"));
    FT_TRY(channel_vector(save_invstd, C, "save_invstd"));
    FT_TRY(channel_vector(dweight, C, "grad_weight"));
    FT_TRY(channel_vector(dbias, C, "grad_bias"));
    if (!save_mean || !save_invstd)
        return ft_fail(FT_ERR_VALUE, "batch_norm: save_mean and save_invstd are required");
    const float *x = (const float *)ft_tensor_data(inp), *dy = (const float *)ft_tensor_data(dout);
    const float *y = out ? (const float *)ft_tensor_data(out) : NULL;
    const float *mean = (const float *)ft_tensor_data(save_mean), *invstd = (const float *)ft_tensor_data(save_invstd);
    double *sums = malloc((size_t)(2 * C + 1) * sizeof *sums);
    float *k = malloc((size_t)(3 * C + 1) * sizeof *k); /* scale, k1, k2 per channel */
    ft_status s = sums && k ? FT_OK : ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
    sums_in in = {.x = x, .y = y, .dy = dy, .center = mean, .act = p->act};
    if (s == FT_OK)
        s = channel_sums(sums, sums + C, &l, &in); /* sum dz, sum dz * (x - mean) */
    if (s == FT_OK) {
        for (int64_t c = 0; c < C; c++) {
            float w = weight ? ((const float *)ft_tensor_data(weight))[c] : 1.0f;
            if (dweight)
                ((float *)ft_tensor_data(dweight))[c] = (float)(sums[C + c] * invstd[c]);
            if (dbias)
                ((float *)ft_tensor_data(dbias))[c] = (float)sums[c];
            k[c] = w * invstd[c];
            /* In training, the mean and variance depend on x too. */
            k[C + c] = p->training ? (float)(sums[c] / (double)M) : 0.0f;
            k[2 * C + c] = p->training ? (float)(sums[C + c] / (double)M * invstd[c] * invstd[c]) : 0.0f;
        }
    }
    if (s == FT_OK && dinp && M > 0) {
        float *dx = (float *)ft_tensor_data(dinp);
        int64_t total = M * C;
#pragma omp parallel for schedule(static) if (total > PARALLEL_ELEMS)
        for (int64_t i = 0; i < total; i++) {
            int64_t c = l.channels_last ? i % C : (i / l.S) % C;
            float dz = p->act.kind ? dy[i] * ft_act_grad_from_output(p->act, y[i]) : dy[i];
            dx[i] = k[c] * (dz - k[C + c] - (x[i] - mean[c]) * k[2 * C + c]);
        }
    }
    free(sums);
    free(k);
    return s;
}
