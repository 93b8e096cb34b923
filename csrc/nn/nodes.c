/* The rows of ft_node_kinds (nn/node.h): one forward and one backward per
 * kind, each a call of its ops on the tensors the program prepared. */
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "nn/node.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/groupnorm.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/math.h"
#include "ops/reduce.h"
#include "ops/rnn.h"
#include "ops/softmax.h"
#include "ops/upsample.h"

static const ft_act no_act = {FT_ACT_NONE, 0};

int64_t ft_node_numel(const ft_node *nd) {
    int64_t k = 1;
    for (int d = 0; d < nd->ndim; d++)
        k *= nd->shape[d];
    return k;
}

static const ft_tensor *param(const ft_tensor *t) { return t->storage ? t : NULL; }

static ft_grad_acc acc_of(const ft_node_run *r) { return (ft_grad_acc){r->din_acc[0], r->dweight_acc, r->dbias_acc}; }

/* aux seen as `n` float32 (or int32) values from element `at`. */
static ft_tensor aux_vector(const ft_node_run *r, int64_t at, int64_t n) {
    ft_tensor t = {.storage = r->aux.storage, .offset = r->aux.offset + at * 4, .dtype = FT_FLOAT32, .ndim = 1,
                   .shape = {n}, .strides = {1}};
    return t;
}

/* ---- the input, identity, reshape, permute, slice, parameters ---- */

static bool always_view(const ft_node *nd, const ft_node *in, bool channels_last, bool training) { return true; }

static bool is_image(const ft_node *nd) { return nd->ndim == 3; }

static ft_status same_numel(const ft_node *nd, const ft_node *const *in) {
    if (ft_node_numel(nd) != ft_node_numel(in[0]))
        return ft_fail(FT_ERR_SHAPE, "program: a %s of %lld values into %lld", ft_node_kinds[nd->kind].name,
                       (long long)ft_node_numel(in[0]), (long long)ft_node_numel(nd));
    return FT_OK;
}

static ft_status same_shape(const ft_node *nd, const ft_node *const *in) {
    for (int k = 0; k < ft_node_kinds[nd->kind].max_inputs && in[k]; k++)
        if (in[k]->ndim != nd->ndim || memcmp(in[k]->shape, nd->shape, (size_t)nd->ndim * sizeof *nd->shape))
            return ft_fail(FT_ERR_SHAPE, "program: a %s node's inputs and output differ in shape",
                           ft_node_kinds[nd->kind].name);
    return FT_OK;
}

/* Whether an image's channels-last order is its (C, H, W) order. */
static bool ordered_both_ways(const ft_node *image) {
    return (image->shape[1] == 1 && image->shape[2] == 1) || image->shape[0] == 1;
}

/* A reshape is a view when its input's memory order is its output's: in a
 * channels-last program, an image's values are gathered into (C, H, W)
 * order, and values that are no image scattered into a channels-last one
 * (FT_LAYOUT_OF_IMAGES). */
static bool reshape_is_view(const ft_node *nd, const ft_node *in, bool channels_last, bool training) {
    if (!channels_last)
        return true;
    return is_image(in) ? ordered_both_ways(in) : !is_image(nd) || ordered_both_ways(nd);
}

/* t's elements as a dense tensor of `like`'s shape. */
static ft_tensor reshaped(const ft_tensor *t, const ft_tensor *like) {
    ft_tensor v = *t;
    v.ndim = like->ndim;
    memcpy(v.shape, like->shape, sizeof v.shape);
    ft_contiguous_strides(v.strides, v.ndim, v.shape);
    return v;
}

/* dst = src, or dst += src when acc: the backward of the nodes that move values. */
static ft_status put(const ft_tensor *dst, const ft_tensor *src, bool acc) {
    return acc ? ft_add_forward(dst, dst, src, no_act) : ft_tensor_copy(dst, src, false);
}

/* The copying reshape: a channels-last image gathered into (C, H, W) order,
 * or values in order scattered into a channels-last image. */
static ft_status reshape_forward(const ft_node_run *r) {
    if (!ft_tensor_is_contiguous(&r->out)) {
        ft_tensor src = reshaped(&r->in[0], &r->out);
        return ft_tensor_copy(&r->out, &src, false);
    }
    ft_tensor dst = reshaped(&r->out, &r->in[0]);
    return ft_tensor_copy(&dst, &r->in[0], false);
}

static ft_status reshape_backward(const ft_node_run *r) {
    if (!ft_tensor_is_contiguous(&r->dout)) {
        ft_tensor d = reshaped(r->din[0], &r->dout);
        return put(&d, &r->dout, r->din_acc[0]);
    }
    ft_tensor g = reshaped(&r->dout, &r->in[0]);
    return put(r->din[0], &g, r->din_acc[0]);
}

static ft_status permute_check(const ft_node *nd, const ft_node *const *in) {
    unsigned seen = 0;
    for (int d = 0; d < nd->ndim; d++) {
        int p = nd->perm[d];
        if (p < 0 || p >= nd->ndim || (seen >> p & 1) || nd->ndim != in[0]->ndim || nd->shape[d] != in[0]->shape[p])
            return ft_fail(FT_ERR_SHAPE, "program: a permute's order is not a permutation of its input's dimensions");
        seen |= 1u << p;
    }
    return FT_OK;
}

/* t (N, ...) with its per-sample dimensions ordered as `perm` says (inverse: undoing it). */
static ft_tensor permuted(const ft_tensor *t, const int *perm, bool inverse) {
    ft_tensor v = *t;
    for (int d = 0; d + 1 < t->ndim; d++) {
        int from = inverse ? d : perm[d], to = inverse ? perm[d] : d;
        v.shape[1 + to] = t->shape[1 + from];
        v.strides[1 + to] = t->strides[1 + from];
    }
    return v;
}

static ft_status permute_forward(const ft_node_run *r) {
    ft_tensor src = permuted(&r->in[0], r->nd->perm, false);
    return ft_tensor_copy(&r->out, &src, false);
}

static ft_status permute_backward(const ft_node_run *r) {
    ft_tensor g = permuted(&r->dout, r->nd->perm, true);
    return put(r->din[0], &g, r->din_acc[0]);
}

static ft_status slice_check(const ft_node *nd, const ft_node *const *in) {
    int d = nd->slice_dim;
    bool ok = d >= 0 && d < nd->ndim && nd->ndim == in[0]->ndim && nd->slice_start >= 0 && nd->slice_step >= 1 &&
              nd->slice_start + (nd->shape[d] - 1) * nd->slice_step < in[0]->shape[d];
    for (int k = 0; ok && k < nd->ndim; k++)
        ok = k == d || nd->shape[k] == in[0]->shape[k];
    return ok ? FT_OK : ft_fail(FT_ERR_SHAPE, "program: a slice reaches outside its input");
}

/* The sliced elements of t (N, ...). */
static ft_tensor sliced(const ft_tensor *t, const ft_node *nd) {
    ft_tensor v = *t;
    int d = 1 + nd->slice_dim;
    v.offset += nd->slice_start * t->strides[d] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    v.shape[d] = nd->shape[nd->slice_dim];
    v.strides[d] *= nd->slice_step;
    return v;
}

static ft_status slice_forward(const ft_node_run *r) {
    ft_tensor src = sliced(&r->in[0], r->nd);
    return ft_tensor_copy(&r->out, &src, false);
}

/* The unsliced elements get zero (when writing) and the sliced ones dout. */
static ft_status slice_backward(const ft_node_run *r) {
    if (!r->din_acc[0])
        FT_TRY(ft_tensor_zero(r->din[0]));
    ft_tensor dst = sliced(r->din[0], r->nd);
    return ft_add_forward(&dst, &dst, &r->dout, no_act);
}

/* A parameter node's weight has its shape (dim -1), or varies along its
 * first dimension (a per-channel scale) or its last (a per-feature bias)
 * only, the same along the others. */
static ft_status param_check(const ft_node *nd, const ft_node *const *in) {
    int64_t want = nd->dim < 0 ? ft_node_numel(nd) : nd->dim < nd->ndim ? nd->shape[nd->dim] : -1;
    bool ok = nd->weight.storage && ft_tensor_numel(&nd->weight) == want && ft_tensor_is_contiguous(&nd->weight) &&
              (nd->dim <= 0 || (nd->dim == nd->ndim - 1 && nd->ndim != 3));
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: a parameter node needs a contiguous weight of its shape, or of its "
                                      "first dimension, or of the last dimension of a non-image sample");
}

/* dweight (=, +=) the sum of dout over the samples (and over the dimensions
 * the weight is the same along): the reduction of a bias gradient. */
static ft_status param_backward(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    ft_tensor g = r->dout, dw = *r->dweight;
    dw.shape[0] = ft_tensor_numel(&dw);
    dw.ndim = 1;
    dw.strides[0] = 1;
    if (nd->dim < 0 || nd->dim == nd->ndim - 1) { /* (rows, n): every value its own, or the features last */
        int64_t n = nd->dim < 0 ? ft_node_numel(nd) : nd->shape[nd->ndim - 1];
        g.ndim = 2;
        g.shape[0] = ft_tensor_numel(&r->dout) / n;
        g.shape[1] = n;
        g.strides[0] = n;
        g.strides[1] = 1;
    } else if (g.ndim == 3) { /* per channel of (C, L) sequences: as (C, 1, L) images */
        g.ndim = 4;
        g.shape[3] = g.shape[2], g.strides[3] = g.strides[2];
        g.shape[2] = 1, g.strides[2] = g.strides[3] * g.shape[3];
    }
    return ft_bias_grad(&dw, &g, r->dweight_acc);
}

/* ---- convolution and linear, with a fused activation ---- */

/* A 1-d convolution's weight (K, C, S) as the (K, C, 1, S) of the 2-d one it runs as. */
static ft_tensor conv_weight(const ft_tensor *w) {
    ft_tensor v = *w;
    if (w->ndim == 3) {
        v.ndim = 4;
        v.shape[3] = w->shape[2], v.strides[3] = w->strides[2];
        v.shape[2] = 1, v.strides[2] = w->strides[2] * w->shape[2];
    }
    return v;
}

static ft_status conv2d_forward(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    ft_conv2d_fusion fusion = {.act = nd->act};
    ft_tensor w = conv_weight(&nd->weight);
    return ft_conv2d_forward(&r->out, &r->in[0], &w, param(&nd->bias), &nd->conv, &fusion);
}

/* A conv's, linear's or add's backward reads its output for a fused activation only. */
static bool act_fused(const ft_node *nd) { return nd->act.kind != FT_ACT_NONE; }

/* For the kinds whose backward needs only the output's gradient (and what
 * they saved). */
static bool never(const ft_node *nd) { return false; }

/* The fused activation's backward, in place on dout: the op's own gradient. */
static ft_status unfuse(const ft_node_run *r) {
    if (r->nd->act.kind == FT_ACT_NONE)
        return FT_OK;
    return ft_activation_backward(&r->dout, &r->dout, NULL, &r->out, r->nd->act, false);
}

static ft_status conv2d_backward(const ft_node_run *r) {
    FT_TRY(unfuse(r));
    ft_tensor w = conv_weight(&r->nd->weight), dw;
    if (r->dweight)
        dw = conv_weight(r->dweight);
    return ft_conv2d_backward(r->din[0], r->dweight ? &dw : NULL, r->dbias, &r->dout, &r->in[0], &w, &r->nd->conv,
                              acc_of(r));
}

static ft_status conv_transpose2d_forward(const ft_node_run *r) {
    ft_tensor w = conv_weight(&r->nd->weight);
    return ft_conv_transpose2d_forward(&r->out, &r->in[0], &w, param(&r->nd->bias), &r->nd->conv);
}

static ft_status conv_transpose2d_backward(const ft_node_run *r) {
    ft_tensor w = conv_weight(&r->nd->weight), dw;
    if (r->dweight)
        dw = conv_weight(r->dweight);
    return ft_conv_transpose2d_backward(r->din[0], r->dweight ? &dw : NULL, r->dbias, &r->dout, &r->in[0], &w,
                                        &r->nd->conv, acc_of(r));
}

/* t (N, ..., F) as the (N * ..., F) rows linear works on (program
 * buffers of non-image shapes are dense). */
static ft_tensor as_rows(const ft_tensor *t) {
    if (t->ndim == 2)
        return *t;
    ft_tensor v = *t;
    v.ndim = 2;
    v.shape[1] = t->shape[t->ndim - 1];
    v.shape[0] = ft_tensor_numel(t) / (v.shape[1] ? v.shape[1] : 1);
    v.strides[0] = v.shape[1];
    v.strides[1] = 1;
    return v;
}

static ft_status linear_forward(const ft_node_run *r) {
    ft_tensor out = as_rows(&r->out), in = as_rows(&r->in[0]);
    return ft_linear_forward(&out, &in, param(&r->nd->weight), param(&r->nd->bias), r->nd->act);
}

static ft_status linear_backward(const ft_node_run *r) {
    FT_TRY(unfuse(r));
    ft_tensor g = as_rows(&r->dout), in = as_rows(&r->in[0]), din;
    if (r->din[0])
        din = as_rows(r->din[0]);
    return ft_linear_backward(r->din[0] ? &din : NULL, r->dweight, r->dbias, &g, &in, &r->nd->weight, acc_of(r));
}

/* ---- normalization ---- */

static int64_t batchnorm_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return 2 * nd->shape[0] * 4; /* mean, invstd */
}

/* counter (() int64) += 1 where it lives. */
static ft_status count_batch(const ft_tensor *counter) {
    if (ft_op_device(counter).type == FT_DEV_CUDA)
        return FT_CUDA_CALL("batch_norm", increment, counter);
    ++*(int64_t *)ft_tensor_data(counter);
    return FT_OK;
}

/* Whether a batch norm normalizes by the batch's statistics: in a training run unless in eval mode at compile,
 * and always without running statistics (track_running_stats=False), in eval mode too, as PyTorch. */
static bool batch_statistics(const ft_node *nd, bool training) {
    return !nd->running_mean.storage || (training && nd->bn.training);
}

static ft_status batchnorm_forward(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    int64_t C = nd->shape[0];
    ft_tensor mean = aux_vector(r, 0, C), invstd = aux_vector(r, C, C);
    ft_batchnorm_params bn = nd->bn;
    bn.training = batch_statistics(nd, r->training);
    bn.act = nd->act;
    /* a replay takes the batch statistics again (the same input gives the same ones) and updates nothing */
    bool update = bn.training && !r->replay;
    if (update && nd->num_batches.storage)
        FT_TRY(count_batch(&nd->num_batches));
    if (nd->bn.momentum < 0) { /* momentum=None: a cumulative average, batch k weighing 1 / k (a host count) */
        bn.momentum = 0.0;     /* unused but by an update of running statistics */
        if (update && nd->num_batches.storage) {
            if (ft_op_device(&nd->num_batches).type != FT_DEV_CPU)
                return ft_fail(FT_ERR_VALUE, "batch_norm: momentum=None (a cumulative average) trains on the CPU only");
            bn.momentum = 1.0 / (double)*(const int64_t *)ft_tensor_data(&nd->num_batches);
        }
    }
    bool running = update || !bn.training;
    return ft_batchnorm_forward(&r->out, &mean, &invstd, &r->in[0], param(&nd->weight), param(&nd->bias),
                                running ? param(&nd->running_mean) : NULL, running ? param(&nd->running_var) : NULL,
                                &bn);
}

static ft_status batchnorm_backward(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    int64_t C = nd->shape[0];
    ft_tensor mean = aux_vector(r, 0, C), invstd = aux_vector(r, C, C);
    ft_batchnorm_params bn = nd->bn;
    bn.training = batch_statistics(nd, true);
    bn.act = nd->act;
    /* InPlace-ABN's input may be gone: the program frees it after the forward */
    return ft_batchnorm_backward(r->din[0], r->dweight, r->dbias, &r->dout, bn.inplace_abn ? NULL : &r->in[0],
                                 &r->out, param(&nd->weight), param(&nd->bias), &mean, &invstd, &bn, acc_of(r));
}

static bool batchnorm_reads_inputs(const ft_node *nd) { return !nd->bn.inplace_abn; }

static bool batchnorm_reads_output(const ft_node *nd) { return nd->act.kind != FT_ACT_NONE || nd->bn.inplace_abn; }

/* The elements a layer norm normalizes together: its trailing norm_dims. */
static int64_t norm_size(const ft_node *nd) {
    int64_t d = 1;
    for (int k = nd->ndim - nd->norm_dims; k < nd->ndim; k++)
        d *= nd->shape[k];
    return d;
}

static ft_status layernorm_check(const ft_node *nd, const ft_node *const *in) {
    if (nd->norm_dims < 1 || nd->norm_dims > nd->ndim)
        return ft_fail(FT_ERR_VALUE, "program: a layer norm normalizes %d of %d dimensions", nd->norm_dims, nd->ndim);
    return same_shape(nd, in);
}

static int64_t layernorm_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return 2 * rows * (ft_node_numel(nd) / norm_size(nd)) * 4; /* each row's mean and rstd */
}

static ft_status layernorm_forward(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    int64_t n = r->out.shape[0] * (ft_node_numel(nd) / norm_size(nd));
    ft_tensor mean = aux_vector(r, 0, n), rstd = aux_vector(r, n, n);
    return ft_layernorm_forward(&r->out, &mean, &rstd, &r->in[0], param(&nd->weight), param(&nd->bias),
                                norm_size(nd), nd->eps);
}

static ft_status layernorm_backward(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    int64_t n = r->out.shape[0] * (ft_node_numel(nd) / norm_size(nd));
    ft_tensor mean = aux_vector(r, 0, n), rstd = aux_vector(r, n, n);
    return ft_layernorm_backward(r->din[0], r->dweight, r->dbias, &r->dout, &r->in[0], param(&nd->weight), &mean,
                                 &rstd, norm_size(nd), acc_of(r));
}

/* ---- activations and dropout ---- */

static ft_status act_forward(const ft_node_run *r) { return ft_activation_forward(&r->out, &r->in[0], r->nd->act); }

static ft_status act_backward(const ft_node_run *r) {
    return ft_activation_backward(r->din[0], &r->dout, &r->in[0], &r->out, r->nd->act, r->din_acc[0]);
}

static bool dropout_is_view(const ft_node *nd, const ft_node *in, bool channels_last, bool training) {
    return !training || nd->dropout_p == 0;
}

static ft_dropout_params dropout_of(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    int64_t span = nd->dropout_channels && nd->shape[0] ? ft_node_numel(nd) / nd->shape[0] : 1;
    return (ft_dropout_params){nd->dropout_p, r->seed, r->mask_offset, span > 0 ? span : 1};
}

/* One draw per element (dropout runs only in the training step: a view otherwise). */
static uint64_t element_draws(const ft_node *nd, const ft_node *const *in, int64_t rows, bool training) {
    return ft_dropout_blocks(rows * ft_node_numel(nd));
}

static ft_status dropout_forward(const ft_node_run *r) {
    ft_dropout_params dp = dropout_of(r);
    return ft_dropout_forward(&r->out, &r->in[0], &dp);
}

static ft_status dropout_backward(const ft_node_run *r) {
    ft_dropout_params dp = dropout_of(r);
    return ft_dropout_backward(r->din[0], &r->dout, &dp, r->din_acc[0]);
}

/* Noise (randn_like, rand_like) in the shape of its input, which it does not
 * read: core/rng.h's draws, four values per Philox block (element_draws). */
static ft_status noise_forward(const ft_node_run *r) {
    ft_rng_state rng = {r->seed, r->mask_offset};
    return r->nd->uniform ? ft_rng_uniform(&r->out, &rng, 0.0, 1.0) : ft_rng_normal(&r->out, &rng, 0.0, 1.0);
}

/* ---- pooling ---- */

static int64_t indices_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return rows * ft_node_numel(nd) * 4;
}

/* The int32 argmax indices, laid out as the output. */
static ft_tensor indices(const ft_node_run *r) {
    ft_tensor t = r->out;
    t.storage = r->aux.storage;
    t.offset = r->aux.offset;
    t.dtype = FT_INT32;
    return t;
}

static ft_status maxpool_forward(const ft_node_run *r) {
    ft_tensor idx = indices(r);
    return ft_max_pool2d_forward(&r->out, &idx, &r->in[0], &r->nd->pool);
}

static ft_status maxpool_backward(const ft_node_run *r) {
    ft_tensor idx = indices(r);
    return ft_max_pool2d_backward(r->din[0], &r->dout, &idx, r->din_acc[0]);
}

static ft_status adaptive_maxpool_forward(const ft_node_run *r) {
    ft_tensor idx = indices(r);
    return ft_adaptive_max_pool2d_forward(&r->out, &idx, &r->in[0]);
}

static ft_status adaptive_maxpool_backward(const ft_node_run *r) {
    ft_tensor idx = indices(r);
    return ft_adaptive_max_pool2d_backward(r->din[0], &r->dout, &idx, r->din_acc[0]);
}

static ft_status avgpool_forward(const ft_node_run *r) {
    return ft_avg_pool2d_forward(&r->out, &r->in[0], &r->nd->pool);
}

static ft_status avgpool_backward(const ft_node_run *r) {
    return ft_avg_pool2d_backward(r->din[0], &r->dout, &r->nd->pool, r->din_acc[0]);
}

static ft_status adaptive_avgpool_forward(const ft_node_run *r) {
    return ft_adaptive_avg_pool2d_forward(&r->out, &r->in[0]);
}

static ft_status adaptive_avgpool_backward(const ft_node_run *r) {
    return ft_adaptive_avg_pool2d_backward(r->din[0], &r->dout, r->din_acc[0]);
}

/* ---- group norm, embedding, upsampling ---- */

static ft_status groupnorm_check(const ft_node *nd, const ft_node *const *in) {
    if (nd->ndim < 1 || nd->groups < 1 || nd->shape[0] % nd->groups)
        return ft_fail(FT_ERR_SHAPE, "program: a group norm of %lld groups over %lld channels",
                       (long long)nd->groups, (long long)(nd->ndim ? nd->shape[0] : 0));
    return same_shape(nd, in);
}

static int64_t groupnorm_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return 2 * rows * nd->groups * 4; /* each (sample, group)'s mean and rstd */
}

/* The saved mean (which 0) or rstd (1), (N, G). */
static ft_tensor group_stats(const ft_node_run *r, int which) {
    int64_t n = r->out.shape[0], G = r->nd->groups;
    ft_tensor t = aux_vector(r, which * n * G, n * G);
    t.ndim = 2;
    t.shape[0] = n, t.shape[1] = G;
    t.strides[0] = G, t.strides[1] = 1;
    return t;
}

static ft_status groupnorm_forward(const ft_node_run *r) {
    ft_tensor mean = group_stats(r, 0), rstd = group_stats(r, 1);
    return ft_group_norm_forward(&r->out, &mean, &rstd, &r->in[0], param(&r->nd->weight), param(&r->nd->bias),
                                 r->nd->groups, r->nd->eps);
}

static ft_status groupnorm_backward(const ft_node_run *r) {
    ft_tensor mean = group_stats(r, 0), rstd = group_stats(r, 1);
    return ft_group_norm_backward(r->din[0], r->dweight, r->dbias, &r->dout, &r->in[0], &mean, &rstd,
                                  param(&r->nd->weight), r->nd->groups, acc_of(r));
}

static ft_status embedding_check(const ft_node *nd, const ft_node *const *in) {
    const ft_tensor *w = &nd->weight;
    /* the input's ids, or a slice of them (whose dtype the program's plan gives; the op checks it) */
    bool ok = (in[0]->kind != FT_NODE_INPUT || in[0]->dtype == FT_INT64) && w->storage && w->ndim == 2 &&
              nd->ndim == in[0]->ndim + 1 && nd->shape[nd->ndim - 1] == w->shape[1] &&
              !memcmp(nd->shape, in[0]->shape, (size_t)in[0]->ndim * sizeof *nd->shape);
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: an embedding reads the int64 ids of the input and gives their "
                                      "rows of its (V, D) weight (compile with input_dtype=ft.int64)");
}

/* Ids the same for every sample (a parameter node's, read with a batch
 * stride of 0: the fixed positions of a relative position bias) are the
 * ops' ids one sample at a time. */
static ft_status embedding_forward(const ft_node_run *r) {
    const ft_tensor *ids = &r->in[0];
    if (ids->strides[0] != 0)
        return ft_embedding_forward(&r->out, ids, &r->nd->weight, r->nd->padding_idx);
    ft_tensor id = ft_rows_of(ids, 0, 1);
    for (int64_t s = 0; s < ids->shape[0]; s++) {
        ft_tensor out = ft_rows_of(&r->out, s, 1);
        FT_TRY(ft_embedding_forward(&out, &id, &r->nd->weight, r->nd->padding_idx));
    }
    return FT_OK;
}

static ft_status embedding_backward(const ft_node_run *r) {
    const ft_tensor *ids = &r->in[0];
    if (ids->strides[0] != 0)
        return ft_embedding_backward(r->dweight, &r->dout, ids, r->nd->padding_idx, r->dweight_acc);
    ft_tensor id = ft_rows_of(ids, 0, 1);
    for (int64_t s = 0; s < ids->shape[0]; s++) {
        ft_tensor dout = ft_rows_of(&r->dout, s, 1);
        FT_TRY(ft_embedding_backward(r->dweight, &dout, &id, r->nd->padding_idx, r->dweight_acc || s > 0));
    }
    return FT_OK;
}

static ft_status upsample_check(const ft_node *nd, const ft_node *const *in) {
    bool ok = nd->factor[0] >= 1 && nd->factor[1] >= 1 && nd->shape[0] == in[0]->shape[0] &&
              nd->shape[nd->ndim - 1] == in[0]->shape[nd->ndim - 1] * nd->factor[1] &&
              (nd->ndim == 2 ? nd->factor[0] == 1 : nd->shape[1] == in[0]->shape[1] * nd->factor[0]);
    return ok ? FT_OK : ft_fail(FT_ERR_SHAPE, "program: an upsampling's shape is not its input's times its factors");
}

static ft_status upsample_forward(const ft_node_run *r) {
    return ft_upsample_nearest2d_forward(&r->out, &r->in[0], r->nd->factor[0], r->nd->factor[1]);
}

static ft_status upsample_backward(const ft_node_run *r) {
    return ft_upsample_nearest2d_backward(r->din[0], &r->dout, r->nd->factor[0], r->nd->factor[1], r->din_acc[0]);
}

static ft_status bilinear_check(const ft_node *nd, const ft_node *const *in) {
    bool ok = nd->ndim == in[0]->ndim && nd->shape[0] == in[0]->shape[0] && (nd->ndim == 3 || nd->ndim == 2);
    return ok ? FT_OK : ft_fail(FT_ERR_SHAPE, "program: a bilinear upsampling keeps its input's channels and rank");
}

static ft_status bilinear_forward(const ft_node_run *r) {
    return ft_upsample_bilinear2d_forward(&r->out, &r->in[0], &r->nd->lerp);
}

static ft_status bilinear_backward(const ft_node_run *r) {
    return ft_upsample_bilinear2d_backward(r->din[0], &r->dout, &r->nd->lerp, r->din_acc[0]);
}

/* ---- matmul ---- */

/* Per sample (L..., M, K) @ (L..., K, P) -> (L..., M, P): a matrix product
 * for each index of the leading dimensions L (a head's). */
static ft_status matmul_check(const ft_node *nd, const ft_node *const *in) {
    int d = nd->ndim - 2;
    bool ok = d >= 0 && in[0]->ndim == nd->ndim && in[1]->ndim == nd->ndim &&
              !memcmp(in[0]->shape, nd->shape, (size_t)d * sizeof *nd->shape) &&
              !memcmp(in[1]->shape, nd->shape, (size_t)d * sizeof *nd->shape) &&
              in[0]->shape[d + 1] == in[1]->shape[d] && nd->shape[d] == in[0]->shape[d] &&
              nd->shape[d + 1] == in[1]->shape[d + 1];
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: a matmul takes (..., M, K) and (..., K, P) samples to (..., M, P)");
}

/* The number of matrices of t (N, L..., R, C): N times the sizes of L. */
static int64_t matrices(const ft_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 2; i++)
        n *= t->shape[i];
    return n;
}

/* Matrix k of t (N, L..., R, C), in row-major order of its leading
 * indices, or its transpose (C, R): the matrices linear works on. */
static ft_tensor matrix(const ft_tensor *t, int64_t k, bool transposed) {
    ft_tensor v = *t;
    int d = t->ndim - 2;
    for (int i = d - 1; i >= 0; i--) {
        v.offset += k % t->shape[i] * t->strides[i] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
        k /= t->shape[i];
    }
    v.ndim = 2;
    v.shape[0] = t->shape[transposed ? d + 1 : d], v.shape[1] = t->shape[transposed ? d : d + 1];
    v.strides[0] = t->strides[transposed ? d + 1 : d], v.strides[1] = t->strides[transposed ? d : d + 1];
    /* A matrix of one row or column reads nothing along that stride, but oneDNN takes one below the other
     * dimension's extent as overlapping memory (a (1, K) view of a (K, 1) column has strides (1, 1)). */
    for (int k = 0; k < 2; k++)
        if (v.shape[k] == 1 && v.strides[k] < v.shape[1 - k] * v.strides[1 - k])
            v.strides[k] = v.shape[1 - k] * v.strides[1 - k];
    return v;
}

/* t (..., R, C) viewed as (..., C, R). */
static ft_tensor transpose_last(const ft_tensor *t) {
    ft_tensor v = *t;
    int d = t->ndim - 2;
    v.shape[d] = t->shape[d + 1], v.shape[d + 1] = t->shape[d];
    v.strides[d] = t->strides[d + 1], v.strides[d + 1] = t->strides[d];
    return v;
}

/* out[k] = a[k] @ b[k]: on the CPU one batched matmul, on CUDA as linear's x @ w^T with w = b[k]^T, one matmul
 * per matrix. */
static ft_status matmul_forward(const ft_node_run *r) {
    if (ft_op_device(&r->out).type == FT_DEV_CPU)
        return ft_matmul_batched(&r->out, &r->in[0], &r->in[1], false);
    for (int64_t k = 0; k < matrices(&r->out); k++) {
        ft_tensor out = matrix(&r->out, k, false), a = matrix(&r->in[0], k, false), bt = matrix(&r->in[1], k, true);
        FT_TRY(ft_linear_forward(&out, &a, &bt, NULL, no_act));
    }
    return FT_OK;
}

/* da[k] = dout[k] @ b[k]^T and db[k] = a[k]^T @ dout[k]: linear's dx and, transposed, its dw. */
static ft_status matmul_backward(const ft_node_run *r) {
    if (ft_op_device(&r->dout).type == FT_DEV_CPU) {
        ft_tensor at = transpose_last(&r->in[0]), bt = transpose_last(&r->in[1]);
        if (r->din[0])
            FT_TRY(ft_matmul_batched(r->din[0], &r->dout, &bt, r->din_acc[0]));
        return r->din[1] ? ft_matmul_batched(r->din[1], &at, &r->dout, r->din_acc[1]) : FT_OK;
    }
    for (int64_t k = 0; k < matrices(&r->dout); k++) {
        ft_tensor g = matrix(&r->dout, k, false), a = matrix(&r->in[0], k, false), bt = matrix(&r->in[1], k, true);
        ft_tensor da, dbt;
        if (r->din[0])
            da = matrix(r->din[0], k, false);
        if (r->din[1])
            dbt = matrix(r->din[1], k, true);
        FT_TRY(ft_linear_backward(r->din[0] ? &da : NULL, r->din[1] ? &dbt : NULL, NULL, &g, &a, &bt,
                                  (ft_grad_acc){.inp = r->din_acc[0], .weight = r->din_acc[1]}));
    }
    return FT_OK;
}

/* ---- attention ---- */

/* Whether q, k and v come packed in one input, and whether a key mask follows them. */
/* The inputs: q, k and v (or one packed input), a key mask, then a score bias. */
static int attention_qkv_mask(const ft_node *nd) { return nd->ninputs - nd->score_bias; }
static bool attention_packed(const ft_node *nd) { return attention_qkv_mask(nd) <= 2; }
static bool attention_masked(const ft_node *nd) { return attention_qkv_mask(nd) % 2 == 0; }

/* E, the width of the queries (one packed input: a third of its width). */
static int64_t attention_width(const ft_node *nd, const ft_node *const *in) {
    return in[0]->shape[1] / (attention_packed(nd) ? 3 : 1);
}

/* Tk, the keys' count. */
static int64_t attention_keys(const ft_node *nd, const ft_node *const *in) {
    return in[attention_packed(nd) ? 0 : 1]->shape[0];
}

static ft_status attention_check(const ft_node *nd, const ft_node *const *in) {
    int64_t E = in[0]->ndim == 2 ? attention_width(nd, in) : 0, H = nd->groups;
    bool packed = attention_packed(nd);
    const ft_node *mask = attention_masked(nd) ? in[attention_qkv_mask(nd) - 1] : NULL;
    const ft_node *bias = nd->score_bias ? in[nd->ninputs - 1] : NULL;
    bool ok = in[0]->ndim == 2 && H >= 1 && E % H == 0 && E > 0 && nd->ndim == 2 &&
              nd->shape[0] == in[0]->shape[0] && nd->shape[1] == E &&
              (packed ? in[0]->shape[1] == 3 * E
                      : in[1]->ndim == 2 && in[2]->ndim == 2 && in[1]->shape[1] == E && in[2]->shape[1] == E &&
                            in[1]->shape[0] == in[2]->shape[0]) &&
              (!mask || (mask->ndim == 1 && mask->shape[0] == attention_keys(nd, in))) &&
              (!bias || (bias->ndim == 3 && bias->shape[0] == H && bias->shape[1] == nd->shape[0] &&
                         bias->shape[2] == attention_keys(nd, in)));
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: attention takes queries (T, E) and keys and values (S, E), or one "
                                      "packed (T, 3E) input, with E divisible by the %lld heads, then optionally "
                                      "a key mask (S,) and a score bias (heads, T, S)",
                        (long long)H);
}

static int64_t attention_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return rows * nd->groups * nd->shape[0] * 4; /* each query row's log-sum-exp */
}

/* Columns [col, col + E) of t (N, T, W) as the heads (N, H, T, E / H), without a copy. */
static ft_tensor heads_of(const ft_tensor *t, int64_t col, int64_t E, int64_t H) {
    ft_tensor v = *t;
    v.ndim = 4;
    v.offset += col * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    int64_t N = t->shape[0], T = t->shape[1], sN = t->strides[0], sT = t->strides[1], Dh = E / H;
    int64_t shape[4] = {N, H, T, Dh}, strides[4] = {sN, Dh, sT, 1};
    memcpy(v.shape, shape, sizeof shape);
    memcpy(v.strides, strides, sizeof strides);
    return v;
}

/* The queries, keys and values (k 0, 1, 2) among the inputs (or their gradients) ts. */
static ft_tensor qkv(const ft_node_run *r, const ft_tensor *const *ts, int k) {
    int64_t E = r->nd->shape[1];
    return attention_packed(r->nd) ? heads_of(ts[0], k * E, E, r->nd->groups) : heads_of(ts[k], 0, E, r->nd->groups);
}

static ft_tensor attention_lse(const ft_node_run *r) {
    ft_tensor t = aux_vector(r, 0, 0);
    int64_t shape[3] = {r->out.shape[0], r->nd->groups, r->nd->shape[0]};
    t.ndim = 3;
    memcpy(t.shape, shape, sizeof shape);
    ft_contiguous_strides(t.strides, 3, t.shape);
    return t;
}

/* A query's probability for each key, in the training step only: the mask's draws (ops/attention.h). */
static uint64_t attention_draws(const ft_node *nd, const ft_node *const *in, int64_t rows, bool training) {
    return training && nd->dropout_p > 0 ? ft_dropout_blocks(rows * nd->groups * nd->shape[0] * attention_keys(nd, in))
                                         : 0;
}

/* The op's parameters, pointing at the key mask and the score bias among the inputs. */
static ft_sdpa_params sdpa_params(const ft_node_run *r) {
    const ft_node *nd = r->nd;
    ft_sdpa_params p = {.scale = nd->scale, .causal = nd->causal, .dropout_p = r->training ? nd->dropout_p : 0.0,
                        .seed = r->seed, .offset = r->mask_offset};
    if (attention_masked(nd))
        p.key_mask = &r->in[attention_qkv_mask(nd) - 1];
    if (nd->score_bias)
        p.bias = &r->in[r->nin - 1];
    return p;
}

/* The inputs (or their gradients) ts as (q, k, v): one packed input is all three. */
static void qkv_inputs(const ft_node_run *r, const ft_tensor **out, const ft_tensor *const *ts) {
    bool packed = attention_packed(r->nd);
    out[0] = ts[0], out[1] = ts[packed ? 0 : 1], out[2] = ts[packed ? 0 : 2];
}

static ft_status attention_forward(const ft_node_run *r) {
    const ft_tensor *all[3] = {&r->in[0], &r->in[1], &r->in[2]}, *ins[3];
    qkv_inputs(r, ins, all);
    ft_tensor q = qkv(r, ins, 0), k = qkv(r, ins, 1), v = qkv(r, ins, 2), out = heads_of(&r->out, 0, r->nd->shape[1],
                                                                                        r->nd->groups);
    ft_tensor lse = attention_lse(r);
    ft_sdpa_params p = sdpa_params(r);
    return ft_sdpa_forward(&out, r->training ? &lse : NULL, &q, &k, &v, &p);
}

static bool same_buffer(const ft_tensor *a, const ft_tensor *b) {
    return a && b && a->storage == b->storage && a->offset == b->offset;
}

static ft_status attention_backward(const ft_node_run *r) {
    const ft_tensor *all[3] = {&r->in[0], &r->in[1], &r->in[2]}, *ins[3], *dins[3];
    qkv_inputs(r, ins, all);
    qkv_inputs(r, dins, r->din);
    ft_tensor q = qkv(r, ins, 0), k = qkv(r, ins, 1), v = qkv(r, ins, 2), lse = attention_lse(r);
    int64_t E = r->nd->shape[1], H = r->nd->groups;
    ft_tensor out = heads_of(&r->out, 0, E, H), dout = heads_of(&r->dout, 0, E, H), d[3];
    ft_sdpa_params p = sdpa_params(r);
    int b = r->nin - 1; /* the bias's gradient, if it has one: with the first call's */
    const ft_tensor *dbias = r->nd->score_bias ? r->din[b] : NULL;
    bool dbias_acc = dbias && r->din_acc[b];
    const ft_tensor *g[3] = {NULL, NULL, NULL};
    bool packed = attention_packed(r->nd), acc[3];
    for (int x = 0; x < 3; x++) {
        int i = packed ? 0 : x; /* a packed input's gradient holds all three */
        if (r->din[i]) {
            d[x] = qkv(r, dins, x);
            g[x] = &d[x];
        }
        acc[x] = r->din_acc[i];
    }
    if (packed || !(same_buffer(r->din[0], r->din[1]) || same_buffer(r->din[0], r->din[2]) ||
                         same_buffer(r->din[1], r->din[2])))
        return ft_sdpa_backward(g[0], g[1], g[2], dbias, &dout, &q, &k, &v, &out, &lse, &p,
                                (ft_sdpa_acc){acc[0], acc[1], acc[2], dbias_acc});
    /* One node read as two of q, k and v (the attention of x to itself): each share in turn, under the rule
     * the program set for it (the later shares add). */
    for (int x = 0; x < 3; x++)
        if (g[x]) {
            FT_TRY(ft_sdpa_backward(x == 0 ? g[0] : NULL, x == 1 ? g[1] : NULL, x == 2 ? g[2] : NULL, dbias, &dout,
                                    &q, &k, &v, &out, &lse, &p, (ft_sdpa_acc){acc[0], acc[1], acc[2], dbias_acc}));
            dbias = NULL;
        }
    if (dbias) /* no other gradient wanted */
        FT_TRY(ft_sdpa_backward(NULL, NULL, NULL, dbias, &dout, &q, &k, &v, &out, &lse, &p,
                                (ft_sdpa_acc){.bias = dbias_acc}));
    return FT_OK;
}

/* ---- masks ---- */

static ft_status math_check(const ft_node *nd, const ft_node *const *in) {
    if (nd->math_op < 0 || nd->math_op >= FT_MATH_NUM_OPS || ft_math_arity((ft_math_op)nd->math_op) > 2 ||
        (nd->ninputs == 2 && ft_math_arity((ft_math_op)nd->math_op) != 2))
        return ft_fail(FT_ERR_VALUE, "program: math op code %d is not one a node of %d inputs takes", nd->math_op,
                       nd->ninputs);
    return same_shape(nd, in);
}

/* A mask computes in its inputs' dtype (integers compared with a fraction, or two of different dtypes, in
 * float64; a float32 and a bfloat16 value in float32), any other op in the output's. The second operand is the
 * node's second input, or else the number nd->scale. */
static ft_status math_forward(const ft_node_run *r) {
    ft_math_op op = (ft_math_op)r->nd->math_op;
    double s = r->nd->scale;
    ft_dtype in = r->in[0].dtype, compute = r->out.dtype;
    if (r->out.dtype == FT_BOOL && r->nin == 2) {
        ft_dtype other = r->in[1].dtype;
        compute = in == other ? in : ft_dtype_is_float(in) && ft_dtype_is_float(other) ? FT_FLOAT32 : FT_FLOAT64;
    } else if (r->out.dtype == FT_BOOL) {
        compute = ft_dtype_is_float(in) || s == floor(s) ? in : FT_FLOAT64;
    }
    ft_math_arg args[2] = {{&r->in[0], {0}}, {r->nin == 2 ? &r->in[1] : NULL, {.kind = FT_SCALAR_FLOAT, .f = s}}};
    return ft_math_pointwise(&r->out, op, compute, args, ft_math_arity(op));
}

/* ---- LSTM cells ---- */

static ft_status lstm_check(const ft_node *nd, const ft_node *const *in) {
    bool ok = nd->ndim == 1 && in[0]->ndim == 1 && in[0]->shape[0] == 4 * nd->shape[0] &&
              (nd->kind != FT_NODE_LSTM_HIDDEN || nd->ninputs == 2);
    for (int k = 1; ok && k < nd->ninputs; k++)
        ok = in[k]->ndim == 1 && in[k]->shape[0] == nd->shape[0];
    return ok ? FT_OK : ft_fail(FT_ERR_SHAPE, "program: an LSTM cell takes gates (4H,) and states (H,)");
}

/* Gates [k0, k1) of the gates' gradient to zero, where this node writes it (the other gates' columns: the ops
 * write only their own, and the other node reading the gates adds its part later). */
static ft_status other_gates(const ft_node_run *r, int k0, int k1) {
    if (!r->din[0] || r->din_acc[0])
        return FT_OK;
    ft_tensor v = ft_lstm_gates(r->din[0], k0, k1);
    return ft_tensor_zero(&v);
}

static ft_status lstm_cell_node_forward(const ft_node_run *r) {
    return ft_lstm_cell_forward(&r->out, &r->in[0], r->nin > 1 ? &r->in[1] : NULL);
}

static ft_status lstm_cell_node_backward(const ft_node_run *r) {
    FT_TRY(other_gates(r, 3, 4));
    bool prev = r->nin > 1;
    return ft_lstm_cell_backward(r->din[0], prev ? r->din[1] : NULL, &r->dout, &r->in[0], prev ? &r->in[1] : NULL,
                                 r->din_acc[0], prev && r->din_acc[1]);
}

static ft_status lstm_hidden_node_forward(const ft_node_run *r) {
    return ft_lstm_hidden_forward(&r->out, &r->in[0], &r->in[1]);
}

static ft_status lstm_hidden_node_backward(const ft_node_run *r) {
    FT_TRY(other_gates(r, 0, 3));
    return ft_lstm_hidden_backward(r->din[0], r->din[1], &r->dout, &r->in[0], &r->in[1], r->din_acc[0],
                                   r->din_acc[1]);
}

/* A whole LSTM layer: what its backward reads (T, N, 6H) fills the aux of its forward. */
static ft_status lstm_layer_check(const ft_node *nd, const ft_node *const *in) {
    const ft_node *x = in[0];
    int64_t H = nd->ndim == 2 ? nd->shape[1] / 2 : 0;
    const ft_tensor *w = &nd->weight;
    bool ok = H > 0 && nd->shape[1] == 2 * H && x->ndim == 2 && x->shape[0] == nd->shape[0] &&
              x->shape[1] == 4 * H && nd->ninputs != 2 && w->storage && w->ndim == 2 && w->shape[0] == 4 * H &&
              w->shape[1] == H && (!nd->bias.storage || ft_tensor_numel(&nd->bias) == 4 * H);
    for (int k = 1; ok && k < nd->ninputs; k++)
        ok = in[k]->ndim == 1 && in[k]->shape[0] == H;
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: an LSTM layer takes input projections (T, 4H), optionally h0 and c0 "
                                      "(H,), and a weight (4H, H); it gives (T, 2H)");
}

static int64_t lstm_layer_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return (int64_t)ft_dtype_get(dtype)->itemsize * rows * 3 * ft_node_numel(nd);
}

/* A recurrent layer's aux, what its backward reads, as (T, N, k C) contiguous, C the columns of its output
 * (N, T, C): an LSTM's k = 3 (6H of its 2H), a GRU's 5. */
static ft_tensor layer_saved(const ft_node_run *r, int64_t k) {
    const ft_tensor *o = &r->out;
    int64_t N = o->shape[0], C = k * o->shape[2];
    ft_tensor t = {.storage = r->aux.storage, .offset = r->aux.offset, .dtype = o->dtype, .ndim = 3,
                   .shape = {o->shape[1], N, C}, .strides = {N * C, C, 1}};
    return t;
}

/* An RNN layer's backward reads its initial states, when given. */
static bool rnn_layer_state(const ft_node *nd) { return nd->ninputs > 1; }

static ft_status lstm_layer_forward(const ft_node_run *r) {
    ft_tensor g = layer_saved(r, 3);
    bool state = r->nin > 1;
    return ft_lstm_forward(&r->out, &g, &r->in[0], state ? &r->in[1] : NULL, state ? &r->in[2] : NULL,
                           &r->nd->weight, param(&r->nd->bias), r->nd->reverse);
}

static ft_status lstm_layer_backward(const ft_node_run *r) {
    ft_tensor g = layer_saved(r, 3);
    bool state = r->nin > 1;
    ft_rnn_acc acc = {r->din_acc[0], r->din_acc[1], r->din_acc[2], r->dweight_acc, r->dbias_acc};
    return ft_lstm_backward(r->din[0], state ? r->din[1] : NULL, state ? r->din[2] : NULL, r->dweight, r->dbias,
                            &r->dout, &g, state ? &r->in[1] : NULL, state ? &r->in[2] : NULL,
                            &r->nd->weight, r->nd->reverse, acc);
}

/* A whole GRU layer: what its backward reads (T, N, 5H) fills the aux of its forward. */
static ft_status gru_layer_check(const ft_node *nd, const ft_node *const *in) {
    const ft_node *x = in[0];
    int64_t H = nd->ndim == 2 ? nd->shape[1] : 0;
    const ft_tensor *w = &nd->weight;
    bool ok = H > 0 && x->ndim == 2 && x->shape[0] == nd->shape[0] && x->shape[1] == 3 * H && w->storage &&
              w->ndim == 2 && w->shape[0] == 3 * H && w->shape[1] == H &&
              (!nd->bias.storage || ft_tensor_numel(&nd->bias) == 3 * H) &&
              (nd->ninputs == 1 || (in[1]->ndim == 1 && in[1]->shape[0] == H));
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: a GRU layer takes input projections (T, 3H), optionally h0 (H,), "
                                      "and a weight (3H, H); it gives (T, H)");
}

static int64_t gru_layer_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    return (int64_t)ft_dtype_get(dtype)->itemsize * rows * 5 * ft_node_numel(nd);
}

static ft_status gru_layer_forward(const ft_node_run *r) {
    ft_tensor g = layer_saved(r, 5);
    return ft_gru_forward(&r->out, &g, &r->in[0], r->nin > 1 ? &r->in[1] : NULL, &r->nd->weight,
                          param(&r->nd->bias), r->nd->reverse);
}

static ft_status gru_layer_backward(const ft_node_run *r) {
    ft_tensor g = layer_saved(r, 5);
    bool state = r->nin > 1;
    ft_rnn_acc acc = {r->din_acc[0], state && r->din_acc[1], false, r->dweight_acc, r->dbias_acc};
    return ft_gru_backward(r->din[0], state ? r->din[1] : NULL, r->dweight, r->dbias, &r->dout, &g,
                           state ? &r->in[1] : NULL, &r->nd->weight, r->nd->reverse, acc);
}

/* ---- softmax ---- */

static ft_status softmax_check(const ft_node *nd, const ft_node *const *in) {
    if (nd->dim < 0 || nd->dim >= nd->ndim)
        return ft_fail(FT_ERR_SHAPE, "program: a %s along dimension %d of %d-d samples",
                       ft_node_kinds[nd->kind].name, nd->dim, nd->ndim);
    return same_shape(nd, in);
}

static ft_status softmax_forward(const ft_node_run *r) {
    return (r->nd->kind == FT_NODE_SOFTMAX ? ft_softmax_forward : ft_log_softmax_forward)(&r->out, &r->in[0],
                                                                                          1 + r->nd->dim);
}

static ft_status softmax_backward(const ft_node_run *r) {
    return (r->nd->kind == FT_NODE_SOFTMAX ? ft_softmax_backward : ft_log_softmax_backward)(
        r->din[0], &r->dout, &r->out, 1 + r->nd->dim, r->din_acc[0]);
}

/* ---- products ---- */

static ft_status mul_forward(const ft_node_run *r) { return ft_mul_forward(&r->out, &r->in[0], &r->in[1]); }

static ft_status mul_backward(const ft_node_run *r) {
    const ft_tensor *da = r->din[0], *db = r->din[1];
    if (da && db && da->storage == db->storage && da->offset == db->offset) { /* x * x */
        FT_TRY(ft_mul_backward(da, NULL, &r->dout, &r->in[0], &r->in[1], r->din_acc[0], false));
        return ft_mul_backward(NULL, da, &r->dout, &r->in[0], &r->in[1], false, true);
    }
    return ft_mul_backward(da, db, &r->dout, &r->in[0], &r->in[1], r->din_acc[0], r->din_acc[1]);
}

static int64_t factor_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) { return 4; }

/* A constant factor, kept at the start of the aux block where the ops run. */
static ft_status put_factor(const ft_node_run *r, double value) {
    ft_tensor c = aux_vector(r, 0, 1);
    return ft_tensor_fill(&c, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = (float)value});
}

/* The factor seen with t's shape (zero strides). */
static ft_tensor factor_as(const ft_node_run *r, const ft_tensor *t) {
    ft_tensor c = aux_vector(r, 0, 1);
    c.ndim = t->ndim;
    memcpy(c.shape, t->shape, sizeof c.shape);
    memset(c.strides, 0, sizeof c.strides);
    return c;
}

static ft_status scale_forward(const ft_node_run *r) {
    FT_TRY(put_factor(r, r->nd->scale));
    ft_tensor c = factor_as(r, &r->out);
    return ft_mul_forward(&r->out, &r->in[0], &c);
}

static ft_status scale_backward(const ft_node_run *r) {
    ft_tensor c = factor_as(r, &r->dout);
    return ft_mul_backward(r->din[0], NULL, &r->dout, NULL, &c, r->din_acc[0], false);
}

/* ---- broadcasting ---- */

/* The sizes of `small` are those of `large` or 1, per sample. */
static bool broadcasts(const ft_node *small, const ft_node *large) {
    bool ok = small->ndim == large->ndim;
    for (int d = 0; ok && d < small->ndim; d++)
        ok = small->shape[d] == large->shape[d] || small->shape[d] == 1;
    return ok;
}

static ft_status expand_check(const ft_node *nd, const ft_node *const *in) {
    if (broadcasts(in[0], nd))
        return FT_OK;
    return ft_fail(FT_ERR_SHAPE, "program: an expand's input has sizes other than its own or 1");
}

static ft_status expand_forward(const ft_node_run *r) { return ft_broadcast_to(&r->out, &r->in[0], 1.0, false); }

static ft_status expand_backward(const ft_node_run *r) {
    return r->din[0] ? ft_sum_to(r->din[0], &r->dout, 1.0, r->din_acc[0]) : FT_OK;
}

/* The mask: the second input (a mask of each sample), or the weight (a bool tensor the same for every sample,
 * a causal mask, of the sample's sizes or 1, which the ops broadcast over the batch from the right). */
static ft_status masked_fill_check(const ft_node *nd, const ft_node *const *in) {
    bool ok = in[0]->ndim == nd->ndim && !memcmp(in[0]->shape, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
    if (nd->ninputs == 2) {
        ok = ok && broadcasts(in[1], nd);
    } else {
        const ft_tensor *m = &nd->weight;
        ok = ok && m->storage && m->dtype == FT_BOOL && m->ndim == nd->ndim;
        for (int d = 0; ok && d < nd->ndim; d++)
            ok = m->shape[d] == nd->shape[d] || m->shape[d] == 1;
    }
    return ok ? FT_OK : ft_fail(FT_ERR_SHAPE, "program: a masked fill's mask has sizes other than its input's or 1");
}

static const ft_tensor *fill_mask(const ft_node_run *r) { return r->nin == 2 ? &r->in[1] : &r->nd->weight; }

/* scale where the mask holds, else the input: selected, not multiplied, so an infinite scale fills exactly. */
static ft_status masked_fill_forward(const ft_node_run *r) {
    if (fill_mask(r)->dtype != FT_BOOL)
        return ft_fail(FT_ERR_DTYPE, "program: a masked fill's mask must be bool");
    ft_math_arg args[3] = {{fill_mask(r), {0}}, {NULL, {.kind = FT_SCALAR_FLOAT, .f = r->nd->scale}}, {&r->in[0], {0}}};
    return ft_math_pointwise(&r->out, FT_MATH_WHERE, r->out.dtype, args, 3);
}

/* dout where the mask is false, 0 where it holds; added to an earlier share through dout, zeroed in place. */
static ft_status masked_fill_backward(const ft_node_run *r) {
    if (!r->din[0])
        return FT_OK;
    const ft_tensor *g = r->din_acc[0] ? &r->dout : r->din[0];
    ft_math_arg args[3] = {{fill_mask(r), {0}}, {NULL, {.kind = FT_SCALAR_FLOAT, .f = 0}}, {&r->dout, {0}}};
    FT_TRY(ft_math_pointwise(g, FT_MATH_WHERE, g->dtype, args, 3));
    return r->din_acc[0] ? put(r->din[0], &r->dout, true) : FT_OK;
}

static ft_status sum_dims_check(const ft_node *nd, const ft_node *const *in) {
    if (broadcasts(nd, in[0]))
        return FT_OK;
    return ft_fail(FT_ERR_SHAPE, "program: a sum over dimensions has sizes other than its input's or 1");
}

static ft_status sum_dims_forward(const ft_node_run *r) { return ft_sum_to(&r->out, &r->in[0], r->nd->scale, false); }

static ft_status sum_dims_backward(const ft_node_run *r) {
    return r->din[0] ? ft_broadcast_to(r->din[0], &r->dout, r->nd->scale, r->din_acc[0]) : FT_OK;
}

/* ---- add and concatenation ---- */

/* An add's own gradient passes dout through: only an activation whose
 * derivative needs its input reads the inputs. */
static bool add_reads_inputs(const ft_node *nd) {
    return nd->act.kind != FT_ACT_NONE && !ft_act_grad_uses_output(nd->act);
}

static ft_status add_forward(const ft_node_run *r) {
    return ft_add_forward(&r->out, &r->in[0], &r->in[1], r->nd->act);
}

static ft_status add_backward(const ft_node_run *r) {
    const ft_tensor *da = r->din[0], *db = r->din[1];
    if (da && db && da->storage == db->storage && da->offset == db->offset) { /* x + x: one buffer, two halves */
        FT_TRY(ft_add_backward(da, NULL, &r->dout, &r->in[0], &r->in[1], &r->out, r->nd->act, r->din_acc[0], false));
        return ft_add_backward(da, NULL, &r->dout, &r->in[0], &r->in[1], &r->out, r->nd->act, true, false);
    }
    return ft_add_backward(da, db, &r->dout, &r->in[0], &r->in[1], &r->out, r->nd->act, r->din_acc[0],
                           r->din_acc[1]);
}

/* Inputs that agree but along per-sample dimension `dim`, where their sizes add up to the node's. */
static ft_status cat_check(const ft_node *nd, const ft_node *const *in) {
    if (nd->dim < 0 || nd->dim >= nd->ndim)
        return ft_fail(FT_ERR_SHAPE, "program: a cat along dimension %d of %d-d samples", nd->dim, nd->ndim);
    int64_t total = 0;
    for (int k = 0; k < nd->ninputs; k++) {
        bool ok = in[k]->ndim == nd->ndim;
        for (int d = 0; ok && d < nd->ndim; d++)
            ok = d == nd->dim || in[k]->shape[d] == nd->shape[d];
        if (!ok)
            return ft_fail(FT_ERR_SHAPE, "program: a cat's inputs differ outside its dimension %d", nd->dim);
        total += in[k]->shape[nd->dim];
    }
    return total == nd->shape[nd->dim] ? FT_OK : ft_fail(FT_ERR_SHAPE, "program: a cat's sizes do not add up");
}

static ft_status cat_forward(const ft_node_run *r) {
    const ft_tensor *ins[FT_NODE_MAX_INPUTS];
    for (int k = 0; k < r->nin; k++)
        ins[k] = &r->in[k];
    return ft_concat_forward(&r->out, ins, r->nin, 1 + r->nd->dim);
}

/* The inputs that write go first, then those that add: an input read twice
 * (cat([x, x])) is written by its first slice and added to by its second. */
static ft_status cat_backward(const ft_node_run *r) {
    const ft_tensor *fresh[FT_NODE_MAX_INPUTS], *more[FT_NODE_MAX_INPUTS];
    int64_t sizes[FT_NODE_MAX_INPUTS];
    bool any_more = false;
    for (int k = 0; k < r->nin; k++) {
        sizes[k] = r->in[k].shape[1 + r->nd->dim];
        fresh[k] = r->din_acc[k] ? NULL : r->din[k];
        more[k] = r->din_acc[k] ? r->din[k] : NULL;
        any_more |= more[k] != NULL;
    }
    int dim = 1 + r->nd->dim;
    FT_TRY(ft_concat_backward(fresh, sizes, r->nin, &r->dout, dim, false));
    return any_more ? ft_concat_backward(more, sizes, r->nin, &r->dout, dim, true) : FT_OK;
}

/* ---- losses ---- */

/* A per-sample () value (N,) seen as the (N,) vector the loss ops use. */
static ft_tensor as_vector(const ft_tensor *t) {
    ft_tensor v = *t;
    v.ndim = 1;
    v.strides[0] = t->ndim ? t->strides[0] : 1;
    return v;
}

/* Each sample's values as one dense row: a sample's values are contiguous
 * in every layout the program plans. */
static ft_tensor sample_rows(const ft_tensor *t) {
    ft_tensor v = *t;
    v.ndim = 2;
    v.shape[1] = ft_tensor_numel(t) / (t->shape[0] ? t->shape[0] : 1);
    v.strides[1] = 1;
    return v;
}

/* out (N, 1) = the sum of each sample's values (N, F) / norm, of any float dtype: in double, one row on one thread,
 * so the same for any thread count. */
static ft_status sum_rows(const ft_node_run *r, const ft_tensor *values) {
    ft_tensor x = sample_rows(values), out = as_vector(&r->out);
    out.ndim = 2;
    out.shape[1] = 1;
    out.strides[1] = 1;
    return ft_sum_to(&out, &x, 1.0 / r->norm, false);
}

/* The class targets of a batch (B, d...), on the host: each in [0, C) or ignore_index;
 * `weights` (C, on the host) or NULL; the sum of the weights of the targets
 * not ignored into *total. */
static ft_status class_targets(const char *op, const ft_tensor *y, int64_t C, int64_t ignore, const float *weights,
                               double *total) {
    *total = 0;
    const int64_t *labels = (const int64_t *)ft_tensor_data(y); /* contiguous (ft_program_backward) */
    for (int64_t n = 0; n < ft_tensor_numel(y); n++) {
        int64_t t = labels[n];
        if (t == ignore)
            continue;
        if (t < 0 || t >= C)
            return ft_fail(FT_ERR_INDEX, "%s: label %lld at position %lld is outside [0, %lld)", op, (long long)t,
                           (long long)n, (long long)C);
        *total += weights ? weights[t] : 1.0;
    }
    return FT_OK;
}

/* prepare of cross-entropy and nll: the labels checked, and the mean's
 * divisor (the sum of the weights of the labels not ignored). */
static ft_status class_prepare(const ft_node *nd, const ft_node *const *in, const ft_tensor *y, int64_t batch,
                               double *norm) {
    const char *op = ft_node_kinds[nd->kind].name;
    if (!y)
        return ft_fail(FT_ERR_VALUE, "program: a %s node must read the targets directly", op);
    ft_tensor w = {0};
    if (nd->weight.storage)
        FT_TRY(ft_tensor_on_host(&w, &nd->weight, FT_FLOAT32));
    double total;
    ft_status s = class_targets(op, y, in[0]->shape[nd->dim], nd->ignore_index,
                                w.storage ? (const float *)ft_tensor_data(&w) : NULL, &total);
    if (w.storage)
        ft_tensor_release(&w);
    *norm = nd->reduction == FT_NODE_REDUCE_MEAN        ? total
            : nd->reduction == FT_NODE_REDUCE_BATCHMEAN ? (double)batch
                                                        : 1.0;
    return s;
}

/* Cross-entropy takes scores (C,) or (C, d...) per sample (PyTorch's
 * K-dimensional form: classes first) with targets (d...); nll (C,) only.
 * Scores (d..., C) with classes last (dim, the classes' dimension, the
 * last), as a sequence model gives them before logits.transpose(1, 2), are
 * read in place, seen classes first: no copy of the scores or of their
 * gradient. A sample's value is its loss, or with reduction none over
 * positions its positions' losses (d...). */
static bool per_position(const ft_node *nd) { return nd->ndim > 0; }

static ft_status class_check(const ft_node *nd, const ft_node *const *in) {
    const ft_node *x = in[0], *t = in[1];
    bool last = nd->dim > 0 && nd->dim == x->ndim - 1;
    bool shape_ok = nd->ndim == 0 || (nd->reduction == FT_NODE_REDUCE_NONE && nd->ndim == t->ndim &&
                                      !memcmp(nd->shape, t->shape, (size_t)t->ndim * sizeof *t->shape));
    bool ok = shape_ok && x->ndim >= 1 && (nd->dim == 0 || last) &&
              (nd->kind == FT_NODE_CROSS_ENTROPY || x->ndim == 1) && t->kind == FT_NODE_TARGET &&
              t->dtype == FT_INT64 && t->ndim == x->ndim - 1 &&
              !memcmp(t->shape, x->shape + (last ? 0 : 1), (size_t)t->ndim * sizeof *t->shape) &&
              (!nd->weight.storage || ft_tensor_numel(&nd->weight) == x->shape[nd->dim]);
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: a %s node takes scores (classes, ...), or (..., classes), and int64 "
                                      "class targets of the scores' shape without the classes",
                        ft_node_kinds[nd->kind].name);
}

/* The positions of a sample whose losses cross-entropy sums: 1 for (C,) scores. */
static int64_t positions(const ft_node *nd, const ft_node *scores) {
    return ft_node_numel(scores) / scores->shape[nd->dim];
}

/* Scores (N, ...) as the ops take them, classes first: classes-last ones (N, d..., C) seen as (N, C, d...). */
static ft_tensor classes_first(const ft_node *nd, ft_tensor t) {
    if (nd->dim == 0)
        return t;
    int last = t.ndim - 1;
    int64_t c = t.shape[last], cs = t.strides[last];
    memmove(t.shape + 2, t.shape + 1, (size_t)(last - 1) * sizeof *t.shape);
    memmove(t.strides + 2, t.strides + 1, (size_t)(last - 1) * sizeof *t.strides);
    t.shape[1] = c, t.strides[1] = cs;
    return t;
}

/* aux: the backward's factor 1 / norm (a cache line), the logits' gradient
 * for dloss = 1 kept from the forward (the softmax is taken once), then each
 * position's loss to sum (per_position: the output holds them). */
static int64_t cross_entropy_aux(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype) {
    int64_t losses = per_position(nd) ? 0 : rows * positions(nd, in[0]);
    return 4 * (16 + rows * ft_node_numel(in[0]) + losses);
}

/* The logits' gradient for dloss = 1, in the scores' layout, seen classes first. */
static ft_tensor saved_dlogits(const ft_node_run *r) {
    ft_tensor t = r->in[0];
    t.dtype = FT_FLOAT32; /* whatever the logits' */
    t.storage = r->aux.storage;
    t.offset = r->aux.offset + 64; /* after the factor */
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    return classes_first(r->nd, t);
}

/* Each position's loss (N, d...), after the saved gradient. */
static ft_tensor position_losses(const ft_node_run *r) {
    ft_tensor g = saved_dlogits(r), t = g;
    t.offset += 4 * ft_tensor_numel(&g);
    t.ndim = g.ndim - 1;
    t.shape[0] = g.shape[0];
    memmove(t.shape + 1, g.shape + 2, (size_t)(g.ndim - 2) * sizeof *t.shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    return t;
}

static ft_cross_entropy_params ce_params(const ft_node *nd) {
    return (ft_cross_entropy_params){.reduction = FT_REDUCTION_NONE, .ignore_index = nd->ignore_index,
                                     .label_smoothing = nd->label_smoothing};
}

/* out = the sum of each sample's position losses / norm, or those losses themselves (per_position, norm 1). */
static ft_status cross_entropy_forward(const ft_node_run *r) {
    ft_cross_entropy_params ce = ce_params(r->nd);
    ft_tensor losses = per_position(r->nd) ? r->out : position_losses(r), dlogits = saved_dlogits(r),
              scores = classes_first(r->nd, r->in[0]);
    FT_TRY(ft_cross_entropy_forward(&losses, r->training ? &dlogits : NULL, &scores, &r->in[1],
                                    param(&r->nd->weight), &ce));
    return per_position(r->nd) ? FT_OK : sum_rows(r, &losses);
}

/* dlogits (=, +=) the saved gradient times each sample's dout / norm, or each position's dout. */
static ft_status cross_entropy_backward(const ft_node_run *r) {
    ft_tensor dlogits = saved_dlogits(r), each = dlogits;
    memset(each.strides, 0, sizeof each.strides);
    if (per_position(r->nd)) { /* dout (N, d...) over the classes */
        each.storage = r->dout.storage, each.offset = r->dout.offset;
        each.strides[0] = r->dout.strides[0];
        for (int d = 1; d < r->dout.ndim; d++)
            each.strides[d + 1] = r->dout.strides[d];
    } else {
        ft_tensor g = as_vector(&r->dout), c = factor_as(r, &g);
        FT_TRY(put_factor(r, 1.0 / r->norm));
        FT_TRY(ft_mul_forward(&g, &g, &c));
        each.storage = g.storage, each.offset = g.offset;
        each.strides[0] = g.strides[0]; /* a sample's dout over its classes and positions */
    }
    ft_tensor din = r->din[0] ? classes_first(r->nd, *r->din[0]) : (ft_tensor){0};
    return ft_mul_backward(r->din[0] ? &din : NULL, NULL, &dlogits, NULL, &each, r->din_acc[0], false);
}

static ft_status nll_forward(const ft_node_run *r) {
    ft_tensor loss = as_vector(&r->out), t = as_vector(&r->in[1]);
    FT_TRY(ft_nll_loss_forward(&loss, &r->in[0], &t, param(&r->nd->weight), r->nd->ignore_index));
    FT_TRY(put_factor(r, 1.0 / r->norm));
    ft_tensor c = factor_as(r, &loss);
    return ft_mul_forward(&loss, &loss, &c);
}

static ft_status nll_backward(const ft_node_run *r) {
    ft_tensor g = as_vector(&r->dout), c = factor_as(r, &g), t = as_vector(&r->in[1]);
    FT_TRY(ft_mul_forward(&g, &g, &c));
    return ft_nll_loss_backward(r->din[0], &g, &t, param(&r->nd->weight), r->nd->ignore_index, r->din_acc[0]);
}

static ft_status one_hot_check(const ft_node *nd, const ft_node *const *in) {
    const ft_node *t = in[0];
    bool ok = t->kind == FT_NODE_TARGET && t->dtype == FT_INT64 && nd->ndim == t->ndim + 1 &&
              !memcmp(nd->shape, t->shape, (size_t)t->ndim * sizeof *t->shape);
    return ok ? FT_OK
              : ft_fail(FT_ERR_SHAPE, "program: a one-hot node reads the int64 targets (d...) and gives (d..., C)");
}

/* The labels checked before the step, as a class loss checks its own. */
static ft_status one_hot_prepare(const ft_node *nd, const ft_node *const *in, const ft_tensor *y, int64_t batch,
                                 double *norm) {
    double total;
    *norm = 1;
    return class_targets("one_hot", y, nd->shape[nd->ndim - 1], INT64_MIN, NULL, &total);
}

static ft_status one_hot_forward(const ft_node_run *r) { return ft_one_hot_forward(&r->out, &r->in[0]); }

static ft_status detach_forward(const ft_node_run *r) { return ft_tensor_copy(&r->out, &r->in[0], false); }

static ft_status sum_check(const ft_node *nd, const ft_node *const *in) {
    if (nd->ndim != 0)
        return ft_fail(FT_ERR_SHAPE, "program: a sum gives one value per sample");
    return (nd->ninputs == 2) == (nd->reduction == FT_NODE_REDUCE_RATIO)
               ? FT_OK
               : ft_fail(FT_ERR_VALUE, "program: a sum has a second input (the denominator) exactly when it is a "
                                       "ratio");
}

static ft_status sum_prepare(const ft_node *nd, const ft_node *const *in, const ft_tensor *y, int64_t batch,
                             double *norm) {
    int64_t n = ft_node_numel(in[0]);
    *norm = nd->reduction == FT_NODE_REDUCE_MEAN        ? (double)batch * (double)n
            : nd->reduction == FT_NODE_REDUCE_BATCHMEAN ? (double)batch
                                                        : 1.0; /* a ratio's: the program's first pass (ratio_norms) */
    return FT_OK;
}

static ft_status sum_forward(const ft_node_run *r) { return sum_rows(r, &r->in[0]); }

static ft_status sum_backward(const ft_node_run *r) {
    ft_tensor g = as_vector(&r->dout), dx = sample_rows(r->din[0]);
    g.ndim = 2;
    g.shape[1] = 1;
    g.strides[1] = 1;
    return ft_broadcast_to(&dx, &g, 1.0 / r->norm, r->din_acc[0]);
}

const ft_node_kind_info ft_node_kinds[FT_NODE_NKINDS] = {
    /* name, inputs (min, max), images, check, aux bytes, is a view, forward, backward, prepare, precision */
    [FT_NODE_INPUT] = {"input", 0, 0, 0, NULL, NULL, always_view, NULL, NULL},
    [FT_NODE_CONV2D] = {"conv2d", 1, 1, 2, NULL, NULL, NULL, conv2d_forward, conv2d_backward, .precision = FT_NODE_LOW,
                        .reads_output = act_fused},
    [FT_NODE_LINEAR] = {"linear", 1, 1, 0, NULL, NULL, NULL, linear_forward, linear_backward, .precision = FT_NODE_LOW,
                        .reads_output = act_fused},
    [FT_NODE_BATCHNORM] = {"batch_norm", 1, 1, 1, same_shape, batchnorm_aux, NULL, batchnorm_forward,
                           batchnorm_backward, .precision = FT_NODE_ANY, .reads_inputs = batchnorm_reads_inputs,
                           .reads_output = batchnorm_reads_output, .layout = FT_LAYOUT_INPUT},
    [FT_NODE_ACT] = {"activation", 1, 1, 0, same_shape, NULL, NULL, act_forward, act_backward, .precision = FT_NODE_ANY},
    [FT_NODE_MAXPOOL] = {"max_pool2d", 1, 1, 2, NULL, indices_aux, NULL, maxpool_forward, maxpool_backward, .precision = FT_NODE_ANY,
                         .reads_inputs = never, .reads_output = never},
    [FT_NODE_AVGPOOL] = {"avg_pool2d", 1, 1, 2, NULL, NULL, NULL, avgpool_forward, avgpool_backward, .precision = FT_NODE_ANY,
                         .reads_inputs = never, .reads_output = never},
    [FT_NODE_ADAPTIVE_AVGPOOL] = {"adaptive_avg_pool2d", 1, 1, 2, NULL, NULL, NULL, adaptive_avgpool_forward,
                                  adaptive_avgpool_backward, .precision = FT_NODE_ANY,
                                  .reads_inputs = never, .reads_output = never},
    [FT_NODE_ADAPTIVE_MAXPOOL] = {"adaptive_max_pool2d", 1, 1, 2, NULL, indices_aux, NULL, adaptive_maxpool_forward,
                                  adaptive_maxpool_backward, .precision = FT_NODE_ANY,
                                  .reads_inputs = never, .reads_output = never},
    [FT_NODE_ADD] = {"add", 2, 2, 0, same_shape, NULL, NULL, add_forward, add_backward, .precision = FT_NODE_ANY,
                     .reads_inputs = add_reads_inputs, .reads_output = act_fused},
    [FT_NODE_CAT] = {"cat", 1, FT_NODE_MAX_INPUTS, 0, cat_check, NULL, NULL, cat_forward, cat_backward, .precision = FT_NODE_ANY,
                     .reads_inputs = never, .reads_output = never},
    [FT_NODE_RESHAPE] = {"reshape", 1, 1, 0, same_numel, NULL, reshape_is_view, reshape_forward, reshape_backward,
                         .precision = FT_NODE_ANY, .layout = FT_LAYOUT_OF_IMAGES},
    [FT_NODE_DROPOUT] = {"dropout", 1, 1, 0, same_shape, NULL, dropout_is_view, dropout_forward, dropout_backward, .precision = FT_NODE_ANY,
                         .reads_inputs = never, .reads_output = never, .draws = element_draws},
    [FT_NODE_IDENTITY] = {"identity", 1, 1, 0, same_shape, NULL, always_view, NULL, NULL, .precision = FT_NODE_ANY},
    [FT_NODE_LAYERNORM] = {"layer_norm", 1, 1, 0, layernorm_check, layernorm_aux, NULL, layernorm_forward,
                           layernorm_backward, .precision = FT_NODE_ANY},
    [FT_NODE_MUL] = {"mul", 2, 2, 0, same_shape, NULL, NULL, mul_forward, mul_backward, .precision = FT_NODE_ANY},
    [FT_NODE_SCALE] = {"scale", 1, 1, 0, same_shape, factor_aux, NULL, scale_forward, scale_backward, .precision = FT_NODE_ANY,
                       .reads_inputs = never, .reads_output = never},
    [FT_NODE_PERMUTE] = {"permute", 1, 1, 0, permute_check, NULL, NULL, permute_forward, permute_backward, .precision = FT_NODE_ANY,
                         .reads_inputs = never, .reads_output = never},
    [FT_NODE_SLICE] = {"slice", 1, 1, 0, slice_check, NULL, NULL, slice_forward, slice_backward, .precision = FT_NODE_ANY,
                       .reads_inputs = never, .reads_output = never},
    [FT_NODE_PARAM] = {"parameter", 0, 0, 0, param_check, NULL, NULL, NULL, param_backward,
                       .layout = FT_LAYOUT_IN_ORDER},
    [FT_NODE_TARGET] = {"target", 0, 0, 0, NULL, NULL, always_view, NULL, NULL},
    [FT_NODE_CROSS_ENTROPY] = {"cross_entropy", 2, 2, 0, class_check, cross_entropy_aux, NULL,
                               cross_entropy_forward, cross_entropy_backward, class_prepare, .precision = FT_NODE_ANY},
    [FT_NODE_NLL] = {"nll", 2, 2, 0, class_check, factor_aux, NULL, nll_forward, nll_backward, class_prepare},
    [FT_NODE_SUM] = {"sum", 1, 2, 0, sum_check, NULL, NULL, sum_forward, sum_backward, sum_prepare,
                     .precision = FT_NODE_ANY},
    [FT_NODE_SOFTMAX] = {"softmax", 1, 1, 0, softmax_check, NULL, NULL, softmax_forward, softmax_backward, .precision = FT_NODE_ANY},
    [FT_NODE_LOG_SOFTMAX] = {"log_softmax", 1, 1, 0, softmax_check, NULL, NULL, softmax_forward, softmax_backward, .precision = FT_NODE_ANY},
    [FT_NODE_GROUPNORM] = {"group_norm", 1, 1, 0, groupnorm_check, groupnorm_aux, NULL, groupnorm_forward,
                           groupnorm_backward, .precision = FT_NODE_ANY, .layout = FT_LAYOUT_INPUT},
    [FT_NODE_EMBEDDING] = {"embedding", 1, 1, 0, embedding_check, NULL, NULL, embedding_forward, embedding_backward,
                           .precision = FT_NODE_ANY, .layout = FT_LAYOUT_IN_ORDER},
    [FT_NODE_UPSAMPLE] = {"upsample_nearest", 1, 1, 2, upsample_check, NULL, NULL, upsample_forward,
                          upsample_backward, .precision = FT_NODE_ANY, .reads_inputs = never, .reads_output = never},
    [FT_NODE_MATMUL] = {"matmul", 2, 2, 0, matmul_check, NULL, NULL, matmul_forward, matmul_backward,
                        .precision = FT_NODE_LOW},
    [FT_NODE_ATTENTION] = {"attention", 1, 5, 0, attention_check, attention_aux, NULL, attention_forward,
                           attention_backward, .precision = FT_NODE_ANY, .draws = attention_draws},
    [FT_NODE_EXPAND] = {"expand", 1, 1, 0, expand_check, NULL, NULL, expand_forward, expand_backward,
                        .precision = FT_NODE_ANY, .reads_inputs = never, .reads_output = never},
    [FT_NODE_SUM_DIMS] = {"sum_dims", 1, 1, 0, sum_dims_check, NULL, NULL, sum_dims_forward, sum_dims_backward,
                          .precision = FT_NODE_ANY, .reads_inputs = never, .reads_output = never},
    [FT_NODE_ONE_HOT] = {"one_hot", 1, 1, 0, one_hot_check, NULL, NULL, one_hot_forward, NULL, one_hot_prepare,
                         .precision = FT_NODE_ANY, .layout = FT_LAYOUT_IN_ORDER},
    [FT_NODE_DETACH] = {"detach", 1, 1, 0, same_shape, NULL, NULL, detach_forward, NULL, .precision = FT_NODE_ANY},
    [FT_NODE_CONV_TRANSPOSE2D] = {"conv_transpose2d", 1, 1, 2, NULL, NULL, NULL, conv_transpose2d_forward,
                                  conv_transpose2d_backward, .precision = FT_NODE_LOW, .reads_output = never},
    [FT_NODE_MATH] = {"math", 1, 2, 0, math_check, NULL, NULL, math_forward, NULL, .precision = FT_NODE_ANY,
                      .reads_inputs = never, .reads_output = never},
    [FT_NODE_LSTM_CELL] = {"lstm_cell", 1, 2, 0, lstm_check, NULL, NULL, lstm_cell_node_forward,
                           lstm_cell_node_backward, .precision = FT_NODE_ANY, .reads_output = never},
    [FT_NODE_LSTM_HIDDEN] = {"lstm_hidden", 2, 2, 0, lstm_check, NULL, NULL, lstm_hidden_node_forward,
                             lstm_hidden_node_backward, .precision = FT_NODE_ANY, .reads_output = never},
    [FT_NODE_LSTM] = {"lstm", 1, 3, 0, lstm_layer_check, lstm_layer_aux, NULL, lstm_layer_forward,
                      lstm_layer_backward, .precision = FT_NODE_LOW, .reads_inputs = rnn_layer_state,
                      .reads_output = never},
    [FT_NODE_GRU] = {"gru", 1, 2, 0, gru_layer_check, gru_layer_aux, NULL, gru_layer_forward, gru_layer_backward,
                     .precision = FT_NODE_LOW, .reads_inputs = rnn_layer_state, .reads_output = never},
    [FT_NODE_MASKED_FILL] = {"masked_fill", 1, 2, 0, masked_fill_check, NULL, NULL, masked_fill_forward,
                             masked_fill_backward, .precision = FT_NODE_ANY, .reads_output = never},
    [FT_NODE_NOISE] = {"noise", 1, 1, 0, same_shape, NULL, NULL, noise_forward, NULL, .precision = FT_NODE_ANY,
                       .reads_inputs = never, .reads_output = never, .draws = element_draws},
    [FT_NODE_UPSAMPLE_BILINEAR] = {"upsample_bilinear", 1, 1, 2, bilinear_check, NULL, NULL, bilinear_forward,
                                   bilinear_backward, .precision = FT_NODE_ANY, .reads_inputs = never,
                                   .reads_output = never},
};
