/* softmax / log_softmax.
 *
 * Legend: D the row length (the size along dim), n elements of a contiguous
 * float row, L the running lanes of a row reduction. Rows whose elements are
 * not contiguous float32 are gathered into per-thread buffers of D floats. */
#include "ops/softmax.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "kernels/activation.h"
#include "kernels/convert.h"
#include "ops/check.h"
#include "ops/pointwise.h"

#define L 16
/* Elements below which an op runs on one thread. */
#define PARALLEL_WORK (1 << 15)

/* ---- row loops ---- */

static float combine_sum(float *acc) {
    for (int w = L / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

FT_VEC_CLONES
float ft_row_max(const float *x, int64_t n) {
    float acc[L];
    for (int l = 0; l < L; l++)
        acc[l] = -INFINITY;
    int64_t i = 0;
    for (; i + L <= n; i += L)
        for (int l = 0; l < L; l++) {
            float v = x[i + l];
            acc[l] = v > acc[l] || v != v ? v : acc[l];
        }
    for (int l = 0; i + l < n; l++) {
        float v = x[i + l];
        acc[l] = v > acc[l] || v != v ? v : acc[l];
    }
    float m = acc[0];
    for (int l = 1; l < L; l++)
        m = acc[l] > m || acc[l] != acc[l] ? acc[l] : m;
    return m;
}

FT_VEC_CLONES
float ft_row_exp_sum(float *e, const float *x, float shift, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    if (e) {
        for (; i + L <= n; i += L)
            for (int l = 0; l < L; l++) {
                float v = ft_expf(x[i + l] - shift);
                e[i + l] = v;
                acc[l] += v;
            }
        for (int l = 0; i + l < n; l++) {
            float v = ft_expf(x[i + l] - shift);
            e[i + l] = v;
            acc[l] += v;
        }
    } else {
        for (; i + L <= n; i += L)
            for (int l = 0; l < L; l++)
                acc[l] += ft_expf(x[i + l] - shift);
        for (int l = 0; i + l < n; l++)
            acc[l] += ft_expf(x[i + l] - shift);
    }
    return combine_sum(acc);
}

FT_VEC_CLONES
float ft_row_sum(const float *x, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= n; i += L)
        for (int l = 0; l < L; l++)
            acc[l] += x[i + l];
    for (int l = 0; i + l < n; l++)
        acc[l] += x[i + l];
    return combine_sum(acc);
}

FT_VEC_CLONES
float ft_row_dot(const float *x, const float *y, int64_t n) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= n; i += L)
        for (int l = 0; l < L; l++)
            acc[l] += x[i + l] * y[i + l];
    for (int l = 0; i + l < n; l++)
        acc[l] += x[i + l] * y[i + l];
    return combine_sum(acc);
}

FT_VEC_CLONES
static void scale_loop(float *y, float s, int64_t n) { FT_SIMD_FOR(i, n) y[i] *= s; }

/* y = (x - m) - ls: the shift first, so that large x keep their precision. */
FT_VEC_CLONES
static void sub_loop(float *y, const float *x, float m, float ls, int64_t n) { FT_SIMD_FOR(i, n) y[i] = (x[i] - m) - ls; }

FT_VEC_CLONES
static void softmax_grad_loop(float *dx, const float *dy, const float *y, float dot, int64_t n, bool acc) {
    if (acc)
        FT_SIMD_FOR(i, n) dx[i] += y[i] * (dy[i] - dot);
    else
        FT_SIMD_FOR(i, n) dx[i] = y[i] * (dy[i] - dot);
}

FT_VEC_CLONES
static void log_softmax_grad_loop(float *dx, const float *dy, const float *y, float sum, int64_t n, bool acc) {
    if (acc)
        FT_SIMD_FOR(i, n) dx[i] += dy[i] - ft_expf(y[i]) * sum;
    else
        FT_SIMD_FOR(i, n) dx[i] = dy[i] - ft_expf(y[i]) * sum;
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
    float *bufs; /* per thread: nt rows of D */
} sm_job;

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
            sub_loop(p[0], p[1], m, logf(s), D);
        } else {
            float s = ft_row_exp_sum(p[0], p[1], m, D);
            scale_loop(p[0], 1.0f / s, D);
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
    for (int i = 1; i <= nt; i++) { /* inputs first, the output last */
        int k = i % nt;
        FT_TRY(ft_check_cpu_float(op, names[k], t[k], true));
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
