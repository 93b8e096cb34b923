/* cross_entropy (softmax fused) and mse_loss.
 *
 * Legend: C classes (a row: the C logits of one sample), R rows (samples:
 * N times the extra dimensions d...), RC rows per chunk of a fixed-order sum,
 * EC elements per chunk of mse_loss's sum. */
#include "ops/loss.h"

#include <omp.h>
#include <stdlib.h>

#include "kernels/convert.h"
#include "kernels/softmax.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"
#include "ops/softmax.h"

#define RC 16
#define EC 4096
/* Elements below which a loss runs on one thread. */
#define PARALLEL_WORK (1 << 15)

static float load_f(const char *p, ft_dtype dt) {
    return dt == FT_BFLOAT16 ? ft_bf16_to_f32(*(const uint16_t *)p) : *(const float *)p;
}

static void store_f(char *p, ft_dtype dt, float v) {
    if (dt == FT_BFLOAT16)
        *(uint16_t *)p = ft_f32_to_bf16(v);
    else
        *(float *)p = v;
}

/* A float tensor viewed by rows: base, strides over the row dimensions, and
 * the stride along the class dimension. */
typedef struct {
    char *base;
    int64_t st[FT_MAX_DIMS];
    int64_t cs;
    ft_dtype dt;
    int64_t item;
    bool direct; /* float32 with contiguous rows */
} rowed;

static void make_rowed(rowed *r, const ft_tensor *t, int class_dim) {
    r->base = ft_tensor_data(t);
    ft_rows_strides(r->st, t->ndim, t->strides, class_dim);
    r->cs = class_dim >= 0 ? t->strides[class_dim] : 1;
    r->dt = t->dtype;
    r->item = (int64_t)ft_dtype_get(t->dtype)->itemsize;
    r->direct = t->dtype == FT_FLOAT32 && (r->cs == 1 || (class_dim >= 0 && t->shape[class_dim] == 1));
}

static char *row_at(const rowed *r, const ft_rows *rows, const int64_t *pos) {
    return r->base + ft_rows_offset(rows, pos, r->st) * r->item;
}

/* ---- cross entropy ---- */

typedef struct {
    int64_t C;
    ft_rows rows;
    rowed logits, dlogits, loss, dloss; /* loss, dloss: per row (none), class stride unused */
    bool has_dlogits, has_loss_rows, has_dloss_rows, accumulate;
    char *target;
    int64_t tst[FT_MAX_DIMS];
    bool t32;
    const float *w; /* (C) or NULL */
    float W;        /* sum of w, or C */
    double eps;
    int64_t ignore;
    double scale;      /* gradient factor: 1 or 1 / the mean's divisor */
    float dloss_value; /* dloss for mean and sum */
    bool cols;         /* rows in blocks side by side (see ce_cols) */
} ce_job;

static int64_t target_of(const ce_job *j, const int64_t *pos) {
    int64_t off = ft_rows_offset(&j->rows, pos, j->tst);
    return j->t32 ? ((const int32_t *)j->target)[off] : ((const int64_t *)j->target)[off];
}

FT_VEC_CLONES
static void ce_grad_loop(float *g, const float *e, ft_ce_coef k, const float *w, int64_t n) {
    if (w)
        FT_SIMD_FOR(i, n) g[i] = ft_ce_grad(e[i], w[i], k.a, k.b);
    else
        FT_SIMD_FOR(i, n) g[i] = ft_ce_grad(e[i], 1.0f, k.a, k.b);
}

/* The loss of one row; writes its gradient when the job has dlogits. */
static double ce_row(const ce_job *j, int64_t row, float *buf) {
    int64_t pos[FT_MAX_DIMS], C = j->C;
    ft_rows_pos(&j->rows, row, pos);
    int64_t t = target_of(j, pos);
    bool ignored = t == j->ignore;
    char *grow = j->has_dlogits ? row_at(&j->dlogits, &j->rows, pos) : NULL;
    if (ignored) {
        if (grow && !j->accumulate)
            for (int64_t c = 0; c < C; c++)
                store_f(grow + c * j->dlogits.cs * j->dlogits.item, j->dlogits.dt, 0.0f);
        if (j->has_loss_rows)
            store_f(row_at(&j->loss, &j->rows, pos), j->loss.dt, 0.0f);
        return 0.0;
    }
    const float *x;
    char *xrow = row_at(&j->logits, &j->rows, pos);
    if (j->logits.direct) {
        x = (const float *)xrow;
    } else {
        ft_row_load(buf, xrow, j->logits.cs, j->logits.dt, C);
        x = buf;
    }
    /* e: exp(x - m), in dlogits' own row when it is written directly */
    bool in_place = grow && j->dlogits.direct && !j->accumulate;
    float *e = !grow ? NULL : in_place ? (float *)grow : buf + C;
    /* everything read from x before e (which may be x itself: dlogits over
     * logits) is written */
    float m = ft_row_max(x, C), xt = x[t];
    float sx = j->eps > 0.0 ? (j->w ? ft_row_dot(x, j->w, C) : ft_row_sum(x, C)) : 0.0f;
    float s = ft_row_exp_sum(e, x, m, C);
    double lse = ft_ce_lse(m, s);
    double wt = j->w ? j->w[t] : 1.0;
    double l = ft_ce_loss(lse, xt, sx, wt, j->W, j->eps, C);
    if (j->has_loss_rows)
        store_f(row_at(&j->loss, &j->rows, pos), j->loss.dt, (float)l);
    if (grow) {
        double gs = j->scale * (j->has_dloss_rows ? load_f(row_at(&j->dloss, &j->rows, pos), j->dloss.dt)
                                                  : j->dloss_value);
        ft_ce_coef k = ft_ce_coef_of(gs, wt, j->W, j->eps, C, s);
        ce_grad_loop(e, e, k, j->w, C);
        e[t] -= k.c;
        if (!in_place)
            ft_row_store(grow, j->dlogits.cs, j->dlogits.dt, e, C, j->accumulate);
    }
    return l;
}

/* Rows [row0, row0 + R) (R <= RC, within one run of the innermost row
 * dimension, along which logits and dlogits are contiguous): the column form
 * of ce_row, vectorised across the rows, with exactly its arithmetic. The
 * row losses go to l[R]; buf holds C x RC floats. */
static void ce_cols(const ce_job *j, int64_t row0, int R, double *l, float *buf) {
    int64_t pos[FT_MAX_DIMS], C = j->C, in = j->rows.nd - 1;
    ft_rows_pos(&j->rows, row0, pos);
    const float *x = (const float *)row_at(&j->logits, &j->rows, pos);
    int64_t cs = j->logits.cs;
    int64_t t[RC];
    bool ign[RC];
    int64_t toff = ft_rows_offset(&j->rows, pos, j->tst);
    for (int r = 0; r < R; r++) {
        int64_t off = toff + r * j->tst[in];
        t[r] = j->t32 ? ((const int32_t *)j->target)[off] : ((const int64_t *)j->target)[off];
        ign[r] = t[r] == j->ignore;
    }
    float m[RC], s[RC], sx[RC] = {0}, xt[RC];
    ft_cols_max(m, x, cs, C, R);
    for (int r = 0; r < R; r++)
        xt[r] = ign[r] ? 0.0f : x[t[r] * cs + r];
    if (j->eps > 0.0)
        ft_cols_dot(sx, x, cs, NULL, 0, j->w, C, R);
    float *dl = j->has_dlogits ? (float *)row_at(&j->dlogits, &j->rows, pos) : NULL;
    bool in_place = dl && !j->accumulate;
    float *e = !dl ? NULL : in_place ? dl : buf;
    int64_t es = in_place ? j->dlogits.cs : RC;
    ft_cols_exp_sum(s, e, es, x, cs, m, C, R);
    float a[RC], b[RC], c[RC];
    for (int r = 0; r < R; r++) {
        if (ign[r]) {
            l[r] = 0.0;
            a[r] = b[r] = c[r] = 0.0f;
            if (j->has_loss_rows)
                store_f(j->loss.base + (ft_rows_offset(&j->rows, pos, j->loss.st) + r * j->loss.st[in]) * j->loss.item,
                        j->loss.dt, 0.0f);
            continue;
        }
        double lse = ft_ce_lse(m[r], s[r]);
        double wt = j->w ? j->w[t[r]] : 1.0;
        l[r] = ft_ce_loss(lse, xt[r], sx[r], wt, j->W, j->eps, C);
        if (j->has_loss_rows)
            store_f(j->loss.base + (ft_rows_offset(&j->rows, pos, j->loss.st) + r * j->loss.st[in]) * j->loss.item,
                    j->loss.dt, (float)l[r]);
        if (e) {
            double gs = j->scale * (j->has_dloss_rows
                                        ? load_f(j->dloss.base + (ft_rows_offset(&j->rows, pos, j->dloss.st) +
                                                                  r * j->dloss.st[in]) * j->dloss.item,
                                                 j->dloss.dt)
                                        : j->dloss_value);
            ft_ce_coef k = ft_ce_coef_of(gs, wt, j->W, j->eps, C, s[r]);
            a[r] = k.a, b[r] = k.b, c[r] = k.c;
        }
    }
    if (!e)
        return;
    for (int64_t d = 0; d < C; d++) {
        float *g = e + d * es, wd = j->w ? j->w[d] : 1.0f;
        FT_SIMD_FOR(r, R) g[r] = ign[r] ? 0.0f : ft_ce_grad(g[r], wd, a[r], b[r]);
    }
    for (int r = 0; r < R; r++)
        if (!ign[r])
            e[t[r] * es + r] -= c[r];
    if (in_place)
        return;
    for (int64_t d = 0; d < C; d++) {
        float *q = dl + d * j->dlogits.cs;
        const float *g = e + d * es;
        if (j->accumulate)
            FT_SIMD_FOR(r, R) q[r] = ign[r] ? q[r] : q[r] + g[r];
        else
            FT_SIMD_FOR(r, R) q[r] = g[r];
    }
}

/* Checks targets and returns the divisor of the mean: sum of w[t] over the
 * rows not ignored, in fixed chunks. */
static ft_status ce_prepass(const char *op, const ce_job *j, double *divisor) {
    int64_t R = j->rows.nrows, nchunks = (R + RC - 1) / RC;
    double *part = malloc((size_t)(nchunks + 1) * sizeof(double));
    int64_t *bad = malloc((size_t)(nchunks + 1) * sizeof(int64_t));
    if (!part || !bad) {
        free(part);
        free(bad);
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
    }
#pragma omp parallel for schedule(static) if (R > PARALLEL_WORK)
    for (int64_t ch = 0; ch < nchunks; ch++) {
        double sum = 0.0;
        bad[ch] = -1;
        int64_t end = (ch + 1) * RC < R ? (ch + 1) * RC : R, pos[FT_MAX_DIMS];
        ft_rows_pos(&j->rows, ch * RC, pos);
        for (int64_t row = ch * RC; row < end; row++, ft_rows_next(&j->rows, pos)) {
            int64_t t = target_of(j, pos);
            if (t == j->ignore)
                continue;
            if (t < 0 || t >= j->C) {
                if (bad[ch] < 0)
                    bad[ch] = row;
                continue;
            }
            sum += j->w ? j->w[t] : 1.0;
        }
        part[ch] = sum;
    }
    double total = 0.0;
    int64_t first_bad = -1;
    for (int64_t ch = 0; ch < nchunks; ch++) {
        total += part[ch];
        if (first_bad < 0 && bad[ch] >= 0)
            first_bad = bad[ch];
    }
    free(part);
    free(bad);
    if (first_bad >= 0) {
        int64_t pos[FT_MAX_DIMS];
        ft_rows_pos(&j->rows, first_bad, pos);
        return ft_fail(FT_ERR_INDEX, "%s: target %lld (sample %lld) is out of bounds for %lld classes "
                                     "(and is not ignore_index %lld)",
                       op, (long long)target_of(j, pos), (long long)first_bad, (long long)j->C,
                       (long long)j->ignore);
    }
    *divisor = total;
    return FT_OK;
}

static ft_status check_reduction(const char *op, ft_reduction r) {
    if (r != FT_REDUCTION_NONE && r != FT_REDUCTION_MEAN && r != FT_REDUCTION_SUM)
        return ft_fail(FT_ERR_VALUE, "%s: unknown reduction %d", op, (int)r);
    return FT_OK;
}

/* Checks shared by forward and backward (every tensor on dev, that of
 * logits); fills the job's logits, target and C. */
static ft_status ce_setup(const char *op, ce_job *j, const ft_tensor *logits, const ft_tensor *target,
                          const ft_tensor *weight, const ft_cross_entropy_params *p, ft_device dev) {
    FT_TRY(check_reduction(op, p->reduction));
    if (!(p->label_smoothing >= 0.0 && p->label_smoothing <= 1.0))
        return ft_fail(FT_ERR_VALUE, "%s: label_smoothing must be between 0.0 and 1.0, got %g", op,
                       p->label_smoothing);
    FT_TRY(ft_check_float_on(op, "logits", logits, dev, "logits", true));
    if (logits->ndim < 1)
        return ft_fail(FT_ERR_SHAPE, "%s: logits should have shape (C), (N, C) or (N, C, d...), got a 0-d tensor",
                       op);
    int cd = logits->ndim == 1 ? 0 : 1;
    j->C = logits->shape[cd];
    if (j->C < 1)
        return ft_fail(FT_ERR_SHAPE, "%s: logits need at least one class, got %lld", op, (long long)j->C);
    FT_TRY(ft_check_on(op, "target", target, dev, "logits"));
    if (target->dtype != FT_INT64 && target->dtype != FT_INT32)
        return ft_fail(FT_ERR_DTYPE, "%s: target must hold class indices as int64 or int32, got %s", op,
                       ft_dtype_get(target->dtype)->name);
    int64_t tshape[FT_MAX_DIMS];
    ft_rows_strides(tshape, logits->ndim, logits->shape, cd);
    FT_TRY(ft_check_shape(op, "target", target, logits->ndim - 1, tshape));
    ft_rows_init(&j->rows, logits->ndim, logits->shape, cd);
    make_rowed(&j->logits, logits, cd);
    j->target = ft_tensor_data(target);
    ft_rows_strides(j->tst, target->ndim, target->strides, -1);
    j->t32 = target->dtype == FT_INT32;
    j->eps = p->label_smoothing;
    j->ignore = p->ignore_index;
    if (weight) {
        FT_TRY(ft_check_float_on(op, "weight", weight, dev, "logits", true));
        FT_TRY(ft_check_shape(op, "weight", weight, 1, &j->C));
    }
    return FT_OK;
}

/* The job's class weights: w, a float copy of weight that the caller frees
 * (*wcopy; NULL without weight), and their sum W. */
static ft_status ce_weights(const char *op, ce_job *j, const ft_tensor *weight, float **wcopy) {
    *wcopy = NULL;
    j->W = (float)j->C;
    if (weight) {
        float *w = malloc((size_t)j->C * sizeof(float));
        if (!w)
            return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
        ft_row_load(w, ft_tensor_data(weight), weight->strides[0], weight->dtype, j->C);
        double W = 0.0;
        for (int64_t c = 0; c < j->C; c++)
            W += w[c];
        j->W = (float)W;
        j->w = w;
        *wcopy = w;
    }
    return FT_OK;
}

/* Runs the rows in fixed chunks; *total = the sum of the row losses. */
static ft_status ce_rows(const char *op, ce_job *j, double *total) {
    int64_t R = j->rows.nrows, nchunks = (R + RC - 1) / RC, in = j->rows.nd - 1;
    /* column blocks when the rows lie side by side in logits (and dlogits) */
    j->cols = in >= 0 && j->rows.shape[in] > 1 && j->logits.dt == FT_FLOAT32 && j->logits.st[in] == 1 &&
              j->logits.cs != 1 && (!j->has_dlogits || (j->dlogits.dt == FT_FLOAT32 && j->dlogits.st[in] == 1));
    bool parallel = R * j->C > PARALLEL_WORK;
    int threads = parallel ? omp_get_max_threads() : 1;
    size_t per_thread = (size_t)(j->cols ? RC : 2) * (size_t)j->C;
    double *part = malloc((size_t)(nchunks + 1) * sizeof(double));
    float *bufs = malloc((size_t)threads * per_thread * sizeof(float));
    if (!part || !bufs) {
        free(part);
        free(bufs);
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory for %lld classes", op, (long long)j->C);
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
    for (int64_t ch = 0; ch < nchunks; ch++) {
        float *buf = bufs + (size_t)omp_get_thread_num() * per_thread;
        double sum = 0.0;
        int64_t end = (ch + 1) * RC < R ? (ch + 1) * RC : R;
        for (int64_t row = ch * RC; row < end;) {
            if (j->cols) {
                int64_t left = j->rows.shape[in] - row % j->rows.shape[in], n = end - row < left ? end - row : left;
                double l[RC];
                ce_cols(j, row, (int)n, l, buf);
                for (int64_t r = 0; r < n; r++)
                    sum += l[r];
                row += n;
            } else {
                sum += ce_row(j, row++, buf);
            }
        }
        part[ch] = sum;
    }
    double s = 0.0;
    for (int64_t ch = 0; ch < nchunks; ch++)
        s += part[ch];
    free(part);
    free(bufs);
    *total = s;
    return FT_OK;
}

static ft_status check_dlogits(const char *op, const ft_tensor *dlogits, const ft_tensor *logits, ft_device dev) {
    FT_TRY(ft_check_float_on(op, "dlogits", dlogits, dev, "logits", true));
    FT_TRY(ft_check_shape_as(op, "dlogits", dlogits, logits));
    FT_TRY(ft_check_output(op, "dlogits", dlogits));
    return FT_OK;
}

ft_status ft_cross_entropy_forward(const ft_tensor *loss, const ft_tensor *dlogits, const ft_tensor *logits,
                                   const ft_tensor *target, const ft_tensor *weight,
                                   const ft_cross_entropy_params *p) {
    const char *op = "cross_entropy";
    ce_job j = {0};
    ft_device dev = ft_op_device(logits);
    FT_TRY(ce_setup(op, &j, logits, target, weight, p, dev));
    FT_TRY(ft_check_float_on(op, "loss", loss, dev, "logits", true));
    if (p->reduction == FT_REDUCTION_NONE)
        FT_TRY(ft_check_shape_as(op, "loss", loss, target));
    else
        FT_TRY(ft_check_shape(op, "loss", loss, 0, NULL));
    FT_TRY(ft_check_output(op, "loss", loss));
    FT_TRY(ft_check_alias(op, "loss", loss, "logits", logits));
    if (dlogits) {
        FT_TRY(check_dlogits(op, dlogits, logits, dev));
        FT_TRY(ft_check_alias(op, "dlogits", dlogits, "logits", logits));
        FT_TRY(ft_check_alias(op, "dlogits", dlogits, "loss", loss));
        make_rowed(&j.dlogits, dlogits, logits->ndim == 1 ? 0 : 1);
        j.has_dlogits = true;
    }
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, cross_entropy_forward, loss, dlogits, logits, target, weight, p);
    float *wcopy;
    FT_TRY(ce_weights(op, &j, weight, &wcopy));
    ft_status st = FT_OK;
    do {
        double divisor = 0.0;
        if ((st = ce_prepass(op, &j, &divisor)) != FT_OK)
            break;
        if (p->reduction == FT_REDUCTION_NONE) {
            make_rowed(&j.loss, loss, -1);
            j.has_loss_rows = true;
        }
        j.scale = p->reduction == FT_REDUCTION_MEAN ? 1.0 / divisor : 1.0;
        j.dloss_value = 1.0f;
        double total = 0.0;
        if ((st = ce_rows(op, &j, &total)) != FT_OK)
            break;
        if (p->reduction == FT_REDUCTION_MEAN)
            store_f(ft_tensor_data(loss), loss->dtype, (float)(total / divisor));
        else if (p->reduction == FT_REDUCTION_SUM)
            store_f(ft_tensor_data(loss), loss->dtype, (float)total);
    } while (0);
    free(wcopy);
    return st;
}

ft_status ft_cross_entropy_backward(const ft_tensor *dlogits, const ft_tensor *dloss, const ft_tensor *logits,
                                    const ft_tensor *target, const ft_tensor *weight,
                                    const ft_cross_entropy_params *p, bool accumulate) {
    const char *op = "cross_entropy_backward";
    ce_job j = {0};
    ft_device dev = ft_op_device(logits);
    FT_TRY(ce_setup(op, &j, logits, target, weight, p, dev));
    FT_TRY(check_dlogits(op, dlogits, logits, dev));
    FT_TRY(ft_check_alias(op, "dlogits", dlogits, "logits", logits));
    FT_TRY(ft_check_float_on(op, "dloss", dloss, dev, "logits", true));
    if (p->reduction == FT_REDUCTION_NONE)
        FT_TRY(ft_check_shape_as(op, "dloss", dloss, target));
    else
        FT_TRY(ft_check_shape(op, "dloss", dloss, 0, NULL));
    FT_TRY(ft_check_alias(op, "dlogits", dlogits, "dloss", dloss));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, cross_entropy_backward, dlogits, dloss, logits, target, weight, p, accumulate);
    make_rowed(&j.dlogits, dlogits, logits->ndim == 1 ? 0 : 1);
    j.has_dlogits = true;
    j.accumulate = accumulate;
    float *wcopy;
    FT_TRY(ce_weights(op, &j, weight, &wcopy));
    ft_status st = FT_OK;
    do {
        double divisor = 0.0;
        if ((st = ce_prepass(op, &j, &divisor)) != FT_OK)
            break;
        if (p->reduction == FT_REDUCTION_NONE) {
            make_rowed(&j.dloss, dloss, -1);
            j.has_dloss_rows = true;
        } else {
            j.dloss_value = load_f(ft_tensor_data(dloss), dloss->dtype);
        }
        j.scale = p->reduction == FT_REDUCTION_MEAN ? 1.0 / divisor : 1.0;
        double total;
        st = ce_rows(op, &j, &total);
    } while (0);
    free(wcopy);
    return st;
}

/* ---- mse ---- */

typedef struct {
    double sum;
} mse_acc;

FT_VEC_CLONES
static float sq_diff_sum(const float *x, const float *y, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _Pragma("omp simd") for (int l = 0; l < 16; l++) {
            float d = x[i + l] - y[i + l];
            acc[l] += d * d;
        }
    for (int l = 0; i + l < n; l++) {
        float d = x[i + l] - y[i + l];
        acc[l] += d * d;
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

static void mse_sum_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    mse_acc *a = (mse_acc *)vctx;
    a->sum += sq_diff_sum(p[0], p[1], n);
}

FT_VEC_CLONES
static void sq_diff_loop(float *out, const float *x, const float *y, int64_t n) {
    FT_SIMD_FOR(i, n) {
        float d = x[i] - y[i];
        out[i] = d * d;
    }
}

static void mse_none_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    sq_diff_loop(p[0], p[1], p[2], n);
}

/* The reduction, inp and target, and the loss (or its gradient) `arg`:
 * inp's shape for no reduction, else (). */
static ft_status check_mse(const char *op, const char *arg, const ft_tensor *l, const ft_tensor *inp,
                           const ft_tensor *target, ft_reduction reduction, ft_device dev) {
    FT_TRY(check_reduction(op, reduction));
    FT_TRY(ft_check_float_on(op, "inp", inp, dev, "inp", true));
    FT_TRY(ft_check_float_on(op, "target", target, dev, "inp", true));
    FT_TRY(ft_check_float_on(op, arg, l, dev, "inp", true));
    FT_TRY(ft_check_shape_as(op, "target", target, inp));
    if (reduction == FT_REDUCTION_NONE)
        return ft_check_shape_as(op, arg, l, inp);
    return ft_check_shape(op, arg, l, 0, NULL);
}

ft_status ft_mse_loss_forward(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                              ft_reduction reduction) {
    const char *op = "mse_loss";
    ft_device dev = ft_op_device(inp);
    FT_TRY(check_mse(op, "loss", loss, inp, target, reduction, dev));
    FT_TRY(ft_check_output(op, "loss", loss));
    FT_TRY(ft_check_alias(op, "loss", loss, "inp", inp));
    FT_TRY(ft_check_alias(op, "loss", loss, "target", target));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, mse_loss_forward, loss, inp, target, reduction);
    if (reduction == FT_REDUCTION_NONE) {
        ft_pw_loop l = {.nops = 3, .nout = 1, .t = {loss, inp, target}, .fn = mse_none_kernel};
        ft_pw_run(&l);
        return FT_OK;
    }
    ft_pw_loop l = {.nops = 2, .nout = 0, .t = {inp, target}, .fn = mse_sum_kernel};
    ft_pw_plan plan;
    double total = 0.0;
    int64_t n = 0;
    if (ft_pw_plan_make(&plan, &l)) {
        n = ft_pw_plan_numel(&plan);
        int64_t nchunks = (n + EC - 1) / EC;
        double *part = malloc((size_t)nchunks * sizeof(double));
        if (!part)
            return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
#pragma omp parallel for schedule(static) if (n > PARALLEL_WORK)
        for (int64_t ch = 0; ch < nchunks; ch++) {
            mse_acc acc = {0.0};
            ft_pw_loop lc = l;
            lc.ctx = &acc;
            ft_pw_walk(&lc, &plan, ch * EC, (ch + 1) * EC < n ? (ch + 1) * EC : n);
            part[ch] = acc.sum;
        }
        for (int64_t ch = 0; ch < nchunks; ch++)
            total += part[ch];
        free(part);
    }
    float v = reduction == FT_REDUCTION_MEAN ? (float)(total / (double)n) : (float)total;
    store_f(ft_tensor_data(loss), loss->dtype, v);
    return FT_OK;
}

typedef struct {
    int dinp, dtarget, x, y, dloss; /* operand slots, -1 when absent */
    float scale;                    /* 2 dloss (/ n) for mean and sum; 2 for none */
    bool acc_inp, acc_target;
} mse_bwd_ctx;

FT_VEC_CLONES
static void mse_grad_loop(float *d, const float *x, const float *y, const float *dl, float s, int64_t n, bool acc) {
    if (dl) {
        if (acc)
            FT_SIMD_FOR(i, n) d[i] += s * dl[i] * (x[i] - y[i]);
        else
            FT_SIMD_FOR(i, n) d[i] = s * dl[i] * (x[i] - y[i]);
    } else {
        if (acc)
            FT_SIMD_FOR(i, n) d[i] += s * (x[i] - y[i]);
        else
            FT_SIMD_FOR(i, n) d[i] = s * (x[i] - y[i]);
    }
}

static void mse_bwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const mse_bwd_ctx *c = vctx;
    const float *dl = c->dloss >= 0 ? p[c->dloss] : NULL;
    /* dtarget first with the negated scale: dinp may be an input itself */
    if (c->dtarget >= 0) {
        if (c->dinp >= 0) {
            _Alignas(64) float tmp[512];
            for (int64_t off = 0; off < n; off += 512) {
                int64_t m = n - off < 512 ? n - off : 512;
                mse_grad_loop(tmp, p[c->x] + off, p[c->y] + off, dl ? dl + off : NULL, c->scale, m, false);
                mse_grad_loop(p[c->dtarget] + off, p[c->x] + off, p[c->y] + off, dl ? dl + off : NULL, -c->scale,
                              m, c->acc_target);
                if (c->acc_inp)
                    for (int64_t i = 0; i < m; i++)
                        p[c->dinp][off + i] += tmp[i];
                else
                    for (int64_t i = 0; i < m; i++)
                        p[c->dinp][off + i] = tmp[i];
            }
        } else {
            mse_grad_loop(p[c->dtarget], p[c->x], p[c->y], dl, -c->scale, n, c->acc_target);
        }
    } else {
        mse_grad_loop(p[c->dinp], p[c->x], p[c->y], dl, c->scale, n, c->acc_inp);
    }
}

ft_status ft_mse_loss_backward(const ft_tensor *dinp, const ft_tensor *dtarget, const ft_tensor *dloss,
                               const ft_tensor *inp, const ft_tensor *target, ft_reduction reduction,
                               bool accumulate_inp, bool accumulate_target) {
    const char *op = "mse_loss_backward";
    ft_device dev = ft_op_device(inp);
    FT_TRY(check_mse(op, "dloss", dloss, inp, target, reduction, dev));
    const ft_tensor *outs[2] = {dinp, dtarget};
    const char *names[2] = {"dinp", "dtarget"};
    for (int k = 0; k < 2; k++) {
        if (!outs[k])
            continue;
        FT_TRY(ft_check_float_on(op, names[k], outs[k], dev, "inp", true));
        FT_TRY(ft_check_shape_as(op, names[k], outs[k], inp));
        FT_TRY(ft_check_output(op, names[k], outs[k]));
        FT_TRY(ft_check_alias(op, names[k], outs[k], "inp", inp));
        FT_TRY(ft_check_alias(op, names[k], outs[k], "target", target));
        FT_TRY(ft_check_alias(op, names[k], outs[k], "dloss", dloss));
    }
    if (dinp && dtarget && ft_tensor_numel(dinp) > 0 &&
        (ft_same_view(dinp, dtarget) || ft_check_alias(op, "dinp", dinp, "dtarget", dtarget)))
        return ft_fail(FT_ERR_VALUE, "%s: dinp and dtarget must not share memory", op);
    if (!dinp && !dtarget)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, mse_loss_backward, dinp, dtarget, dloss, inp, target, reduction, accumulate_inp,
                         accumulate_target);
    int64_t n = ft_tensor_numel(inp);
    mse_bwd_ctx c = {.dinp = -1, .dtarget = -1, .dloss = -1, .acc_inp = accumulate_inp,
                     .acc_target = accumulate_target, .scale = 2.0f};
    if (reduction != FT_REDUCTION_NONE) {
        double s = 2.0 * load_f(ft_tensor_data(dloss), dloss->dtype);
        if (reduction == FT_REDUCTION_MEAN)
            s /= (double)n;
        c.scale = (float)s;
    }
    ft_pw_loop l = {.fn = mse_bwd_kernel, .ctx = &c};
    if (dinp)
        c.dinp = l.nops, l.t[l.nops++] = dinp;
    if (dtarget)
        c.dtarget = l.nops, l.t[l.nops++] = dtarget;
    l.nout = l.nops;
    l.read_outputs = (dinp && accumulate_inp) || (dtarget && accumulate_target);
    c.x = l.nops, l.t[l.nops++] = inp;
    c.y = l.nops, l.t[l.nops++] = target;
    if (reduction == FT_REDUCTION_NONE)
        c.dloss = l.nops, l.t[l.nops++] = dloss;
    ft_pw_run(&l);
    return FT_OK;
}

/* ---- nll_loss ---- */

/* Checks for both directions: t (N, C) float32, target (N) integers in
 * range, weight (C) contiguous float32 or NULL, all on t's device; the
 * targets are read on the host (copied from a GPU). */
static ft_status check_nll(const char *op, const ft_tensor *t, const ft_tensor *target, const ft_tensor *weight,
                           int64_t ignore_index) {
    ft_device dev = ft_op_device(t);
    FT_TRY(ft_check_float_on(op, "inp", t, dev, "inp", false));
    FT_TRY(ft_check_ndim(op, "inp", t, 2, "(N, C)"));
    FT_TRY(ft_check_on(op, "target", target, dev, "inp"));
    if (target->dtype != FT_INT64 && target->dtype != FT_INT32)
        return ft_fail(FT_ERR_DTYPE, "%s: target must be int64 or int32", op);
    FT_TRY(ft_check_shape(op, "target", target, 1, t->shape));
    if (weight) {
        FT_TRY(ft_check_float_on(op, "weight", weight, dev, "inp", false));
        FT_TRY(ft_check_shape(op, "weight", weight, 1, &t->shape[1]));
        if (!ft_tensor_is_contiguous(weight))
            return ft_fail(FT_ERR_SHAPE, "%s: weight must be contiguous", op);
    }
    ft_tensor host;
    if (dev.type == FT_DEV_CUDA)
        FT_TRY(ft_tensor_to(&host, target, FT_INT64, FT_CPU, false, false, false));
    else
        ft_tensor_share(&host, target);
    ft_status s = FT_OK;
    for (int64_t n = 0; s == FT_OK && n < t->shape[0]; n++) {
        const char *at = ft_tensor_data(&host) + n * host.strides[0] * (int64_t)ft_dtype_get(host.dtype)->itemsize;
        int64_t v = host.dtype == FT_INT64 ? *(const int64_t *)at : *(const int32_t *)at;
        if ((v < 0 || v >= t->shape[1]) && v != ignore_index)
            s = ft_fail(FT_ERR_INDEX, "%s: target %lld at position %lld is outside [0, %lld)", op, (long long)v,
                        (long long)n, (long long)t->shape[1]);
    }
    ft_tensor_release(&host);
    return s;
}

static int64_t nll_target(const ft_tensor *target, int64_t n) {
    const char *at = ft_tensor_data(target) + n * target->strides[0] * (int64_t)ft_dtype_get(target->dtype)->itemsize;
    return target->dtype == FT_INT64 ? *(const int64_t *)at : *(const int32_t *)at;
}

ft_status ft_nll_loss_forward(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                              const ft_tensor *weight, int64_t ignore_index) {
    const char *op = "nll_loss";
    FT_TRY(check_nll(op, inp, target, weight, ignore_index));
    FT_TRY(ft_check_float_on(op, "loss", loss, ft_op_device(inp), "inp", false));
    FT_TRY(ft_check_shape(op, "loss", loss, 1, inp->shape));
    FT_TRY(ft_check_output(op, "loss", loss));
    if (ft_op_device(inp).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, nll_loss_forward, loss, inp, target, weight, ignore_index);
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    for (int64_t n = 0; n < inp->shape[0]; n++) {
        int64_t t = nll_target(target, n);
        float v = 0.0f;
        if (t != ignore_index)
            v = -(w ? w[t] : 1.0f) * ((const float *)ft_tensor_data(inp))[n * inp->strides[0] + t * inp->strides[1]];
        ((float *)ft_tensor_data(loss))[n * loss->strides[0]] = v;
    }
    return FT_OK;
}

ft_status ft_nll_loss_backward(const ft_tensor *dinp, const ft_tensor *dloss, const ft_tensor *target,
                               const ft_tensor *weight, int64_t ignore_index, bool accumulate) {
    const char *op = "nll_loss_backward";
    FT_TRY(check_nll(op, dinp, target, weight, ignore_index));
    FT_TRY(ft_check_output(op, "dinp", dinp));
    FT_TRY(ft_check_float_on(op, "dloss", dloss, ft_op_device(dinp), "dinp", false));
    FT_TRY(ft_check_shape(op, "dloss", dloss, 1, dinp->shape));
    if (!accumulate) /* then every device adds the targets' column */
        FT_TRY(ft_tensor_zero(dinp));
    if (ft_op_device(dinp).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, nll_loss_backward, dinp, dloss, target, weight, ignore_index);
    const float *w = weight ? (const float *)ft_tensor_data(weight) : NULL;
    for (int64_t n = 0; n < dinp->shape[0]; n++) {
        int64_t t = nll_target(target, n);
        if (t == ignore_index)
            continue;
        float g = ((const float *)ft_tensor_data(dloss))[n * dloss->strides[0]];
        ((float *)ft_tensor_data(dinp))[n * dinp->strides[0] + t * dinp->strides[1]] -= (w ? w[t] : 1.0f) * g;
    }
    return FT_OK;
}
