/* The arithmetic of batch, layer and group normalization around their
 * sums, shared by the CPU loops (ops/batchnorm.c, ops/layernorm.c,
 * ops/groupnorm.c) and the CUDA kernels (cuda/norm.cu, cuda/groupnorm.cu):
 * given the same sums both give the same bits (nvcc compiles with
 * --fmad=false, the CPU loops never contract).
 *
 * Legend: n the values a statistic is taken over; mean and rstd (batch
 * norm's invstd) the float statistics; w, b the affine weight and bias (1
 * and 0 without); xhat = (x - mean) rstd. */
#ifndef FT_KERNELS_NORM_H
#define FT_KERNELS_NORM_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/hd.h"

/* ---- statistics ---- */

static inline FT_HD float ft_norm_rstd(double var, double eps) { return (float)(1.0 / sqrt(var + eps)); }

/* *mean and *rstd from the sums of x - shift and of its square over n values
 * (shifted by one of the values, in double: the variance stays accurate for
 * a large mean); returns the biased variance. A variance rounded below 0 is
 * 0; a NaN stays NaN. */
static inline FT_HD double ft_norm_stats(double sum, double sumsq, double n, double shift, double eps, float *mean,
                                         float *rstd) {
    double m = sum / n, var = sumsq / n - m * m;
    var = var < 0 ? 0 : var;
    *mean = (float)(shift + m);
    *rstd = ft_norm_rstd(var, eps);
    return var;
}

/* Batch norm's running statistics (torch's update: the running variance
 * takes the unbiased variance of the M values). */
static inline FT_HD void ft_bn_running(float *running_mean, float *running_var, float mean, double var, int64_t M,
                                       double momentum) {
    *running_mean = (float)((1 - momentum) * *running_mean + momentum * mean);
    *running_var = (float)((1 - momentum) * *running_var + momentum * var * (double)M / (double)(M - 1));
}

/* ---- normalize ---- */

static inline FT_HD float ft_norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

/* Batch and group norm fold the affine per channel, y = x * scale + shift
 * = (x - mean) rstd w + b: one multiply and one add per element, as
 * PyTorch's CPU kernels. */
static inline FT_HD float ft_norm_scale(float rstd, float w) { return rstd * w; }
static inline FT_HD float ft_norm_shift(float mean, float scale, float b) { return b - mean * scale; }
static inline FT_HD float ft_norm_apply(float x, float scale, float shift) { return x * scale + shift; }

/* Layer norm's weight and bias differ per element: y = xhat w + b. */
static inline FT_HD float ft_ln_value(float x, float mean, float rstd, float w, float b) {
    return ft_norm_xhat(x, mean, rstd) * w + b;
}

/* ---- backward ---- */

/* The input gradient of layer and group norm: rstd (dy w - ma - xhat mc),
 * with ma the mean of dy w over the normalized values and mc that of
 * dy w xhat. */
static inline FT_HD float ft_norm_dx(float dy, float w, float xhat, float rstd, float ma, float mc) {
    return rstd * (dy * w - ma - xhat * mc);
}

/* Batch norm's gradients of one channel from its sums, over its M values,
 * of dz (dy through a fused activation) and of dz (x - mean): the parameter
 * gradients, and the factors of dx = k0 (dz - k1 - (x - mean) k2). In eval
 * the statistics are constants: k1 = k2 = 0. */
typedef struct {
    float dweight, dbias;
    float k0, k1, k2;
} ft_bn_grad;

static inline FT_HD ft_bn_grad ft_bn_grads(double sum_dz, double sum_dz_xc, float w, float invstd, int64_t M,
                                           bool training) {
    ft_bn_grad g;
    g.dweight = (float)(sum_dz_xc * invstd);
    g.dbias = (float)sum_dz;
    g.k0 = ft_norm_scale(invstd, w);
    g.k1 = training ? (float)(sum_dz / (double)M) : 0.0f;
    g.k2 = training ? (float)(sum_dz_xc / (double)M * invstd * invstd) : 0.0f;
    return g;
}

static inline FT_HD float ft_bn_dx(float dz, float x, float mean, float k0, float k1, float k2) {
    return k0 * (dz - k1 - (x - mean) * k2);
}

#endif
