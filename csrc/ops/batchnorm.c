#include "ops/batchnorm.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/dist.h"
#include "kernels/convert.h"
#include "kernels/norm.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/gradient.h"
#include "ops/pointwise.h"

/* Rows per partial sum in channels-last layout (fixes the reduction order). */
#define CHUNK 256
/* Elements a kernel converts from (or to) bfloat16 at a time: its float
 * buffers stay in L1. */
#define SLICE 512
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

/* Every tensor of a call is on dev, the input's device. */
static ft_status layout_of(layout *l, const ft_tensor *t, const char *arg, ft_device dev) {
    if (t->ndim != 2 && t->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must be (N, C) or (N, C, H, W), got %d dimensions", arg,
                       t->ndim);
    FT_TRY(ft_check_float_on("batch_norm", arg, t, dev, "input", true));
    l->N = t->shape[0];
    l->C = t->shape[1];
    l->S = t->ndim == 4 ? t->shape[2] * t->shape[3] : 1;
    l->channels_last = t->ndim == 2 || (is_channels_last(t) && !(ft_tensor_is_contiguous(t) && l->S > 1));
    if (!l->channels_last && !ft_tensor_is_contiguous(t))
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must be contiguous in NCHW or channels-last memory", arg);
    return FT_OK;
}

static ft_status same_layout(const layout *want, const ft_tensor *t, const ft_tensor *ref, const char *arg,
                             ft_device dev) {
    layout l;
    FT_TRY(layout_of(&l, t, arg, dev));
    if (t->ndim != ref->ndim || memcmp(t->shape, ref->shape, (size_t)t->ndim * sizeof *t->shape) != 0)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must have the input's shape", arg);
    if (l.channels_last != want->channels_last && ft_tensor_numel(t) > 0) /* an empty tensor has every layout */
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must use the input's memory layout (%s)", arg,
                       want->channels_last ? "channels-last" : "NCHW");
    return FT_OK;
}

static ft_status channel_vector(const ft_tensor *t, int64_t C, const char *arg, ft_device dev) {
    if (!t)
        return FT_OK;
    FT_TRY(ft_check_on("batch_norm", arg, t, dev, "input"));
    if (t->ndim != 1 || t->shape[0] != C || t->dtype != FT_FLOAT32 || t->strides[0] != 1)
        return ft_fail(FT_ERR_SHAPE, "batch_norm: %s must be a contiguous float32 %s tensor of shape (%lld,)", arg,
                       dev.type == FT_DEV_CUDA ? "CUDA" : "CPU", (long long)C);
    return FT_OK;
}

static inline int64_t offset(const layout *l, int64_t n, int64_t c, int64_t s) {
    return l->channels_last ? (n * l->S + s) * l->C + c : (n * l->C + c) * l->S + s;
}

/* The two per-channel sums the forward (of x - center and its square) and
 * the backward (of dz and dz * (x - center)) need, from fixed partials: one
 * per (n, c) plane in NCHW, one per CHUNK rows in channels-last. The inner
 * loops run over contiguous memory and vectorise. x, y and dy are float32
 * or bfloat16 (each read a run at a time into float). */
typedef struct {
    const void *x, *y, *dy; /* y, dy: NULL in the forward */
    bool x16, y16, dy16;    /* bfloat16 */
    const float *center;    /* (C) */
    ft_act act;
    /* InPlace-ABN's backward: x - center taken from y instead of read, as
     * (act^-1(y) - bias[c]) / k[c] with from_y = (1 / k, bias), k the
     * forward's scale; the center is then 0. NULL: x is read. */
    const float *from_y;
    /* A fused relu's backward: its mask recomputed from x with the
     * forward's own arithmetic, x * scale[c] + shift[c] > above (above:
     * 2^-134 for a bfloat16 output, which rounds smaller values to 0), so
     * that y is not read. NULL: the mask comes from y. */
    const float *scale, *shift;
    float above;
    /* with from_y or scale: each element's channel */
    int64_t C, S;
    bool cl;
} sums_in;

/* dz for `n` elements: dy through the fused activation's derivative, taken
 * from the output y, written into dz (dy itself when there is none). */
static inline const float *grad_through_act(float *restrict dz, const float *restrict dy, const float *restrict y,
                                            int64_t n, ft_act act) {
    if (act.kind == FT_ACT_NONE)
        return dy; /* nothing to apply: no copy */
    if (act.kind == FT_ACT_RELU) /* a multiply by the mask, not a branch: signs are random */
        for (int64_t i = 0; i < n; i++)
            dz[i] = dy[i] * (float)(y[i] > 0.0f);
    else
        for (int64_t i = 0; i < n; i++)
            dz[i] = dy[i] * ft_act_grad_from_output(act, y[i]);
    return dz;
}

/* 1 where the forward's relu passed x (its output is positive), else 0. */
static inline float relu_passes(float x, float scale, float shift, float above) {
    return (float)(ft_norm_apply(x, scale, shift) > above);
}

/* dz for the n elements from i0 through a fused relu whose mask comes from x. */
static inline const float *grad_through_relu(float *restrict dz, const float *restrict dy, const float *restrict x,
                                             const sums_in *in, int64_t i0, int64_t n) {
    if (in->cl) /* a run of whole rows: the vectors are repeated over it */
        for (int64_t j = 0; j < n; j++)
            dz[j] = dy[j] * relu_passes(x[j], in->scale[j], in->shift[j], in->above);
    else {
        int64_t c = i0 / in->S % in->C;
        for (int64_t j = 0; j < n; j++)
            dz[j] = dy[j] * relu_passes(x[j], in->scale[c], in->shift[c], in->above);
    }
    return dz;
}

/* x from y for n elements from i0 (InPlace-ABN), into x. */
static inline const float *x_from_output(const sums_in *in, const float *restrict y, int64_t i0, int64_t n,
                                         float *restrict x) {
    const float *inv_k = in->from_y, *bias = in->from_y + in->C;
    float slope = in->act.kind == FT_ACT_LEAKY_RELU ? in->act.alpha : 1.0f;
    int64_t c = in->cl ? i0 % in->C : i0 / in->S % in->C;
    for (int64_t j = 0; j < n; j++) {
        float z = y[j] < 0.0f ? y[j] / slope : y[j];
        x[j] = (z - bias[c]) * inv_k[c];
        if (in->cl && ++c == in->C)
            c = 0;
    }
    return x;
}

/* The length of a slice: whole channels-last rows of C channels, or (C 0)
 * part of a plane. A thread's buffer holds BUFS of them. */
static int64_t slice_of(int64_t C) { return C == 0 ? SLICE : C < SLICE ? SLICE / C * C : C; }
enum { BUFS = 5 };

/* The length of a per-channel vector (scale, shift, center, ...): in
 * channels-last a slice's, the C values repeated (v[j] = v[j % C]), so that
 * a kernel runs over a slice of whole rows in one flat loop rather than a
 * short loop per row; in NCHW C (one channel per plane). */
static int64_t reach_of(const layout *l) { return l->channels_last ? slice_of(l->C) : l->C; }

/* v's first C values repeated up to its reach R. */
static void repeat_channels(float *v, int64_t C, int64_t R) {
    for (int64_t j = C; j < R; j++)
        v[j] = v[j - C];
}

/* The run [i0, i0 + n) of x as floats, and (backward) its dz: buf holds 4n floats. */
static inline const float *run_of(const sums_in *in, int64_t i0, int64_t n, float *buf, const float **dz) {
    const float *y = in->y ? ft_floats_in(in->y, in->y16, i0, n, buf + 2 * n) : NULL;
    const float *x = in->from_y ? x_from_output(in, y, i0, n, buf) : ft_floats_in(in->x, in->x16, i0, n, buf);
    if (in->dy) {
        const float *dy = ft_floats_in(in->dy, in->dy16, i0, n, buf + n);
        *dz = in->scale ? grad_through_relu(buf + 3 * n, dy, x, in, i0, n)
                        : grad_through_act(buf + 3 * n, dy, y, n, in->act);
    }
    return x;
}

/* a[j] += (x - center), b[j] += (x - center)^2 (forward, dz NULL) or
 * a[j] += dz, b[j] += dz * (x - center) (backward) over a slice of n values
 * of whole rows (center repeated over the slice). */
static inline void sum_run(float *a, float *b, const float *x, const float *dz, const float *center, int64_t n) {
    if (!dz) {
        for (int64_t j = 0; j < n; j++) {
            float v = x[j] - center[j];
            a[j] += v;
            b[j] = fmaf(v, v, b[j]);
        }
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        a[j] += dz[j];
        b[j] = fmaf(dz[j], x[j] - center[j], b[j]);
    }
}

enum { LANES = 16 };

/* The sums of channels-last rows [r0, r1) of a C that is a multiple of
 * LANES, a block of LANES channels at a time over the rows, in registers:
 * no conversion buffer and no partial sums in memory. x and dy are both
 * bfloat16 (b16) or both float32; in the backward (dy set) dz is dy, or dy
 * through a relu whose mask comes from x. Always inlined into block_sums
 * with constant flags, so that each case is its own loop. */
static inline __attribute__((always_inline)) void block_sums_as(double *pa, double *pb, const sums_in *in, int64_t r0,
                                                                int64_t r1, int64_t C, bool b16, bool relu) {
    for (int64_t c0 = 0; c0 < C; c0 += LANES) {
        float la[LANES] = {0}, lb[LANES] = {0};
        const float *center = in->center + c0, *scale = in->scale ? in->scale + c0 : NULL;
        const float *shift = in->shift ? in->shift + c0 : NULL;
        for (int64_t i = r0 * C + c0; i < r1 * C; i += C)
            for (int l = 0; l < LANES; l++) {
                float x = ft_float_at(in->x, b16, i + l), v = x - center[l];
                float dz = !in->dy ? v : ft_float_at(in->dy, b16, i + l);
                if (relu)
                    dz *= relu_passes(x, scale[l], shift[l], in->above);
                la[l] += dz;
                lb[l] = fmaf(dz, v, lb[l]);
            }
        for (int l = 0; l < LANES; l++)
            pa[c0 + l] = la[l], pb[c0 + l] = lb[l];
    }
}

FT_VEC_CLONES static void block_sums(double *pa, double *pb, const sums_in *in, int64_t r0, int64_t r1, int64_t C) {
    bool relu = in->scale != NULL;
    if (in->x16)
        relu ? block_sums_as(pa, pb, in, r0, r1, C, true, true) : block_sums_as(pa, pb, in, r0, r1, C, true, false);
    else
        relu ? block_sums_as(pa, pb, in, r0, r1, C, false, true) : block_sums_as(pa, pb, in, r0, r1, C, false, false);
}

/* Whether block_sums serves these sums: channels-last blocks of LANES
 * channels, x and dy of one dtype, and dz needing nothing but x. */
static bool by_blocks(const layout *l, const sums_in *in) {
    return l->channels_last && l->C % LANES == 0 && !in->from_y && !in->y && (!in->dy || in->dy16 == in->x16);
}

/* The partial sums of CHUNK channels-last rows [r0, r1) into pa and pb (C
 * each), and of one NCHW plane of channel c into *a and *b: separate
 * functions so that each is compiled for AVX-512, AVX2 and plain x86-64 and
 * picked at run time. Within a chunk each position of a slice (at most
 * CHUNK values) or a slice of a plane (SLICE / LANES values per lane) sums
 * in float, at the full vector width; from there on in double. */
FT_VEC_CLONES static void rows_sums(double *pa, double *pb, const sums_in *in, int64_t r0, int64_t r1, int64_t C,
                                    float *buf, float *fa) {
    int64_t step = slice_of(C);
    float *fb = fa + step;
    memset(fa, 0, 2 * (size_t)step * sizeof *fa);
    for (int64_t at = r0 * C; at < r1 * C; at += step) {
        int64_t n = r1 * C - at < step ? r1 * C - at : step;
        const float *dz = NULL, *x = run_of(in, at, n, buf, &dz);
        sum_run(fa, fb, x, dz, in->center, n);
    }
    /* the slice's rows onto its first, a vector of channels at a time */
    for (int64_t j = C; j < step; j += C)
        for (int64_t k = 0; k < C; k++)
            fa[k] += fa[j + k], fb[k] += fb[j + k];
    for (int64_t k = 0; k < C; k++)
        pa[k] = fa[k], pb[k] = fb[k];
}

FT_VEC_CLONES static void plane_sums(double *a, double *b, const sums_in *in, int64_t i0, int64_t S, int64_t c,
                                     float *buf) {
    float center = in->center[c];
    /* in registers: added to through the pointers, each slice's sixteen
     * additions would wait on each other's stores (small planes: most of
     * the time) */
    double sa = *a, sb = *b;
    for (int64_t at = 0; at < S; at += SLICE) {
        int64_t n = S - at < SLICE ? S - at : SLICE, full = n / LANES * LANES;
        const float *dz = NULL, *x = run_of(in, i0 + at, n, buf, &dz);
        float la[LANES] = {0}, lb[LANES] = {0};
        for (int64_t j = 0; j < full; j += LANES)
            for (int l = 0; l < LANES; l++) {
                float v = x[j + l] - center;
                la[l] += dz ? dz[j + l] : v;
                lb[l] = fmaf(dz ? dz[j + l] : v, v, lb[l]);
            }
        for (int l = 0; l < n - full; l++) {
            float v = x[full + l] - center;
            la[l] += dz ? dz[full + l] : v;
            lb[l] = fmaf(dz ? dz[full + l] : v, v, lb[l]);
        }
        /* the lanes halved in float, in vectors: sixteen additions in a
         * row in double would take longer than a small plane's own sums */
        for (int w = LANES / 2; w >= 1; w /= 2)
            for (int l = 0; l < w; l++)
                la[l] += la[l + w], lb[l] += lb[l + w];
        sa += la[0], sb += lb[0];
    }
    *a = sa, *b = sb;
}

static ft_status channel_sums(double *sa, double *sb, const layout *l, const sums_in *in) {
    int64_t C = l->C, rows = l->N * l->S;
    int64_t nparts = l->channels_last ? (rows + CHUNK - 1) / CHUNK : l->N * C;
    bool parallel = rows * C > PARALLEL_ELEMS, blocks = by_blocks(l, in);
    /* per thread: the slices, then (channels-last) the float sums of a chunk's slice positions; the
     * block sums keep theirs in registers */
    int64_t run = blocks ? 0 : BUFS * slice_of(l->channels_last ? C : 0) + (l->channels_last ? 2 * slice_of(C) : 0);
    double *part = calloc((size_t)(nparts ? nparts : 1) * (l->channels_last ? (size_t)C : 1) * 2, sizeof *part);
    float *bufs = run ? malloc((size_t)omp_get_max_threads() * (size_t)run * sizeof *bufs) : NULL;
    if (!part || (run && !bufs)) {
        free(part), free(bufs);
        return ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory for partial sums");
    }
    if (l->channels_last) { /* part: (chunks, 2, C) */
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t k = 0; k < nparts; k++) {
            double *pa = part + k * 2 * C, *pb = pa + C;
            int64_t end = (k + 1) * CHUNK < rows ? (k + 1) * CHUNK : rows;
            if (blocks) {
                block_sums(pa, pb, in, k * CHUNK, end, C);
            } else { /* the whole chunk's dz at once: rows of few channels are short */
                float *buf = bufs + omp_get_thread_num() * run;
                rows_sums(pa, pb, in, k * CHUNK, end, C, buf, buf + run - 2 * slice_of(C));
            }
        }
    } else { /* part: (N * C, 2), one run per plane */
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t nc = 0; nc < nparts; nc++) {
            double a = 0, b = 0;
            plane_sums(&a, &b, in, nc * l->S, l->S, nc % C, bufs + omp_get_thread_num() * run);
            part[2 * nc] = a, part[2 * nc + 1] = b;
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double a = 0, b = 0;
        if (l->channels_last)
            for (int64_t k = 0; k < nparts; k++)
                a += part[k * 2 * C + c], b += part[k * 2 * C + C + c];
        else
            for (int64_t nn = 0; nn < l->N; nn++)
                a += part[2 * (nn * C + c)], b += part[2 * (nn * C + c) + 1];
        sa[c] = a;
        sb[c] = b;
    }
    free(part);
    free(bufs);
    return FT_OK;
}

/* out = act(x * scale[c] + shift[c]) over a run of n values, value k's
 * channel c being k * cstride (1: consecutive channels; 0: one channel). */
static inline void normalize_run(float *out, const float *x, const float *scale, const float *shift, int64_t n,
                                 int cstride, ft_act act) {
    for (int64_t k = 0; k < n; k++)
        out[k] = ft_norm_apply(x[k], scale[k * cstride], shift[k * cstride]);
    if (act.kind == FT_ACT_RELU) /* NaN passes through, as in ft_relu */
        for (int64_t k = 0; k < n; k++)
            out[k] = out[k] < 0.0f ? 0.0f : out[k];
    else if (act.kind != FT_ACT_NONE)
        for (int64_t k = 0; k < n; k++)
            out[k] = ft_act_forward(act, out[k]);
}

/* The tensors of a normalization, float32 or bfloat16 each. */
typedef struct {
    void *out;
    const void *x;
    bool out16, x16;
} norm_io;

/* One run: CHUNK channels-last rows [i0, i0 + len) of C channels (scale and
 * shift repeated over a slice), or (C 0) one NCHW plane of channel c, a
 * slice at a time. */
FT_VEC_CLONES static void normalize_rows(const norm_io *io, int64_t i0, int64_t len, int64_t C, int64_t c,
                                         const float *scale, const float *shift, ft_act act, float *buf) {
    int64_t step = slice_of(C);
    bool relu = act.kind == FT_ACT_RELU;
    for (int64_t at = i0; at < i0 + len; at += step) {
        int64_t n = i0 + len - at < step ? i0 + len - at : step;
        if (C && io->x16 && io->out16 && (relu || act.kind == FT_ACT_NONE)) { /* converted in the loop */
            const uint16_t *x = (const uint16_t *)io->x + at;
            uint16_t *out = (uint16_t *)io->out + at;
            for (int64_t j = 0; j < n; j++) {
                float v = ft_norm_apply(ft_bf16_to_f32(x[j]), scale[j], shift[j]);
                out[j] = ft_f32_to_bf16(relu && v < 0.0f ? 0.0f : v);
            }
            continue;
        }
        const float *x = ft_floats_in(io->x, io->x16, at, n, buf);
        float *out = ft_floats_at(io->out, io->out16, at, buf ? buf + step : NULL);
        if (C)
            normalize_run(out, x, scale, shift, n, 1, act);
        else
            normalize_run(out, x, scale + c, shift + c, n, 0, act);
        ft_floats_out(io->out, io->out16, at, n, out);
    }
}

static ft_status normalize(const norm_io *io, const float *scale, const float *shift, ft_act act, const layout *l) {
    int64_t C = l->C, total = l->N * l->C * l->S, rows = l->N * l->S;
    int64_t run = l->channels_last ? CHUNK * C : l->S, nruns = l->channels_last ? (rows + CHUNK - 1) / CHUNK : l->N * C;
    /* float32 runs are read and written in place: buffers for bfloat16 only */
    int64_t per = io->x16 || io->out16 ? BUFS * slice_of(l->channels_last ? C : 0) : 0;
    float *bufs = per ? malloc((size_t)omp_get_max_threads() * (size_t)per * sizeof *bufs) : NULL;
    if (per && !bufs)
        return ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
#pragma omp parallel for schedule(static) if (total > PARALLEL_ELEMS)
    for (int64_t r = 0; r < nruns; r++) {
        int64_t i0 = r * run, n = i0 + run < total ? run : total - i0;
        normalize_rows(io, i0, n, l->channels_last ? C : 0, r % C, scale, shift, act,
                       bufs ? bufs + omp_get_thread_num() * per : NULL);
    }
    free(bufs);
    return FT_OK;
}

/* The affine scale of channel c: the weight (1 without one), or for
 * InPlace-ABN |weight| + eps, which keeps it away from 0 so that the
 * backward can divide by it. */
static float weight_of(const ft_tensor *weight, int64_t c, const ft_batchnorm_params *p) {
    if (!weight)
        return 1.0f;
    float w = ((const float *)ft_tensor_data(weight))[c];
    return p->inplace_abn ? fabsf(w) + (float)p->eps : w;
}

/* The forward's y = x * scale[c] + shift[c] (before the activation), the
 * vectors of reach R. */
static void affine_of(float *scale, float *shift, const float *mean, const float *invstd, const ft_tensor *weight,
                      const ft_tensor *bias, const ft_batchnorm_params *p, int64_t C, int64_t R) {
    for (int64_t c = 0; c < C; c++) {
        scale[c] = ft_norm_scale(invstd[c], weight_of(weight, c, p));
        shift[c] = ft_norm_shift(mean[c], scale[c], bias ? ((const float *)ft_tensor_data(bias))[c] : 0.0f);
    }
    repeat_channels(scale, C, R);
    repeat_channels(shift, C, R);
}

static ft_status check_abn(const ft_batchnorm_params *p, ft_device dev) {
    if (!p->inplace_abn)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        return ft_fail(FT_ERR_DEVICE, "batch_norm: InPlace-ABN runs on the CPU only");
    if (!(p->act.kind == FT_ACT_NONE || (p->act.kind == FT_ACT_LEAKY_RELU && p->act.alpha > 0.0f)))
        return ft_fail(FT_ERR_VALUE, "batch_norm: InPlace-ABN inverts its activation: identity, or a leaky relu of "
                                     "positive slope (for relu, recompute instead)");
    return FT_OK;
}

ft_status ft_batchnorm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                               const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                               const ft_tensor *running_mean, const ft_tensor *running_var,
                               const ft_batchnorm_params *p) {
    ft_device dev = ft_op_device(inp);
    layout l;
    FT_TRY(layout_of(&l, inp, "input", dev));
    FT_TRY(same_layout(&l, out, inp, "out", dev));
    FT_TRY(ft_tensor_check_writable(out, "batch_norm"));
    int64_t C = l.C, M = l.N * l.S;
    FT_TRY(channel_vector(save_mean, C, "save_mean", dev));
    FT_TRY(channel_vector(save_invstd, C, "save_invstd", dev));
    FT_TRY(channel_vector(weight, C, "weight", dev));
    FT_TRY(channel_vector(bias, C, "bias", dev));
    FT_TRY(channel_vector(running_mean, C, "running_mean", dev));
    FT_TRY(channel_vector(running_var, C, "running_var", dev));
    if (!save_mean || !save_invstd)
        return ft_fail(FT_ERR_VALUE, "batch_norm: save_mean and save_invstd are required");
    if (!(p->eps > 0) || !(p->momentum >= 0 && p->momentum <= 1))
        return ft_fail(FT_ERR_VALUE, "batch_norm: eps must be > 0 and momentum in [0, 1]");
    if (!p->training && (!running_mean || !running_var))
        return ft_fail(FT_ERR_VALUE, "batch_norm: eval mode needs running_mean and running_var");
    if (!running_mean != !running_var)
        return ft_fail(FT_ERR_VALUE, "batch_norm: running_mean and running_var go together");
    if (p->training && M <= 1)
        return ft_fail(FT_ERR_VALUE, "batch_norm: training needs more than 1 value per channel, got %lld",
                       (long long)M);
    if (dev.type == FT_DEV_CUDA && p->sync)
        return ft_fail(FT_ERR_DEVICE, "batch_norm: synchronized statistics need the CPU (there is no NCCL path)");
    FT_TRY(check_abn(p, dev));
    if (C == 0) /* nothing to normalize (and no channel to index) */
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH("batch_norm", batchnorm_forward, out, save_mean, save_invstd, inp, weight, bias,
                         running_mean, running_var, p);
    float *mean = (float *)ft_tensor_data(save_mean), *invstd = (float *)ft_tensor_data(save_invstd);
    const void *x = ft_tensor_data(inp);
    bool x16 = inp->dtype == FT_BFLOAT16;
    int64_t R = reach_of(&l);
    float *scale = malloc((size_t)(2 * R + 1) * sizeof *scale), *shift = scale ? scale + R : NULL;
    double *sums = malloc((size_t)(2 * C + 1) * sizeof *sums);
    ft_status s = scale && sums ? FT_OK : ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
    bool sync = p->sync && ft_dist_ready();
    if (s == FT_OK && p->training) {
        /* Sums of x - x[0, c] keep the variance accurate for large means
         * (rank 0's x[0, c] on every rank when the statistics are synchronized). */
        for (int64_t c = 0; c < C; c++)
            shift[c] = *ft_floats_in(x, x16, offset(&l, 0, c, 0), 1, &scale[c]);
        if (sync)
            s = ft_dist_bcast(shift, (int64_t)C * (int64_t)sizeof *shift, 0);
        repeat_channels(shift, C, R);
        sums_in in = {.x = x, .x16 = x16, .center = shift};
        if (s == FT_OK)
            s = channel_sums(sums, sums + C, &l, &in);
        double count = (double)M;
        if (s == FT_OK && sync) {
            sums[2 * C] = count;
            s = ft_dist_allreduce_sum_f64(sums, 2 * C + 1);
            count = sums[2 * C];
        }
        for (int64_t c = 0; s == FT_OK && c < C; c++) {
            double var = ft_norm_stats(sums[c], sums[C + c], count, shift[c], p->eps, &mean[c], &invstd[c]);
            if (running_mean)
                ft_bn_running((float *)ft_tensor_data(running_mean) + c, (float *)ft_tensor_data(running_var) + c,
                              mean[c], var, (int64_t)count, p->momentum);
        }
    } else if (s == FT_OK) {
        const float *rm = (const float *)ft_tensor_data(running_mean), *rv = (const float *)ft_tensor_data(running_var);
        for (int64_t c = 0; c < C; c++) {
            mean[c] = rm[c];
            invstd[c] = ft_norm_rstd(rv[c], p->eps);
        }
    }
    if (s == FT_OK) {
        affine_of(scale, shift, mean, invstd, weight, bias, p, C, R);
        norm_io io = {ft_tensor_data(out), x, out->dtype == FT_BFLOAT16, x16};
        s = normalize(&io, scale, shift, p->act, &l);
    }
    free(scale);
    free(sums);
    return s;
}

/* dx of one run [i0, i0 + len): CHUNK channels-last rows or one NCHW plane
 * of channel c, a slice at a time. mean and the three vectors k, k + R,
 * k + 2R have the reach R (repeated over a channels-last slice). */
FT_VEC_CLONES static void dx_run(void *dxp, bool dx16, const sums_in *in, int64_t i0, int64_t len, const float *mean,
                                 const float *k, int64_t R, bool cl, int64_t c, bool acc, float *buf) {
    int64_t step = cl ? R : slice_of(0);
    /* bfloat16 in and out, dz from dy and x alone: converted in the loop */
    bool direct = cl && dx16 && !acc && in->x16 && in->dy16 && !in->y && !in->from_y;
    for (int64_t at = i0; at < i0 + len; at += step) {
        int64_t n = i0 + len - at < step ? i0 + len - at : step;
        if (direct) {
            const uint16_t *restrict x = (const uint16_t *)in->x + at, *restrict dy = (const uint16_t *)in->dy + at;
            uint16_t *restrict dx = (uint16_t *)dxp + at;
            const float *scale = in->scale, *shift = in->shift;
            float above = in->above;
            if (scale)
                for (int64_t j = 0; j < n; j++) {
                    float xv = ft_bf16_to_f32(x[j]);
                    float dz = ft_bf16_to_f32(dy[j]) * relu_passes(xv, scale[j], shift[j], above);
                    dx[j] = ft_f32_to_bf16(ft_bn_dx(dz, xv, mean[j], k[j], k[R + j], k[2 * R + j]));
                }
            else
                for (int64_t j = 0; j < n; j++) {
                    float xv = ft_bf16_to_f32(x[j]);
                    dx[j] = ft_f32_to_bf16(ft_bn_dx(ft_bf16_to_f32(dy[j]), xv, mean[j], k[j], k[R + j], k[2 * R + j]));
                }
            continue;
        }
        const float *dz = NULL, *x = run_of(in, at, n, buf, &dz);
        float *to = buf + 4 * step;
        float *dx = acc ? (float *)ft_floats_in(dxp, dx16, at, n, to) : ft_floats_at(dxp, dx16, at, to);
        if (cl) {
            for (int64_t j = 0; j < n; j++) {
                float v = ft_bn_dx(dz[j], x[j], mean[j], k[j], k[R + j], k[2 * R + j]);
                dx[j] = acc ? dx[j] + v : v;
            }
        } else {
            for (int64_t j = 0; j < n; j++) {
                float v = ft_bn_dx(dz[j], x[j], mean[c], k[c], k[R + c], k[2 * R + c]);
                dx[j] = acc ? dx[j] + v : v;
            }
        }
        ft_floats_out(dxp, dx16, at, n, dx);
    }
}

ft_status ft_batchnorm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *out,
                                const ft_tensor *weight, const ft_tensor *bias, const ft_tensor *save_mean,
                                const ft_tensor *save_invstd, const ft_batchnorm_params *p, ft_grad_acc acc) {
    const ft_tensor *x = p->inplace_abn ? out : inp; /* what gives the layout, and x */
    if (!x)
        return ft_fail(FT_ERR_VALUE, "batch_norm: the backward needs the %s",
                       p->inplace_abn ? "forward output (InPlace-ABN)" : "input");
    ft_device dev = ft_op_device(x);
    layout l;
    FT_TRY(layout_of(&l, x, p->inplace_abn ? "out" : "input", dev));
    FT_TRY(same_layout(&l, dout, x, "grad_output", dev));
    FT_TRY(check_abn(p, dev));
    if (p->act.kind != FT_ACT_NONE) {
        if (!out)
            return ft_fail(FT_ERR_VALUE, "batch_norm: the fused activation's backward needs the forward output");
        if (!ft_act_grad_uses_output(p->act))
            return ft_fail(FT_ERR_VALUE, "batch_norm: only relu, leaky relu, sigmoid and tanh can be fused");
        FT_TRY(same_layout(&l, out, x, "out", dev));
    }
    if (dinp) {
        FT_TRY(same_layout(&l, dinp, x, "grad_input", dev));
        FT_TRY(ft_tensor_check_writable(dinp, "batch_norm backward"));
        if (acc.inp && dinp->storage == dout->storage && dinp->offset == dout->offset)
            return ft_fail(FT_ERR_VALUE, "batch_norm: grad_input cannot accumulate into grad_output itself");
    }
    int64_t C = l.C, M = l.N * l.S;
    FT_TRY(channel_vector(weight, C, "weight", dev));
    FT_TRY(channel_vector(bias, C, "bias", dev));
    FT_TRY(channel_vector(save_mean, C, "save_mean", dev));
    FT_TRY(channel_vector(save_invstd, C, "save_invstd", dev));
    FT_TRY(channel_vector(dweight, C, "grad_weight", dev));
    FT_TRY(channel_vector(dbias, C, "grad_bias", dev));
    if (!save_mean || !save_invstd)
        return ft_fail(FT_ERR_VALUE, "batch_norm: save_mean and save_invstd are required");
    if (dev.type == FT_DEV_CUDA && p->sync)
        return ft_fail(FT_ERR_DEVICE, "batch_norm: synchronized statistics need the CPU (there is no NCCL path)");
    if (C == 0) /* no channel: no gradient */
        return FT_OK;
    if (dev.type == FT_DEV_CUDA) { /* the backend writes: accumulation is staged */
        ft_grad_out gx = {0}, gw = {0}, gb = {0}; /* each ended, begun or not */
        const ft_tensor *dx_to, *dw_to, *db_to;
        FT_TRY(ft_grad_out_begin_float(&gx, dinp, acc.inp, &dx_to));
        ft_status s = ft_grad_out_begin(&gw, dweight, acc.weight, &dw_to);
        if (s == FT_OK)
            s = ft_grad_out_begin(&gb, dbias, acc.bias, &db_to);
        if (s == FT_OK)
            s = FT_CUDA_CALL("batch_norm", batchnorm_backward, dx_to, dw_to, db_to, dout, inp, out, weight, save_mean,
                             save_invstd, p);
        return ft_grad_out_end(&gb, ft_grad_out_end(&gw, ft_grad_out_end(&gx, s)));
    }
    const float *mean = (const float *)ft_tensor_data(save_mean), *invstd = (const float *)ft_tensor_data(save_invstd);
    double *sums = malloc((size_t)(2 * C + 1) * sizeof *sums);
    /* k0, k1, k2, the center (the mean, 0 for InPlace-ABN) and a relu's
     * scale and shift, each of reach R; then InPlace-ABN's 1 / its scale
     * and bias per channel */
    int64_t R = reach_of(&l);
    float *k = calloc((size_t)(6 * R + 2 * C + 1), sizeof *k), *center = k ? k + 3 * R : NULL;
    ft_status s = sums && k ? FT_OK : ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
    sums_in in = {.dy = ft_tensor_data(dout), .dy16 = dout->dtype == FT_BFLOAT16, .center = center, .act = p->act,
                  .C = C, .S = l.S, .cl = l.channels_last};
    bool relu = p->act.kind == FT_ACT_RELU && !p->inplace_abn;
    if ((p->act.kind != FT_ACT_NONE && !relu) || p->inplace_abn) { /* dz, or x, needs the output */
        in.y = ft_tensor_data(out);
        in.y16 = out->dtype == FT_BFLOAT16;
    }
    if (s == FT_OK && relu) {
        float *scale = k + 4 * R, *shift = k + 5 * R;
        affine_of(scale, shift, mean, invstd, weight, bias, p, C, R);
        in.scale = scale, in.shift = shift, in.above = out->dtype == FT_BFLOAT16 ? 0x1p-134f : 0.0f;
    }
    if (s == FT_OK && p->inplace_abn) {
        float *from_y = k + 6 * R;
        for (int64_t c = 0; c < C; c++) {
            from_y[c] = 1.0f / (weight_of(weight, c, p) * invstd[c]);
            from_y[C + c] = bias ? ((const float *)ft_tensor_data(bias))[c] : 0.0f;
        }
        in.from_y = from_y;
    } else if (s == FT_OK) {
        in.x = ft_tensor_data(inp), in.x16 = inp->dtype == FT_BFLOAT16;
        memcpy(center, mean, (size_t)C * sizeof *center);
        repeat_channels(center, C, R);
    }
    if (s == FT_OK)
        s = channel_sums(sums, sums + C, &l, &in); /* sum dz, sum dz * (x - mean) */
    /* Synchronized statistics: the weight's and bias's gradients are this
     * rank's share (the program averages them over the ranks as any other),
     * the input's sees the sums over every rank, as the statistics did. */
    double *global = NULL;
    int64_t count = M;
    if (s == FT_OK && p->sync && p->training && ft_dist_ready()) {
        global = malloc((size_t)(2 * C + 1) * sizeof *global);
        s = global ? FT_OK : ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
        if (s == FT_OK) {
            memcpy(global, sums, (size_t)(2 * C) * sizeof *global);
            global[2 * C] = (double)M;
            s = ft_dist_allreduce_sum_f64(global, 2 * C + 1);
            count = (int64_t)global[2 * C];
        }
    }
    if (s == FT_OK) {
        for (int64_t c = 0; c < C; c++) {
            float w = weight_of(weight, c, p);
            ft_bn_grad g = ft_bn_grads(sums[c], sums[C + c], w, invstd[c], M, p->training);
            if (p->inplace_abn && weight) { /* d|w| / dw: its sign (0 at 0, as PyTorch's abs) */
                float wc = ((const float *)ft_tensor_data(weight))[c];
                g.dweight *= (float)((wc > 0.0f) - (wc < 0.0f));
            }
            if (global) {
                ft_bn_grad gx = ft_bn_grads(global[c], global[C + c], w, invstd[c], count, p->training);
                g.k0 = gx.k0, g.k1 = gx.k1, g.k2 = gx.k2;
            }
            if (dweight) {
                float *o = (float *)ft_tensor_data(dweight) + c * dweight->strides[0];
                *o = acc.weight ? *o + g.dweight : g.dweight;
            }
            if (dbias) {
                float *o = (float *)ft_tensor_data(dbias) + c * dbias->strides[0];
                *o = acc.bias ? *o + g.dbias : g.dbias;
            }
            k[c] = g.k0, k[R + c] = g.k1, k[2 * R + c] = g.k2;
        }
        for (int i = 0; i < 3; i++)
            repeat_channels(k + i * R, C, R);
    }
    if (s == FT_OK && dinp && M > 0) {
        bool cl = l.channels_last;
        /* runs: CHUNK rows of all channels (channels-last) or one channel's plane */
        int64_t total = M * C, run = cl ? CHUNK * C : l.S, nruns = cl ? (M + CHUNK - 1) / CHUNK : l.N * C;
        int64_t per = BUFS * slice_of(cl ? C : 0);
        float *bufs = malloc((size_t)omp_get_max_threads() * (size_t)per * sizeof *bufs);
        if (!bufs)
            s = ft_fail(FT_ERR_NOMEM, "batch_norm: out of memory");
#pragma omp parallel for schedule(static) if (s == FT_OK && total > PARALLEL_ELEMS)
        for (int64_t r = 0; r < (s == FT_OK ? nruns : 0); r++) {
            int64_t i0 = r * run, len = i0 + run < total ? run : total - i0;
            dx_run(ft_tensor_data(dinp), dinp->dtype == FT_BFLOAT16, &in, i0, len, center, k, R, cl, cl ? 0 : r % C,
                   acc.inp, bufs + omp_get_thread_num() * per);
        }
        free(bufs);
    }
    free(global);
    free(sums);
    free(k);
    return s;
}
