/* 2-d upsampling: nearest-neighbour by integer factors (PyTorch's
 * F.interpolate(mode="nearest") with an integer scale_factor), and bilinear
 * to any size.
 *
 * Legend: N batch, C channels, H W input size, P Q the output size (P = H sh
 * and Q = W sw for nearest). Tensors are 4-d (N, C, H, W) float32 in any
 * strides; the loops take the channels innermost when the output is
 * channels-last. Every element is computed by one thread in a fixed order,
 * so the results do not depend on the thread count. */
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

/* Bilinear resampling of images to the output's size, as PyTorch's
 * F.interpolate(mode="bilinear") (kernels/interp.h maps positions; a size
 * 1 height resamples (C, 1, L) sequences linearly). scale_h and scale_w are
 * the scale factors the user gave (0: none, the sizes' ratio is used); they
 * only move the sampling positions without align_corners. */
typedef struct {
    double scale_h, scale_w;
    bool align_corners;
} ft_bilinear2d_params;

/* out (N, C, P, Q)[n, c, p, q] = the input's four neighbours of (p, q),
 * weighted: l0h (l0w x[i0, j0] + l1w x[i0, j1]) + l1h (l0w x[i1, j0] +
 * l1w x[i1, j1]). */
ft_status ft_upsample_bilinear2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_bilinear2d_params *p);

/* dinp[n, c, h, w] = (or += with accumulate) the sum over the outputs p
 * that read row h, in order, of their row weight times the sum over the
 * outputs q that read column w of their column weight times dout[p, q]: a
 * gather, so every element is one thread's fixed sum. */
ft_status ft_upsample_bilinear2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_bilinear2d_params *p,
                                          bool accumulate);

#endif
