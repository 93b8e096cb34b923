/* The eager tensor math of python/fasttrain/_math.py on tensors of any
 * dtype but the complex ones (bool, the integers, 16-bit floats, float32,
 * float64) and any strides: elementwise ops over broadcast operands, and
 * reductions over any set of dimensions, computed in a dtype the caller
 * chooses (PyTorch's promoted one) with the per-element math of
 * kernels/math.h.
 *
 * _math.py calls these for CUDA tensors; CPU tensors keep computing with
 * NumPy there. The CPU loops here are the reference the CUDA kernels must
 * agree with, and the tests compare them with the NumPy path. */
#ifndef FT_OPS_MATH_H
#define FT_OPS_MATH_H

#include "core/tensor.h"
#include "kernels/math.h"

/* An operand: a tensor, or (t NULL) the scalar s. */
typedef struct {
    const ft_tensor *t;
    ft_scalar s;
} ft_math_arg;

/* The op named `name` (_C's spelling: "add", "floor_divide", ...), or
 * FT_ERR_VALUE. */
ft_status ft_math_op_of(const char *name, ft_math_op *op);
ft_status ft_red_op_of(const char *name, ft_red_op *op);

/* out = op(args[0..n)) elementwise, n the op's arity (where: condition, a,
 * b; clamp: x, min, max). Each tensor argument broadcasts to out's shape
 * (sizes aligned from the last dimension equal or 1) and is cast to
 * `compute` by the copies' rules; a scalar is cast to `compute`, or to
 * float32 when that is a 16-bit float (the CPU path rounds tensors, not
 * numbers, to 16 bits). out's dtype is bool for comparisons and `compute`
 * otherwise; out must not overlap an input. Integer division by zero gives
 * 0 here: the Python layer raises before. */
ft_status ft_math_pointwise(const ft_tensor *out, ft_math_op op, ft_dtype compute, const ft_math_arg *args, int n);

/* out = inp reduced over the dimensions where out has size 1 and inp not
 * (out has inp's number of dimensions, its other sizes inp's), each element
 * cast to `compute` first, the result stored in out's dtype:
 *   sum: in double for floats (one rounding to out's dtype), wrapping for
 *     integers; mean: that sum / count; var, std: two passes in double,
 *     divided by max(count - correction, 0) (compute must be float64, as the
 *     CPU path's); max, min: NaN wins; all, any: out bool or uint8.
 * indices (max and min only; NULL to skip): int64 of out's shape, the first
 * position of each extreme among its reduced elements in C order. max and
 * min of no elements are refused (FT_ERR_INDEX). */
ft_status ft_math_reduce(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp, ft_red_op op,
                         ft_dtype compute, double correction);

#endif
