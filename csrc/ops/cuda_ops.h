/* The ops the CUDA backend implements, with the signatures of the CPU entry
 * points that dispatch to them.
 *
 * Each op entry point (ops/<op>.c) validates its arguments, then calls the
 * entry of this table when the tensors are on a CUDA device (the backend
 * receives only arguments the checks have accepted: same device, dtypes,
 * shapes, no partial aliasing). A NULL entry is an op the backend does not
 * implement; FT_CUDA_DISPATCH reports it. The work is queued on the device's
 * compute stream (the legacy default stream, so that copies made by the core
 * and by user code are ordered with it); an op returns before it has run,
 * except where it must read a result back (e.g. validating targets). */
#ifndef FT_OPS_CUDA_OPS_H
#define FT_OPS_CUDA_OPS_H

#include "core/cuda.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/groupnorm.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/math.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/rnn.h"
#include "ops/softmax.h"
#include "ops/upsample.h"
#include "optim/state.h"

struct ft_cuda_ops {
    /* activation.h */
    ft_status (*activation_forward)(const ft_tensor *out, const ft_tensor *inp, ft_act act);
    ft_status (*activation_backward)(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *inp,
                                     const ft_tensor *out, ft_act act, bool accumulate);
    /* elementwise.h */
    ft_status (*add_forward)(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b, ft_act act);
    ft_status (*add_backward)(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                              const ft_tensor *b, const ft_tensor *out, ft_act act, bool accumulate_a,
                              bool accumulate_b);
    ft_status (*mul_forward)(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b);
    ft_status (*mul_backward)(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                              const ft_tensor *b, bool accumulate_a, bool accumulate_b);
    ft_status (*concat_forward)(const ft_tensor *out, const ft_tensor *const *inps, int n, int dim);
    ft_status (*concat_backward)(const ft_tensor *const *dinps, const int64_t *sizes, int n,
                                 const ft_tensor *dout, int dim, bool accumulate);
    /* rnn.h */
    ft_status (*lstm_cell_forward)(const ft_tensor *c, const ft_tensor *gates, const ft_tensor *c_prev);
    ft_status (*lstm_cell_backward)(const ft_tensor *dgates, const ft_tensor *dc_prev, const ft_tensor *dc,
                                    const ft_tensor *gates, const ft_tensor *c_prev, bool accumulate_gates,
                                    bool accumulate_c_prev);
    ft_status (*lstm_hidden_forward)(const ft_tensor *h, const ft_tensor *gates, const ft_tensor *c);
    ft_status (*lstm_hidden_backward)(const ft_tensor *dgates, const ft_tensor *dc, const ft_tensor *dh,
                                      const ft_tensor *gates, const ft_tensor *c, bool accumulate_gates,
                                      bool accumulate_c);
    /* reduce.h */
    ft_status (*sum_to)(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate);
    ft_status (*broadcast_to)(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate);
    /* dropout.h */
    ft_status (*dropout_forward)(const ft_tensor *out, const ft_tensor *inp, const ft_dropout_params *p);
    ft_status (*dropout_backward)(const ft_tensor *dinp, const ft_tensor *dout, const ft_dropout_params *p,
                                  bool accumulate);
    /* softmax.h: `log` selects log_softmax */
    ft_status (*softmax_forward)(const ft_tensor *out, const ft_tensor *inp, int dim, bool log);
    ft_status (*softmax_backward)(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *out, int dim,
                                  bool accumulate, bool log);
    /* loss.h */
    ft_status (*cross_entropy_forward)(const ft_tensor *loss, const ft_tensor *dlogits, const ft_tensor *logits,
                                       const ft_tensor *target, const ft_tensor *weight,
                                       const ft_cross_entropy_params *p);
    ft_status (*cross_entropy_backward)(const ft_tensor *dlogits, const ft_tensor *dloss, const ft_tensor *logits,
                                        const ft_tensor *target, const ft_tensor *weight,
                                        const ft_cross_entropy_params *p, bool accumulate);
    ft_status (*mse_loss_forward)(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                                  ft_reduction reduction);
    ft_status (*mse_loss_backward)(const ft_tensor *dinp, const ft_tensor *dtarget, const ft_tensor *dloss,
                                   const ft_tensor *inp, const ft_tensor *target, ft_reduction reduction,
                                   bool accumulate_inp, bool accumulate_target);
    ft_status (*nll_loss_forward)(const ft_tensor *loss, const ft_tensor *inp, const ft_tensor *target,
                                  const ft_tensor *weight, int64_t ignore_index);
    /* adds into dinp: the entry point zeroes it first when it writes */
    ft_status (*nll_loss_backward)(const ft_tensor *dinp, const ft_tensor *dloss, const ft_tensor *target,
                                   const ft_tensor *weight, int64_t ignore_index);
    /* pool.h */
    ft_status (*max_pool2d_forward)(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp,
                                    const ft_pool2d_params *p);
    ft_status (*max_pool2d_backward)(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                     bool accumulate);
    ft_status (*avg_pool2d_forward)(const ft_tensor *out, const ft_tensor *inp, const ft_pool2d_params *p);
    ft_status (*avg_pool2d_backward)(const ft_tensor *dinp, const ft_tensor *dout, const ft_pool2d_params *p,
                                     bool accumulate);
    ft_status (*adaptive_avg_pool2d_forward)(const ft_tensor *out, const ft_tensor *inp);
    ft_status (*adaptive_avg_pool2d_backward)(const ft_tensor *dinp, const ft_tensor *dout, bool accumulate);
    ft_status (*adaptive_max_pool2d_forward)(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp);
    ft_status (*adaptive_max_pool2d_backward)(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                              bool accumulate);
    /* batchnorm.h */
    ft_status (*batchnorm_forward)(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_invstd,
                                   const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                                   const ft_tensor *running_mean, const ft_tensor *running_var,
                                   const ft_batchnorm_params *p);
    ft_status (*batchnorm_backward)(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                    const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *out,
                                    const ft_tensor *weight, const ft_tensor *save_mean,
                                    const ft_tensor *save_invstd, const ft_batchnorm_params *p);
    /* layernorm.h */
    ft_status (*layernorm_forward)(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                                   const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                                   int64_t norm_size, double eps);
    ft_status (*layernorm_backward)(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                    const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *weight,
                                    const ft_tensor *save_mean, const ft_tensor *save_rstd, int64_t norm_size);
    /* groupnorm.h: the backward writes or adds each gradient as acc says */
    ft_status (*group_norm_forward)(const ft_tensor *out, const ft_tensor *save_mean, const ft_tensor *save_rstd,
                                    const ft_tensor *inp, const ft_tensor *weight, const ft_tensor *bias,
                                    int64_t groups, double eps);
    ft_status (*group_norm_backward)(const ft_tensor *dinp, const ft_tensor *dweight, const ft_tensor *dbias,
                                     const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *save_mean,
                                     const ft_tensor *save_rstd, const ft_tensor *weight, int64_t groups,
                                     ft_grad_acc acc);
    /* embedding.h; embedding_first_bad_id: *pos = the first position of ids (T, int64) whose id is outside
     * [0, V) and *value that id, or *pos = -1; it waits for the answer */
    ft_status (*embedding_first_bad_id)(const ft_tensor *ids, int64_t V, int64_t *pos, int64_t *value);
    ft_status (*embedding_forward)(const ft_tensor *out, const ft_tensor *ids, const ft_tensor *weight,
                                   int64_t padding_idx);
    ft_status (*embedding_backward)(const ft_tensor *dweight, const ft_tensor *dout, const ft_tensor *ids,
                                    int64_t padding_idx, bool accumulate);
    ft_status (*one_hot)(const ft_tensor *out, const ft_tensor *ids);
    /* upsample.h */
    ft_status (*upsample_nearest2d_forward)(const ft_tensor *out, const ft_tensor *inp, int64_t scale_h,
                                            int64_t scale_w);
    ft_status (*upsample_nearest2d_backward)(const ft_tensor *dinp, const ft_tensor *dout, int64_t scale_h,
                                             int64_t scale_w, bool accumulate);
    ft_status (*upsample_bilinear2d_forward)(const ft_tensor *out, const ft_tensor *inp,
                                             const ft_bilinear2d_params *p);
    ft_status (*upsample_bilinear2d_backward)(const ft_tensor *dinp, const ft_tensor *dout,
                                              const ft_bilinear2d_params *p, bool accumulate);
    /* reduce.h: db (C) = the channel sums of dout */
    ft_status (*bias_grad)(const ft_tensor *db, const ft_tensor *dout);
    /* conv2d.h: cuDNN */
    ft_status (*conv2d_forward)(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w, const ft_tensor *b,
                                const ft_conv2d_params *p, const ft_conv2d_fusion *fusion);
    ft_status (*conv2d_backward)(const ft_tensor *dinp, const ft_tensor *dw, const ft_tensor *db,
                                 const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                                 const ft_conv2d_params *p);
    /* linear.h: cuBLASLt; db is given only with dw (it comes out of dw's product) */
    ft_status (*linear_forward)(const ft_tensor *out, const ft_tensor *x, const ft_tensor *w, const ft_tensor *b,
                                ft_act act);
    ft_status (*linear_backward)(const ft_tensor *dx, const ft_tensor *dw, const ft_tensor *db,
                                 const ft_tensor *dout, const ft_tensor *x, const ft_tensor *w);
    /* attention.h; the backward writes its gradients (NULL: not computed) */
    ft_status (*sdpa_forward)(const ft_tensor *out, const ft_tensor *lse, const ft_tensor *q, const ft_tensor *k,
                              const ft_tensor *v, const ft_sdpa_params *p);
    ft_status (*sdpa_backward)(const ft_tensor *dq, const ft_tensor *dk, const ft_tensor *dv, const ft_tensor *dout,
                               const ft_tensor *q, const ft_tensor *k, const ft_tensor *v, const ft_tensor *out,
                               const ft_tensor *lse, const ft_sdpa_params *p);
    /* math.h: the eager tensor math, planned and checked by the entry point; `t` names the device */
    ft_status (*math_pointwise)(const ft_tensor *t, const ft_math_map *m);
    ft_status (*math_reduce)(const ft_tensor *t, const ft_math_reduction *r);
    /* nn/program.c: counter (() int64) += 1, a batch norm's num_batches_tracked */
    ft_status (*increment)(const ft_tensor *counter);
    /* optim/optim.h: the passes of ft_optimizer_step and ft_ema_update; each returns once its work is queued,
     * except optim_grad_sumsq, which waits for the sum it returns */
    /* x (n) = 0 */
    ft_status (*optim_zero)(float *x, int64_t n, int device);
    /* o->table = table (o->nseg entries in host memory, free to reuse on return) */
    ft_status (*optim_upload)(const ft_cuda_optim *o, const ft_cuda_optim_segment *table);
    /* partial[2b] = the sum over block b of (grad * grad_scale)^2 (0 in a segment without grad), with params
     * partial[2b + 1] = that of the params (else 0); *sumsq = the sum of every partial[2b] */
    ft_status (*optim_grad_sumsq)(const ft_cuda_optim *o, float grad_scale, bool params, double *sumsq);
    /* The update of every segment with a grad, the grads scaled by grad_scale * clip; LAMB and LARS first
     * work out their trust ratios (LARS from the partials the last optim_grad_sumsq left, with params) */
    ft_status (*optim_update)(const ft_cuda_optim *o, float grad_scale, float clip);
    /* avg[offset + i] = lerp(avg[offset + i], param[i], weight) for every segment of table (nseg, device
     * memory, nblocks blocks in all) */
    ft_status (*ema_update)(float *avg, const ft_cuda_flat_segment *table, int nseg, int64_t nblocks, float weight,
                            int device);
};

/* In an entry point whose tensors are on a CUDA device: the status of the
 * backend's `entry` called with the arguments, or FT_ERR_DEVICE when the
 * backend has none. FT_CUDA_DISPATCH returns it. */
#define FT_CUDA_CALL(op, entry, ...)                                                                     \
    (ft_cuda_op_table() && ft_cuda_op_table()->entry                                                     \
         ? ft_cuda_op_table()->entry(__VA_ARGS__)                                                        \
         : ft_fail(FT_ERR_DEVICE, "%s: has no CUDA implementation in this build", (op)))
#define FT_CUDA_DISPATCH(op, entry, ...) return FT_CUDA_CALL(op, entry, __VA_ARGS__)

#endif
