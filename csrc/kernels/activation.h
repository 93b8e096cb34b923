/* Activation functions and their derivatives, shared by the CPU loops
 * (ops/activation.c, the fused add + act of ops/elementwise.c, the fused
 * bias/BN + act of the oneDNN ops) and the CUDA kernels.
 *
 * The transcendental functions here (exp, tanh, the normal CDF) are written
 * without branches or library calls so that the CPU loops vectorise; each is
 * accurate to about 1-2 float ulp (the normal CDF to 1.2e-7 relative in
 * its lower tail), checked against float64 references in the tests. Only
 * explicit fmaf() is used, never implicit contraction, so every CPU code
 * path (AVX-512, AVX2, scalar) gives bitwise the same float. */
#ifndef FT_KERNELS_ACTIVATION_H
#define FT_KERNELS_ACTIVATION_H

#include <math.h>
#include <stdbool.h>

#include "kernels/hd.h"

typedef enum {
    FT_ACT_NONE = 0,   /* identity */
    FT_ACT_RELU,       /* max(x, 0) */
    FT_ACT_LEAKY_RELU, /* x > 0 ? x : alpha * x */
    FT_ACT_GELU,       /* x * Phi(x), Phi the normal CDF (PyTorch approximate='none') */
    FT_ACT_GELU_TANH,  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate='tanh') */
    FT_ACT_SILU,       /* x * sigmoid(x) */
    FT_ACT_SIGMOID,    /* 1 / (1 + exp(-x)) */
    FT_ACT_TANH,
    FT_ACT_HARDSWISH, /* x * min(max(x + 3, 0), 6) / 6 */
    FT_ACT_ABS,
    FT_ACT_SOFTPLUS,  /* log(1 + exp(x)) */
    FT_ACT_HUBER,     /* |x| < alpha ? x^2 / 2 : alpha (|x| - alpha / 2): the Huber and smooth L1 losses */
    FT_ACT_XLOGX,     /* x log x, 0 at 0: the entropy term of the KL divergence */
    FT_ACT_EXP,
    FT_ACT_LOG,
    FT_ACT_POW,       /* x ** alpha (x * x, sqrt, 1 / sqrt and 1 / x for alpha 2, 0.5, -0.5 and -1, as torch's ops) */
    FT_ACT_CLAMP_MIN, /* max(x, alpha), NaN kept (PyTorch's clamp(min=)) */
    FT_ACT_CLAMP_MAX, /* min(x, alpha), NaN kept */
    FT_ACT_STD_SQRT,  /* sqrt(x) with gradient 0 at 0: a variance to torch.std, whose backward passes none there */
    FT_ACT_LOG_FLOOR, /* max(log x, alpha), no gradient below alpha: binary cross entropy's logs (alpha -100) */
    FT_ACT_ERF,       /* the error function (BERT's GELU written out: x * 0.5 * (1 + erf(x / sqrt(2)))) */
    FT_ACT_SIN,       /* sin x, and */
    FT_ACT_COS,       /* cos x: a sinusoidal embedding of a time computed in forward (DDPM's), Fourier features */
    FT_NUM_ACTS
} ft_act_kind;

/* An activation: its kind and parameter (leaky_relu's negative slope). */
typedef struct {
    ft_act_kind kind;
    float alpha;
} ft_act;

/* ---- vectorisable elementary functions ---- */

/* exp(x): Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
 * Taylor polynomial (error below 6e-9) and 2^n applied in two halves so
 * that results underflow gradually to 0 and overflow to inf. NaN stays NaN. */
static inline FT_HD float ft_expf(float x) {
    x = x < -104.0f ? -104.0f : x;
    x = x > 89.0f ? 89.0f : x;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |t| < 2^22) */
    float shifted = x * 1.44269504088896341f + 12582912.0f;
    float n = shifted - 12582912.0f;
    int32_t ni = (int32_t)(ft_f32_bits(shifted) - 0x4B400000u);
    float r = fmaf(-n, 0.693145751953125f, x);
    r = fmaf(-n, 1.428606765330187e-06f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t n1 = ni >> 1, n2 = ni - n1; /* floor(ni / 2): each in [-75, 65] */
    float s1 = ft_bits_f32((uint32_t)(n1 + 127) << 23), s2 = ft_bits_f32((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* tanh(x): an odd polynomial x + x^3 P(x^2) for |x| < 0.625 (fitted to
 * 7.5e-8 relative), 1 - 2 / (exp(2|x|) + 1) with x's sign above. */
static inline FT_HD float ft_tanhf(float x) {
    float ax = fabsf(x);
    float z = x * x;
    float p = 0.0021780235692858696f;
    p = fmaf(p, z, -0.008214971981942654f);
    p = fmaf(p, z, 0.021715553477406502f);
    p = fmaf(p, z, -0.053949397057294846f);
    p = fmaf(p, z, 0.1333322674036026f);
    p = fmaf(p, z, -0.3333333134651184f);
    float small = fmaf(x * z, p, x);
    float big = 1.0f - 2.0f / (ft_expf(2.0f * ax) + 1.0f);
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}

/* 1 / (1 + exp(-x)): relative accuracy over the whole range (for very
 * negative x it is exp(x) to within an ulp). */
static inline FT_HD float ft_sigmoidf(float x) { return 1.0f / (1.0f + ft_expf(-x)); }

/* erfc(z) for z >= 0 with fractional error below 1.2e-7 everywhere
 * (Numerical Recipes' Chebyshev fit "erfcc"). */
static inline FT_HD float ft_erfc_pos(float z) {
    float t = 1.0f / fmaf(0.5f, z, 1.0f);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    return t * ft_expf(p - z * z);
}

/* Phi(x) = 0.5 erfc(-x / sqrt 2), the standard normal CDF; accurate
 * relative to its value in the lower tail, where GELU needs it. */
static inline FT_HD float ft_normcdff(float x) {
    float half_tail = 0.5f * ft_erfc_pos(fabsf(x) * 0.70710678118654752f);
    return x < 0.0f ? half_tail : 1.0f - half_tail;
}

#define FT_GELU_TANH_BETA 0.79788456080286536f /* sqrt(2 / pi) */
#define FT_GELU_TANH_KAPPA 0.044715f
#define FT_INV_SQRT_2PI 0.39894228040143268f

/* ---- forward ---- */

static inline FT_HD float ft_relu(float x) { return x < 0.0f ? 0.0f : x; } /* NaN passes through */
static inline FT_HD float ft_leaky_relu(float x, float alpha) { return x > 0.0f ? x : x * alpha; }
static inline FT_HD float ft_gelu(float x) { return x * ft_normcdff(x); }
/* 0.5 (1 + tanh(u)) is sigmoid(2u): one exponential and one division, where
 * tanh takes both and a polynomial. */
static inline FT_HD float ft_gelu_tanh(float x) {
    float inner = FT_GELU_TANH_BETA * fmaf(FT_GELU_TANH_KAPPA * x * x, x, x);
    return x * ft_sigmoidf(2.0f * inner);
}
static inline FT_HD float ft_silu(float x) { return x * ft_sigmoidf(x); }
static inline FT_HD float ft_hardswish(float x) { return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f; }
/* max(x, 0) + log(1 + exp(-|x|)): no overflow for large |x| */
static inline FT_HD float ft_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(ft_expf(-fabsf(x))); }
static inline FT_HD float ft_huber(float x, float delta) {
    float a = fabsf(x);
    return a < delta ? 0.5f * x * x : delta * (a - 0.5f * delta);
}
static inline FT_HD float ft_xlogx(float x) { return x > 0.0f ? x * logf(x) : 0.0f; }
static inline FT_HD float ft_powf(float x, float a) {
    return a == 2.0f ? x * x : a == 1.0f ? x : a == 0.5f ? sqrtf(x) : a == -0.5f ? 1.0f / sqrtf(x)
                                           : a == -1.0f  ? 1.0f / x : powf(x, a);
}

static inline FT_HD float ft_clamp_min(float x, float a) { return x < a ? a : x; }
static inline FT_HD float ft_clamp_max(float x, float a) { return x > a ? a : x; }
/* 0 at the bound, as PyTorch 2's clamp, hardtanh and relu6 */
static inline FT_HD float ft_clamp_min_grad(float x, float a) { return x > a ? 1.0f : 0.0f; }
static inline FT_HD float ft_clamp_max_grad(float x, float a) { return x < a ? 1.0f : 0.0f; }

static inline FT_HD float ft_act_forward(ft_act a, float x) {
    switch (a.kind) {
    case FT_ACT_RELU: return ft_relu(x);
    case FT_ACT_LEAKY_RELU: return ft_leaky_relu(x, a.alpha);
    case FT_ACT_GELU: return ft_gelu(x);
    case FT_ACT_GELU_TANH: return ft_gelu_tanh(x);
    case FT_ACT_SILU: return ft_silu(x);
    case FT_ACT_SIGMOID: return ft_sigmoidf(x);
    case FT_ACT_TANH: return ft_tanhf(x);
    case FT_ACT_HARDSWISH: return ft_hardswish(x);
    case FT_ACT_ABS: return fabsf(x);
    case FT_ACT_SOFTPLUS: return ft_softplus(x);
    case FT_ACT_HUBER: return ft_huber(x, a.alpha);
    case FT_ACT_XLOGX: return ft_xlogx(x);
    case FT_ACT_EXP: return ft_expf(x);
    case FT_ACT_LOG: return logf(x);
    case FT_ACT_POW: return ft_powf(x, a.alpha);
    case FT_ACT_CLAMP_MIN: return ft_clamp_min(x, a.alpha);
    case FT_ACT_CLAMP_MAX: return ft_clamp_max(x, a.alpha);
    case FT_ACT_STD_SQRT: return sqrtf(x);
    case FT_ACT_LOG_FLOOR: return ft_clamp_min(logf(x), a.alpha); /* log(0) = -inf held at the floor */
    case FT_ACT_ERF: return erff(x);
    case FT_ACT_SIN: return sinf(x);
    case FT_ACT_COS: return cosf(x);
    default: return x;
    }
}

/* ---- derivatives ----
 *
 * Backward needs either the activation's input or its output. ReLU, leaky
 * ReLU with alpha >= 0, sigmoid and tanh have derivatives that are functions
 * of the output, so an in-place forward (out over inp) loses nothing; GELU
 * and SiLU need the input. */

static inline FT_HD bool ft_act_grad_uses_output(ft_act a) {
    switch (a.kind) {
    case FT_ACT_NONE:
    case FT_ACT_RELU:
    case FT_ACT_SIGMOID:
    case FT_ACT_TANH: return true;
    case FT_ACT_LEAKY_RELU: return a.alpha >= 0.0f;
    default: return false;
    }
}

/* d act / dx at input x (PyTorch's conventions at the kinks: relu'(0) = 0,
 * leaky_relu'(0) = alpha). */
static inline FT_HD float ft_relu_grad(float x) { return x > 0.0f ? 1.0f : 0.0f; }
static inline FT_HD float ft_leaky_relu_grad(float x, float alpha) { return x > 0.0f ? 1.0f : alpha; }
static inline FT_HD float ft_gelu_grad(float x) {
    float pdf = FT_INV_SQRT_2PI * ft_expf(-0.5f * x * x);
    return fmaf(x, pdf, ft_normcdff(x));
}
static inline FT_HD float ft_gelu_tanh_grad(float x) { /* s = sigmoid(2u) as in ft_gelu_tanh */
    float x2 = x * x;
    float s = ft_sigmoidf(2.0f * FT_GELU_TANH_BETA * fmaf(FT_GELU_TANH_KAPPA * x2, x, x));
    float dinner = FT_GELU_TANH_BETA * fmaf(3.0f * FT_GELU_TANH_KAPPA, x2, 1.0f);
    return fmaf(2.0f * x * s * (1.0f - s), dinner, s);
}
static inline FT_HD float ft_silu_grad(float x) {
    float s = ft_sigmoidf(x);
    return s * fmaf(x, 1.0f - s, 1.0f);
}
static inline FT_HD float ft_sigmoid_grad(float x) {
    float s = ft_sigmoidf(x);
    return s * (1.0f - s);
}
static inline FT_HD float ft_tanh_grad(float x) {
    float t = ft_tanhf(x);
    return 1.0f - t * t;
}

static inline FT_HD float ft_hardswish_grad(float x) {
    return x < -3.0f ? 0.0f : x > 3.0f ? 1.0f : fmaf(2.0f, x, 3.0f) / 6.0f;
}
static inline FT_HD float ft_sign(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f; }
static inline FT_HD float ft_huber_grad(float x, float delta) { return fabsf(x) < delta ? x : delta * ft_sign(x); }
static inline FT_HD float ft_xlogx_grad(float x) { return x > 0.0f ? logf(x) + 1.0f : 0.0f; }
static inline FT_HD float ft_pow_grad(float x, float a) { return a == 0.0f ? 0.0f : a * ft_powf(x, a - 1.0f); }
/* all values equal: no deviation to move, where sqrt's own derivative is infinite */
static inline FT_HD float ft_std_sqrt_grad(float x) { return x > 0.0f ? 0.5f / sqrtf(x) : 0.0f; }
/* a probability of exactly 0 (or 1 in log(1 - p)) passes none, where 1 / x is infinite */
static inline FT_HD float ft_log_floor_grad(float x, float floor) { return logf(x) > floor ? 1.0f / x : 0.0f; }
static inline FT_HD float ft_erf_grad(float x) { return 1.12837916709551257f * ft_expf(-x * x); } /* 2 / sqrt(pi) */

static inline FT_HD float ft_act_grad_from_input(ft_act a, float x) {
    switch (a.kind) {
    case FT_ACT_RELU: return ft_relu_grad(x);
    case FT_ACT_LEAKY_RELU: return ft_leaky_relu_grad(x, a.alpha);
    case FT_ACT_GELU: return ft_gelu_grad(x);
    case FT_ACT_GELU_TANH: return ft_gelu_tanh_grad(x);
    case FT_ACT_SILU: return ft_silu_grad(x);
    case FT_ACT_SIGMOID: return ft_sigmoid_grad(x);
    case FT_ACT_TANH: return ft_tanh_grad(x);
    case FT_ACT_HARDSWISH: return ft_hardswish_grad(x);
    case FT_ACT_ABS: return ft_sign(x);
    case FT_ACT_SOFTPLUS: return ft_sigmoidf(x);
    case FT_ACT_HUBER: return ft_huber_grad(x, a.alpha);
    case FT_ACT_XLOGX: return ft_xlogx_grad(x);
    case FT_ACT_EXP: return ft_expf(x);
    case FT_ACT_LOG: return 1.0f / x;
    case FT_ACT_POW: return ft_pow_grad(x, a.alpha);
    case FT_ACT_CLAMP_MIN: return ft_clamp_min_grad(x, a.alpha);
    case FT_ACT_CLAMP_MAX: return ft_clamp_max_grad(x, a.alpha);
    case FT_ACT_STD_SQRT: return ft_std_sqrt_grad(x);
    case FT_ACT_LOG_FLOOR: return ft_log_floor_grad(x, a.alpha);
    case FT_ACT_ERF: return ft_erf_grad(x);
    case FT_ACT_SIN: return cosf(x);
    case FT_ACT_COS: return -sinf(x);
    default: return 1.0f;
    }
}

/* d act / dx from the output y, for the kinds ft_act_grad_uses_output
 * accepts (y > 0 exactly where x > 0 for relu and leaky relu, alpha >= 0). */
static inline FT_HD float ft_act_grad_from_output(ft_act a, float y) {
    switch (a.kind) {
    case FT_ACT_RELU: return y > 0.0f ? 1.0f : 0.0f;
    case FT_ACT_LEAKY_RELU: return y > 0.0f ? 1.0f : a.alpha;
    case FT_ACT_SIGMOID: return y * (1.0f - y);
    case FT_ACT_TANH: return 1.0f - y * y;
    default: return 1.0f;
    }
}

#endif
