/* The per-tensor trust ratios of LAMB and LARS (optim/optim.h), shared by
 * the CPU step and the CUDA passes (cuda/optim.cu). */
#ifndef FT_OPTIM_TRUST_H
#define FT_OPTIM_TRUST_H

#include <math.h>
#include <stdbool.h>

#include "kernels/hd.h"

/* ||p|| / ||u|| (LAMB) or eta ||p|| / (||g|| + weight_decay ||p|| + eps)
 * (LARS) of one tensor, from the sum of squares of u (LAMB) or of the grads
 * as the norm pass saw them, before clipping (LARS: `clip` is the clipping
 * coefficient applied since), and that of the params; 1 when a norm is 0 or
 * the group is excluded from adaptation. */
static inline FT_HD double ft_optim_trust_ratio(bool lars, bool exclude, double first_sq, double param_sq,
                                                double clip, double eta, double weight_decay, double eps) {
    if (exclude)
        return 1.0;
    double first = sqrt(first_sq), pnorm = sqrt(param_sq);
    if (!lars)
        return pnorm > 0 && first > 0 ? pnorm / first : 1.0;
    double gnorm = first * clip;
    return pnorm > 0 && gnorm > 0 ? eta * pnorm / (gnorm + weight_decay * pnorm + eps) : 1.0;
}

#endif
