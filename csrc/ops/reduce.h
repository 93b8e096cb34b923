/* Per-channel sums with a fixed reduction order, so that results are
 * bitwise identical for any thread count. */
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

#endif
