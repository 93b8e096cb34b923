/* Losses: cross_entropy over logits (softmax fused in, its gradient written
 * in the same pass) and mse_loss, with PyTorch's formulas.
 *
 * Legend: N batch, C classes, (d...) optional extra dimensions (the K-d
 * case: logits (N, C, d...), target (N, d...)); a 1-d logits (C) with a 0-d
 * target is one sample. (...) the shape of mse_loss's input.
 * Logits and inputs are float32 or bfloat16 (computed in float), any
 * strides; targets int64 or int32. Sums over samples are taken in double
 * over fixed chunks of samples, combined in chunk order, so every result is
 * bitwise identical for any thread count.
 * Gradient rule: a gradient output is written (=) unless its accumulate flag
 * is set, then added to (+=); a NULL gradient output is skipped. */
#ifndef FT_OPS_LOSS_H
#define FT_OPS_LOSS_H

#include <stdbool.h>

#include "core/tensor.h"

/* PyTorch's enum values. */
typedef enum { FT_REDUCTION_NONE = 0, FT_REDUCTION_MEAN = 1, FT_REDUCTION_SUM = 2 } ft_reduction;

typedef struct {
    ft_reduction reduction;
    int64_t ignore_index;   /* targets equal to it add nothing (PyTorch default -100) */
    double label_smoothing; /* in [0, 1] */
} ft_cross_entropy_params;

/* With logp = log_softmax(logits) over C, w the class weights (1 without
 * `weight`), eps the smoothing and t a sample's target:
 *   l = (1 - eps) * (-w[t] logp[t]) + eps / C * (-sum_c w[c] logp[c]),
 * 0 for samples with t == ignore_index. loss is () for mean and sum, (N, d...)
 * for none; mean divides the sum by sum of w[t] over the samples not ignored
 * (NaN when that is 0, as PyTorch). Targets outside [0, C) other than
 * ignore_index are FT_ERR_INDEX.
 *
 * dlogits (N, C, d...), when not NULL, receives in the same pass the
 * gradient of the loss for dloss = 1 (mean, sum) or dloss = ones (none):
 * scale * ((1 - eps) w[t] (p - onehot(t)) + eps / C (W p - w)), p =
 * softmax(logits), W = sum of w, scale 1 or 1 / the mean's divisor; 0 for
 * ignored samples. weight (C) may be NULL. */
ft_status ft_cross_entropy_forward(const ft_tensor *loss, const ft_tensor *dlogits, const ft_tensor *logits,
                                   const ft_tensor *target, const ft_tensor *weight,
                                   const ft_cross_entropy_params *p);

/* dlogits (N, C, d...) = (or +=) dloss (() or (N, d...)) times the gradient
 * above, softmax recomputed from logits. */
ft_status ft_cross_entropy_backward(const ft_tensor *dlogits, const ft_tensor *dloss, const ft_tensor *logits,
                                    const ft_tensor *target, const ft_tensor *weight,
                                    const ft_cross_entropy_params *p, bool accumulate);

/* loss = (inp - target)^2: (...) for none, its sum or mean () otherwise
 * (mean of nothing is NaN). inp and target have one shape. */
ft_status ft_mse_loss_forward(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                              ft_reduction reduction);

/* dinp (...) = (or +=) 2 (inp - target) dloss (/ numel for mean),
 * dtarget (...) = (or +=) its negation; either may be NULL. */
ft_status ft_mse_loss_backward(const ft_tensor *dinp, const ft_tensor *dtarget, const ft_tensor *dloss,
                               const ft_tensor *inp, const ft_tensor *target, ft_reduction reduction,
                               bool accumulate_inp, bool accumulate_target);

/* loss (N) = -w[t] inp[n, t] for log-probabilities inp (N, C), 0 where t ==
 * ignore_index: the negative log-likelihood of each sample (the compiled
 * program normalizes and sums). float32 inp, int64 or int32 target (N),
 * weight (C) or NULL; targets outside [0, C) other than ignore_index are
 * FT_ERR_INDEX. */
ft_status ft_nll_loss_forward(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                              const ft_tensor *weight, int64_t ignore_index);

/* dinp (N, C) = (or +=) -w[t] dloss[n] at column t, 0 elsewhere. */
ft_status ft_nll_loss_backward(const ft_tensor *dinp, const ft_tensor *dloss, const ft_tensor *target,
                               const ft_tensor *weight, int64_t ignore_index, bool accumulate);

#endif
