/* Optimizers as one fused pass over flat float32 buffers.
 *
 * An optimizer is created once over a list of segments, one per parameter
 * tensor (typically views into one flat parameter buffer and one flat
 * gradient buffer), and then called once per training step. Its state lives
 * in one allocation per state kind (ft_alloc via ft_storage, so it shows in
 * the memory statistics), laid out in segment order.
 *
 * A step is:
 *   1. when clipping, a reported norm or LARS asks for it: one read pass over
 *      the gradients for the global L2 norm of grad * grad_scale (and, for
 *      LARS, the per-tensor norms of grads and params);
 *   2. LAMB only: one pass updating the moments and computing the per-tensor
 *      norms of the update and the params;
 *   3. one update pass. The clipping coefficient is applied to each gradient
 *      element inside it, so gradients are never rewritten.
 * Every pass runs over fixed blocks of at most FT_OPTIM_BLOCK elements of
 * one segment, split statically over the OpenMP pool; every reduction sums
 * per-block partials (in double) in block order, so results are bitwise the
 * same for any thread count.
 *
 * The update formulas (per element, csrc/kernels/optim.h):
 *   SGD    torch.optim.SGD: weight decay, momentum, dampening, nesterov, maximize.
 *   ADAMW  torch.optim.AdamW with bias correction and amsgrad, maximize.
 *   ADAM   torch.optim.Adam: AdamW's update with the weight decay added to
 *          the gradient (L2) instead of shrinking the params.
 *   LAMB   You et al. 2019, "Large Batch Optimization for Deep Learning",
 *          Algorithm 2 with bias correction and phi(x) = x:
 *            m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *            u = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * p
 *            p = p - lr * (||p|| / ||u||) * u
 *          norms per parameter tensor; the ratio is 1 when either norm is 0
 *          or the group has lars_exclude.
 *   LARS   You, Gitman, Ginsburg 2017, "Large Batch Training of
 *          Convolutional Networks", Algorithm 1 (momentum inside, the global
 *          lr applied to the velocity, as in the paper):
 *            local_lr = trust_coefficient * ||p|| / (||g|| + weight_decay ||p|| + eps)
 *            v = momentum v + lr * local_lr * (g + weight_decay * p);  p = p - v
 *          norms per parameter tensor; local_lr is 1 when either norm is 0
 *          or the group has lars_exclude. eps defaults to 0 in the paper.
 *   RMSPROP torch.optim.RMSprop: weight decay, alpha, eps, momentum, centered.
 *   ADADELTA torch.optim.Adadelta: weight decay, rho (the group's alpha), eps.
 *   ADAGRAD torch.optim.Adagrad: weight decay, lr_decay, initial_accumulator_value, eps.
 *   ADAMAX torch.optim.Adamax: weight decay, betas, eps.
 *   NADAM  torch.optim.NAdam: weight decay (L2 or decoupled), betas, eps, momentum_decay.
 *   RADAM  torch.optim.RAdam: weight decay (L2 or decoupled), betas, eps.
 * maximize negates the gradient for every kind.
 *
 * On a CUDA device (ft_optimizer_create) the params, grads and state all
 * live in that device's memory and the passes run there (cuda/optim.cu),
 * queued on its compute stream; a step waits for the device only to read
 * back the global norm when it computes one. Sums of squares add the same
 * terms in double as on the CPU, in a fixed tree order instead of the CPU's
 * block order: they agree with the CPU's to double rounding (LAMB's, whose
 * terms come from float math, to float rounding) and are bitwise the same
 * from run to run. */
#ifndef FT_OPTIM_OPTIM_H
#define FT_OPTIM_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/storage.h"

/* Elements per reduction block: the blocks, not the threads, fix the order. */
#define FT_OPTIM_BLOCK 16384

typedef enum {
    FT_OPTIM_SGD,
    FT_OPTIM_ADAMW,
    FT_OPTIM_LAMB,
    FT_OPTIM_LARS,
    FT_OPTIM_ADAM,
    FT_OPTIM_RMSPROP,
    FT_OPTIM_ADADELTA,
    FT_OPTIM_ADAGRAD,
    FT_OPTIM_ADAMAX,
    FT_OPTIM_NADAM,
    FT_OPTIM_RADAM
} ft_optim_kind;
#define FT_OPTIM_NKINDS (FT_OPTIM_RADAM + 1)

/* Hyperparameters of a parameter group. Each kind reads only its own
 * fields (SGD: lr, weight_decay, momentum, dampening, nesterov; ADAMW and
 * ADAM: lr, weight_decay, beta1, beta2, eps, amsgrad; LAMB: lr, weight_decay, beta1,
 * beta2, eps, lars_exclude; LARS: lr, weight_decay, momentum, eps,
 * trust_coefficient, lars_exclude; all: maximize) and refuses options of
 * other kinds that are switched on (nesterov, amsgrad, lars_exclude,
 * centered, decoupled_weight_decay). RMSPROP reads lr, weight_decay,
 * momentum, eps, alpha, centered; ADADELTA lr, weight_decay, eps and alpha
 * (its rho); ADAGRAD lr, weight_decay, lr_decay, initial_accumulator_value,
 * eps; ADAMAX lr, weight_decay, beta1, beta2, eps; NADAM those and
 * momentum_decay, decoupled_weight_decay; RADAM ADAMAX's and
 * decoupled_weight_decay. */
typedef struct {
    double lr, weight_decay, momentum, dampening;
    bool nesterov, maximize;
    double beta1, beta2, eps;
    bool amsgrad;
    double trust_coefficient;
    bool lars_exclude; /* LARS/LAMB adaptation off for this group, e.g. BN and bias */
    double alpha;      /* the running averages' smoothing constant: RMSprop's alpha, Adadelta's rho */
    bool centered;     /* RMSprop: normalize by the variance's estimate rather than the second moment */
    double lr_decay, initial_accumulator_value; /* Adagrad */
    double momentum_decay;                      /* NAdam */
    bool decoupled_weight_decay;                /* NAdam, RAdam: shrink the params (AdamW's) instead of L2 */
} ft_optim_group;

/* One parameter tensor: numel contiguous float32 elements. grad may be NULL:
 * the segment is then skipped by steps (no update, no state change, not in
 * the norm), as torch.optim skips a parameter whose .grad is None. */
typedef struct {
    float *param;
    const float *grad;
    int64_t numel;
    int group;
} ft_optim_segment;

typedef struct ft_optimizer ft_optimizer;

/* State kinds, named as in torch.optim's state dicts. SGD has a momentum
 * buffer when a group has momentum != 0; ADAMW and ADAM exp_avg and exp_avg_sq, and
 * max_exp_avg_sq when a group has amsgrad; LAMB exp_avg and exp_avg_sq;
 * LARS a momentum buffer (the paper's velocity v); RMSPROP square_avg, a
 * momentum buffer when a group has momentum != 0 and grad_avg when one is
 * centered; ADADELTA square_avg and acc_delta; ADAGRAD sum; ADAMAX exp_avg
 * and exp_inf; NADAM and RADAM exp_avg and exp_avg_sq. */
typedef enum {
    FT_OPTIM_MOMENTUM_BUFFER,
    FT_OPTIM_EXP_AVG,
    FT_OPTIM_EXP_AVG_SQ,
    FT_OPTIM_MAX_EXP_AVG_SQ,
    FT_OPTIM_SQUARE_AVG,
    FT_OPTIM_GRAD_AVG,
    FT_OPTIM_ACC_DELTA,
    FT_OPTIM_EXP_INF,
    FT_OPTIM_SUM,
    FT_OPTIM_NUM_STATES
} ft_optim_state;

/* The per-segment counters a checkpoint needs besides the state buffers. */
typedef struct {
    int64_t steps;        /* updates applied to this segment (t - 1 of the next bias correction) */
    bool momentum_valid;  /* SGD: the momentum buffer holds a value (else the next step copies d) */
    double mu_product;    /* NAdam: the product of the momentum coefficients of the steps taken (read when steps > 0) */
} ft_optim_segment_state;

/* The class name of a kind: "SGD", "AdamW", "LAMB", "LARS", "Adam", "RMSprop", "Adadelta", "Adagrad", "Adamax",
 * "NAdam", "RAdam". */
const char *ft_optim_kind_name(ft_optim_kind kind);

/* FT_ERR_VALUE naming group `index` and its first bad hyperparameter (lr
 * finite and >= 0, betas in [0, 1), eps > 0, ...; see ft_optim_group). */
ft_status ft_optim_check_group(ft_optim_kind kind, int index, const ft_optim_group *g);

/* Validates every group and segment (params must not overlap each other,
 * grads must not overlap params) and allocates zeroed state. The params and
 * grads are in the memory of `device` (the CPU or a CUDA device; the caller
 * vouches for the pointers), where the state is allocated too: FT_ERR_DEVICE
 * when that device cannot be used. The optimizer keeps copies of both arrays
 * but only borrows the memory they point to. */
ft_status ft_optimizer_create(ft_optimizer **out, ft_device device, ft_optim_kind kind, int ngroups,
                              const ft_optim_group *groups, int nsegments, const ft_optim_segment *segments);
void ft_optimizer_destroy(ft_optimizer *opt);

/* One update of every segment that has a gradient. grad_scale (finite, > 0)
 * multiplies the gradients first (e.g. 1 / loss_scale). max_grad_norm > 0
 * clips by the global norm as torch.nn.utils.clip_grad_norm_ does (the
 * coefficient max_grad_norm / (norm + 1e-6), capped at 1); 0 disables it.
 * *grad_norm (when not NULL) receives the global L2 norm of the scaled
 * gradients before clipping (also when it is not finite and the step is
 * refused), or 0 when no segment has a gradient.
 *
 * The norm is computed when clipping, when grad_norm is not NULL and for
 * LARS; when it is not finite, FT_ERR_VALUE is returned and neither params
 * nor state change. Without it, gradients are not inspected (as with
 * torch.optim) and non-finite values reach the params. */
ft_status ft_optimizer_step(ft_optimizer *opt, float grad_scale, double max_grad_norm, double *grad_norm);

/* Points segment i at grads[i] (NULL: skip it) for the following steps,
 * validated as at creation; on failure nothing changes. */
ft_status ft_optimizer_set_grads(ft_optimizer *opt, const float *const *grads);

/* Has the update pass also write each updated param, rounded to `dtype`
 * (bfloat16 or float16, to nearest even), at copies[i] (segment i's numel
 * elements; NULL: none), as it goes: the low-precision weights of a
 * mixed-precision program without a pass of their own. copies NULL stops
 * it. CPU only (FT_ERR_DEVICE on CUDA); the caller vouches for the memory. */
ft_status ft_optimizer_set_copies(ft_optimizer *opt, ft_dtype dtype, void *const *copies);

/* Changes a group's hyperparameters, validated as at creation; may allocate
 * a state buffer that a newly enabled option needs (momentum, amsgrad). */
ft_status ft_optimizer_set_group(ft_optimizer *opt, int group, const ft_optim_group *g);

ft_optim_kind ft_optimizer_kind(const ft_optimizer *opt);
ft_device ft_optimizer_device(const ft_optimizer *opt);
int ft_optimizer_num_groups(const ft_optimizer *opt);
int ft_optimizer_num_segments(const ft_optimizer *opt);
const ft_optim_group *ft_optimizer_group(const ft_optimizer *opt, int group);
const ft_optim_segment *ft_optimizer_segment(const ft_optimizer *opt, int segment);

/* The number of steps that updated at least one segment. */
int64_t ft_optimizer_num_steps(const ft_optimizer *opt);

/* The flat float32 buffer of a state kind on the optimizer's device
 * (borrowed; retain it to keep it beyond the optimizer), or NULL when this
 * optimizer has none. Segment i occupies elements [offset(i), offset(i) +
 * numel) of every buffer. */
ft_storage *ft_optimizer_state(const ft_optimizer *opt, ft_optim_state kind);
int64_t ft_optimizer_offset(const ft_optimizer *opt, int segment);
int64_t ft_optimizer_state_numel(const ft_optimizer *opt);

/* torch.optim's key of a state kind ("momentum_buffer", "exp_avg", ...). */
const char *ft_optim_state_name(ft_optim_state kind);

ft_optim_segment_state ft_optimizer_segment_state(const ft_optimizer *opt, int segment);
ft_status ft_optimizer_set_segment_state(ft_optimizer *opt, int segment, ft_optim_segment_state st);

/* ---- exponential moving average of weights ----
 * avg = lerp(avg, param, 1 - decay) over every segment in one pass, the
 * averages in one flat allocation in segment order, starting as copies of
 * the params. */
typedef struct {
    const float *param;
    int64_t numel;
} ft_ema_segment;

typedef struct ft_ema ft_ema;

/* The params are in the memory of `device`, where the averages live. */
ft_status ft_ema_create(ft_ema **out, ft_device device, int nsegments, const ft_ema_segment *segments);
void ft_ema_destroy(ft_ema *ema);

/* decay in [0, 1]. */
ft_status ft_ema_update(ft_ema *ema, double decay);

/* The averages (borrowed), segment i at elements [offset(i), offset(i) + numel). */
ft_storage *ft_ema_average(const ft_ema *ema);
int64_t ft_ema_offset(const ft_ema *ema, int segment);
int ft_ema_num_segments(const ft_ema *ema);
ft_ema_segment ft_ema_get_segment(const ft_ema *ema, int segment);

#endif
