/* The windows of 2-d pooling, shared by the CPU loops (ops/pool.c) and the
 * CUDA kernels (cuda/pool.cu), which must agree on them to the element.
 *
 * A window along one dimension is a span: for output row (or column) o, the
 * input rows lo, lo + step, ... < hi, already clipped to the input, and
 * `padded`, the window's extent counting padding (the count_include_pad
 * divisor). */
#ifndef FT_KERNELS_POOL_H
#define FT_KERNELS_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/hd.h"

typedef struct {
    int64_t lo, hi, step, padded;
} ft_pool_span;

/* floor(a / b), for b != 0 */
static inline FT_HD int64_t ft_floor_div(int64_t a, int64_t b) {
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* Window o of max_pool2d or avg_pool2d (kernel k, stride, pad, dilation)
 * over `in` input elements. */
static inline FT_HD ft_pool_span ft_pool_fixed_span(int64_t o, int64_t in, int64_t k, int64_t stride, int64_t pad,
                                                    int64_t dil) {
    int64_t start = o * stride - pad;
    int64_t end = start + (k - 1) * dil + 1;
    int64_t lo = start;
    if (lo < 0)
        lo += (-lo + dil - 1) / dil * dil;
    int64_t padded_end = start + k < in + pad ? start + k : in + pad; /* dil is 1 for avg pooling */
    ft_pool_span s = {lo, end < in ? end : in, dil, padded_end - start};
    return s;
}

/* Window o of n adaptive windows over `in` elements: [floor(o in / n), ceil((o + 1) in / n)). */
static inline FT_HD ft_pool_span ft_pool_adaptive_span(int64_t o, int64_t n, int64_t in) {
    int64_t lo = o * in / n, hi = ((o + 1) * in + n - 1) / n;
    ft_pool_span s = {lo, hi, 1, hi - lo};
    return s;
}

/* The number of input elements of a window. */
static inline FT_HD int64_t ft_pool_span_count(ft_pool_span s) {
    return s.hi > s.lo ? (s.hi - s.lo + s.step - 1) / s.step : 0;
}

/* What an average pool divides the sum of window (r, c) by. */
static inline FT_HD float ft_pool_divisor(ft_pool_span r, ft_pool_span c, int64_t divisor_override,
                                          bool count_include_pad) {
    if (divisor_override > 0)
        return (float)divisor_override;
    if (count_include_pad)
        return (float)(r.padded * c.padded);
    return (float)(ft_pool_span_count(r) * ft_pool_span_count(c));
}

#endif
