/* Batch normalization over the channels of (N, C, H, W) or (N, C) tensors,
 * with an optional fused activation (BN + ReLU), on fasttrain's own loops:
 * the statistics are reduced in a fixed order, so results are bitwise the
 * same for any thread count.
 *
 * Legend: N batch, C channels, H W spatial size; M = N * H * W values per
 * channel. NCHW or channels-last (NHWC) memory; every tensor of one call in
 * the same layout. float32. */
#ifndef FT_OPS_BATCHNORM_H
#define FT_OPS_BATCHNORM_H

#include "core/tensor.h"
#include "kernels/activation.h"
#include "ops/gradient.h"

typedef struct {
    bool training;   /* batch statistics (and running-stat updates) vs running statistics */
    double eps;
    double momentum; /* running = (1 - momentum) * running + momentum * batch statistic; a program node's -1:
                        PyTorch's momentum=None, 1 / the count of batches (nn/nodes.c) */
    ft_act act;      /* applied to the normalized output; backward needs `out` then */
    bool sync;       /* SyncBatchNorm: batch statistics over every rank of ft.distributed (CPU), as one batch */
    /* In-place activated batch norm (InPlace-ABN, CPU): the scale is
     * |weight| + eps, act is none or a leaky relu of positive slope, and the
     * backward takes x back from out (inverting both) instead of reading
     * inp, which the caller may then free after the forward. */
    bool inplace_abn;
} ft_batchnorm_params;

/* out = act((inp - mean) * invstd * weight + bias).
 * save_mean (C) and save_invstd (C) receive the statistics used (batch ones
 * in training, running ones in eval); running_mean/var (C) are updated in
 * training when given (the variance unbiased, as PyTorch). weight and bias
 * may be NULL (1 and 0). */
ft_status ft_batchnorm_forward(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                               const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                               const ft_tensor *running_mean, const ft_tensor *running_var,
                               const ft_batchnorm_params *p);

/* Gradients from dout (the gradient of out). `out` is needed only when
 * p->act is not FT_ACT_NONE (its backward is taken from the output; the
 * CPU recomputes a relu's mask from inp, weight and bias instead) or for
 * InPlace-ABN, which reads out, weight and bias instead of inp (NULL).
 * weight and bias are the forward's (NULL: 1 and 0).
 * dinp, dweight (C), dbias (C) may each be NULL; each is written (=), or
 * added to (+=) as `acc` says (ops/gradient.h). dinp may alias dout
 * (in-place backward) when it is written. */
ft_status ft_batchnorm_backward(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *out,
                                const ft_tensor *weight, const ft_tensor *bias, const ft_tensor *save_mean,
                                const ft_tensor *save_invstd, const ft_batchnorm_params *p, ft_grad_acc acc);

#endif
