/* Bilinear resampling with antialiasing, bit for bit the algorithm of
 * Pillow's Image.resize (libImaging/Resample.c), which is what torchvision's
 * Resize and RandomResizedCrop run on PIL images:
 *
 *   - the filter is the triangle of half-width 1, stretched by the reduction
 *     factor when downscaling (that stretch is the antialiasing);
 *   - weights are computed in double, normalised to sum 1 per output pixel,
 *     then rounded to fixed point with 22 fractional bits;
 *   - two passes, horizontal first, each rounding to uint8 with the sum
 *     started at one half (round half up) and clipped to [0, 255].
 *
 * Legend: I = input size along the resampled axis, O = output size,
 * K = taps per output pixel (ft_resize_ksize). */
#ifndef FT_KERNELS_RESIZE_H
#define FT_KERNELS_RESIZE_H

#include <math.h>

#include "kernels/hd.h"

#define FT_RESIZE_PRECISION_BITS 22

static inline FT_HD double ft_bilinear_filter(double x) {
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Taps per output pixel when [in0, in1) of the input becomes out_size pixels. */
static inline FT_HD int ft_resize_ksize(double in0, double in1, int out_size) {
    double filterscale = (in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    return (int)ceil(filterscale) * 2 + 1;
}

/* Weights of output pixel `xx`: taps start at input index bounds[0] and there
 * are bounds[1] of them; kk (K) gets the fixed-point weights, zero past
 * bounds[1]. The box [in0, in1) may be fractional (Pillow's `box`); taps are
 * clamped to [0, in_size). */
static inline FT_HD void ft_resize_coeffs_at(int in_size, double in0, double in1, int out_size, int ksize, int xx,
                                              int *bounds /* (2) */, int32_t *kk /* (K) */) {
    double scale = (in1 - in0) / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 1.0 * filterscale, ss = 1.0 / filterscale;
    double center = in0 + (xx + 0.5) * scale, ww = 0.0;
    int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
    if (xmin < 0)
        xmin = 0;
    if (xmax > in_size)
        xmax = in_size;
    xmax -= xmin;
    if (xmax > ksize) /* cannot happen for valid inputs; keeps kk in bounds */
        xmax = ksize;
    if (xmax < 0)
        xmax = 0;
    /* Two sweeps, as Pillow: the sum of all weights first, then each weight
     * divided by it (dividing later matters for the last bit). */
    for (int x = 0; x < xmax; x++)
        ww += ft_bilinear_filter((x + xmin - center + 0.5) * ss);
    for (int x = 0; x < ksize; x++) {
        double k = 0.0;
        if (x < xmax) {
            k = ft_bilinear_filter((x + xmin - center + 0.5) * ss);
            if (ww != 0.0)
                k /= ww;
        }
        double fixed = k * (double)(1 << FT_RESIZE_PRECISION_BITS);
        kk[x] = (int32_t)(k < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    bounds[0] = xmin;
    bounds[1] = xmax;
}

/* A fixed-point sum back to a pixel value. */
static inline FT_HD uint8_t ft_resize_clip8(int32_t acc) {
    if (acc >= (1 << FT_RESIZE_PRECISION_BITS << 8))
        return 255;
    if (acc <= 0)
        return 0;
    return (uint8_t)(acc >> FT_RESIZE_PRECISION_BITS);
}

#define FT_RESIZE_ROUND_INIT (1 << (FT_RESIZE_PRECISION_BITS - 1))

#endif
