/* Per-element optimizer math, shared by the fused CPU pass (optim/optim.c)
 * and the CUDA kernels.
 *
 * Every function is one element of one parameter tensor in float32, as
 * torch.optim computes it on float32 tensors. The coefficients are worked
 * out once per tensor and step in double (learning rate, bias corrections,
 * trust ratios) and rounded to float, as PyTorch rounds its Python-float
 * scalars when it hands them to a float kernel. The update formulas follow
 * the operation order of torch.optim's single-tensor code, so the results
 * agree with it to float rounding. */
#ifndef FT_KERNELS_OPTIM_H
#define FT_KERNELS_OPTIM_H

#include <math.h>
#include <stdbool.h>

#include "kernels/hd.h"

/* The gradient the update sees: scaled (e.g. by 1/loss_scale), then
 * multiplied by the clipping coefficient (1 without clipping), as
 * GradScaler.unscale_ followed by clip_grad_norm_ would leave it; negated
 * for maximize (exact, so it can come last). */
static inline FT_HD float ft_optim_grad(float g, float scale, float clip, bool maximize) {
    g = g * scale * clip;
    return maximize ? -g : g;
}

/* g + weight_decay * p: the weight decay of SGD and Adam, added to the gradient (L2). */
static inline FT_HD float ft_l2_grad(float g, float p, float weight_decay) {
    return weight_decay != 0.0f ? g + weight_decay * p : g;
}

/* ---- SGD (torch.optim.SGD) ----
 * d = g + weight_decay * p
 * b = d on the first momentum step, else momentum * b + (1 - dampening) * d
 * d = d + momentum * b with nesterov, else b      (only when momentum != 0)
 * p = p - lr * d */
typedef struct {
    float lr, weight_decay, momentum, one_minus_dampening;
    bool nesterov;
    bool first; /* the momentum buffer starts as a copy of d */
} ft_sgd_coef;

static inline FT_HD float ft_sgd_direction(float g, float p, const ft_sgd_coef *c) {
    return ft_l2_grad(g, p, c->weight_decay);
}

static inline FT_HD float ft_sgd_momentum(float b, float d, const ft_sgd_coef *c) {
    return c->first ? d : c->momentum * b + c->one_minus_dampening * d;
}

static inline FT_HD float ft_sgd_nesterov(float d, float b, const ft_sgd_coef *c) {
    return c->nesterov ? d + c->momentum * b : b;
}

static inline FT_HD float ft_sgd_param(float p, float d, const ft_sgd_coef *c) { return p - c->lr * d; }

/* ---- Adam moments (AdamW and LAMB) ----
 * m = beta1 * m + (1 - beta1) * g
 * v = beta2 * v + (1 - beta2) * g * g */
typedef struct {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
} ft_adam_moments;

static inline FT_HD float ft_adam_exp_avg(float m, float g, const ft_adam_moments *c) {
    return c->beta1 * m + c->one_minus_beta1 * g;
}

static inline FT_HD float ft_adam_exp_avg_sq(float v, float g, const ft_adam_moments *c) {
    return c->beta2 * v + c->one_minus_beta2 * g * g;
}

/* ---- AdamW (torch.optim.AdamW), and Adam (torch.optim.Adam) ----
 * Adam: g = g + weight_decay * p first; AdamW: p = p * (1 - lr * weight_decay)
 * vmax = max(vmax, v) with amsgrad; the denominator uses vmax, else v
 * p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps) */
typedef struct {
    ft_adam_moments mom;
    float decay;     /* 1 - lr * weight_decay (AdamW; 1 for Adam) */
    float step_size; /* lr / (1 - beta1^t) */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
    float eps;
    float l2; /* weight_decay (Adam; 0 for AdamW) */
} ft_adamw_coef;

/* torch.maximum: NaN wins, so a NaN moment (AMSGrad's, Adamax's) is not hidden. */
static inline FT_HD float ft_optim_max(float vmax, float v) { return vmax != vmax || vmax > v ? vmax : v; }

static inline FT_HD float ft_adamw_param(float p, float m, float v, const ft_adamw_coef *c) {
    float denom = sqrtf(v) / c->bc2_sqrt + c->eps;
    return p * c->decay - c->step_size * (m / denom);
}

/* ---- LAMB (You et al., "Large Batch Optimization for Deep Learning",
 * Algorithm 2, with phi the identity) ----
 * u = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p
 * p = p - lr * trust * u, trust = ||p|| / ||u|| over the tensor (1 when
 * either norm is 0 or the group is excluded from adaptation) */
typedef struct {
    ft_adam_moments mom;
    float bc1, bc2; /* 1 - beta1^t, 1 - beta2^t */
    float eps, weight_decay;
    float lr_trust; /* lr * trust, known after the norm pass */
} ft_lamb_coef;

static inline FT_HD float ft_lamb_direction(float p, float m, float v, const ft_lamb_coef *c) {
    return (m / c->bc1) / (sqrtf(v / c->bc2) + c->eps) + c->weight_decay * p;
}

static inline FT_HD float ft_lamb_param(float p, float u, const ft_lamb_coef *c) { return p - c->lr_trust * u; }

/* ---- LARS (You, Gitman, Ginsburg, "Large Batch Training of Convolutional
 * Networks", Algorithm 1) ----
 * local_lr = eta * ||p|| / (||g|| + weight_decay * ||p|| + eps) over the tensor
 *            (1 when a norm is 0 or the group is excluded from adaptation)
 * v = momentum * v + lr * local_lr * (g + weight_decay * p)
 * p = p - v */
typedef struct {
    float momentum, weight_decay;
    float scaled_lr; /* lr * local_lr */
} ft_lars_coef;

static inline FT_HD float ft_lars_velocity(float v, float g, float p, const ft_lars_coef *c) {
    return c->momentum * v + c->scaled_lr * (g + c->weight_decay * p);
}

/* ---- weight EMA: avg = lerp(avg, p, 1 - decay), torch.lerp's formula
 * (the form torch.optim.swa_utils.get_ema_multi_avg_fn uses) ---- */
static inline FT_HD float ft_ema_lerp(float avg, float p, float weight) {
    return weight < 0.5f ? avg + weight * (p - avg) : p - (p - avg) * (1.0f - weight);
}

/* ---- RMSprop (torch.optim.RMSprop) ----
 * g = g + weight_decay * p
 * v = alpha * v + (1 - alpha) * g * g
 * centered: a = lerp(a, g, 1 - alpha), avg = sqrt(v - a * a) + eps; else avg = sqrt(v) + eps
 * momentum: b = momentum * b + g / avg, p = p - lr * b; else p = p - lr * g / avg */
typedef struct {
    float lr, weight_decay, alpha, one_minus_alpha, eps, momentum;
} ft_rmsprop_coef;

/* The new p for gradient g, updating the element's v, its a when centered
 * (else NULL) and its b when there is momentum (else NULL). */
static inline FT_HD float ft_rmsprop_param(float p, float g, float *v, float *a, float *b, const ft_rmsprop_coef *c) {
    float vi = c->alpha * *v + c->one_minus_alpha * g * g;
    *v = vi;
    float avg;
    if (a) {
        float ai = ft_ema_lerp(*a, g, c->one_minus_alpha);
        *a = ai;
        avg = sqrtf(vi - ai * ai) + c->eps;
    } else {
        avg = sqrtf(vi) + c->eps;
    }
    float d = g / avg;
    if (b) {
        d = c->momentum * *b + d;
        *b = d;
    }
    return p - c->lr * d;
}

/* ---- Adadelta (torch.optim.Adadelta) ----
 * g = g + weight_decay * p
 * v = rho * v + (1 - rho) * g * g
 * d = sqrt(u + eps) / sqrt(v + eps) * g
 * u = rho * u + (1 - rho) * d * d
 * p = p - lr * d
 * (rho in ft_rmsprop_coef's alpha) */
static inline FT_HD float ft_adadelta_param(float p, float g, float *v, float *u, const ft_rmsprop_coef *c) {
    float vi = c->alpha * *v + c->one_minus_alpha * g * g;
    *v = vi;
    float d = sqrtf(*u + c->eps) / sqrtf(vi + c->eps) * g;
    *u = c->alpha * *u + c->one_minus_alpha * d * d;
    return p - c->lr * d;
}

/* ---- Adagrad (torch.optim.Adagrad) ----
 * g = g + weight_decay * p
 * s = s + g * g                       (s starts at initial_accumulator_value)
 * p = p - clr * g / (sqrt(s) + eps),  clr = lr / (1 + (t - 1) * lr_decay) */
typedef struct {
    float clr, weight_decay, eps, initial;
    bool first; /* the sum starts at `initial` (a loaded sum is the same value until a step has run) */
} ft_adagrad_coef;

static inline FT_HD float ft_adagrad_param(float p, float g, float *s, const ft_adagrad_coef *c) {
    float si = (c->first ? c->initial : *s) + g * g;
    *s = si;
    return p - c->clr * (g / (sqrtf(si) + c->eps));
}

/* ---- Adamax, NAdam and RAdam (torch.optim's), on Adam's first moment m ----
 * each: g = g + l2 * p (weight_decay, or 0 when decoupled), p = p * decay
 * (1 - lr * weight_decay when decoupled, else 1), m as Adam's, then
 * Adamax: u = max(beta2 * u, |g| + eps);  p = p - clr * m / u,  clr = lr / (1 - beta1^t)
 * NAdam:  v as Adam's;  d = sqrt(v / (1 - beta2^t)) + eps
 *         p = p - lr (1 - mu_t) / (1 - prod_{i<=t} mu_i) * g / d
 *               - lr mu_{t+1} / (1 - prod_{i<=t+1} mu_i) * m / d,  mu_i = beta1 (1 - 0.5 * 0.96^(i momentum_decay))
 * RAdam:  v as Adam's;  p = p - lr * m / (1 - beta1^t) * r,  r = sqrt(1 - beta2^t) / (sqrt(v) + eps) * rect
 *         while the variance's length rho_t > 5 (rect its rectification), else r = 1 */
typedef struct {
    ft_adam_moments mom;
    float l2, decay, eps;
    float bc1;                  /* 1 - beta1^t (RAdam) */
    float bc2, bc2_sqrt;        /* 1 - beta2^t (NAdam), its square root (RAdam) */
    float lr;                   /* clr (Adamax); lr (RAdam) */
    float grad_coef, avg_coef;  /* NAdam's two step sizes */
    float rect;                 /* RAdam: 0 while the update is not adaptive */
    double mu_product;          /* NAdam: prod_{i<=t} mu_i, the segment's state after the step */
} ft_moments_coef;

static inline FT_HD float ft_adamax_param(float p, float g, float *m, float *u, const ft_moments_coef *c) {
    float mi = ft_adam_exp_avg(*m, g, &c->mom), ui = ft_optim_max(c->mom.beta2 * *u, fabsf(g) + c->eps);
    *m = mi;
    *u = ui;
    return p * c->decay - c->lr * (mi / ui);
}

static inline FT_HD float ft_nadam_param(float p, float g, float *m, float *v, const ft_moments_coef *c) {
    float mi = ft_adam_exp_avg(*m, g, &c->mom), vi = ft_adam_exp_avg_sq(*v, g, &c->mom);
    *m = mi;
    *v = vi;
    float d = sqrtf(vi / c->bc2) + c->eps;
    p = p * c->decay - c->grad_coef * (g / d);
    return p - c->avg_coef * (mi / d);
}

static inline FT_HD float ft_radam_param(float p, float g, float *m, float *v, const ft_moments_coef *c) {
    float mi = ft_adam_exp_avg(*m, g, &c->mom), vi = ft_adam_exp_avg_sq(*v, g, &c->mom);
    *m = mi;
    *v = vi;
    float u = mi / c->bc1 * c->lr;
    if (c->rect != 0.0f)
        u = u * (c->bc2_sqrt / (sqrtf(vi) + c->eps)) * c->rect;
    return p * c->decay - u;
}

#endif
