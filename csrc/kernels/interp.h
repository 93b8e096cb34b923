/* Linear interpolation along one axis, as PyTorch's upsample_bilinear2d
 * maps output positions to input positions (ATen's
 * area_pixel_compute_source_index and guard_index_and_lambda), in float:
 *
 *   src = align_corners ? scale p : max(scale (p + 0.5) - 0.5, 0)
 *   i0 = min(floor(src), I - 1), i1 = min(i0 + 1, I - 1)
 *   l1 = clamp(src - i0, 0, 1), l0 = 1 - l1
 *
 * Legend: I = input size along the axis, O = output size, p an output
 * index. The CPU loops and the CUDA kernels both call these, so the two
 * devices compute the same bits. */
#ifndef FT_KERNELS_INTERP_H
#define FT_KERNELS_INTERP_H

#include <math.h>
#include <stdbool.h>

#include "kernels/hd.h"

typedef struct {
    int64_t i0, i1;
    float l0, l1;
} ft_lerp_tap;

/* The source coordinate's step: with align_corners, (I - 1) / (O - 1);
 * else 1 / scale_factor where the user gave one (> 0), as PyTorch keeps
 * it, and I / O otherwise. */
static inline FT_HD float ft_lerp_scale(int64_t in, int64_t out, double scale_factor, bool align_corners) {
    if (align_corners)
        return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    return scale_factor > 0.0 ? (float)(1.0 / scale_factor) : (float)in / (float)out;
}

static inline FT_HD ft_lerp_tap ft_lerp_at(int64_t p, int64_t in, float scale, bool align_corners) {
    float src = align_corners ? scale * (float)p : scale * ((float)p + 0.5f) - 0.5f;
    if (src < 0.0f)
        src = 0.0f;
    ft_lerp_tap t;
    t.i0 = (int64_t)floorf(src);
    if (t.i0 > in - 1)
        t.i0 = in - 1;
    t.i1 = t.i0 < in - 1 ? t.i0 + 1 : t.i0;
    float l1 = src - (float)t.i0;
    t.l1 = l1 < 0.0f ? 0.0f : l1 > 1.0f ? 1.0f : l1;
    t.l0 = 1.0f - t.l1;
    return t;
}

/* The weight with which output p reads input i (0 where it does not). */
static inline FT_HD float ft_lerp_weight(ft_lerp_tap t, int64_t i) {
    return (t.i0 == i ? t.l0 : 0.0f) + (t.i1 == i ? t.l1 : 0.0f);
}

/* The outputs [*lo, *hi) that read input i: both tap indices grow with p,
 * so two binary searches find them (the first p whose i1 reaches i, the
 * first whose i0 passes it). */
static inline FT_HD void ft_lerp_readers(int64_t i, int64_t in, int64_t out, float scale, bool align_corners,
                                         int64_t *lo, int64_t *hi) {
    int64_t a = 0, b = out;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (ft_lerp_at(m, in, scale, align_corners).i1 < i)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    b = out;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (ft_lerp_at(m, in, scale, align_corners).i0 <= i)
            a = m + 1;
        else
            b = m;
    }
    *hi = a;
}

#endif
