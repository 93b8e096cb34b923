/* Argument checks shared by the op entry points. Every message names the op
 * and the argument and, for shapes, the expected and the actual shape:
 * "max_pool2d_backward: dout should have shape (8, 3, 4, 4), got (8, 3, 5, 5)". */
#ifndef FT_OPS_CHECK_H
#define FT_OPS_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "core/tensor.h"

/* "(2, 3, 4)" written into buf (truncated to n bytes). */
const char *ft_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

/* The device an op on t runs on: t's, with page-locked host memory counted
 * as the CPU. */
static inline ft_device ft_op_device(const ft_tensor *t) {
    ft_device d = ft_tensor_device(t);
    return d.type == FT_DEV_CUDA ? d : FT_CPU;
}

/* FT_ERR_DEVICE unless t is on dev, the device of the op's first argument
 * `ref_arg`: "<op>: <arg> is on cpu, <ref_arg> on cuda:0; move them to one device". */
ft_status ft_check_on(const char *op, const char *arg, const ft_tensor *t, ft_device dev, const char *ref_arg);

/* FT_ERR_DTYPE unless t is float32, or with allow_low a 16-bit float:
 * bfloat16, or on CUDA float16 (the CPU has no float16 arithmetic). */
ft_status ft_check_float(const char *op, const char *arg, const ft_tensor *t, bool allow_low);

/* FT_ERR_DTYPE unless t has ref's dtype. */
ft_status ft_check_dtype_as(const char *op, const char *arg, const ft_tensor *t, const char *ref_arg,
                            const ft_tensor *ref);

/* FT_ERR_SHAPE unless t has exactly this shape. */
ft_status ft_check_shape(const char *op, const char *arg, const ft_tensor *t, int ndim, const int64_t *shape);
static inline ft_status ft_check_shape_as(const char *op, const char *arg, const ft_tensor *t,
                                          const ft_tensor *ref) {
    return ft_check_shape(op, arg, t, ref->ndim, ref->shape);
}

/* FT_ERR_SHAPE unless t has ndim dimensions; `names` (e.g. "(N, C, H, W)")
 * goes into the message. */
ft_status ft_check_ndim(const char *op, const char *arg, const ft_tensor *t, int ndim, const char *names);

/* For tensors an op writes: FT_ERR_READONLY for read-only memory and
 * FT_ERR_VALUE when two of its elements may share memory (a zero stride over
 * more than one element, or interleaved strides). */
ft_status ft_check_output(const char *op, const char *arg, const ft_tensor *t);

/* FT_ERR_VALUE when output `out` partly overlaps input `inp`: they must be
 * disjoint (in memory, or as separate column ranges of the same rows) or the
 * very same view (an in-place op). */
ft_status ft_check_alias(const char *op, const char *out_arg, const ft_tensor *out, const char *inp_arg,
                         const ft_tensor *inp);

/* FT_ERR_VALUE when output `out` shares any memory with input `inp`, itself
 * included: for ops that read other elements than the one they write
 * (resampling, transposed convolution), which cannot run in place. */
ft_status ft_check_apart(const char *op, const char *out_arg, const ft_tensor *out, const char *inp_arg,
                         const ft_tensor *inp);

/* True when a and b are the same elements in the same order (same memory,
 * dtype, shape and strides). */
bool ft_same_view(const ft_tensor *a, const ft_tensor *b);

/* The common first checks of an op: on dev (that of ref_arg) and a float dtype. */
static inline ft_status ft_check_float_on(const char *op, const char *arg, const ft_tensor *t, ft_device dev,
                                          const char *ref_arg, bool allow_low) {
    FT_TRY(ft_check_on(op, arg, t, dev, ref_arg));
    return ft_check_float(op, arg, t, allow_low);
}

/* FT_OK for NULL or a contiguous float32 vector of n elements on dev (a
 * norm's weight, bias or saved statistics). */
static inline ft_status ft_check_vector(const char *op, const char *arg, const ft_tensor *t, int64_t n,
                                        ft_device dev) {
    if (!t)
        return FT_OK;
    FT_TRY(ft_check_float_on(op, arg, t, dev, "input", false));
    if (ft_tensor_numel(t) != n || !ft_tensor_is_contiguous(t))
        return ft_fail(FT_ERR_SHAPE, "%s: %s must be contiguous with %lld elements", op, arg, (long long)n);
    return FT_OK;
}

#endif
