#include "core/tensor.h"

#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"

ft_status ft_shape_numel(int64_t *numel, int ndim, const int64_t *shape, size_t itemsize) {
    if (ndim < 0 || ndim > FT_MAX_DIMS)
        return ft_fail(FT_ERR_VALUE, "a tensor has at most %d dimensions, got %d", FT_MAX_DIMS, ndim);
    int64_t n = 1;
    bool overflow = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return ft_fail(FT_ERR_VALUE, "negative dimension %lld in a shape", (long long)shape[i]);
        overflow |= __builtin_mul_overflow(n, shape[i], &n);
    }
    int64_t bytes;
    if (!overflow)
        overflow = __builtin_mul_overflow(n, (int64_t)itemsize, &bytes);
    /* A zero-size dimension makes every other size harmless. */
    for (int i = 0; i < ndim && overflow; i++)
        if (shape[i] == 0)
            overflow = false, n = 0;
    if (overflow)
        return ft_fail(FT_ERR_OVERFLOW, "a tensor of this shape would hold more than 2**63 bytes");
    *numel = n;
    return FT_OK;
}

int64_t ft_tensor_numel(const ft_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return 0;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

void ft_contiguous_strides(int64_t *strides, int ndim, const int64_t *shape) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        /* Only a tensor with a zero dimension can overflow here, and its
         * strides address nothing. */
        if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s))
            s = 0;
    }
}

/* Dense with strides growing from the last dimension (C order) or from the
 * first (Fortran order); size-1 dimensions may have any stride. */
static bool dense_in_order(const ft_tensor *t, bool fortran) {
    int64_t expected = 1;
    for (int k = 0; k < t->ndim; k++) {
        int i = fortran ? k : t->ndim - 1 - k;
        if (t->shape[i] == 0)
            return true;
        if (t->shape[i] != 1 && t->strides[i] != expected)
            return false;
        expected *= t->shape[i];
    }
    return true;
}

bool ft_tensor_is_contiguous(const ft_tensor *t) { return dense_in_order(t, false); }

bool ft_tensor_is_f_contiguous(const ft_tensor *t) { return dense_in_order(t, true); }

ft_status ft_tensor_empty(ft_tensor *out, int ndim, const int64_t *shape, ft_dtype dtype, ft_device device,
                          bool pinned) {
    int64_t numel;
    size_t itemsize = ft_dtype_get(dtype)->itemsize;
    FT_TRY(ft_shape_numel(&numel, ndim, shape, itemsize));
    if (device.type == FT_DEV_CUDA)
        FT_TRY(ft_cuda_check_device(device.index));
    ft_storage *s;
    FT_TRY(ft_storage_new(&s, (size_t)numel * itemsize, device, pinned));
    memset(out, 0, sizeof *out);
    out->storage = s;
    out->dtype = dtype;
    out->ndim = ndim;
    if (ndim)
        memcpy(out->shape, shape, (size_t)ndim * sizeof *shape);
    ft_contiguous_strides(out->strides, ndim, shape);
    return FT_OK;
}

ft_status ft_tensor_empty_like(ft_tensor *out, const ft_tensor *ref, int ndim, const int64_t *shape, ft_dtype dtype,
                               ft_device device) {
    int perm[FT_MAX_DIMS]; /* dims outermost first */
    int64_t pshape[FT_MAX_DIMS] = {0};
    for (int d = 0; d < ndim; d++)
        if (ref->shape[d] > 1 && ref->strides[d] == 0) /* expanded: no layout to follow, as PyTorch's empty_like */
            return ft_tensor_empty(out, ndim, shape, dtype, device, false);
    for (int d = 0; d < ndim; d++)
        perm[d] = d;
    ft_sort_dims_by_stride(perm, ndim, ref->shape, ref->strides);
    for (int k = 0; k < ndim; k++)
        pshape[k] = shape[perm[k]];
    FT_TRY(ft_tensor_empty(out, ndim, pshape, dtype, device, false));
    int64_t cstr[FT_MAX_DIMS];
    memcpy(cstr, out->strides, sizeof cstr);
    for (int k = 0; k < ndim; k++) {
        out->shape[perm[k]] = pshape[k];
        out->strides[perm[k]] = cstr[k];
    }
    return FT_OK;
}

/* The byte range [lo, hi) that a non-empty view touches, relative to the
 * storage; false when it does not fit in int64. */
static bool byte_extent(const ft_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t itemsize = (int64_t)ft_dtype_get(t->dtype)->itemsize, neg = 0, pos = 0, span;
    for (int i = 0; i < t->ndim; i++) {
        if (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &span) ||
            __builtin_add_overflow(span < 0 ? neg : pos, span, span < 0 ? &neg : &pos))
            return false;
    }
    return !__builtin_mul_overflow(neg, itemsize, &neg) && !__builtin_mul_overflow(pos, itemsize, &pos) &&
           !__builtin_add_overflow(pos, itemsize, &pos) && !__builtin_add_overflow(t->offset, neg, lo) &&
           !__builtin_add_overflow(t->offset, pos, hi);
}

ft_status ft_tensor_view(ft_tensor *out, const ft_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset) {
    int64_t numel;
    FT_TRY(ft_shape_numel(&numel, ndim, shape, ft_dtype_get(base->dtype)->itemsize));
    ft_tensor v = {.storage = base->storage, .offset = offset, .dtype = base->dtype, .ndim = ndim};
    if (ndim) {
        memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(v.strides, strides, (size_t)ndim * sizeof *strides);
    }
    int64_t lo, hi;
    if (numel > 0 && !(byte_extent(&v, &lo, &hi) && lo >= 0 && hi <= (int64_t)base->storage->nbytes))
        return ft_fail(FT_ERR_SHAPE, "the view's strides and offset reach outside its storage of %zu bytes",
                       base->storage->nbytes);
    ft_storage_retain(v.storage);
    *out = v;
    return FT_OK;
}

ft_status ft_tensor_borrow(ft_tensor *out, void *data, int ndim, const int64_t *shape, const int64_t *strides,
                           ft_dtype dtype, ft_device device, bool readonly, void (*release)(void *owner),
                           void *owner) {
    int64_t numel, lo = 0, hi = 0;
    FT_TRY(ft_shape_numel(&numel, ndim, shape, ft_dtype_get(dtype)->itemsize));
    ft_tensor v = {.dtype = dtype, .ndim = ndim};
    if (ndim) {
        memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(v.strides, strides, (size_t)ndim * sizeof *strides);
    }
    if (numel > 0 && !byte_extent(&v, &lo, &hi))
        return ft_fail(FT_ERR_SHAPE, "strides reach beyond the 64-bit address space");
    v.offset = -lo;
    FT_TRY(ft_storage_borrow(&v.storage, (char *)data + lo, (size_t)(hi - lo), device, readonly, release, owner));
    *out = v;
    return FT_OK;
}

void ft_tensor_share(ft_tensor *out, const ft_tensor *t) {
    *out = *t;
    ft_storage_retain(out->storage);
}

void ft_tensor_release(ft_tensor *t) {
    ft_storage_release(t->storage);
    t->storage = NULL;
}

ft_status ft_tensor_check_writable(const ft_tensor *t, const char *what) {
    if (t->storage->readonly)
        return ft_fail(FT_ERR_READONLY,
                       "%s: the tensor's memory is read-only (it comes from a read-only array or DLPack "
                       "capsule); clone() it to get a writable copy",
                       what);
    return FT_OK;
}

/* Whether two views on one device may touch the same bytes; views of one
 * array can come through different storages (two from_numpy slices), so
 * compare addresses, not storages. */
static bool overlaps(const ft_tensor *a, const ft_tensor *b) {
    int64_t alo, ahi, blo, bhi;
    if (!byte_extent(a, &alo, &ahi) || !byte_extent(b, &blo, &bhi))
        return true;
    uintptr_t a0 = (uintptr_t)a->storage->data, b0 = (uintptr_t)b->storage->data;
    return a0 + (uintptr_t)alo < b0 + (uintptr_t)bhi && b0 + (uintptr_t)blo < a0 + (uintptr_t)ahi;
}

static ft_copy_desc describe(const ft_tensor *dst, const ft_tensor *src) {
    ft_copy_desc d = {.ndim = dst->ndim, .dst = ft_tensor_data(dst), .src = ft_tensor_data(src),
                      .dst_dtype = dst->dtype, .src_dtype = src->dtype};
    memcpy(d.shape, dst->shape, sizeof d.shape);
    memcpy(d.dst_strides, dst->strides, sizeof d.dst_strides);
    memcpy(d.src_strides, src->strides, sizeof d.src_strides);
    return d;
}

static bool on_host(const ft_tensor *t) { return t->storage->device.type != FT_DEV_CUDA; }

/* Copies between devices: whole contiguous same-dtype buffers move with one
 * memcpy; anything else is first made so on the side where it is cheapest. */
static ft_status copy_across(const ft_tensor *dst, const ft_tensor *src, bool non_blocking) {
    const ft_cuda_api *cuda = ft_cuda();
    if (!cuda)
        return ft_fail(FT_ERR_DEVICE, "CUDA is not available: %s", ft_cuda_unavailable_reason());
    ft_device sdev = ft_tensor_device(src), ddev = ft_tensor_device(dst);
    if (!on_host(src) && !on_host(dst) && ft_device_eq(sdev, ddev)) {
        ft_copy_desc d = describe(dst, src);
        return cuda->copy_strided(&d, ddev.index, NULL);
    }
    bool broadcast = false;
    for (int k = 0; k < src->ndim; k++)
        broadcast |= src->strides[k] == 0 && src->shape[k] > 1;
    if (broadcast && on_host(src) && !on_host(dst)) {
        /* fill_ and expanded views: only the distinct elements cross, and
         * the device spreads them */
        ft_tensor compact = *src, crossed;
        for (int k = 0; k < src->ndim; k++)
            if (src->strides[k] == 0)
                compact.shape[k] = 1;
        FT_TRY(ft_tensor_to(&crossed, &compact, src->dtype, ddev, false, false, false));
        ft_tensor spread = crossed;
        for (int k = 0; k < src->ndim; k++)
            if (src->strides[k] == 0) {
                spread.shape[k] = src->shape[k];
                spread.strides[k] = 0;
            }
        ft_copy_desc d = describe(dst, &spread);
        ft_status st = cuda->copy_strided(&d, ddev.index, NULL);
        ft_tensor_release(&crossed);
        return st;
    }
    ft_tensor s_buf = {0}, d_buf = {0};
    ft_status st = FT_OK;
    const ft_tensor *s = src, *d = dst;
    if (!ft_tensor_is_contiguous(src)) {
        st = ft_tensor_to(&s_buf, src, src->dtype, sdev, false, false, false);
        s = &s_buf;
    }
    if (st == FT_OK && (!ft_tensor_is_contiguous(dst) || dst->dtype != src->dtype)) {
        st = ft_tensor_empty(&d_buf, dst->ndim, dst->shape, src->dtype, ddev, false);
        d = &d_buf;
    }
    if (st == FT_OK) {
        int dev = on_host(d) ? sdev.index : ddev.index;
        size_t nbytes = (size_t)ft_tensor_numel(d) * ft_dtype_get(d->dtype)->itemsize;
        bool async = non_blocking && d == dst && s == src && src->storage->pinned | dst->storage->pinned;
        st = async ? ft_cuda_copy_async(ft_tensor_data(d), ft_tensor_data(s), nbytes, dev)
                   : cuda->memcpy(ft_tensor_data(d), ft_tensor_data(s), nbytes, dev, NULL);
    }
    if (st == FT_OK && d != dst)
        st = ft_tensor_copy(dst, d, false);
    if (s_buf.storage)
        ft_tensor_release(&s_buf);
    if (d_buf.storage)
        ft_tensor_release(&d_buf);
    return st;
}

ft_status ft_tensor_copy(const ft_tensor *dst, const ft_tensor *src, bool non_blocking) {
    if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, (size_t)dst->ndim * sizeof *dst->shape) != 0)
        return ft_fail(FT_ERR_SHAPE, "copy between different shapes");
    FT_TRY(ft_copy_check_dtypes(dst->dtype, src->dtype));
    FT_TRY(ft_tensor_check_writable(dst, "copy_"));
    if (ft_tensor_numel(dst) == 0)
        return FT_OK;
    ft_device sdev = ft_tensor_device(src);
    if (ft_device_eq(sdev, ft_tensor_device(dst)) && overlaps(dst, src)) {
        /* elements would be read after being written (x[1:].copy_(x[:-1])): through a copy of src */
        ft_tensor tmp;
        FT_TRY(ft_tensor_to(&tmp, src, src->dtype, sdev, false, false, false));
        ft_status st = ft_tensor_copy(dst, &tmp, false);
        ft_tensor_release(&tmp);
        return st;
    }
    if (!on_host(src) || !on_host(dst))
        return copy_across(dst, src, non_blocking);
    ft_copy_desc d = describe(dst, src);
    ft_copy_cpu(&d);
    return FT_OK;
}

ft_status ft_tensor_fill(const ft_tensor *dst, ft_scalar v) {
    /* The scalar, converted once to dst's dtype (the copy then converts nothing), as a tensor whose zero strides
     * broadcast it to dst's shape. */
    FT_TRY(ft_copy_check_dtypes(dst->dtype, v.kind == FT_SCALAR_FLOAT ? FT_FLOAT64 : FT_INT64));
    _Alignas(16) unsigned char value[16] = {0};
    ft_store_scalar(value, dst->dtype, v);
    ft_storage *s;
    FT_TRY(ft_storage_borrow(&s, value, sizeof value, FT_CPU, true, ft_storage_unowned, NULL));
    ft_tensor src = {.storage = s, .dtype = dst->dtype, .ndim = dst->ndim};
    memcpy(src.shape, dst->shape, sizeof src.shape);
    ft_status st = ft_tensor_copy(dst, &src, false);
    ft_storage_release(s);
    return st;
}

ft_status ft_tensor_zero(const ft_tensor *dst) {
    return ft_tensor_fill(dst, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0});
}

ft_status ft_tensor_to(ft_tensor *out, const ft_tensor *t, ft_dtype dtype, ft_device device, bool pinned,
                       bool non_blocking, bool keep_layout) {
    FT_TRY(ft_copy_check_dtypes(dtype, t->dtype));
    FT_TRY(keep_layout ? ft_tensor_empty_like(out, t, t->ndim, t->shape, dtype, device)
                       : ft_tensor_empty(out, t->ndim, t->shape, dtype, device, pinned));
    ft_status st = ft_tensor_copy(out, t, non_blocking);
    if (st != FT_OK)
        ft_tensor_release(out);
    return st;
}

ft_status ft_tensor_on_host(ft_tensor *out, const ft_tensor *t, ft_dtype dtype) {
    if (on_host(t) && t->dtype == dtype && ft_tensor_is_contiguous(t)) {
        ft_tensor_share(out, t);
        return FT_OK;
    }
    return ft_tensor_to(out, t, dtype, FT_CPU, false, false, false);
}
