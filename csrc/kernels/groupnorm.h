/* The per-element arithmetic of group normalization, shared by the CPU loops
 * (ops/groupnorm.c) and the CUDA kernels (cuda/groupnorm.cu): given the same
 * statistics both give the same bits (nvcc compiles with --fmad=false). */
#ifndef FT_KERNELS_GROUPNORM_H
#define FT_KERNELS_GROUPNORM_H

#include "kernels/hd.h"

/* y = x * scale + shift is (x - mean) * rstd * w + b folded per channel:
 * one multiply and one add per element, as PyTorch's CPU kernel. */
static inline FT_HD float ft_gn_scale(float rstd, float w) { return rstd * w; }
static inline FT_HD float ft_gn_shift(float mean, float scale, float b) { return b - mean * scale; }
static inline FT_HD float ft_gn_apply(float x, float scale, float shift) { return x * scale + shift; }

/* The input gradient of one element: rstd (dy w - ma - xhat mc), with ma the
 * group's mean of dy w and mc its mean of dy w xhat. */
static inline FT_HD float ft_gn_dx(float dy, float x, float w, float mean, float rstd, float ma, float mc) {
    float xhat = (x - mean) * rstd;
    return rstd * (dy * w - ma - xhat * mc);
}

#endif
