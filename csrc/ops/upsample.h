/* Nearest-neighbour 2-d upsampling by integer factors (PyTorch's
 * F.interpolate(mode="nearest") with an integer scale_factor).
 *
 * Legend: N batch, C channels, H W input size, P = H sh, Q = W sw the output
 * size. Tensors are 4-d (N, C, H, W) float32 in any strides; the loops take
 * the channels innermost when the output is channels-last. Every element is
 * computed by one thread in a fixed order, so the results do not depend on
 * the thread count. */
#ifndef FT_OPS_UPSAMPLE_H
#define FT_OPS_UPSAMPLE_H

#include <stdbool.h>

#include "core/tensor.h"

/* out (N, C, P, Q)[n, c, i, j] = inp (N, C, H, W)[n, c, i / sh, j / sw]. */
ft_status ft_upsample_nearest2d_forward(const ft_tensor *out, const ft_tensor *inp, int64_t scale_h,
                                        int64_t scale_w);

/* dinp (N, C, H, W)[n, c, h, w] = (or += with accumulate) the sum of the
 * sh x sw block of dout (N, C, P, Q) it was copied to, rows then columns. */
ft_status ft_upsample_nearest2d_backward(const ft_tensor *dinp, const ft_tensor *dout, int64_t scale_h,
                                         int64_t scale_w, bool accumulate);

#endif
