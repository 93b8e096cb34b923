#include "ops/check.h"

#include <stdio.h>
#include <stdlib.h>

const char *ft_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = 0;
    int w = snprintf(buf, n, "(");
    for (int i = 0; i < ndim; i++) {
        k = w > 0 && (size_t)w < n ? (size_t)w : n - 1;
        w = (int)k + snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    }
    k = w > 0 && (size_t)w < n ? (size_t)w : n - 1;
    snprintf(buf + k, n - k, ndim == 1 ? ",)" : ")");
    return buf;
}

static const char *device_str(char *buf, size_t n, ft_device d) {
    if (d.type == FT_DEV_CUDA)
        snprintf(buf, n, "cuda:%d", d.index);
    else
        snprintf(buf, n, "cpu");
    return buf;
}

ft_status ft_check_on(const char *op, const char *arg, const ft_tensor *t, ft_device dev, const char *ref_arg) {
    ft_device d = ft_op_device(t);
    if (ft_device_eq(d, dev))
        return FT_OK;
    char have[24], want[24];
    return ft_fail(FT_ERR_DEVICE, "%s: %s is on %s, %s on %s; move them to one device", op, arg,
                   device_str(have, sizeof have, d), ref_arg, device_str(want, sizeof want, dev));
}

ft_status ft_check_float(const char *op, const char *arg, const ft_tensor *t, bool allow_low) {
    bool gpu = ft_op_device(t).type == FT_DEV_CUDA;
    if (t->dtype == FT_FLOAT32 || (allow_low && (t->dtype == FT_BFLOAT16 || (gpu && t->dtype == FT_FLOAT16))))
        return FT_OK;
    if (allow_low && t->dtype == FT_FLOAT16)
        return ft_fail(FT_ERR_DTYPE, "%s: %s is float16, which fasttrain computes in on CUDA only (the CPU has no "
                                     "float16 arithmetic): use bfloat16", op, arg);
    /* one message on both devices, as every check's (the GPU tests compare them) */
    return ft_fail(FT_ERR_DTYPE, "%s: %s must be %s, got %s", op, arg,
                   allow_low ? "float32 or bfloat16 (or float16 on CUDA)" : "float32", ft_dtype_get(t->dtype)->name);
}

ft_status ft_check_dtype_as(const char *op, const char *arg, const ft_tensor *t, const char *ref_arg,
                            const ft_tensor *ref) {
    if (t->dtype == ref->dtype)
        return FT_OK;
    return ft_fail(FT_ERR_DTYPE, "%s: %s must have the dtype of %s (%s), got %s", op, arg, ref_arg,
                   ft_dtype_get(ref->dtype)->name, ft_dtype_get(t->dtype)->name);
}

ft_status ft_check_shape(const char *op, const char *arg, const ft_tensor *t, int ndim, const int64_t *shape) {
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (ok)
        return FT_OK;
    char want[160], have[160];
    return ft_fail(FT_ERR_SHAPE, "%s: %s should have shape %s, got %s", op, arg,
                   ft_shape_str(want, sizeof want, ndim, shape), ft_shape_str(have, sizeof have, t->ndim, t->shape));
}

ft_status ft_check_ndim(const char *op, const char *arg, const ft_tensor *t, int ndim, const char *names) {
    if (t->ndim == ndim)
        return FT_OK;
    char have[160];
    return ft_fail(FT_ERR_SHAPE, "%s: %s should have %d dimensions %s, got shape %s", op, arg, ndim, names,
                   ft_shape_str(have, sizeof have, t->ndim, t->shape));
}

static int cmp_abs_stride(const void *a, const void *b) {
    const int64_t *x = a, *y = b; /* (|stride|, size) pairs */
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

ft_status ft_check_output(const char *op, const char *arg, const ft_tensor *t) {
    if (t->storage->readonly)
        return ft_fail(FT_ERR_READONLY, "%s: %s is read-only memory (it comes from a read-only array or DLPack "
                                        "capsule); clone() it to get a writable tensor",
                       op, arg);
    int64_t dims[FT_MAX_DIMS][2];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0)
            return FT_OK;
        if (t->shape[i] > 1)
            dims[n][0] = llabs(t->strides[i]), dims[n][1] = t->shape[i], n++;
    }
    qsort(dims, (size_t)n, sizeof dims[0], cmp_abs_stride);
    int64_t reach = 1; /* elements spanned by the dimensions so far */
    for (int i = 0; i < n; i++) {
        if (dims[i][0] < reach)
            return ft_fail(FT_ERR_VALUE, "%s: %s has elements that share memory (zero or overlapping strides); "
                                         "it cannot be written",
                           op, arg);
        reach = dims[i][0] * (dims[i][1] - 1) + reach;
    }
    return FT_OK;
}

/* [lo, hi): the addresses t's elements touch; false when t is empty. */
static bool extent(const ft_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t item = (int64_t)ft_dtype_get(t->dtype)->itemsize;
    *lo = *hi = (int64_t)(intptr_t)ft_tensor_data(t);
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0)
            return false;
        int64_t span = (t->shape[i] - 1) * t->strides[i] * item;
        if (span < 0)
            *lo += span;
        else
            *hi += span;
    }
    *hi += item;
    return true;
}

bool ft_same_view(const ft_tensor *a, const ft_tensor *b) {
    if (ft_tensor_data(a) != ft_tensor_data(b) || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->strides[i] != b->strides[i]))
            return false;
    return true;
}

/* t's layout with its dimensions ordered by stride, outermost first, and
 * those that tile their inner neighbour merged (heads of D columns, H of
 * them, are E = H D columns): the number of dimensions left. */
static int merged_layout(const ft_tensor *t, int64_t *shape, int64_t *strides) {
    int dims[FT_MAX_DIMS], n = 0, m = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1)
            dims[n++] = i;
    ft_sort_dims_by_stride(dims, n, t->shape, t->strides);
    for (int k = 0; k < n; k++) {
        int64_t size = t->shape[dims[k]], stride = t->strides[dims[k]];
        if (m > 0 && strides[m - 1] == stride * size) { /* the outer one tiles this one: one dimension */
            shape[m - 1] *= size;
            strides[m - 1] = stride;
        } else {
            shape[m] = size, strides[m] = stride, m++;
        }
    }
    return m;
}

/* Whether a and b are disjoint column ranges of the same rows: the same
 * layout of rows of R elements (every stride a multiple of R but the unit
 * stride of the columns) whose D columns do not meet modulo R (the q, k and
 * v of one packed (T, 3E) projection, wherever the rows start). */
static bool columns_apart(const ft_tensor *a, const ft_tensor *b) {
    int64_t sa[FT_MAX_DIMS], ta[FT_MAX_DIMS], sb[FT_MAX_DIMS], tb[FT_MAX_DIMS];
    int64_t item = (int64_t)ft_dtype_get(a->dtype)->itemsize;
    if (a->storage != b->storage || a->dtype != b->dtype || a->offset % item || b->offset % item)
        return false;
    int n = merged_layout(a, sa, ta);
    if (n < 2 || n != merged_layout(b, sb, tb) || ta[n - 1] != 1)
        return false;
    int64_t R = ta[n - 2], D = sa[n - 1];
    for (int k = 0; k < n; k++)
        if (sa[k] != sb[k] || ta[k] != tb[k] || ta[k] < 0 || (k < n - 1 && ta[k] % R))
            return false;
    int64_t d = ((b->offset - a->offset) / item % R + R) % R; /* b's first column, counted from a's */
    return d >= D && R - d >= D;
}

ft_status ft_check_alias(const char *op, const char *out_arg, const ft_tensor *out, const char *inp_arg,
                         const ft_tensor *inp) {
    int64_t alo, ahi, blo, bhi;
    if (!extent(out, &alo, &ahi) || !extent(inp, &blo, &bhi) || ahi <= blo || bhi <= alo || ft_same_view(out, inp) ||
        columns_apart(out, inp))
        return FT_OK;
    return ft_fail(FT_ERR_VALUE, "%s: %s partly overlaps %s in memory; pass the same tensor (in place) or "
                                 "separate memory",
                   op, out_arg, inp_arg);
}

ft_status ft_check_apart(const char *op, const char *out_arg, const ft_tensor *out, const char *inp_arg,
                         const ft_tensor *inp) {
    if (ft_tensor_numel(out) && ft_same_view(out, inp))
        return ft_fail(FT_ERR_VALUE, "%s: %s cannot be %s itself (the op reads elements after writing others); "
                                     "pass separate memory",
                       op, out_arg, inp_arg);
    return ft_check_alias(op, out_arg, out, inp_arg, inp);
}
