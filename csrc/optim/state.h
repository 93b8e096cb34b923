/* The per-segment state an optimizer step hands to its passes: the
 * coefficients of each param tensor (optim/optim.c works them out for the
 * CPU loops and the CUDA passes alike) and, on a CUDA device, the segment
 * table and the flat state in device memory that cuda/optim.cu runs over
 * (the passes of ft_cuda_ops in ops/cuda_ops.h).
 *
 * An optimizer's (or EMA's) flat buffers are cut into segments, one per
 * param tensor, and each segment into blocks of FT_OPTIM_BLOCK elements,
 * numbered across the segments in order. The passes run one thread block
 * per such block, and every reduction sums per-block partials in a fixed
 * tree order, so results do not depend on the launch configuration. */
#ifndef FT_OPTIM_STATE_H
#define FT_OPTIM_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/optim.h"

/* A segment's coefficients for one step, as its kind reads them. */
typedef union {
    ft_sgd_coef sgd;
    ft_adamw_coef adamw;
    ft_lamb_coef lamb;
    ft_lars_coef lars;
    ft_rmsprop_coef rmsprop;
    ft_adagrad_coef adagrad;
    ft_moments_coef moments; /* Adamax, NAdam, RAdam */
} ft_optim_coef;

/* A param tensor and its place in the flat buffers. */
typedef struct {
    float *param;        /* (numel) */
    const float *grad;   /* (numel); NULL: the segment sits this step out (always NULL for an EMA) */
    int64_t numel;
    int64_t offset;      /* of its first element in the flat state (or averages) */
    int64_t first_block; /* its blocks are [first_block, first_block + ceil(numel / FT_OPTIM_BLOCK)) */
} ft_cuda_flat_segment;

/* A segment in one optimizer step: its coefficients and its group's options. */
typedef struct {
    ft_cuda_flat_segment flat;
    ft_optim_coef coef; /* LAMB's lr_trust and LARS's scaled_lr are worked out on the device */
    double lr, weight_decay, trust_coefficient, eps; /* the group's, for the trust ratios */
    bool maximize, lars_exclude;
    bool momentum; /* SGD and RMSprop: the segment has a momentum buffer */
    bool amsgrad;
    bool centered; /* RMSprop */
} ft_cuda_optim_segment;

/* One optimizer's device memory (all of it on `device`). */
typedef struct {
    int device;
    int kind; /* ft_optim_kind */
    int nseg;
    int64_t nblocks;
    ft_cuda_optim_segment *table; /* (nseg): this step's, from optim_upload */
    /* flat state; NULL when absent */
    float *momentum_buffer, *exp_avg, *exp_avg_sq, *max_exp_avg_sq, *square_avg, *grad_avg, *acc_delta, *exp_inf,
        *sum;
    double *partial; /* (nblocks, 2): per-block sums of squares */
    double *total;   /* (1) */
} ft_cuda_optim;

#endif
