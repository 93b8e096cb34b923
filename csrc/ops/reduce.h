/* Sums with a fixed reduction order, so that results are bitwise identical
 * for any thread count: per channel (bias gradients), and the
 * two directions of broadcasting. */
#ifndef FT_OPS_REDUCE_H
#define FT_OPS_REDUCE_H

#include "core/tensor.h"

/* db (C) = (or += with accumulate, ops/gradient.h) the sums of dout (N, C)
 * or (N, C, H, W), any layout, over every dimension but 1, in double and
 * rounded once to float32: the gradient of a bias. */
ft_status ft_bias_grad(const ft_tensor *db, const ft_tensor *dout, bool accumulate);

/* Broadcasting between out and inp of one rank whose sizes agree or are 1
 * in one of them (NumPy's rule once ranks agree); float32 or bfloat16, any
 * strides, on one device. Gradient rule (ops/gradient.h): out is written (=)
 * unless `accumulate`, then added to (+=).
 *
 * ft_sum_to: out = scale * inp summed over the dimensions where out has size
 * 1 and inp does not, in double and in C order (the gradient of a broadcast,
 * and sum/mean over dimensions).
 * ft_broadcast_to: out = scale * inp repeated along the dimensions where inp
 * has size 1 and out does not (a broadcast, and the gradient of a sum). */
ft_status ft_sum_to(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate);
ft_status ft_broadcast_to(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate);

#endif
