/* The row math of softmax, log_softmax and cross-entropy, shared by the CPU
 * loops (ops/softmax.c, ops/loss.c) and the CUDA kernels (cuda/softmax.cu).
 *
 * A row's reductions (its max, the sum of exp(x - max), ...) run in
 * FT_ROW_LANES lanes: element d goes to lane d % FT_ROW_LANES, each lane
 * folds its elements in order, then ft_lanes_max / ft_lanes_sum combine the
 * lanes in a fixed order. The CPU's lanes are SIMD lanes, CUDA's the threads
 * of a half warp or the registers of one thread; with the same order and the
 * per-element functions below both give the same floats (nvcc compiles with
 * --fmad=false, the CPU loops never contract).
 *
 * The per-row scalars of cross-entropy are worked out in double and rounded
 * once, the per-element steps in float. Legend: C classes, t the row's
 * target class, w the class weights (1 without), W their sum (C without),
 * eps the label smoothing, m the row's max, s its sum of exp(x - m). */
#ifndef FT_KERNELS_SOFTMAX_H
#define FT_KERNELS_SOFTMAX_H

#include <math.h>
#include <stdint.h>

#include "kernels/activation.h"
#include "kernels/hd.h"

#define FT_ROW_LANES 16

/* The running max of a lane: x replaces m only when larger (a NaN element
 * never does; its exp still makes the row's sum NaN). */
static inline FT_HD float ft_max_step(float m, float x) { return x > m ? x : m; }

/* The row's max from its lanes, lane 0 first. */
static inline FT_HD float ft_lanes_max(const float *acc) {
    float m = acc[0];
    for (int l = 1; l < FT_ROW_LANES; l++)
        m = ft_max_step(m, acc[l]);
    return m;
}

/* The row's sum from its lanes (overwritten): lane l += lane l + w for
 * w = 8, 4, 2, 1, written out so that nvcc keeps acc in registers. */
static inline FT_HD float ft_lanes_sum(float *acc) {
#if FT_ROW_LANES != 16
#error "ft_lanes_sum's tree is written for 16 lanes"
#endif
    for (int l = 0; l < 8; l++)
        acc[l] += acc[l + 8];
    for (int l = 0; l < 4; l++)
        acc[l] += acc[l + 4];
    acc[0] += acc[2];
    acc[1] += acc[3];
    return acc[0] + acc[1];
}

/* ---- softmax and log_softmax ---- */

static inline FT_HD float ft_softmax_exp(float x, float m) { return ft_expf(x - m); }

/* softmax: e = exp(x - m) times inv = 1 / s. */
static inline FT_HD float ft_softmax_inv(float s) { return 1.0f / s; }
static inline FT_HD float ft_softmax_value(float e, float inv) { return e * inv; }

/* log_softmax: (x - m) - log(s), the shift first so that large x keep their
 * precision. log(s) is rounded from double, correctly rounded (glibc's logf
 * is not for about one argument in a thousand, CUDA's logf less often). */
static inline FT_HD float ft_log_softmax_log_sum(float s) { return (float)log((double)s); }
static inline FT_HD float ft_log_softmax_value(float x, float m, float log_sum) { return (x - m) - log_sum; }

/* The input gradients from dy and the forward's output y: softmax's with
 * dot = sum(dy * y), log_softmax's with sum = sum(dy). */
static inline FT_HD float ft_softmax_grad(float dy, float y, float dot) { return y * (dy - dot); }
static inline FT_HD float ft_log_softmax_grad(float dy, float y, float sum) { return dy - ft_expf(y) * sum; }

/* ---- cross-entropy with class weights and label smoothing ----
 * loss = -(1 - eps) w[t] (x[t] - lse) - eps / C sum_c w[c] (x[c] - lse),
 * lse = m + log(s); a row whose target is ignore_index has loss 0 and
 * gradient 0. */

static inline FT_HD double ft_ce_lse(float m, float s) { return (double)m + log((double)s); }

/* sx = sum_c w[c] x[c], only read with eps > 0. */
static inline FT_HD double ft_ce_loss(double lse, float xt, float sx, double wt, float W, double eps, int64_t C) {
    double l = (1.0 - eps) * -wt * ((double)xt - lse);
    if (eps > 0.0)
        l += eps / (double)C * -((double)sx - lse * (double)W);
    return l;
}

/* The gradient of a row times gs (dloss, over the mean's divisor with
 * reduction mean): ft_ce_grad(e, w[c], k) for every class c, e = exp(x[c] -
 * m), then minus k.c at c = t. */
typedef struct {
    float a, b, c;
} ft_ce_coef;

static inline FT_HD ft_ce_coef ft_ce_coef_of(double gs, double wt, float W, double eps, int64_t C, float s) {
    ft_ce_coef k;
    k.a = (float)(gs * ((1.0 - eps) * wt + eps * W / (double)C) / s);
    k.b = (float)(gs * eps / (double)C);
    k.c = (float)(gs * (1.0 - eps) * wt);
    return k;
}

/* w = 1 without class weights (the multiply is then exact). */
static inline FT_HD float ft_ce_grad(float e, float w, float a, float b) { return a * e - b * w; }

#endif
