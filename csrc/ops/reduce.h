/* Sums with a fixed reduction order, so that results are bitwise identical
 * for any thread count: per channel (batch norm, bias gradients), and the
 * two directions of broadcasting. */
#ifndef FT_OPS_REDUCE_H
#define FT_OPS_REDUCE_H

#include "core/tensor.h"

/* sums[c] = sum of t over every dimension but 1, for t of 2 (N, C) or 4
 * (N, C, H, W) dimensions in any layout; float32 or bfloat16; accumulated in
 * double. With `sq`, sq[c] = the sum of squares of (t - shift[c]) and sums is
 * of (t - shift[c]) too (shift may be NULL for zero). */
ft_status ft_channel_sums(double *sums, double *sq, const float *shift, const ft_tensor *t);

/* db (C) = (or += with accumulate, ops/gradient.h) the channel sums of dout
 * as float32: the gradient of a bias. */
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
