/* Tensors: a strided view of a storage.
 *
 * NumPy dimension order; shape and strides are int64 and strides count
 * elements (the DLPack convention) and may be zero or negative; `offset` is
 * the byte distance from the storage's data to element (0, ..., 0). */
#ifndef FT_CORE_TENSOR_H
#define FT_CORE_TENSOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/copy.h"
#include "core/dtype.h"
#include "core/storage.h"

typedef struct {
    ft_storage *storage; /* one owned reference */
    int64_t offset;      /* bytes */
    ft_dtype dtype;
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    int64_t strides[FT_MAX_DIMS]; /* elements */
} ft_tensor;

static inline char *ft_tensor_data(const ft_tensor *t) { return (char *)t->storage->data + t->offset; }
static inline ft_device ft_tensor_device(const ft_tensor *t) { return t->storage->device; }

/* The element count of `shape`, or FT_ERR_VALUE for a negative size and
 * FT_ERR_OVERFLOW when the count times `itemsize` does not fit in int64. */
ft_status ft_shape_numel(int64_t *numel, int ndim, const int64_t *shape, size_t itemsize);
int64_t ft_tensor_numel(const ft_tensor *t);
bool ft_tensor_is_contiguous(const ft_tensor *t);
bool ft_tensor_is_f_contiguous(const ft_tensor *t); /* Fortran order */

/* Fills strides for a C-contiguous layout of `shape`. */
void ft_contiguous_strides(int64_t *strides, int ndim, const int64_t *shape);

/* Sorts the n dimensions listed in dims from the outermost in memory (the
 * largest |stride|) to the innermost, keeping ties in their order: the one
 * way layouts are read from strides (NCHW, NHWC, transposed views). A
 * size-1 dimension's stride says nothing of the order: it goes inside the
 * dimensions of the same stride, so that (N, 1, H, W) with strides
 * (HW, 1, W, 1) reads as channels-last and with (HW, HW, W, 1) as NCHW, as
 * in PyTorch. */
static inline bool ft_dim_outside(const int64_t *shape, const int64_t *strides, int a, int b) {
    uint64_t sa = strides[a] < 0 ? -(uint64_t)strides[a] : (uint64_t)strides[a];
    uint64_t sb = strides[b] < 0 ? -(uint64_t)strides[b] : (uint64_t)strides[b];
    return sa != sb ? sa > sb : shape[a] != 1 && shape[b] == 1;
}

static inline void ft_sort_dims_by_stride(int *dims, int n, const int64_t *shape, const int64_t *strides) {
    for (int i = 1; i < n; i++) {
        int d = dims[i], j = i;
        while (j > 0 && ft_dim_outside(shape, strides, d, dims[j - 1])) {
            dims[j] = dims[j - 1];
            j--;
        }
        dims[j] = d;
    }
}

/* A new, uninitialised, C-contiguous tensor. */
ft_status ft_tensor_empty(ft_tensor *out, int ndim, const int64_t *shape, ft_dtype dtype, ft_device device,
                          bool pinned);

/* A new, uninitialised, dense tensor of `shape` and `dtype` on `device`
 * whose dimensions lie in memory in the order of ref's (ref has ndim
 * dimensions): NCHW stays NCHW, channels-last stays channels-last; an
 * expanded ref (a stride 0) gives a C-contiguous one. */
ft_status ft_tensor_empty_like(ft_tensor *out, const ft_tensor *ref, int ndim, const int64_t *shape, ft_dtype dtype,
                               ft_device device);

/* A view of base's storage; every element it addresses must lie inside it. */
ft_status ft_tensor_view(ft_tensor *out, const ft_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset);

/* A tensor over foreign memory whose element (0, ..., 0) is at `data`; the
 * storage spans exactly the bytes the strides reach. On failure nothing is
 * taken: the caller still owns `owner`. */
ft_status ft_tensor_borrow(ft_tensor *out, void *data, int ndim, const int64_t *shape, const int64_t *strides,
                           ft_dtype dtype, ft_device device, bool readonly, void (*release)(void *owner),
                           void *owner);

/* A second reference to the same view. */
void ft_tensor_share(ft_tensor *out, const ft_tensor *t);
void ft_tensor_release(ft_tensor *t);

/* FT_ERR_READONLY naming `what` when t's memory may not be written. */
ft_status ft_tensor_check_writable(const ft_tensor *t, const char *what);

/* dst[...] = src[...] for equal shapes (broadcast by giving src zero
 * strides), converting dtype, between any two devices. Overlapping memory is
 * handled as if src were read completely first. With non_blocking, copies
 * between page-locked host memory and a device are queued on the device's
 * copy stream and ordered before later work on its compute stream. */
ft_status ft_tensor_copy(const ft_tensor *dst, const ft_tensor *src, bool non_blocking);

/* Every element of dst = v converted to dst's dtype. */
ft_status ft_tensor_fill(const ft_tensor *dst, ft_scalar v);

/* dst = 0: ft_tensor_fill's zero, where a gradient gets nothing. */
ft_status ft_tensor_zero(const ft_tensor *dst);

/* A copy of t with the given dtype, device and pinning: C-contiguous, or
 * with keep_layout (not pinned) dense in the order of t's dimensions, as
 * PyTorch's preserve_format (a channels-last t stays channels-last). */
ft_status ft_tensor_to(ft_tensor *out, const ft_tensor *t, ft_dtype dtype, ft_device device, bool pinned,
                       bool non_blocking, bool keep_layout);

/* t as a contiguous CPU tensor of `dtype` to read on the host: t itself
 * when it is one, else a copy (which waits for a device). The caller
 * releases *out. */
ft_status ft_tensor_on_host(ft_tensor *out, const ft_tensor *t, ft_dtype dtype);

#endif
