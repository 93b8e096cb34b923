/* softmax / log_softmax.
 *
 * Legend: D the row length (the size along dim), n elements of a contiguous
 * float row, L the running lanes of a row reduction. Rows whose elements are
 * not contiguous float32 are gathered into per-thread buffers of D floats. */
#include "ops/softmax.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/convert.h"
#include "kernels/softmax.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

#define L FT_ROW_LANES
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* A loop over the L lanes, vectorised as one (AVX-512) or two (AVX2) registers. */
#define LANES(l) _Pragma("omp simd") for (int l = 0; l < L; l++)
/* Elements below which an op runs on one thread. */
#define PARALLEL_WORK (1 << 15)

/* ---- row loops ---- */

FT_VEC_CLONES
float ft_row_max(const float *x, int64_t n) {
    float acc[L];
    for (int l = 0; l < L; l++)
        acc[l] = -INFINITY;
    int64_t i = 0;
    for (; i + L <= n; i += L)
        LANES(l)
            acc[l] = ft_max_step(acc[l], x[i + l]);
    for (int l = 0; i + l < n; l++)
        acc[l] = ft_max_step(acc[l], x[i + l]);
    return ft_lanes_max(acc);
}

FT_VEC_CLONES
float ft_row_exp_sum(float *e, const float *x, float shift, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    if (e) {
        for (; i + L <= n; i += L)
            LANES(l) {
                float v = ft_softmax_exp(x[i + l], shift);
                e[i + l] = v;
                acc[l] += v;
            }
        for (int l = 0; i + l < n; l++) {
            float v = ft_softmax_exp(x[i + l], shift);
            e[i + l] = v;
            acc[l] += v;
        }
    } else {
        for (; i + L <= n; i += L)
            LANES(l)
                acc[l] += ft_softmax_exp(x[i + l], shift);
        for (int l = 0; i + l < n; l++)
            acc[l] += ft_softmax_exp(x[i + l], shift);
    }
    return ft_lanes_sum(acc);
}

FT_VEC_CLONES
float ft_row_sum(const float *x, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= n; i += L)
        LANES(l)
            acc[l] += x[i + l];
    for (int l = 0; i + l < n; l++)
        acc[l] += x[i + l];
    return ft_lanes_sum(acc);
}

FT_VEC_CLONES
float ft_row_dot(const float *x, const float *y, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= n; i += L)
        LANES(l)
            acc[l] += x[i + l] * y[i + l];
    for (int l = 0; i + l < n; l++)
        acc[l] += x[i + l] * y[i + l];
    return ft_lanes_sum(acc);
}

FT_VEC_CLONES
static void scale_loop(float *y, float inv, int64_t n) { FT_SIMD_FOR(i, n) y[i] = ft_softmax_value(y[i], inv); }

FT_VEC_CLONES
static void log_value_loop(float *y, const float *x, float m, float log_sum, int64_t n) {
    FT_SIMD_FOR(i, n) y[i] = ft_log_softmax_value(x[i], m, log_sum);
}

FT_VEC_CLONES
static void softmax_grad_loop(float *dx, const float *dy, const float *y, float dot, int64_t n, bool acc) {
    if (acc)
        FT_SIMD_FOR(i, n) dx[i] += ft_softmax_grad(dy[i], y[i], dot);
    else
        FT_SIMD_FOR(i, n) dx[i] = ft_softmax_grad(dy[i], y[i], dot);
}

FT_VEC_CLONES
static void log_softmax_grad_loop(float *dx, const float *dy, const float *y, float sum, int64_t n, bool acc) {
    if (acc)
        FT_SIMD_FOR(i, n) dx[i] += ft_log_softmax_grad(dy[i], y[i], sum);
    else
        FT_SIMD_FOR(i, n) dx[i] = ft_log_softmax_grad(dy[i], y[i], sum);
}

/* ---- column forms: R rows side by side ----
 * Element d of row r is at x[d * stride + r]. Each row's sum is taken with
 * the lanes of the row forms (element d into lane d % L, then ft_lanes_sum's
 * tree, here over a vector of rows per lane), so both forms give bitwise the
 * same results. */

ALWAYS_INLINE void combine_cols(float (*acc)[FT_COLS], float *s, int R) {
    for (int w = L / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            FT_SIMD_FOR(r, R) acc[l][r] += acc[l + w][r];
    FT_SIMD_FOR(r, R) s[r] = acc[0][r];
}

ALWAYS_INLINE void zero_cols(float (*acc)[FT_COLS], int R) {
    for (int l = 0; l < L; l++)
        FT_SIMD_FOR(r, R) acc[l][r] = 0.0f;
}

ALWAYS_INLINE void cols_max(float *m, const float *x, int64_t stride, int64_t D, int R) {
    FT_SIMD_FOR(r, R) m[r] = -INFINITY;
    for (int64_t d = 0; d < D; d++) {
        const float *p = x + d * stride;
        FT_SIMD_FOR(r, R) m[r] = ft_max_step(m[r], p[r]);
    }
}

/* The column loops are compiled once for R = L (a full vector, the common
 * block of the losses) and once for any R. */
FT_VEC_CLONES
void ft_cols_max(float *m, const float *x, int64_t stride, int64_t D, int R) {
    if (R == L)
        cols_max(m, x, stride, D, L);
    else
        cols_max(m, x, stride, D, R);
}

ALWAYS_INLINE void cols_exp_sum(float *s, float *e, int64_t estride, const float *x, int64_t stride,
                                const float *shift, int64_t D, int R) {
    float acc[L][FT_COLS];
    zero_cols(acc, R);
    for (int64_t d = 0; d < D; d++) {
        const float *p = x + d * stride;
        float *a = acc[d % L];
        if (e) {
            float *q = e + d * estride;
            FT_SIMD_FOR(r, R) {
                float v = ft_softmax_exp(p[r], shift[r]);
                q[r] = v;
                a[r] += v;
            }
        } else {
            FT_SIMD_FOR(r, R) a[r] += ft_softmax_exp(p[r], shift[r]);
        }
    }
    combine_cols(acc, s, R);
}

FT_VEC_CLONES
void ft_cols_exp_sum(float *s, float *e, int64_t estride, const float *x, int64_t stride, const float *shift,
                     int64_t D, int R) {
    if (R == L)
        cols_exp_sum(s, e, estride, x, stride, shift, D, L);
    else
        cols_exp_sum(s, e, estride, x, stride, shift, D, R);
}

ALWAYS_INLINE void cols_dot(float *s, const float *x, int64_t stride, const float *y, int64_t ystride,
                            const float *w, int64_t D, int R) {
    float acc[L][FT_COLS];
    zero_cols(acc, R);
    for (int64_t d = 0; d < D; d++) {
        const float *p = x + d * stride;
        float *a = acc[d % L];
        if (y) {
            const float *q = y + d * ystride;
            FT_SIMD_FOR(r, R) a[r] += p[r] * q[r];
        } else if (w) {
            float wd = w[d];
            FT_SIMD_FOR(r, R) a[r] += p[r] * wd;
        } else {
            FT_SIMD_FOR(r, R) a[r] += p[r];
        }
    }
    combine_cols(acc, s, R);
}

FT_VEC_CLONES
void ft_cols_dot(float *s, const float *x, int64_t stride, const float *y, int64_t ystride, const float *w,
                 int64_t D, int R) {
    if (R == L)
        cols_dot(s, x, stride, y, ystride, w, D, L);
    else
        cols_dot(s, x, stride, y, ystride, w, D, R);
}

/* ---- rows ---- */

void ft_rows_init(ft_rows *r, int ndim, const int64_t *shape, int skip) {
    r->nd = 0;
    r->nrows = 1;
    for (int d = 0; d < ndim; d++)
        if (d != skip) {
            r->shape[r->nd++] = shape[d];
            r->nrows *= shape[d];
        }
}

void ft_rows_strides(int64_t *dst, int ndim, const int64_t *strides, int skip) {
    int k = 0;
    for (int d = 0; d < ndim; d++)
        if (d != skip)
            dst[k++] = strides[d];
}

void ft_rows_pos(const ft_rows *r, int64_t row, int64_t *pos) {
    for (int d = r->nd - 1; d >= 0; d--) {
        pos[d] = row % r->shape[d];
        row /= r->shape[d];
    }
}

void ft_rows_next(const ft_rows *r, int64_t *pos) {
    for (int d = r->nd - 1; d >= 0; d--) {
        if (++pos[d] < r->shape[d])
            return;
        pos[d] = 0;
    }
}

void ft_row_load(float *buf, const void *p, int64_t stride, ft_dtype dt, int64_t n) {
    if (dt == FT_BFLOAT16)
        for (int64_t i = 0; i < n; i++)
            buf[i] = ft_bf16_to_f32(((const uint16_t *)p)[i * stride]);
    else
        for (int64_t i = 0; i < n; i++)
            buf[i] = ((const float *)p)[i * stride];
}

void ft_row_store(void *p, int64_t stride, ft_dtype dt, const float *buf, int64_t n, bool accumulate) {
    if (dt == FT_BFLOAT16) {
        uint16_t *q = p;
        for (int64_t i = 0; i < n; i++)
            q[i * stride] = ft_f32_to_bf16(accumulate ? ft_bf16_to_f32(q[i * stride]) + buf[i] : buf[i]);
    } else {
        float *q = p;
        for (int64_t i = 0; i < n; i++)
            q[i * stride] = accumulate ? q[i * stride] + buf[i] : buf[i];
    }
}

/* ---- the op ---- */

/* Operands: forward [out, inp]; backward [dinp, dout, out]. */
typedef struct {
    bool log, backward, accumulate;
    int nt;
    int64_t D;
    ft_rows rows;
    char *base[3];
    int64_t st[3][FT_MAX_DIMS];
    int64_t dstride[3];
    ft_dtype dt[3];
    bool direct[3];
    bool cols; /* blocks of rows that are adjacent in every operand (all float32) */
} sm_job;

/* Rows [row0, row0 + R) as columns: adjacent along the innermost row
 * dimension of every operand, within one run of it. */
static void do_cols(const sm_job *j, int64_t row0, int R) {
    int64_t pos[FT_MAX_DIMS], D = j->D;
    ft_rows_pos(&j->rows, row0, pos);
    float *p[3];
    int64_t ds[3];
    for (int k = 0; k < j->nt; k++) {
        p[k] = (float *)j->base[k] + ft_rows_offset(&j->rows, pos, j->st[k]);
        ds[k] = j->dstride[k];
    }
    float a[FT_COLS], b[FT_COLS];
    if (!j->backward) {
        ft_cols_max(a, p[1], ds[1], D, R);
        ft_cols_exp_sum(b, j->log ? NULL : p[0], ds[0], p[1], ds[1], a, D, R);
        if (j->log) {
            for (int r = 0; r < R; r++)
                b[r] = ft_log_softmax_log_sum(b[r]);
            for (int64_t d = 0; d < D; d++) {
                float *y = p[0] + d * ds[0];
                const float *x = p[1] + d * ds[1];
                FT_SIMD_FOR(r, R) y[r] = ft_log_softmax_value(x[r], a[r], b[r]);
            }
        } else {
            FT_SIMD_FOR(r, R) b[r] = ft_softmax_inv(b[r]);
            for (int64_t d = 0; d < D; d++) {
                float *y = p[0] + d * ds[0];
                FT_SIMD_FOR(r, R) y[r] = ft_softmax_value(y[r], b[r]);
            }
        }
        return;
    }
    /* backward: a = sum(dout) (log) or sum(dout * out) */
    ft_cols_dot(a, p[1], ds[1], j->log ? NULL : p[2], ds[2], NULL, D, R);
    for (int64_t d = 0; d < D; d++) {
        float *dx = p[0] + d * ds[0];
        const float *dy = p[1] + d * ds[1], *y = p[2] + d * ds[2];
        if (j->log) {
            if (j->accumulate)
                FT_SIMD_FOR(r, R) dx[r] += ft_log_softmax_grad(dy[r], y[r], a[r]);
            else
                FT_SIMD_FOR(r, R) dx[r] = ft_log_softmax_grad(dy[r], y[r], a[r]);
        } else {
            if (j->accumulate)
                FT_SIMD_FOR(r, R) dx[r] += ft_softmax_grad(dy[r], y[r], a[r]);
            else
                FT_SIMD_FOR(r, R) dx[r] = ft_softmax_grad(dy[r], y[r], a[r]);
        }
    }
}

static void do_row(const sm_job *j, int64_t row, float *buf) {
    int64_t pos[FT_MAX_DIMS];
    ft_rows_pos(&j->rows, row, pos);
    float *p[3];
    for (int k = 0; k < j->nt; k++) {
        char *at = j->base[k] + ft_rows_offset(&j->rows, pos, j->st[k]) * (int64_t)ft_dtype_get(j->dt[k])->itemsize;
        if (j->direct[k]) {
            p[k] = (float *)at;
        } else {
            p[k] = buf + k * j->D;
            if (k > 0)
                ft_row_load(p[k], at, j->dstride[k], j->dt[k], j->D);
        }
    }
    int64_t D = j->D;
    bool acc_direct = j->accumulate && j->direct[0];
    if (!j->backward) {
        float m = ft_row_max(p[1], D);
        if (j->log) {
            float s = ft_row_exp_sum(NULL, p[1], m, D);
            log_value_loop(p[0], p[1], m, ft_log_softmax_log_sum(s), D);
        } else {
            float s = ft_row_exp_sum(p[0], p[1], m, D);
            scale_loop(p[0], ft_softmax_inv(s), D);
        }
    } else if (j->log) {
        log_softmax_grad_loop(p[0], p[1], p[2], ft_row_sum(p[1], D), D, acc_direct);
    } else {
        softmax_grad_loop(p[0], p[1], p[2], ft_row_dot(p[1], p[2], D), D, acc_direct);
    }
    if (!j->direct[0]) {
        char *at = j->base[0] + ft_rows_offset(&j->rows, pos, j->st[0]) * (int64_t)ft_dtype_get(j->dt[0])->itemsize;
        ft_row_store(at, j->dstride[0], j->dt[0], p[0], D, j->accumulate);
    }
}

static ft_status run(const char *op, bool log, bool backward, const ft_tensor *const *t, const char *const *names,
                     int nt, int dim, bool accumulate) {
    const ft_tensor *ref = t[1];
    ft_device dev = ft_op_device(ref);
    for (int i = 1; i <= nt; i++) { /* inputs first, the output last */
        int k = i % nt;
        FT_TRY(ft_check_float_on(op, names[k], t[k], dev, names[1], true));
        if (k != 1)
            FT_TRY(ft_check_shape_as(op, names[k], t[k], ref));
    }
    FT_TRY(ft_check_output(op, names[0], t[0]));
    for (int k = 1; k < nt; k++)
        FT_TRY(ft_check_alias(op, names[0], t[0], names[k], t[k]));
    int ndim = ref->ndim;
    if (dim < -(ndim > 0 ? ndim : 1) || dim >= (ndim > 0 ? ndim : 1))
        return ft_fail(FT_ERR_INDEX, "%s: dim %d is out of range for a %d-d tensor", op, dim, ndim);
    if (dim < 0)
        dim += ndim > 0 ? ndim : 1;
    if (dev.type == FT_DEV_CUDA) {
        if (backward)
            FT_CUDA_DISPATCH(op, softmax_backward, t[0], t[1], t[2], dim, accumulate, log);
        FT_CUDA_DISPATCH(op, softmax_forward, t[0], t[1], dim, log);
    }
    sm_job j = {.log = log, .backward = backward, .accumulate = accumulate, .nt = nt};
    j.D = ndim ? ref->shape[dim] : 1;
    ft_rows_init(&j.rows, ndim, ref->shape, ndim ? dim : -1);
    if (j.D == 0 || j.rows.nrows == 0)
        return FT_OK;
    bool any_buffer = false;
    for (int k = 0; k < nt; k++) {
        j.base[k] = ft_tensor_data(t[k]);
        ft_rows_strides(j.st[k], ndim, t[k]->strides, ndim ? dim : -1);
        j.dstride[k] = ndim ? t[k]->strides[dim] : 1;
        j.dt[k] = t[k]->dtype;
        j.direct[k] = j.dt[k] == FT_FLOAT32 && (j.dstride[k] == 1 || j.D == 1);
        any_buffer |= !j.direct[k];
    }
    int64_t work = j.D * j.rows.nrows;
    int threads = work > PARALLEL_WORK ? omp_get_max_threads() : 1;
    /* column blocks when the rows are adjacent in every operand */
    int in = j.rows.nd - 1;
    j.cols = in >= 0 && j.rows.shape[in] > 1;
    for (int k = 0; k < nt && j.cols; k++)
        j.cols = j.dt[k] == FT_FLOAT32 && j.st[k][in] == 1 && j.dstride[k] != 1;
    if (j.cols) {
        int64_t run = j.rows.shape[in], per = (run + FT_COLS - 1) / FT_COLS, blocks = j.rows.nrows / run * per;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t first = b / per * run + b % per * FT_COLS, left = run - b % per * FT_COLS;
            do_cols(&j, first, (int)(left < FT_COLS ? left : FT_COLS));
        }
        return FT_OK;
    }
    float *bufs = NULL;
    if (any_buffer) {
        bufs = malloc((size_t)threads * (size_t)nt * (size_t)j.D * sizeof(float));
        if (!bufs)
            return ft_fail(FT_ERR_NOMEM, "%s: out of memory for row buffers of %lld floats", op,
                           (long long)(threads * nt * j.D));
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t row = 0; row < j.rows.nrows; row++)
        do_row(&j, row, bufs ? bufs + (size_t)omp_get_thread_num() * (size_t)nt * (size_t)j.D : NULL);
    free(bufs);
    return FT_OK;
}

ft_status ft_softmax_forward(const ft_tensor *out, const ft_tensor *inp, int dim) {
    const ft_tensor *t[] = {out, inp};
    const char *names[] = {"out", "inp"};
    return run("softmax", false, false, t, names, 2, dim, false);
}

ft_status ft_log_softmax_forward(const ft_tensor *out, const ft_tensor *inp, int dim) {
    const ft_tensor *t[] = {out, inp};
    const char *names[] = {"out", "inp"};
    return run("log_softmax", true, false, t, names, 2, dim, false);
}

ft_status ft_softmax_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *out, int dim,
                              bool accumulate) {
    const ft_tensor *t[] = {dinp, dout, out};
    const char *names[] = {"dinp", "dout", "out"};
    return run("softmax_backward", false, true, t, names, 3, dim, accumulate);
}

ft_status ft_log_softmax_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *out, int dim,
                                  bool accumulate) {
    const ft_tensor *t[] = {dinp, dout, out};
    const char *names[] = {"dinp", "dout", "out"};
    return run("log_softmax_backward", true, true, t, names, 3, dim, accumulate);
}
