/* Layer normalization (PyTorch's LayerNorm) over the last D elements of each
 * row, on fasttrain's own loops: each row is reduced by one thread in a fixed
 * order, so results do not depend on the thread count.
 *
 * Legend: R rows (every leading dimension), D the normalized size (the
 * product of normalized_shape). float32, contiguous rows. */
#ifndef FT_OPS_LAYERNORM_H
#define FT_OPS_LAYERNORM_H

#include "core/tensor.h"
#include "ops/gradient.h"

/* out (R, D) = (inp - mean) * rstd * weight (D) + bias (D); save_mean and
 * save_rstd (R) receive each row's statistics. weight and bias may be NULL.
 * The tensors may have any leading shape; D is `norm_size`. */
ft_status ft_layernorm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                               const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                               int64_t norm_size, double eps);

/* dinp (R, D), dweight (D), dbias (D): each may be NULL and is written (=),
 * or added to (+=) as `acc` says (ops/gradient.h). */
ft_status ft_layernorm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *weight,
                                const ft_tensor *save_mean, const ft_tensor *save_rstd, int64_t norm_size,
                                ft_grad_acc acc);

#endif
