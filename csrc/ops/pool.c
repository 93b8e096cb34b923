/* 2-d pooling.
 *
 * Legend: N batch, C channels, H W input size, P Q output size, CB a block
 * of channels (the vector dimension of the channels-last loops).
 * Every pool is described by its windows (kernels/pool.h, shared with the
 * CUDA kernels): for output row i the input rows lo, lo + step, ... < hi
 * (already clipped to the input), and likewise for columns; `padded` is the
 * window's extent counting padding (the count_include_pad divisor). */
#include "ops/pool.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "kernels/convert.h"
#include "kernels/pool.h"
#include "ops/check.h"
#include "ops/chunks.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

#define CB 64
/* Channels-last kernels that walk a window's rows in turn prefetch the
 * memory PREFETCH_PIXELS pixels further on (a row or more ahead): the
 * hardware prefetchers do not keep up with rows read or written in turn,
 * and the accesses waited on memory (bf16 512x32x28x28 max pool: forward
 * 2.5 -> 1.0 ms, backward 2.2 -> 1.1 ms). A prefetch past the end of a
 * tensor is harmless: it never faults, so it takes an address computed as
 * an integer rather than a pointer past the tensor. */
#define PREFETCH_PIXELS 64

static inline void prefetch_at(const void *base, int64_t elem, int64_t itemsize, int rw) {
    uintptr_t at = (uintptr_t)base + (uintptr_t)(elem * itemsize);
    __builtin_prefetch((const void *)at, rw, 3);
}

/* Work (elements touched) below which a pool runs on one thread. */
#define PARALLEL_WORK (1 << 15)

typedef ft_pool_span span;

enum { POOL_MAX, POOL_AVG };

typedef struct {
    int kind;
    int64_t N, C, H, W, P, Q;
    const span *rows, *cols; /* (P), (Q) */
    int64_t divisor_override;
    bool count_include_pad;
    /* the column rule of fixed windows (k, stride, pad, dilation), k = 0 for adaptive ones */
    int64_t ck, cs, cp, cd;
    /* forward: x the input, y the output; backward: x = dout, y = dinp.
     * Channels-last max pools read and write bfloat16 in place (x16, y16
     * instead of x, y); their backward adds into float scratch, (H, W, CB)
     * per thread, and rounds once. */
    const float *x;
    float *y;
    const uint16_t *x16;
    uint16_t *y16;
    float *scratch;
    int64_t xs[4], ys[4];
    void *ind; /* (N, C, P, Q) int64 or int32, or NULL */
    bool ind32;
    int64_t is[4];
    bool accumulate;
    /* backward: the th x tw input tiles a max pool's indices are tried in (th = 0: not tried) */
    int64_t th, tw;
    bool bad;          /* backward: an index outside [-1, H W) was met... */
    int64_t bad_index; /* ...this one (any of them, when threads race) */
} pool_job;

static int64_t out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
    int64_t o = ft_floor_div(in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
    if (ceil_mode && (o - 1) * stride >= in + pad)
        o--; /* the last window must start inside the input or its left padding */
    return o;
}

ft_status ft_pool2d_out_size(int64_t *P, int64_t *Q, int64_t H, int64_t W, const ft_pool2d_params *p,
                             const char *op) {
    for (int i = 0; i < 2; i++) {
        if (p->kernel[i] < 1 || p->stride[i] < 1 || p->dilation[i] < 1)
            return ft_fail(FT_ERR_VALUE, "%s: kernel_size, stride and dilation must be positive, got "
                                         "kernel_size=(%lld, %lld), stride=(%lld, %lld), dilation=(%lld, %lld)",
                           op, (long long)p->kernel[0], (long long)p->kernel[1], (long long)p->stride[0],
                           (long long)p->stride[1], (long long)p->dilation[0], (long long)p->dilation[1]);
        if (p->padding[i] < 0 || p->padding[i] > p->kernel[i] / 2)
            return ft_fail(FT_ERR_VALUE, "%s: pad should be at most half of kernel size, but got pad=(%lld, %lld) "
                                         "and kernel_size=(%lld, %lld)",
                           op, (long long)p->padding[0], (long long)p->padding[1], (long long)p->kernel[0],
                           (long long)p->kernel[1]);
        if (p->kernel[i] > (INT64_C(1) << 31) || p->stride[i] > (INT64_C(1) << 31) ||
            p->dilation[i] > (INT64_C(1) << 31))
            return ft_fail(FT_ERR_VALUE, "%s: kernel_size, stride or dilation is too large", op);
    }
    if (H < 1 || W < 1)
        return ft_fail(FT_ERR_SHAPE, "%s: the input's height and width must be at least 1, got %lld x %lld", op,
                       (long long)H, (long long)W);
    *P = out_size(H, p->kernel[0], p->padding[0], p->stride[0], p->dilation[0], p->ceil_mode);
    *Q = out_size(W, p->kernel[1], p->padding[1], p->stride[1], p->dilation[1], p->ceil_mode);
    if (*P < 1 || *Q < 1)
        return ft_fail(FT_ERR_SHAPE, "%s: given an input of %lld x %lld, the calculated output size %lld x %lld is "
                                     "too small",
                       op, (long long)H, (long long)W, (long long)*P, (long long)*Q);
    return FT_OK;
}

/* ---- windows ---- */

static void fixed_spans(span *s, int64_t n, int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
    for (int64_t o = 0; o < n; o++)
        s[o] = ft_pool_fixed_span(o, in, k, stride, pad, dil);
}

static void adaptive_spans(span *s, int64_t n, int64_t in) {
    for (int64_t o = 0; o < n; o++)
        s[o] = ft_pool_adaptive_span(o, n, in);
}

static int64_t count(const span *s) { return ft_pool_span_count(*s); }

static float divisor(const pool_job *j, const span *r, const span *c) {
    return ft_pool_divisor(*r, *c, j->divisor_override, j->count_include_pad);
}

static inline void store_index(const pool_job *j, int64_t off, int64_t v) {
    if (j->ind32)
        ((int32_t *)j->ind)[off] = (int32_t)v;
    else
        ((int64_t *)j->ind)[off] = v;
}

static inline int64_t load_index(const pool_job *j, int64_t off) {
    return j->ind32 ? ((const int32_t *)j->ind)[off] : ((const int64_t *)j->ind)[off];
}

/* ---- forward ---- */

/* Outputs ow of a row whose windows lie inside the input along W: each
 * window element (h, kw) updates n outputs at once, elements s apart. */
#define OWB 128

/* The window elements of nb whole-column outputs starting at input column
 * w0, for input rows r: acc = max (and its position at) or sum. Compiled for
 * element steps 1 and 2 (stride 1 and 2 over contiguous rows) as constants. */
static inline __attribute__((always_inline)) void interior(const pool_job *j, const float *x, const span *r,
                                                           int64_t w0, int64_t nb, float *acc, int64_t *at,
                                                           int64_t step) {
    int64_t sh = j->xs[2], W = j->W, cs = j->cs;
    for (int64_t h = r->lo; h < r->hi; h += r->step)
        for (int64_t kw = 0; kw < j->ck; kw++) {
            int64_t w = w0 + kw * j->cd, pos0 = h * W + w;
            const float *p = x + h * sh + w * j->xs[3];
            if (j->kind == POOL_MAX) {
                FT_SIMD_FOR(i, nb) {
                    float v = p[i * step];
                    bool take = v > acc[i] || v != v;
                    acc[i] = take ? v : acc[i];
                    at[i] = take ? pos0 + i * cs : at[i];
                }
            } else {
                FT_SIMD_FOR(i, nb) acc[i] += p[i * step];
            }
        }
}

FT_VEC_CLONES
static void interior_run(const pool_job *j, const float *x, const span *r, int64_t w0, int64_t nb, float *acc,
                         int64_t *at) {
    int64_t step = j->cs * j->xs[3];
    if (step == 1)
        interior(j, x, r, w0, nb, acc, at, 1);
    else if (step == 2)
        interior(j, x, r, w0, nb, acc, at, 2);
    else
        interior(j, x, r, w0, nb, acc, at, step);
}

/* One output (oh, ow) of a W-innermost plane. */
static void fwd_one(const pool_job *j, const float *x, float *y, int64_t idx_base, int64_t oh, int64_t ow) {
    const span *r = &j->rows[oh], *q = &j->cols[ow];
    int64_t sh = j->xs[2], sw = j->xs[3];
    float *o = y + oh * j->ys[2] + ow * j->ys[3];
    bool empty = r->lo >= r->hi || q->lo >= q->hi;
    if (j->kind == POOL_MAX) {
        float m = -INFINITY;
        int64_t at = empty ? -1 : r->lo * j->W + q->lo;
        for (int64_t h = r->lo; h < r->hi; h += r->step)
            for (int64_t w = q->lo; w < q->hi; w += q->step) {
                float v = x[h * sh + w * sw];
                if (v > m || v != v)
                    m = v, at = h * j->W + w;
            }
        *o = m;
        if (j->ind)
            store_index(j, idx_base + oh * j->is[2] + ow * j->is[3], at);
    } else {
        float sum = 0.0f;
        for (int64_t h = r->lo; h < r->hi; h++)
            for (int64_t w = q->lo; w < q->hi; w++)
                sum += x[h * sh + w * sw];
        *o = empty ? 0.0f : sum / divisor(j, r, q);
    }
}

/* One (n, c) plane, W-innermost layouts. Outputs are visited window element
 * by window element in the scalar order (rows, then columns), so every path
 * gives the same bits. */
static void fwd_plane(const pool_job *j, int64_t n, int64_t c) {
    const float *x = j->x + n * j->xs[0] + c * j->xs[1];
    float *y = j->y + n * j->ys[0] + c * j->ys[1];
    int64_t idx_base = n * j->is[0] + c * j->is[1];
    /* [q0, q1): outputs whose column window is whole inside the input */
    int64_t q0 = 0, q1 = 0;
    if (j->ck > 0) {
        q0 = (j->cp + j->cs - 1) / j->cs;
        q1 = ft_floor_div(j->W - (j->ck - 1) * j->cd - 1 + j->cp, j->cs) + 1;
        q1 = q1 > j->Q ? j->Q : q1;
        q1 = q1 < q0 ? q0 : q1;
    }
    _Alignas(64) float acc[OWB];
    _Alignas(64) int64_t at[OWB];
    for (int64_t oh = 0; oh < j->P; oh++) {
        const span *r = &j->rows[oh];
        for (int64_t ow = 0; ow < q0 && ow < j->Q; ow++)
            fwd_one(j, x, y, idx_base, oh, ow);
        for (int64_t ow0 = q0; ow0 < q1; ow0 += OWB) {
            int64_t nb = q1 - ow0 < OWB ? q1 - ow0 : OWB, w0 = ow0 * j->cs - j->cp;
            bool max = j->kind == POOL_MAX;
            for (int64_t i = 0; i < nb; i++) {
                acc[i] = max ? -INFINITY : 0.0f;
                at[i] = r->lo < r->hi ? r->lo * j->W + w0 + i * j->cs : -1;
            }
            interior_run(j, x, r, w0, nb, acc, at);
            float *o = y + oh * j->ys[2] + ow0 * j->ys[3];
            if (max) {
                for (int64_t i = 0; i < nb; i++)
                    o[i * j->ys[3]] = acc[i];
                if (j->ind)
                    for (int64_t i = 0; i < nb; i++)
                        store_index(j, idx_base + oh * j->is[2] + (ow0 + i) * j->is[3], at[i]);
            } else {
                for (int64_t i = 0; i < nb; i++)
                    o[i * j->ys[3]] = r->lo < r->hi ? acc[i] / divisor(j, r, &j->cols[ow0 + i]) : 0.0f;
            }
        }
        for (int64_t ow = q1 > q0 ? q1 : q0; ow < j->Q; ow++)
            fwd_one(j, x, y, idx_base, oh, ow);
    }
}

/* The maximum and its position over window rows r by columns q of nc
 * channels at stride sc (inlined, so that a constant sc of 1 specializes it). */
static inline __attribute__((always_inline)) void max_window_cl(const pool_job *j, const span *r, const span *q,
                                                                const float *x, const uint16_t *x16, int64_t sc,
                                                                int64_t nc, float *acc, int64_t *at) {
    for (int64_t h = r->lo; h < r->hi; h += r->step)
        for (int64_t w = q->lo; w < q->hi; w += q->step) {
            int64_t px = h * j->xs[2] + w * j->xs[3];
            int64_t pos = h * j->W + w;
            FT_SIMD_FOR(i, nc) {
                float v = x16 ? ft_bf16_to_f32(x16[px + i * sc]) : x[px + i * sc];
                bool take = v > acc[i] || v != v;
                acc[i] = take ? v : acc[i];
                at[i] = take ? pos : at[i];
            }
        }
}

/* One block of channels [c0, c0 + nc) of output row (n, oh), channels-last layouts. */
FT_VEC_CLONES
static void fwd_row_cl(const pool_job *j, int64_t n, int64_t oh, int64_t c0, int64_t nc) {
    const span *r = &j->rows[oh];
    int64_t xo = n * j->xs[0] + c0 * j->xs[1], yo = n * j->ys[0] + oh * j->ys[2] + c0 * j->ys[1];
    const float *x = j->x ? j->x + xo : NULL;
    const uint16_t *x16 = j->x16 ? j->x16 + xo : NULL;
    int64_t sc = j->xs[1], yc = j->ys[1];
    _Alignas(64) float acc[CB];
    _Alignas(64) int64_t at[CB];
    for (int64_t ow = 0; ow < j->Q; ow++) {
        const span *q = &j->cols[ow];
        bool empty = r->lo >= r->hi || q->lo >= q->hi;
        if (j->kind == POOL_MAX) {
            int64_t first = empty ? -1 : r->lo * j->W + q->lo;
            FT_SIMD_FOR(i, nc) {
                acc[i] = -INFINITY;
                at[i] = first;
            }
            if (sc == 1) /* the usual dense channels: contiguous vector loads */
                max_window_cl(j, r, q, x, x16, 1, nc, acc, at);
            else
                max_window_cl(j, r, q, x, x16, sc, nc, acc, at);
            int64_t o = yo + ow * j->ys[3];
            if (j->y16) /* a maximum is one of the inputs: exact */
                FT_SIMD_FOR(i, nc) j->y16[o + i * yc] = ft_f32_to_bf16(acc[i]);
            else
                FT_SIMD_FOR(i, nc) j->y[o + i * yc] = acc[i];
            if (j->ind) {
                int64_t base = n * j->is[0] + oh * j->is[2] + ow * j->is[3] + c0 * j->is[1], is = j->is[1];
                if (j->ind32) {
                    int32_t *ind = (int32_t *)j->ind + base;
                    FT_SIMD_FOR(i, nc) ind[i * is] = (int32_t)at[i];
                } else {
                    int64_t *ind = (int64_t *)j->ind + base;
                    FT_SIMD_FOR(i, nc) ind[i * is] = at[i];
                }
            }
        } else {
            float *o = j->y + yo + ow * j->ys[3];
            FT_SIMD_FOR(i, nc) acc[i] = 0.0f;
            for (int64_t h = r->lo; h < r->hi; h++)
                for (int64_t w = q->lo; w < q->hi; w++) {
                    const float *px = x + h * j->xs[2] + w * j->xs[3];
                    FT_SIMD_FOR(i, nc) acc[i] += px[i * sc];
                }
            float d = empty ? 1.0f : divisor(j, r, q);
            FT_SIMD_FOR(i, nc) o[i * yc] = empty ? 0.0f : acc[i] / d;
        }
    }
}

/* The global average of 16 planes (n, c0 .. c0 + nc) whose H x W elements
 * are contiguous: the planes side by side in one vector, each summed in
 * (h, w) order like the channels-last loop, so both layouts agree bitwise. */
FT_VEC_CLONES
static void global_avg_planes(const pool_job *j, int64_t n, int64_t c0, int nc) {
    const float *x = j->x + n * j->xs[0] + c0 * j->xs[1];
    int64_t HW = j->H * j->W, sc = j->xs[1];
    float acc[16] = {0};
    for (int64_t i = 0; i < HW; i++)
        FT_SIMD_FOR(k, nc) acc[k] += x[k * sc + i];
    float d = divisor(j, &j->rows[0], &j->cols[0]);
    float *y = j->y + n * j->ys[0] + c0 * j->ys[1];
    for (int k = 0; k < nc; k++)
        y[k * j->ys[1]] = acc[k] / d;
}

static bool global_contiguous(const pool_job *j) {
    return j->kind == POOL_AVG && j->P == 1 && j->Q == 1 && j->rows[0].lo == 0 && j->rows[0].hi == j->H &&
           j->cols[0].lo == 0 && j->cols[0].hi == j->W && (j->W == 1 || j->xs[3] == 1) &&
           (j->H == 1 || j->xs[2] == j->W * j->xs[3]);
}

/* Channels innermost in t (NHWC, channels_last): C > 1 at stride 1. */
static bool channels_last(const ft_tensor *t) { return t->shape[1] > 1 && t->strides[1] == 1; }

static int64_t window_size(const pool_job *j) {
    int64_t h = j->P ? count(&j->rows[0]) : 0, w = j->Q ? count(&j->cols[0]) : 0;
    return (h > 1 ? h : 1) * (w > 1 ? w : 1);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(FT_NO_CLONES)
#include <immintrin.h>
#define HAVE_AVX512 1

/* fwd_row_cl's max pool over channels [c0, c0 + nc), nc a multiple of 16,
 * dense in x, y and the indices: each 16 channels' maximum and position
 * stay in registers across the window (fwd_row_cl keeps them in memory,
 * where each window position's compare and blend waits on the previous
 * one's stores). Positions in int32: the caller checks that H W fits. */
__attribute__((target("avx512f"))) static void fwd_row_max16(const pool_job *j, int64_t n, int64_t oh, int64_t c0,
                                                             int64_t nc) {
    const span *r = &j->rows[oh];
    int64_t xo = n * j->xs[0] + c0, yo = n * j->ys[0] + oh * j->ys[2] + c0;
    for (int64_t ow = 0; ow < j->Q; ow++) {
        const span *q = &j->cols[ow];
        bool empty = r->lo >= r->hi || q->lo >= q->hi;
        int64_t o = yo + ow * j->ys[3];
        for (int64_t b = 0; b < nc; b += 16) {
            __m512 best = _mm512_set1_ps(-INFINITY);
            __m512i at = _mm512_set1_epi32(empty ? -1 : (int32_t)(r->lo * j->W + q->lo));
            for (int64_t h = r->lo; h < r->hi; h += r->step)
                for (int64_t w = q->lo; w < q->hi; w += q->step) {
                    int64_t px = xo + h * j->xs[2] + w * j->xs[3] + b, ahead = px + PREFETCH_PIXELS * j->xs[3];
                    if (j->x16)
                        prefetch_at(j->x16, ahead, 2, 0);
                    else
                        prefetch_at(j->x, ahead, 4, 0);
                    __m512 v = j->x16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(j->x16 + px))), 16))
                                      : _mm512_loadu_ps(j->x + px);
                    __mmask16 take = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                    best = _mm512_mask_mov_ps(best, take, v);
                    at = _mm512_mask_mov_epi32(at, take, _mm512_set1_epi32((int32_t)(h * j->W + w)));
                }
            if (j->y16) { /* ft_f32_to_bf16 of a maximum (one of the inputs): its top half, NaN made quiet */
                __m512i top = _mm512_srli_epi32(_mm512_castps_si512(best), 16);
                top = _mm512_mask_or_epi32(top, _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q), top,
                                           _mm512_set1_epi32(0x40));
                _mm256_storeu_si256((void *)(j->y16 + o + b), _mm512_cvtepi32_epi16(top));
            } else {
                _mm512_storeu_ps(j->y + o + b, best);
            }
            if (j->ind) {
                int64_t base = n * j->is[0] + oh * j->is[2] + ow * j->is[3] + c0 + b;
                if (j->ind32) {
                    _mm512_storeu_si512((int32_t *)j->ind + base, at);
                } else {
                    _mm512_storeu_si512((int64_t *)j->ind + base, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at)));
                    _mm512_storeu_si512((int64_t *)j->ind + base + 8,
                                        _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1)));
                }
            }
        }
    }
}
#endif

static void run_forward(const pool_job *j, bool cl) {
    int64_t work = j->N * j->C * j->P * j->Q * window_size(j);
    if (cl) {
        int64_t nb = (j->C + CB - 1) / CB, items = j->N * j->P * nb;
        bool max16 = false;
#ifdef HAVE_AVX512
        max16 = j->kind == POOL_MAX && j->xs[1] == 1 && j->ys[1] == 1 && (!j->ind || j->is[1] == 1) &&
                j->H * j->W <= INT32_MAX && __builtin_cpu_supports("avx512f");
#endif
#pragma omp parallel for schedule(static) if (work > PARALLEL_WORK)
        for (int64_t it = 0; it < items; it++) {
            int64_t b = it % nb, row = it / nb;
            int64_t c0 = b * CB, nc = j->C - c0 < CB ? j->C - c0 : CB, vec = max16 ? nc / 16 * 16 : 0;
#ifdef HAVE_AVX512
            if (vec)
                fwd_row_max16(j, row / j->P, row % j->P, c0, vec);
#endif
            if (vec < nc)
                fwd_row_cl(j, row / j->P, row % j->P, c0 + vec, nc - vec);
        }
    } else if (global_contiguous(j)) {
        int64_t nb = (j->C + 15) / 16, items = j->N * nb;
#pragma omp parallel for schedule(static) if (work > PARALLEL_WORK)
        for (int64_t it = 0; it < items; it++) {
            int64_t c0 = it % nb * 16;
            global_avg_planes(j, it / nb, c0, (int)(j->C - c0 < 16 ? j->C - c0 : 16));
        }
    } else {
        int64_t planes = j->N * j->C;
#pragma omp parallel for schedule(static) if (work > PARALLEL_WORK)
        for (int64_t pl = 0; pl < planes; pl++)
            fwd_plane(j, pl / j->C, pl % j->C);
    }
}

/* ---- backward (scatter into dinp: x = dout, y = dinp) ---- */

/* The offset of plane position at = h W + w in a plane of row stride sh and
 * column stride sw: a product where rows are dense (no division per element). */
static inline int64_t position(const pool_job *j, int64_t at, int64_t sh, int64_t sw) {
    return sh == j->W * sw ? at * sw : at / j->W * sh + at % j->W * sw;
}

static void note_bad(pool_job *j, int64_t v) {
    __atomic_store_n(&j->bad_index, v, __ATOMIC_RELAXED);
    __atomic_store_n(&j->bad, true, __ATOMIC_RELAXED);
}

static void bwd_plane(pool_job *j, int64_t n, int64_t c) {
    const float *g = j->x + n * j->xs[0] + c * j->xs[1];
    float *d = j->y + n * j->ys[0] + c * j->ys[1];
    int64_t sh = j->ys[2], sw = j->ys[3], HW = j->H * j->W;
    if (!j->accumulate)
        for (int64_t h = 0; h < j->H; h++)
            for (int64_t w = 0; w < j->W; w++)
                d[h * sh + w * sw] = 0.0f;
    for (int64_t oh = 0; oh < j->P; oh++) {
        const span *r = &j->rows[oh];
        for (int64_t ow = 0; ow < j->Q; ow++) {
            float v = g[oh * j->xs[2] + ow * j->xs[3]];
            if (j->kind == POOL_MAX) {
                int64_t at = load_index(j, n * j->is[0] + c * j->is[1] + oh * j->is[2] + ow * j->is[3]);
                if (at < 0 || at >= HW) {
                    if (at != -1)
                        note_bad(j, at);
                    continue;
                }
                d[position(j, at, sh, sw)] += v;
            } else {
                const span *q = &j->cols[ow];
                if (r->lo >= r->hi || q->lo >= q->hi)
                    continue;
                float share = v / divisor(j, r, q);
                for (int64_t h = r->lo; h < r->hi; h++)
                    for (int64_t w = q->lo; w < q->hi; w++)
                        d[h * sh + w * sw] += share;
            }
        }
    }
}

/* d[the position of each channel's index] += its dout (g float32, or g16
 * bfloat16 with bf16: inlined into one loop per dtype). */
static inline __attribute__((always_inline)) void scatter_max(pool_job *j, int64_t base, float *d, int64_t dh,
                                                              int64_t dw, int64_t dc, const float *g,
                                                              const uint16_t *g16, bool bf16, int64_t gc, int64_t nc) {
    for (int64_t i = 0; i < nc; i++) {
        int64_t at = load_index(j, base + i * j->is[1]);
        if (at < 0 || at >= j->H * j->W) {
            if (at != -1)
                note_bad(j, at);
            continue;
        }
        d[position(j, at, dh, dw) + i * dc] += bf16 ? ft_bf16_to_f32(g16[i * gc]) : g[i * gc];
    }
}

/* Whether every index of block (n, c0 .. c0 + nc) is -1 or lies in its
 * output's tile: th x tw input positions from (oh th, ow tw). Counts each
 * index's matches over its tile, so that the test vectorizes (no division). */
static inline __attribute__((always_inline)) bool in_tiles(const pool_job *j, int64_t n, int64_t c0, int64_t nc,
                                                           bool ind32) {
    const int64_t th = j->th, tw = j->tw, W = j->W;
    int bad = 0;
    for (int64_t oh = 0; oh < j->P; oh++)
        for (int64_t ow = 0; ow < j->Q; ow++) {
            int64_t base = n * j->is[0] + oh * j->is[2] + ow * j->is[3] + c0;
            const int32_t *i32 = ind32 ? (const int32_t *)j->ind + base : NULL;
            const int64_t *i64 = ind32 ? NULL : (const int64_t *)j->ind + base;
            _Alignas(64) int64_t at[CB];
            _Alignas(64) int32_t matches[CB];
            FT_SIMD_FOR(i, nc) {
                at[i] = ind32 ? i32[i] : i64[i];
                matches[i] = at[i] == -1;
            }
            for (int64_t h = oh * th; h < (oh + 1) * th; h++)
                for (int64_t w = ow * tw; w < (ow + 1) * tw; w++) {
                    int64_t pos = h * W + w;
                    FT_SIMD_FOR(i, nc) matches[i] += at[i] == pos;
                }
            FT_SIMD_FOR(i, nc) bad |= matches[i] != 1;
        }
    return !bad;
}

/* dinp of block (n, c0 .. c0 + nc) from the tiles' outputs: each input
 * position takes its tile's dout where the index names it, as the scatter
 * would add it (the same sums, signed zeros included). Returns in_tiles. */
static inline __attribute__((always_inline)) bool gather_tiles(pool_job *j, int64_t n, int64_t c0, int64_t nc,
                                                               bool ind32, bool bf16, bool accumulate) {
    const int64_t th = j->th, tw = j->tw, W = j->W, P = j->P, Q = j->Q;
    const int64_t *xs = j->xs, *ys = j->ys, *is = j->is;
    int bad = 0;
    for (int64_t oh = 0; oh < P; oh++)
        for (int64_t ow = 0; ow < Q; ow++) {
            int64_t base = n * is[0] + oh * is[2] + ow * is[3] + c0;
            int64_t pg = n * xs[0] + oh * xs[2] + ow * xs[3] + c0;
            /* the indices in their own width (int32 compares fill a vector
             * twice as full); g is what a hit adds: without accumulate
             * 0 + dout (a -0 gradient lands as +0, as the scatter adds it),
             * converted once rather than at every position, with it dout
             * itself (x + -0 is x) */
            _Alignas(64) int32_t at32[CB], matches[CB];
            _Alignas(64) int64_t at64[CB];
            _Alignas(64) float g[CB];
            _Alignas(64) uint16_t g16[CB];
            FT_SIMD_FOR(i, nc) {
                if (ind32)
                    at32[i] = ((const int32_t *)j->ind)[base + i];
                else
                    at64[i] = ((const int64_t *)j->ind)[base + i];
                g[i] = (bf16 ? ft_bf16_to_f32(j->x16[pg + i]) : j->x[pg + i]) + (accumulate ? -0.0f : 0.0f);
                if (bf16 && !accumulate)
                    g16[i] = ft_f32_to_bf16(g[i]);
                matches[i] = (ind32 ? at32[i] : at64[i]) == -1;
            }
            for (int64_t h = oh * th; h < (oh + 1) * th; h++)
                for (int64_t w = ow * tw; w < (ow + 1) * tw; w++) {
                    int64_t pos = h * W + w, at_d = n * ys[0] + h * ys[2] + w * ys[3] + c0;
                    float *restrict d = bf16 ? NULL : j->y + at_d;
                    uint16_t *restrict d16 = bf16 ? j->y16 + at_d : NULL;
                    if (bf16)
                        prefetch_at(j->y16, at_d + PREFETCH_PIXELS * ys[3], 2, 1);
                    else
                        prefetch_at(j->y, at_d + PREFETCH_PIXELS * ys[3], 4, 1);
                    FT_SIMD_FOR(i, nc) {
                        bool hit = ind32 ? at32[i] == (int32_t)pos : at64[i] == pos;
                        matches[i] += hit;
                        if (!accumulate && bf16)
                            d16[i] = hit ? g16[i] : 0;
                        else if (!accumulate)
                            d[i] = hit ? g[i] : 0.0f;
                        else {
                            float old = bf16 ? ft_bf16_to_f32(d16[i]) : d[i];
                            if (bf16)
                                d16[i] = ft_f32_to_bf16(hit ? old + g[i] : old);
                            else
                                d[i] = hit ? old + g[i] : old;
                        }
                    }
                }
            FT_SIMD_FOR(i, nc) bad |= matches[i] != 1;
        }
    if (!accumulate) /* the rows and columns past the last tiles */
        for (int64_t h = 0; h < j->H; h++)
            for (int64_t w = h < P * th ? Q * tw : 0; w < W; w++) {
                int64_t at_d = n * ys[0] + h * ys[2] + w * ys[3] + c0;
                if (bf16)
                    FT_SIMD_FOR(i, nc) j->y16[at_d + i] = 0;
                else
                    FT_SIMD_FOR(i, nc) j->y[at_d + i] = 0.0f;
            }
    return !bad;
}

/* gather_tiles with the job's index and gradient dtypes as constants (each
 * combination its own specialized loop). */
static inline __attribute__((always_inline)) bool gather_as(pool_job *j, int64_t n, int64_t c0, int64_t nc,
                                                            bool accumulate) {
    if (j->y16)
        return j->ind32 ? gather_tiles(j, n, c0, nc, true, true, accumulate)
                        : gather_tiles(j, n, c0, nc, false, true, accumulate);
    return j->ind32 ? gather_tiles(j, n, c0, nc, true, false, accumulate)
                    : gather_tiles(j, n, c0, nc, false, false, accumulate);
}

/* The max pool's backward of one block by tiles; false where an index lies
 * outside its tile (then the block is done by the scatter: written over
 * without accumulate, checked before anything is written with it). */
static inline __attribute__((always_inline)) bool bwd_block_tiles(pool_job *j, int64_t n, int64_t c0, int64_t nc) {
    if (!j->accumulate)
        return gather_as(j, n, c0, nc, false);
    if (j->ind32 ? !in_tiles(j, n, c0, nc, true) : !in_tiles(j, n, c0, nc, false))
        return false;
    return gather_as(j, n, c0, nc, true);
}

FT_VEC_CLONES
static void bwd_block_cl(pool_job *j, int64_t n, int64_t c0, int64_t nc) {
    if (j->th && bwd_block_tiles(j, n, c0, nc))
        return;
    int64_t go = n * j->xs[0] + c0 * j->xs[1], gc = j->xs[1], HW = j->H * j->W;
    int64_t dout = n * j->ys[0] + c0 * j->ys[1]; /* dinp's block */
    /* where the block's sums go: dinp, or for bfloat16 this thread's scratch, (H, W, nc) */
    float *d = j->y16 ? j->scratch + (int64_t)omp_get_thread_num() * HW * CB : j->y + dout;
    int64_t dh = j->y16 ? j->W * nc : j->ys[2], dw = j->y16 ? nc : j->ys[3], dc = j->y16 ? 1 : j->ys[1];
    if (j->y16 && j->accumulate)
        for (int64_t h = 0; h < j->H; h++)
            for (int64_t w = 0; w < j->W; w++) {
                const uint16_t *pi = j->y16 + dout + h * j->ys[2] + w * j->ys[3];
                float *pd = d + h * dh + w * dw;
                FT_SIMD_FOR(i, nc) pd[i] = ft_bf16_to_f32(pi[i * j->ys[1]]);
            }
    else if (!j->accumulate)
        for (int64_t h = 0; h < j->H; h++)
            for (int64_t w = 0; w < j->W; w++) {
                float *pd = d + h * dh + w * dw;
                FT_SIMD_FOR(i, nc) pd[i * dc] = 0.0f;
            }
    _Alignas(64) float share[CB];
    for (int64_t oh = 0; oh < j->P; oh++) {
        const span *r = &j->rows[oh];
        for (int64_t ow = 0; ow < j->Q; ow++) {
            int64_t pg = go + oh * j->xs[2] + ow * j->xs[3];
            if (j->kind == POOL_MAX) {
                int64_t base = n * j->is[0] + oh * j->is[2] + ow * j->is[3] + c0 * j->is[1];
                if (j->x16)
                    scatter_max(j, base, d, dh, dw, dc, NULL, j->x16 + pg, true, gc, nc);
                else
                    scatter_max(j, base, d, dh, dw, dc, j->x + pg, NULL, false, gc, nc);
            } else {
                const span *q = &j->cols[ow];
                if (r->lo >= r->hi || q->lo >= q->hi)
                    continue;
                float div = divisor(j, r, q);
                FT_SIMD_FOR(i, nc) share[i] = j->x[pg + i * gc] / div;
                for (int64_t h = r->lo; h < r->hi; h++)
                    for (int64_t w = q->lo; w < q->hi; w++) {
                        float *pd = d + h * dh + w * dw;
                        FT_SIMD_FOR(i, nc) pd[i * dc] += share[i];
                    }
            }
        }
    }
    if (j->y16) /* rounded once, as the float32 pool's result */
        for (int64_t h = 0; h < j->H; h++)
            for (int64_t w = 0; w < j->W; w++) {
                const float *pd = d + h * dh + w * dw;
                uint16_t *po = j->y16 + dout + h * j->ys[2] + w * j->ys[3];
                FT_SIMD_FOR(i, nc) po[i * j->ys[1]] = ft_f32_to_bf16(pd[i]);
            }
}

static void run_backward(pool_job *j, bool cl) {
    int64_t work = j->N * j->C * (j->P * j->Q * window_size(j) + j->H * j->W);
    if (cl) {
        /* A max pool's windows are mostly disjoint tiles (kernel = stride): then each input position takes
         * at most one gradient, gathered in one streaming pass instead of scattered. */
        bool tiles = j->kind == POOL_MAX && j->xs[1] == 1 && j->ys[1] == 1 && j->is[1] == 1 && j->P > 0 &&
                     j->Q > 0 && j->P <= j->H && j->Q <= j->W;
        j->th = tiles ? j->H / j->P : 0, j->tw = tiles ? j->W / j->Q : 0;
        int64_t nb = (j->C + CB - 1) / CB, items = j->N * nb;
#pragma omp parallel for schedule(static) if (work > PARALLEL_WORK)
        for (int64_t it = 0; it < items; it++) {
            int64_t c0 = it % nb * CB;
            bwd_block_cl(j, it / nb, c0, j->C - c0 < CB ? j->C - c0 : CB);
        }
    } else {
        int64_t planes = j->N * j->C;
#pragma omp parallel for schedule(static) if (work > PARALLEL_WORK)
        for (int64_t pl = 0; pl < planes; pl++)
            bwd_plane(j, pl / j->C, pl % j->C);
    }
}

/* ---- entry points ---- */

static void set_strides(int64_t *dst, const ft_tensor *t) {
    for (int i = 0; i < 4; i++)
        dst[i] = t->strides[i];
}

/* Every tensor of a call is on dev, the device of its first input `ref`
 * (inp forward, dout backward). */
static ft_status check_4d(const char *op, const char *arg, const ft_tensor *t, ft_device dev, const char *ref) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, ref, true));
    return ft_check_ndim(op, arg, t, 4, "(N, C, H, W)");
}

static ft_status check_indices(const char *op, const ft_tensor *ind, const int64_t *shape, int64_t HW, ft_device dev,
                               const char *ref) {
    FT_TRY(ft_check_on(op, "indices", ind, dev, ref));
    if (ind->dtype != FT_INT64 && ind->dtype != FT_INT32)
        return ft_fail(FT_ERR_DTYPE, "%s: indices must be int64 or int32, got %s", op,
                       ft_dtype_get(ind->dtype)->name);
    if (ind->dtype == FT_INT32 && HW > INT32_MAX)
        return ft_fail(FT_ERR_VALUE, "%s: int32 indices cannot address a plane of %lld elements; use int64", op,
                       (long long)HW);
    return ft_check_shape(op, "indices", ind, 4, shape);
}

static ft_status alloc_spans(span **rows, span **cols, int64_t P, int64_t Q) {
    *rows = malloc((size_t)(P + Q + 1) * sizeof(span));
    if (!*rows)
        return ft_fail(FT_ERR_NOMEM, "pooling: out of memory for %lld window descriptors", (long long)(P + Q));
    *cols = *rows + P;
    return FT_OK;
}

typedef enum { FIXED, ADAPTIVE } window_rule;

typedef struct {
    const char *op;
    int kind;
    window_rule rule;
    const ft_pool2d_params *p;
    bool accumulate;
} pool_call;

static ft_status pool_forward(const char *op, int kind, window_rule rule, const ft_tensor *out,
                              const ft_tensor *ind, const ft_tensor *inp, const ft_pool2d_params *p);

static ft_status pool_backward(const char *op, int kind, window_rule rule, const ft_tensor *dinp,
                               const ft_tensor *dout, const ft_tensor *ind, const ft_pool2d_params *p,
                               bool accumulate);

/* Floats of the bfloat16 max pool's backward scratch (all threads) past
 * which it goes through float32 chunks instead. */
#define MAX_SCRATCH ((int64_t)1 << 22)

/* Whether a pool from a to b (input to output, or dout to dinp, `backward`)
 * runs on their 16-bit floats in place: on CUDA every pool (cuda/pool.cu);
 * on the CPU a max pool of bfloat16 a and b, a channels-last (the backward
 * also wants dinp channels-last). */
static bool native_bf16(int kind, const ft_tensor *a, const ft_tensor *b, bool backward) {
    if (ft_op_device(a).type == FT_DEV_CUDA)
        return true;
    return kind == POOL_MAX && a->dtype == FT_BFLOAT16 && b->dtype == FT_BFLOAT16 && channels_last(a) &&
           (!backward || channels_last(b));
}

static ft_status float_forward(const ft_tensor *const *ts, int64_t first, const void *ctx) {
    const pool_call *c = ctx;
    return pool_forward(c->op, c->kind, c->rule, ts[0], ts[2], ts[1], c->p);
}

static ft_status float_backward(const ft_tensor *const *ts, int64_t first, const void *ctx) {
    const pool_call *c = ctx;
    return pool_backward(c->op, c->kind, c->rule, ts[0], ts[1], ts[2], c->p, c->accumulate);
}

/* The shared forward of the four pools. */
static ft_status pool_forward(const char *op, int kind, window_rule rule, const ft_tensor *out,
                              const ft_tensor *ind, const ft_tensor *inp, const ft_pool2d_params *p) {
    ft_device dev = ft_op_device(inp);
    FT_TRY(check_4d(op, "inp", inp, dev, "inp"));
    FT_TRY(check_4d(op, "out", out, dev, "inp"));
    int64_t N = inp->shape[0], C = inp->shape[1], H = inp->shape[2], W = inp->shape[3], P, Q;
    if (rule == FIXED) {
        if (kind == POOL_AVG && (p->dilation[0] != 1 || p->dilation[1] != 1))
            return ft_fail(FT_ERR_VALUE, "%s: dilation must be 1", op);
        FT_TRY(ft_pool2d_out_size(&P, &Q, H, W, p, op));
    } else {
        P = out->shape[2], Q = out->shape[3];
        if (H < 1 || W < 1)
            return ft_fail(FT_ERR_SHAPE, "%s: the input's height and width must be at least 1, got %lld x %lld", op,
                           (long long)H, (long long)W);
    }
    int64_t oshape[4] = {N, C, P, Q};
    FT_TRY(ft_check_shape(op, "out", out, 4, oshape));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "inp", inp));
    if (ind) {
        FT_TRY(check_indices(op, ind, oshape, H * W, dev, "inp"));
        FT_TRY(ft_check_output(op, "indices", ind));
        FT_TRY(ft_check_alias(op, "indices", ind, "inp", inp));
        FT_TRY(ft_check_alias(op, "indices", ind, "out", out));
    }
    if (N * C * P * Q == 0)
        return FT_OK;
    ft_chunk_arg args[3] = {{out, true, false}, {inp, false, false}, {ind, true, false}};
    bool native16 = native_bf16(kind, inp, out, false);
    if (!native16 && ft_chunks_needed(args, 3))
        return ft_by_float_chunks(args, 3, float_forward, &(pool_call){op, kind, rule, p, false});
    if (dev.type == FT_DEV_CUDA) {
        if (kind == POOL_MAX && rule == FIXED)
            FT_CUDA_DISPATCH(op, max_pool2d_forward, out, ind, inp, p);
        if (kind == POOL_MAX)
            FT_CUDA_DISPATCH(op, adaptive_max_pool2d_forward, out, ind, inp);
        if (rule == FIXED)
            FT_CUDA_DISPATCH(op, avg_pool2d_forward, out, inp, p);
        FT_CUDA_DISPATCH(op, adaptive_avg_pool2d_forward, out, inp);
    }
    pool_job j = {.kind = kind, .N = N, .C = C, .H = H, .W = W, .P = P, .Q = Q,
                  .ind = ind ? ft_tensor_data(ind) : NULL, .ind32 = ind && ind->dtype == FT_INT32};
    if (native16)
        j.x16 = (const uint16_t *)ft_tensor_data(inp), j.y16 = (uint16_t *)ft_tensor_data(out);
    else
        j.x = (const float *)ft_tensor_data(inp), j.y = (float *)ft_tensor_data(out);
    span *rows = NULL, *cols = NULL;
    FT_TRY(alloc_spans(&rows, &cols, P, Q));
    if (rule == FIXED) {
        fixed_spans(rows, P, H, p->kernel[0], p->stride[0], p->padding[0], p->dilation[0]);
        fixed_spans(cols, Q, W, p->kernel[1], p->stride[1], p->padding[1], p->dilation[1]);
        j.ck = p->kernel[1], j.cs = p->stride[1], j.cp = p->padding[1], j.cd = p->dilation[1];
        j.divisor_override = p->divisor_override;
        j.count_include_pad = p->count_include_pad;
    } else {
        adaptive_spans(rows, P, H);
        adaptive_spans(cols, Q, W);
    }
    j.rows = rows, j.cols = cols;
    set_strides(j.xs, inp);
    set_strides(j.ys, out);
    if (ind)
        set_strides(j.is, ind);
    run_forward(&j, channels_last(inp));
    free(rows);
    return FT_OK;
}

/* The shared backward: max pools from indices (p unused), avg pools from p. */
static ft_status pool_backward(const char *op, int kind, window_rule rule, const ft_tensor *dinp,
                               const ft_tensor *dout, const ft_tensor *ind, const ft_pool2d_params *p,
                               bool accumulate) {
    ft_device dev = ft_op_device(dout);
    FT_TRY(check_4d(op, "dout", dout, dev, "dout"));
    FT_TRY(check_4d(op, "dinp", dinp, dev, "dout"));
    int64_t N = dinp->shape[0], C = dinp->shape[1], H = dinp->shape[2], W = dinp->shape[3];
    int64_t P = dout->shape[2], Q = dout->shape[3];
    if (rule == FIXED && kind == POOL_AVG) {
        if (p->dilation[0] != 1 || p->dilation[1] != 1)
            return ft_fail(FT_ERR_VALUE, "%s: dilation must be 1", op);
        FT_TRY(ft_pool2d_out_size(&P, &Q, H, W, p, op));
    } else if (H < 1 || W < 1) {
        return ft_fail(FT_ERR_SHAPE, "%s: the input's height and width must be at least 1, got %lld x %lld", op,
                       (long long)H, (long long)W);
    }
    int64_t oshape[4] = {N, C, P, Q};
    FT_TRY(ft_check_shape(op, "dout", dout, 4, oshape));
    FT_TRY(ft_check_output(op, "dinp", dinp));
    FT_TRY(ft_check_alias(op, "dinp", dinp, "dout", dout));
    if (kind == POOL_MAX) {
        if (!ind)
            return ft_fail(FT_ERR_VALUE, "%s: needs the indices of the forward", op);
        FT_TRY(check_indices(op, ind, oshape, H * W, dev, "dout"));
        FT_TRY(ft_check_alias(op, "dinp", dinp, "indices", ind));
    }
    if (N * C * H * W == 0)
        return FT_OK;
    ft_chunk_arg args[3] = {{dinp, true, accumulate}, {dout, false, false}, {ind, false, false}};
    /* the scratch of the bfloat16 scatter: (H, W, CB) floats per thread */
    int64_t scratch = H * W * CB * (int64_t)omp_get_max_threads();
    bool native16 = native_bf16(kind, dout, dinp, true) && (dev.type == FT_DEV_CUDA || scratch <= MAX_SCRATCH);
    if (!native16 && ft_chunks_needed(args, 3))
        return ft_by_float_chunks(args, 3, float_backward, &(pool_call){op, kind, rule, p, accumulate});
    if (dev.type == FT_DEV_CUDA) {
        if (kind == POOL_MAX && rule == FIXED)
            FT_CUDA_DISPATCH(op, max_pool2d_backward, dinp, dout, ind, accumulate);
        if (kind == POOL_MAX)
            FT_CUDA_DISPATCH(op, adaptive_max_pool2d_backward, dinp, dout, ind, accumulate);
        if (rule == FIXED)
            FT_CUDA_DISPATCH(op, avg_pool2d_backward, dinp, dout, p, accumulate);
        FT_CUDA_DISPATCH(op, adaptive_avg_pool2d_backward, dinp, dout, accumulate);
    }
    pool_job j = {.kind = kind, .N = N, .C = C, .H = H, .W = W, .P = P, .Q = Q,
                  .ind = ind ? ft_tensor_data(ind) : NULL, .ind32 = ind && ind->dtype == FT_INT32,
                  .accumulate = accumulate};
    if (native16)
        j.x16 = (const uint16_t *)ft_tensor_data(dout), j.y16 = (uint16_t *)ft_tensor_data(dinp);
    else
        j.x = (const float *)ft_tensor_data(dout), j.y = (float *)ft_tensor_data(dinp);
    span *rows = NULL, *cols = NULL;
    FT_TRY(alloc_spans(&rows, &cols, P, Q));
    if (rule == FIXED && kind == POOL_AVG) {
        fixed_spans(rows, P, H, p->kernel[0], p->stride[0], p->padding[0], 1);
        fixed_spans(cols, Q, W, p->kernel[1], p->stride[1], p->padding[1], 1);
        j.divisor_override = p->divisor_override;
        j.count_include_pad = p->count_include_pad;
    } else {
        adaptive_spans(rows, P, H);
        adaptive_spans(cols, Q, W);
    }
    j.rows = rows, j.cols = cols;
    set_strides(j.xs, dout);
    set_strides(j.ys, dinp);
    if (ind)
        set_strides(j.is, ind);
    /* from the caching allocator: a step's pools take the same block each time, without page faults */
    const ft_mem_pool host = {FT_MEM_HOST, 0};
    size_t granted = 0;
    if (native16 && ft_alloc((void **)&j.scratch, &granted, (size_t)scratch * sizeof *j.scratch, host) != FT_OK) {
        free(rows);
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory for the scratch of %lld floats", op, (long long)scratch);
    }
    run_backward(&j, channels_last(dinp));
    if (native16)
        ft_free(j.scratch, granted, host);
    free(rows);
    if (j.bad)
        return ft_fail(FT_ERR_INDEX, "%s: indices holds %lld, outside [0, %lld) for a %lld x %lld input", op,
                       (long long)j.bad_index, (long long)(H * W), (long long)H, (long long)W);
    return FT_OK;
}

ft_status ft_max_pool2d_forward(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp,
                                const ft_pool2d_params *p) {
    return pool_forward("max_pool2d", POOL_MAX, FIXED, out, indices, inp, p);
}

ft_status ft_max_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                 bool accumulate) {
    return pool_backward("max_pool2d_backward", POOL_MAX, FIXED, dinp, dout, indices, NULL, accumulate);
}

ft_status ft_avg_pool2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_pool2d_params *p) {
    return pool_forward("avg_pool2d", POOL_AVG, FIXED, out, NULL, inp, p);
}

ft_status ft_avg_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_pool2d_params *p,
                                 bool accumulate) {
    return pool_backward("avg_pool2d_backward", POOL_AVG, FIXED, dinp, dout, NULL, p, accumulate);
}

ft_status ft_adaptive_avg_pool2d_forward(const ft_tensor *out, const ft_tensor *inp) {
    return pool_forward("adaptive_avg_pool2d", POOL_AVG, ADAPTIVE, out, NULL, inp, NULL);
}

ft_status ft_adaptive_avg_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, bool accumulate) {
    return pool_backward("adaptive_avg_pool2d_backward", POOL_AVG, ADAPTIVE, dinp, dout, NULL, NULL, accumulate);
}

ft_status ft_adaptive_max_pool2d_forward(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp) {
    return pool_forward("adaptive_max_pool2d", POOL_MAX, ADAPTIVE, out, indices, inp, NULL);
}

ft_status ft_adaptive_max_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                          bool accumulate) {
    return pool_backward("adaptive_max_pool2d_backward", POOL_MAX, ADAPTIVE, dinp, dout, indices, NULL,
                         accumulate);
}
