/* Group normalization (PyTorch's F.group_norm): the C channels of each sample
 * fall into G groups of C / G, and each (sample, group) is normalized by its
 * own mean and biased variance, then scaled and shifted per channel.
 *
 * Legend: N batch, C channels, S the spatial size (the product of the
 * dimensions after C; 1 for (N, C)), G groups, Cg = C / G.
 * float32. inp is (N, C, *) contiguous, or 4-d (N, C, H, W) channels-last
 * (NHWC strides); out, dout and dinp have inp's shape and strides. Each
 * (n, g) is reduced by one thread in a fixed order, and the parameter
 * gradients are summed over n in order, so results do not depend on the
 * thread count. */
#ifndef FT_OPS_GROUPNORM_H
#define FT_OPS_GROUPNORM_H

#include "core/tensor.h"
#include "ops/gradient.h"

/* out (N, C, *) = (inp - mean) * rstd * weight (C) + bias (C) per group;
 * save_mean and save_rstd (N, G) receive the statistics (each may be NULL,
 * as may weight and bias). */
ft_status ft_group_norm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                                const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                                int64_t groups, double eps);

/* dinp (N, C, *), dweight (C), dbias (C): each may be NULL and is written
 * (=), or added to (+=) as `acc` says (ops/gradient.h). dinp may be dout
 * itself (written in place) unless it accumulates. */
ft_status ft_group_norm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                 const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *save_mean,
                                 const ft_tensor *save_rstd, const ft_tensor *weight, int64_t groups,
                                 ft_grad_acc acc);

#endif
