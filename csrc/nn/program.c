#include "nn/program.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "ops/activation.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/loss.h"

/* Arena blocks start on cache lines. */
#define ALIGN 64

/* One planned buffer: bytes, lifetime [first, last] in schedule steps
 * (forward of node i at step i, the loss at n, backward of node i at 2n - i)
 * and its place in the arena. */
typedef struct {
    int64_t bytes, first, last, offset;
} block;

enum { OUT, AUX, DOUT, NBUF }; /* the buffers of a node */

struct ft_program {
    int n;
    ft_node *nodes;
    ft_loss_spec loss;
    int64_t batch;
    bool channels_last;
    ft_device device;       /* where the parameters, the arenas and every op of a step are */
    uint64_t seed, dropout_offset;
    int *last_consumer;     /* (n) the plan's last user of each node (see last_users) */
    block *train, *eval;    /* (n, NBUF) */
    ft_storage *train_arena, *eval_arena;
    int64_t train_bytes, eval_bytes;
    ft_tensor scratch;      /* a gradient computed before it is added to another */
    ft_tensor grad_scratch; /* parameter gradients of micro-batches after the first */
    ft_tensor loss_value;   /* () float32 */
    ft_tensor one;          /* () float32 1: the loss's own gradient */
    ft_tensor share;        /* () float32: a micro-batch's share of the batch's mean loss */
    bool *written;          /* (n) whether dout[i] holds a first contribution */
    uint64_t *dropout_at;   /* (n) the Philox offset of each dropout node's last mask */
    double *seconds;        /* (n, 2) time spent in each node's forward and backward */
    ft_tensor stats_backup; /* (bytes) uint8: the batch-norm running statistics before the current step */
    int64_t stats_bytes;
};

/* ---- shapes and buffers ---- */

static bool is_image(const ft_node *nd) { return nd->ndim == 3; }

static int64_t sample_numel(const ft_node *nd) {
    int64_t k = 1;
    for (int d = 0; d < nd->ndim; d++)
        k *= nd->shape[d];
    return k;
}

/* A (rows, ...) view at `offset` bytes of `arena` in the program's layout. */
static ft_tensor view_at(const ft_program *p, const ft_node *nd, ft_storage *arena, int64_t offset, int64_t rows,
                         ft_dtype dtype) {
    ft_tensor t = {.storage = arena, .offset = offset, .dtype = dtype, .ndim = nd->ndim + 1};
    t.shape[0] = rows;
    memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    if (is_image(nd) && p->channels_last) {
        int64_t C = nd->shape[0], H = nd->shape[1], W = nd->shape[2];
        int64_t s[4] = {H * W * C, 1, W * C, C};
        memcpy(t.strides, s, sizeof s);
    }
    return t;
}

/* Whether a flatten can be a view: the (C, H, W) order is memory order. */
static bool flatten_is_view(const ft_program *p, const ft_node *in) {
    return !is_image(in) || !p->channels_last || (in->shape[1] == 1 && in->shape[2] == 1) || in->shape[0] == 1;
}

/* The number of elements a layer norm normalizes together: the trailing
 * norm_dims of its per-sample shape. */
static int64_t norm_size(const ft_node *nd) {
    int64_t d = 1;
    for (int k = nd->ndim - nd->norm_dims; k < nd->ndim; k++)
        d *= nd->shape[k];
    return d;
}

static int64_t aux_bytes(const ft_node *nd, int64_t rows) {
    if (nd->kind == FT_NODE_BATCHNORM)
        return 2 * nd->shape[0] * 4; /* mean and invstd */
    if (nd->kind == FT_NODE_LAYERNORM)
        return 2 * rows * (sample_numel(nd) / norm_size(nd)) * 4; /* each row's mean and rstd */
    if (nd->kind == FT_NODE_MAXPOOL || nd->kind == FT_NODE_ADAPTIVE_MAXPOOL)
        return rows * sample_numel(nd) * 4; /* int32 argmax indices */
    return 0;
}

static int64_t round_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Greedy placement: largest blocks first, each at the lowest offset free
 * during its lifetime. Returns the arena size. */
static int64_t place(block *b, int nb) {
    int *order = malloc((size_t)(nb ? nb : 1) * sizeof *order);
    bool *placed = calloc((size_t)(nb ? nb : 1), sizeof *placed);
    int64_t size = 0;
    if (!order || !placed) {
        free(order), free(placed);
        return -1;
    }
    for (int i = 0; i < nb; i++)
        order[i] = i;
    for (int i = 1; i < nb; i++) /* insertion sort by size, descending; lists are short */
        for (int j = i; j > 0 && b[order[j]].bytes > b[order[j - 1]].bytes; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int k = 0; k < nb; k++) {
        block *x = &b[order[k]];
        if (x->bytes == 0)
            continue;
        int64_t at = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (int j = 0; j < nb; j++) {
                block *y = &b[j];
                if (!placed[j] || y->last < x->first || x->last < y->first)
                    continue;
                if (at < y->offset + y->bytes && y->offset < at + x->bytes) {
                    at = round_up(y->offset + y->bytes);
                    moved = true;
                }
            }
        }
        x->offset = at;
        placed[order[k]] = true;
        if (at + x->bytes > size)
            size = at + x->bytes;
    }
    free(order);
    free(placed);
    return size;
}

static bool is_alias_kind(const ft_program *p, int i, bool training) {
    const ft_node *nd = &p->nodes[i];
    switch (nd->kind) {
    case FT_NODE_INPUT:
    case FT_NODE_IDENTITY: return true;
    case FT_NODE_FLATTEN: return flatten_is_view(p, &p->nodes[nd->inputs[0]]);
    case FT_NODE_DROPOUT: return !training || nd->dropout_p == 0;
    default: return false;
    }
}

static bool shares_grad(const ft_program *p, int i);

/* The last node that reads node i's output (training=false) or first writes
 * its gradient (training=true), looking through the alias nodes that read
 * (or write) on their input's behalf. Nodes come in topological order, so
 * one pass from the end settles every chain. */
static void last_users(const ft_program *p, bool training, int *last) {
    for (int i = p->n - 1; i >= 0; i--) {
        last[i] = i;
        for (int j = i + 1; j < p->n; j++)
            for (int k = 0; k < p->nodes[j].ninputs; k++)
                if (p->nodes[j].inputs[k] == i) {
                    bool through = training ? shares_grad(p, j) : is_alias_kind(p, j, false);
                    int user = through ? last[j] : j;
                    if (user > last[i])
                        last[i] = user;
                }
    }
}

static ft_status plan(ft_program *p, bool training, block *b, ft_storage **arena, int64_t *bytes) {
    int n = p->n;
    last_users(p, training, p->last_consumer);
    for (int i = 0; i < n; i++) {
        const ft_node *nd = &p->nodes[i];
        block *bi = &b[i * NBUF];
        memset(bi, 0, NBUF * sizeof *bi);
        int64_t out_bytes = p->batch * sample_numel(nd) * 4;
        int64_t end = training ? 2 * n - i : (p->last_consumer[i] == i ? n : p->last_consumer[i]);
        if (!is_alias_kind(p, i, training))
            bi[OUT] = (block){out_bytes, i, end, 0};
        bi[AUX] = (block){aux_bytes(nd, p->batch), i, training ? 2 * n - i : i, 0};
        if (training && nd->kind != FT_NODE_INPUT && !shares_grad(p, i))
            bi[DOUT] = (block){out_bytes, p->last_consumer[i] == i ? n : 2 * n - p->last_consumer[i], 2 * n - i, 0};
    }
    int64_t size = place(b, n * NBUF);
    if (size < 0)
        return ft_fail(FT_ERR_NOMEM, "out of memory planning the activations");
    *bytes = size;
    return ft_storage_new(arena, (size_t)size, p->device, false);
}

/* The output view of node i for `rows` samples (x for the input node). */
static ft_tensor node_out(const ft_program *p, bool training, int i, int64_t rows, const ft_tensor *x) {
    const ft_node *nd = &p->nodes[i];
    if (nd->kind == FT_NODE_INPUT) {
        ft_tensor t = *x;
        t.shape[0] = rows;
        return t;
    }
    if (is_alias_kind(p, i, training)) {
        ft_tensor t = node_out(p, training, nd->inputs[0], rows, x);
        if (nd->kind == FT_NODE_FLATTEN) { /* the same memory seen as (rows, F) */
            t.ndim = 2;
            t.shape[1] = sample_numel(nd);
            t.strides[0] = t.shape[1];
            t.strides[1] = 1;
        }
        return t;
    }
    const block *b = &(training ? p->train : p->eval)[i * NBUF + OUT];
    return view_at(p, nd, training ? p->train_arena : p->eval_arena, b->offset, rows, FT_FLOAT32);
}

static ft_tensor node_aux(const ft_program *p, bool training, int i, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    const block *b = &(training ? p->train : p->eval)[i * NBUF + AUX];
    ft_storage *arena = training ? p->train_arena : p->eval_arena;
    if (nd->kind == FT_NODE_BATCHNORM) {
        ft_tensor t = {.storage = arena, .offset = b->offset, .dtype = FT_FLOAT32, .ndim = 2,
                       .shape = {2, nd->shape[0]}, .strides = {nd->shape[0], 1}};
        return t;
    }
    return view_at(p, nd, arena, b->offset, rows, FT_INT32);
}

/* A layer norm's saved mean and rstd (rows * R each) in its aux block. */
static void ln_statistics(const ft_program *p, bool training, int i, int64_t rows, ft_tensor *mean, ft_tensor *rstd) {
    const ft_node *nd = &p->nodes[i];
    const block *b = &(training ? p->train : p->eval)[i * NBUF + AUX];
    int64_t n = rows * (sample_numel(nd) / norm_size(nd));
    ft_tensor t = {.storage = training ? p->train_arena : p->eval_arena, .offset = b->offset, .dtype = FT_FLOAT32,
                   .ndim = 1, .shape = {n}, .strides = {1}};
    *mean = t;
    *rstd = t;
    rstd->offset += n * 4;
}

static ft_tensor node_dout(const ft_program *p, int i, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    if (nd->kind == FT_NODE_FLATTEN && is_alias_kind(p, i, true)) {
        ft_tensor t = node_dout(p, nd->inputs[0], rows);
        t.ndim = 2;
        t.shape[1] = sample_numel(nd);
        t.strides[0] = t.shape[1];
        t.strides[1] = 1;
        return t;
    }
    if (shares_grad(p, i))
        return node_dout(p, nd->inputs[0], rows);
    return view_at(p, nd, p->train_arena, p->train[i * NBUF + DOUT].offset, rows, FT_FLOAT32);
}

/* Alias nodes share their input's gradient buffer: a write to theirs is a
 * write to their input's. */
static bool shares_grad(const ft_program *p, int i) {
    const ft_node *nd = &p->nodes[i];
    return nd->kind == FT_NODE_IDENTITY || (nd->kind == FT_NODE_DROPOUT && nd->dropout_p == 0) ||
           (nd->kind == FT_NODE_FLATTEN && is_alias_kind(p, i, true));
}

static int grad_owner(const ft_program *p, int i) {
    return shares_grad(p, i) ? grad_owner(p, p->nodes[i].inputs[0]) : i;
}

static ft_tensor rows_of(const ft_tensor *t, int64_t r0, int64_t rows) {
    ft_tensor v = *t;
    v.shape[0] = rows;
    v.offset += r0 * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    return v;
}

/* A batch norm's saved mean and invstd (C), the two rows of its aux block. */
static void bn_statistics(const ft_program *p, bool training, int i, ft_tensor *mean, ft_tensor *invstd) {
    ft_tensor aux = node_aux(p, training, i, 0);
    *mean = rows_of(&aux, 0, 1);
    *invstd = rows_of(&aux, 1, 1);
    mean->ndim = invstd->ndim = 1;
    mean->shape[0] = invstd->shape[0] = p->nodes[i].shape[0];
    mean->strides[0] = invstd->strides[0] = 1;
}

/* ---- creation ---- */

static ft_status validate(const ft_program *p) {
    const ft_storage *grads = NULL;
    for (int i = 0; i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        if ((i == 0) != (nd->kind == FT_NODE_INPUT))
            return ft_fail(FT_ERR_VALUE, "program: node 0, and only node 0, must be the input");
        if (nd->ninputs < 0 || nd->ninputs > FT_NODE_MAX_INPUTS || (i > 0 && nd->ninputs < 1))
            return ft_fail(FT_ERR_VALUE, "program: node %d has %d inputs", i, nd->ninputs);
        for (int k = 0; k < nd->ninputs; k++)
            if (nd->inputs[k] < 0 || nd->inputs[k] >= i)
                return ft_fail(FT_ERR_VALUE, "program: node %d reads node %d, which does not come before it", i,
                               nd->inputs[k]);
        if (nd->ndim != 1 && nd->ndim != 3)
            return ft_fail(FT_ERR_VALUE, "program: node %d has a %d-d per-sample shape", i, nd->ndim);
        if (nd->kind == FT_NODE_LAYERNORM && (nd->norm_dims < 1 || nd->norm_dims > nd->ndim))
            return ft_fail(FT_ERR_VALUE, "program: layer norm node %d normalizes %d of %d dimensions", i,
                           nd->norm_dims, nd->ndim);
        const ft_tensor *on[7] = {&nd->weight, &nd->bias, &nd->dweight, &nd->dbias, &nd->running_mean,
                                  &nd->running_var, &nd->num_batches};
        for (int k = 0; k < 7; k++)
            if (on[k]->storage && !ft_device_eq(ft_op_device(on[k]), p->device))
                return ft_fail(FT_ERR_DEVICE, "program: node %d has a parameter or buffer on another device than "
                                              "the model's flat parameters", i);
        const ft_tensor *g[2] = {&nd->dweight, &nd->dbias};
        for (int k = 0; k < 2; k++) {
            if (!g[k]->storage)
                continue;
            if (grads && g[k]->storage != grads)
                return ft_fail(FT_ERR_VALUE, "program: parameter gradients must share one flat buffer");
            grads = g[k]->storage;
        }
    }
    const ft_node *last = &p->nodes[p->n - 1];
    if (last->ndim != 1)
        return ft_fail(FT_ERR_VALUE, "program: the output must be (N, classes), got a per-sample shape of %d dims",
                       last->ndim);
    return FT_OK;
}

void ft_program_destroy(ft_program *p) {
    if (!p)
        return;
    if (p->train_arena)
        ft_storage_release(p->train_arena);
    if (p->eval_arena)
        ft_storage_release(p->eval_arena);
    if (p->scratch.storage)
        ft_tensor_release(&p->scratch);
    if (p->grad_scratch.storage)
        ft_tensor_release(&p->grad_scratch);
    if (p->loss_value.storage)
        ft_tensor_release(&p->loss_value);
    if (p->one.storage)
        ft_tensor_release(&p->one);
    if (p->share.storage)
        ft_tensor_release(&p->share);
    if (p->stats_backup.storage)
        ft_tensor_release(&p->stats_backup);
    free(p->nodes);
    free(p->last_consumer);
    free(p->train);
    free(p->eval);
    free(p->written);
    free(p->dropout_at);
    free(p->seconds);
    free(p);
}

ft_status ft_program_create(ft_program **out, int nnodes, const ft_node *nodes, const ft_loss_spec *loss,
                            int64_t batch, bool channels_last, uint64_t seed, ft_device device) {
    if (nnodes < 2)
        return ft_fail(FT_ERR_VALUE, "program: a model needs an input and at least one layer");
    if (batch < 1)
        return ft_fail(FT_ERR_VALUE, "program: the batch size must be at least 1, got %lld", (long long)batch);
    ft_program *p = calloc(1, sizeof *p);
    if (!p)
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
    p->n = nnodes;
    p->batch = batch;
    p->channels_last = channels_last;
    p->device = device;
    p->seed = seed;
    p->loss = *loss;
    p->nodes = malloc((size_t)nnodes * sizeof *p->nodes);
    p->last_consumer = malloc((size_t)nnodes * sizeof *p->last_consumer);
    p->train = malloc((size_t)nnodes * NBUF * sizeof *p->train);
    p->eval = malloc((size_t)nnodes * NBUF * sizeof *p->eval);
    p->written = calloc((size_t)nnodes, sizeof *p->written);
    p->dropout_at = calloc((size_t)nnodes, sizeof *p->dropout_at);
    p->seconds = calloc((size_t)nnodes * 2, sizeof *p->seconds);
    ft_status s = p->nodes && p->last_consumer && p->train && p->eval && p->written && p->dropout_at &&
                          p->seconds
                      ? FT_OK
                      : ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
    if (s == FT_OK) {
        memcpy(p->nodes, nodes, (size_t)nnodes * sizeof *nodes);
        s = validate(p);
    }
    int64_t max_sample = 0;
    for (int i = 0; s == FT_OK && i < nnodes; i++)
        if (sample_numel(&nodes[i]) > max_sample)
            max_sample = sample_numel(&nodes[i]);
    if (s == FT_OK)
        s = plan(p, true, p->train, &p->train_arena, &p->train_bytes);
    if (s == FT_OK)
        s = plan(p, false, p->eval, &p->eval_arena, &p->eval_bytes);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->scratch, 1, (int64_t[]){batch * max_sample}, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->loss_value, 0, NULL, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->one, 0, NULL, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->share, 0, NULL, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_fill(&p->one, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 1});
    for (int i = 0; s == FT_OK && i < nnodes; i++) {
        const ft_tensor *g = nodes[i].dweight.storage ? &nodes[i].dweight : &nodes[i].dbias;
        if (g->storage && !p->grad_scratch.storage) {
            /* Zeroed once: gradients that no node writes (a dropped bias) must add nothing. */
            int64_t numel = (int64_t)(g->storage->nbytes / 4);
            s = ft_tensor_empty(&p->grad_scratch, 1, &numel, FT_FLOAT32, device, false);
            if (s == FT_OK)
                s = ft_tensor_fill(&p->grad_scratch, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0});
        }
        if (nodes[i].kind == FT_NODE_BATCHNORM && nodes[i].running_mean.storage)
            p->stats_bytes += 8 * nodes[i].shape[0] + 8; /* mean, var, and the int64 count */
    }
    if (s == FT_OK && p->stats_bytes)
        s = ft_tensor_empty(&p->stats_backup, 1, &p->stats_bytes, FT_UINT8, device, false);
    if (s != FT_OK) {
        ft_program_destroy(p);
        return s;
    }
    *out = p;
    return FT_OK;
}

ft_status ft_program_output_size(const ft_program *p, int64_t *classes) {
    *classes = p->nodes[p->n - 1].shape[0];
    return FT_OK;
}

const double *ft_program_seconds(const ft_program *p) { return p->seconds; }

void ft_program_memory(const ft_program *p, int64_t *train_bytes, int64_t *eval_bytes) {
    *train_bytes = p->train_bytes;
    *eval_bytes = p->eval_bytes;
}

/* ---- batch-norm running statistics ---- */

/* `bytes` bytes at t's data as a flat uint8 tensor: byte copies between any
 * two devices. */
static ft_tensor bytes_of(const ft_tensor *t, int64_t bytes) {
    ft_tensor v = {.storage = t->storage, .offset = t->offset, .dtype = FT_UINT8, .ndim = 1, .shape = {bytes},
                   .strides = {1}};
    return v;
}

/* Copies every batch norm's running mean, variance and count to or from
 * the backup (all contiguous: they are the model's own buffers). */
static ft_status copy_statistics(ft_program *p, bool save) {
    int64_t at = 0;
    for (int i = 0; p->stats_bytes && i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        if (nd->kind != FT_NODE_BATCHNORM || !nd->running_mean.storage)
            continue;
        const ft_tensor *parts[3] = {&nd->running_mean, &nd->running_var, &nd->num_batches};
        int64_t bytes[3] = {nd->shape[0] * 4, nd->shape[0] * 4, 8};
        for (int k = 0; k < 3; k++) {
            if (parts[k]->storage) {
                ft_tensor model = bytes_of(parts[k], bytes[k]), backup = bytes_of(&p->stats_backup, bytes[k]);
                backup.offset += at;
                FT_TRY(ft_tensor_copy(save ? &backup : &model, save ? &model : &backup, false));
            }
            at += bytes[k];
        }
    }
    return FT_OK;
}

ft_status ft_program_undo_statistics(ft_program *p) { return copy_statistics(p, false); }

void ft_program_dropout_state(const ft_program *p, uint64_t *seed, uint64_t *offset) {
    *seed = p->seed;
    *offset = p->dropout_offset;
}

void ft_program_set_dropout_state(ft_program *p, uint64_t seed, uint64_t offset) {
    p->seed = seed;
    p->dropout_offset = offset;
}

/* ---- forward ---- */

/* counter (() int64) += 1 where it lives. */
static ft_status count_batch(const ft_tensor *counter) {
    if (ft_op_device(counter).type == FT_DEV_CUDA)
        return FT_CUDA_CALL("batch_norm", increment, counter);
    ++*(int64_t *)ft_tensor_data(counter);
    return FT_OK;
}

static ft_status forward_node(ft_program *p, bool training, int i, int64_t rows, const ft_tensor *x) {
    const ft_node *nd = &p->nodes[i];
    if (is_alias_kind(p, i, training))
        return FT_OK;
    ft_tensor out = node_out(p, training, i, rows, x);
    ft_tensor in = node_out(p, training, nd->inputs[0], rows, x);
    const ft_tensor *w = nd->weight.storage ? &nd->weight : NULL, *b = nd->bias.storage ? &nd->bias : NULL;
    switch (nd->kind) {
    case FT_NODE_CONV2D: {
        ft_conv2d_fusion fusion = {.act = nd->act};
        return ft_conv2d_forward(&out, &in, w, b, &nd->conv, &fusion);
    }
    case FT_NODE_LINEAR: return ft_linear_forward(&out, &in, w, b, nd->act);
    case FT_NODE_BATCHNORM: {
        ft_tensor mean, invstd;
        bn_statistics(p, training, i, &mean, &invstd);
        ft_batchnorm_params bn = nd->bn;
        bn.training = training && nd->bn.training;
        bn.act = nd->act;
        if (bn.training && nd->num_batches.storage)
            FT_TRY(count_batch(&nd->num_batches));
        return ft_batchnorm_forward(&out, &mean, &invstd, &in, w, b, nd->running_mean.storage ? &nd->running_mean : NULL,
                                    nd->running_var.storage ? &nd->running_var : NULL, &bn);
    }
    case FT_NODE_ACT: return ft_activation_forward(&out, &in, nd->act);
    case FT_NODE_LAYERNORM: {
        ft_tensor mean, rstd;
        ln_statistics(p, training, i, rows, &mean, &rstd);
        return ft_layernorm_forward(&out, &mean, &rstd, &in, w, b, norm_size(nd), nd->eps);
    }
    case FT_NODE_MAXPOOL: {
        ft_tensor idx = node_aux(p, training, i, rows);
        return ft_max_pool2d_forward(&out, &idx, &in, &nd->pool);
    }
    case FT_NODE_AVGPOOL: return ft_avg_pool2d_forward(&out, &in, &nd->pool);
    case FT_NODE_ADAPTIVE_AVGPOOL: return ft_adaptive_avg_pool2d_forward(&out, &in);
    case FT_NODE_ADAPTIVE_MAXPOOL: {
        ft_tensor idx = node_aux(p, training, i, rows);
        return ft_adaptive_max_pool2d_forward(&out, &idx, &in);
    }
    case FT_NODE_ADD: {
        ft_tensor other = node_out(p, training, nd->inputs[1], rows, x);
        return ft_add_forward(&out, &in, &other, nd->act);
    }
    case FT_NODE_CAT: {
        ft_tensor ins[FT_NODE_MAX_INPUTS];
        const ft_tensor *ptrs[FT_NODE_MAX_INPUTS];
        for (int k = 0; k < nd->ninputs; k++) {
            ins[k] = node_out(p, training, nd->inputs[k], rows, x);
            ptrs[k] = &ins[k];
        }
        return ft_concat_forward(&out, ptrs, nd->ninputs, 1);
    }
    case FT_NODE_FLATTEN: { /* channels-last images: gather into (C, H, W) order */
        ft_tensor dst = out;
        dst.ndim = in.ndim;
        memcpy(dst.shape, in.shape, sizeof dst.shape);
        ft_contiguous_strides(dst.strides, dst.ndim, dst.shape);
        return ft_tensor_copy(&dst, &in, false);
    }
    case FT_NODE_DROPOUT: {
        ft_dropout_params dp = {nd->dropout_p, p->seed, p->dropout_offset};
        p->dropout_at[i] = p->dropout_offset;
        p->dropout_offset += ft_dropout_blocks(ft_tensor_numel(&out));
        return ft_dropout_forward(&out, &in, &dp);
    }
    default: return ft_fail(FT_ERR_VALUE, "program: node %d has an unknown kind %d", i, (int)nd->kind);
    }
}

static ft_status forward(ft_program *p, bool training, int64_t rows, const ft_tensor *x) {
    for (int i = 1; i < p->n; i++) {
        double t0 = omp_get_wtime();
        FT_TRY(forward_node(p, training, i, rows, x));
        p->seconds[2 * i] += omp_get_wtime() - t0;
    }
    return FT_OK;
}

static ft_status check_input(const ft_program *p, const ft_tensor *x) {
    const ft_node *in = &p->nodes[0];
    int64_t want[4] = {x->ndim ? x->shape[0] : 0};
    memcpy(want + 1, in->shape, (size_t)in->ndim * sizeof *want);
    FT_TRY(ft_check_float("program", "input", x, false));
    FT_TRY(ft_check_shape("program", "input", x, in->ndim + 1, want));
    if (x->shape[0] < 1)
        return ft_fail(FT_ERR_SHAPE, "program: the batch is empty");
    return FT_OK;
}

/* A batch tensor where the program runs: t itself, or a copy. With
 * `queued`, a copy from page-locked memory returns before it is done: for
 * callers that wait for the device (reading a loss) before they return, and
 * with it the caller's hold on t. The caller releases *out. */
static ft_status on_device(const ft_program *p, const ft_tensor *t, bool queued, ft_tensor *out) {
    if (ft_device_eq(ft_op_device(t), p->device)) {
        ft_tensor_share(out, t);
        return FT_OK;
    }
    return ft_tensor_to(out, t, t->dtype, p->device, false, queued);
}

/* Labels checked on the host (a CUDA tensor is copied there first): *host
 * gets them on the CPU, and *dev (when not NULL) where the program runs. On
 * failure neither is held. */
static ft_status labels(const ft_program *p, const ft_tensor *y, int64_t rows, ft_tensor *host, ft_tensor *dev) {
    int64_t classes = p->nodes[p->n - 1].shape[0];
    if (p->loss.mse) {
        FT_TRY(ft_check_float("program", "targets", y, false));
        FT_TRY(ft_check_shape("program", "targets", y, 2, (int64_t[]){rows, classes}));
    } else if (y->ndim != 1 || y->shape[0] != rows || y->dtype != FT_INT64) {
        return ft_fail(FT_ERR_SHAPE, "program: labels must be an int64 tensor of shape (%lld,)", (long long)rows);
    }
    if (ft_op_device(y).type == FT_DEV_CPU)
        ft_tensor_share(host, y);
    else
        FT_TRY(ft_tensor_to(host, y, y->dtype, FT_CPU, false, false));
    const char *base = ft_tensor_data(host);
    for (int64_t r = 0; !p->loss.mse && r < rows; r++) {
        int64_t v;
        memcpy(&v, base + r * host->strides[0] * 8, 8);
        if ((v < 0 || v >= classes) && v != p->loss.ignore_index) {
            ft_tensor_release(host);
            return ft_fail(FT_ERR_INDEX, "program: label %lld at position %lld is outside [0, %lld)", (long long)v,
                           (long long)r, (long long)classes);
        }
    }
    ft_status s = dev ? on_device(p, y, true, dev) : FT_OK;
    if (s != FT_OK)
        ft_tensor_release(host);
    return s;
}

/* The value of a () float32 tensor on any device (waits for a CUDA one). */
static ft_status scalar_value(const ft_tensor *t, double *v) {
    float f;
    ft_tensor host;
    FT_TRY(ft_tensor_borrow(&host, &f, 0, NULL, NULL, FT_FLOAT32, FT_CPU, false, ft_storage_unowned, NULL));
    ft_status s = ft_tensor_copy(&host, t, false);
    ft_tensor_release(&host);
    *v = f;
    return s;
}

/* ---- loss and backward ---- */

/* loss (()) of the outputs against y with the given reduction, and its
 * gradient into dout when that is not NULL. */
static ft_status compute_loss(ft_program *p, const ft_tensor *loss, const ft_tensor *out, const ft_tensor *y,
                              ft_reduction r, const ft_tensor *dout) {
    if (!p->loss.mse) {
        ft_cross_entropy_params ce = {.label_smoothing = p->loss.label_smoothing, .ignore_index = p->loss.ignore_index,
                                      .reduction = r};
        return ft_cross_entropy_forward(loss, dout, out, y, NULL, &ce);
    }
    FT_TRY(ft_mse_loss_forward(loss, out, y, r));
    return dout ? ft_mse_loss_backward(dout, NULL, &p->one, out, y, r, false, false) : FT_OK;
}

/* The loss of the output logits against y, scaled by `scale`, and its
 * gradient written into the output node's gradient buffer. */
static ft_status loss_and_grad(ft_program *p, int64_t rows, const ft_tensor *y, double scale, double *loss) {
    int last = p->n - 1;
    ft_tensor logits = node_out(p, true, last, rows, NULL), dlogits = node_dout(p, last, rows);
    FT_TRY(compute_loss(p, &p->loss_value, &logits, y, p->loss.sum ? FT_REDUCTION_SUM : FT_REDUCTION_MEAN,
                        &dlogits));
    double value;
    FT_TRY(scalar_value(&p->loss_value, &value));
    *loss += scale * value;
    if (scale != 1.0) { /* a micro-batch's share of the whole batch's mean */
        FT_TRY(ft_tensor_fill(&p->share, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = (float)scale}));
        ft_tensor share = p->share; /* broadcast over dlogits by zero strides */
        share.ndim = dlogits.ndim;
        memcpy(share.shape, dlogits.shape, sizeof share.shape);
        FT_TRY(ft_mul_forward(&dlogits, &dlogits, &share));
    }
    p->written[grad_owner(p, last)] = true;
    return FT_OK;
}

/* dst (=, or += when acc) the result of an op that can only write: it
 * writes into the scratch buffer first when dst already holds a gradient. */
static ft_tensor write_target(ft_program *p, const ft_tensor *dst, bool acc) {
    if (!acc)
        return *dst;
    ft_tensor t = *dst;
    t.storage = p->scratch.storage;
    t.offset = 0;
    int64_t e = 1;
    /* dense in dst's own dimension order */
    int order[FT_MAX_DIMS];
    for (int d = 0; d < t.ndim; d++)
        order[d] = d;
    for (int a = 1; a < t.ndim; a++) /* sort dimensions by stride, innermost first */
        for (int b = a; b > 0 && t.strides[order[b]] < t.strides[order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1], order[b - 1] = tmp;
        }
    for (int k = 0; k < t.ndim; k++) {
        t.strides[order[k]] = e;
        e *= t.shape[order[k]];
    }
    return t;
}

static ft_status finish_write(const ft_tensor *dst, const ft_tensor *written, bool acc) {
    return acc ? ft_add_forward(dst, dst, written, (ft_act){FT_ACT_NONE, 0}) : FT_OK;
}

/* A parameter gradient view, redirected to the scratch flat buffer for
 * micro-batches after the first. */
static const ft_tensor *param_grad(const ft_program *p, const ft_tensor *g, ft_tensor *tmp, bool redirect) {
    if (!g->storage)
        return NULL;
    if (!redirect)
        return g;
    *tmp = *g;
    tmp->storage = p->grad_scratch.storage;
    return tmp;
}

static ft_status backward_node(ft_program *p, int i, int64_t rows, const ft_tensor *x, bool redirect) {
    const ft_node *nd = &p->nodes[i];
    if (!p->written[grad_owner(p, i)] || grad_owner(p, i) != i)
        return FT_OK; /* no gradient reaches it, or an alias sharing its input's gradient */
    ft_tensor g = node_dout(p, i, rows), out = node_out(p, true, i, rows, x);
    int src = nd->inputs[0], owner = grad_owner(p, src);
    bool need_dx = owner != 0, acc = p->written[owner];
    ft_tensor in = node_out(p, true, src, rows, x), dx = need_dx ? node_dout(p, src, rows) : in;
    ft_tensor gw_tmp, gb_tmp;
    const ft_tensor *dw = param_grad(p, &nd->dweight, &gw_tmp, redirect), *db = param_grad(p, &nd->dbias, &gb_tmp, redirect);
    ft_status s = FT_OK;
    switch (nd->kind) {
    case FT_NODE_CONV2D:
    case FT_NODE_LINEAR: {
        if (nd->act.kind != FT_ACT_NONE) /* the fused activation's backward, in place */
            FT_TRY(ft_activation_backward(&g, &g, NULL, &out, nd->act, false));
        ft_tensor target = write_target(p, &dx, acc);
        s = nd->kind == FT_NODE_CONV2D
                ? ft_conv2d_backward(need_dx ? &target : NULL, dw, db, &g, &in, &nd->weight, &nd->conv)
                : ft_linear_backward(need_dx ? &target : NULL, dw, db, &g, &in, &nd->weight);
        if (s == FT_OK && need_dx)
            s = finish_write(&dx, &target, acc);
        break;
    }
    case FT_NODE_BATCHNORM: {
        ft_tensor mean, invstd;
        bn_statistics(p, true, i, &mean, &invstd);
        ft_batchnorm_params bn = nd->bn;
        bn.act = nd->act;
        ft_tensor target = write_target(p, &dx, acc);
        s = ft_batchnorm_backward(need_dx ? &target : NULL, dw, db, &g, &in, &out,
                                  nd->weight.storage ? &nd->weight : NULL, &mean, &invstd, &bn);
        if (s == FT_OK && need_dx)
            s = finish_write(&dx, &target, acc);
        break;
    }
    case FT_NODE_ACT:
        if (need_dx)
            s = ft_activation_backward(&dx, &g, &in, &out, nd->act, acc);
        break;
    case FT_NODE_LAYERNORM: {
        ft_tensor mean, rstd, target = write_target(p, &dx, acc);
        ln_statistics(p, true, i, rows, &mean, &rstd);
        s = ft_layernorm_backward(need_dx ? &target : NULL, dw, db, &g, &in, nd->weight.storage ? &nd->weight : NULL,
                                  &mean, &rstd, norm_size(nd));
        if (s == FT_OK && need_dx)
            s = finish_write(&dx, &target, acc);
        break;
    }
    case FT_NODE_MAXPOOL:
    case FT_NODE_ADAPTIVE_MAXPOOL: {
        ft_tensor idx = node_aux(p, true, i, rows);
        if (need_dx)
            s = nd->kind == FT_NODE_MAXPOOL ? ft_max_pool2d_backward(&dx, &g, &idx, acc)
                                            : ft_adaptive_max_pool2d_backward(&dx, &g, &idx, acc);
        break;
    }
    case FT_NODE_AVGPOOL:
        if (need_dx)
            s = ft_avg_pool2d_backward(&dx, &g, &nd->pool, acc);
        break;
    case FT_NODE_ADAPTIVE_AVGPOOL:
        if (need_dx)
            s = ft_adaptive_avg_pool2d_backward(&dx, &g, acc);
        break;
    case FT_NODE_ADD: {
        int src2 = nd->inputs[1], owner2 = grad_owner(p, src2);
        ft_tensor in2 = node_out(p, true, src2, rows, x), dx2 = owner2 ? node_dout(p, src2, rows) : in2;
        if (owner2 == owner && owner != 0) { /* x + x: both halves go to one buffer */
            s = ft_add_backward(&dx, NULL, &g, &in, &in2, &out, nd->act, acc, false);
            if (s == FT_OK)
                s = ft_add_backward(&dx, NULL, &g, &in, &in2, &out, nd->act, true, false);
        } else {
            s = ft_add_backward(need_dx ? &dx : NULL, owner2 ? &dx2 : NULL, &g, &in, &in2, &out, nd->act, acc,
                                owner2 && p->written[owner2]);
        }
        if (owner2)
            p->written[owner2] = true;
        break;
    }
    case FT_NODE_CAT: {
        ft_tensor douts[FT_NODE_MAX_INPUTS];
        const ft_tensor *fresh[FT_NODE_MAX_INPUTS], *more[FT_NODE_MAX_INPUTS];
        int64_t sizes[FT_NODE_MAX_INPUTS];
        bool any_more = false;
        for (int k = 0; k < nd->ninputs; k++) {
            int o = grad_owner(p, nd->inputs[k]);
            douts[k] = node_dout(p, nd->inputs[k], rows);
            sizes[k] = p->nodes[nd->inputs[k]].shape[0];
            fresh[k] = o && !p->written[o] ? &douts[k] : NULL;
            more[k] = o && p->written[o] ? &douts[k] : NULL;
            any_more |= more[k] != NULL;
        }
        s = ft_concat_backward(fresh, sizes, nd->ninputs, &g, 1, false);
        if (s == FT_OK && any_more)
            s = ft_concat_backward(more, sizes, nd->ninputs, &g, 1, true);
        for (int k = 0; k < nd->ninputs; k++)
            p->written[grad_owner(p, nd->inputs[k])] |= grad_owner(p, nd->inputs[k]) != 0;
        return s;
    }
    case FT_NODE_FLATTEN: { /* the copy flatten: scatter back into channels-last order */
        if (!need_dx)
            break;
        ft_tensor g4 = g;
        g4.ndim = dx.ndim;
        memcpy(g4.shape, dx.shape, sizeof g4.shape);
        ft_contiguous_strides(g4.strides, g4.ndim, g4.shape);
        s = acc ? ft_add_forward(&dx, &dx, &g4, (ft_act){FT_ACT_NONE, 0}) : ft_tensor_copy(&dx, &g4, false);
        break;
    }
    case FT_NODE_DROPOUT:
        if (need_dx) {
            ft_dropout_params dp = {nd->dropout_p, p->seed, p->dropout_at[i]};
            s = ft_dropout_backward(&dx, &g, &dp, acc);
        }
        break;
    default: break;
    }
    if (need_dx)
        p->written[owner] = true;
    return s;
}

/* grads += scratch over the whole flat gradient buffer. */
static ft_status add_flat(const ft_program *p, ft_storage *grads) {
    int64_t n = (int64_t)(grads->nbytes / 4);
    ft_tensor g = {.storage = grads, .dtype = FT_FLOAT32, .ndim = 1, .shape = {n}, .strides = {1}};
    return ft_add_forward(&g, &g, &p->grad_scratch, (ft_act){FT_ACT_NONE, 0});
}

static ft_storage *grad_storage(const ft_program *p) {
    for (int i = 0; i < p->n; i++) {
        if (p->nodes[i].dweight.storage)
            return p->nodes[i].dweight.storage;
        if (p->nodes[i].dbias.storage)
            return p->nodes[i].dbias.storage;
    }
    return NULL;
}

/* The steps of ft_program_backward over x and y where the program runs. */
static ft_status backward_batches(ft_program *p, const ft_tensor *x, const ft_tensor *y, double *loss) {
    int64_t B = x->shape[0];
    FT_TRY(copy_statistics(p, true));
    ft_storage *grads = grad_storage(p);
    for (int64_t r0 = 0, m = 0; r0 < B; r0 += p->batch, m++) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        ft_tensor xm = rows_of(x, r0, rows), ym = rows_of(y, r0, rows);
        FT_TRY(forward(p, true, rows, &xm));
        memset(p->written, 0, (size_t)p->n * sizeof *p->written);
        FT_TRY(loss_and_grad(p, rows, &ym, p->loss.sum ? 1.0 : (double)rows / (double)B, loss));
        if (!isfinite(*loss)) /* the caller refuses or skips this step: leave no trace of it */
            return copy_statistics(p, false);
        for (int i = p->n - 1; i > 0; i--) {
            double t0 = omp_get_wtime();
            FT_TRY(backward_node(p, i, rows, &xm, m > 0));
            p->seconds[2 * i + 1] += omp_get_wtime() - t0;
        }
        if (m > 0 && grads)
            FT_TRY(add_flat(p, grads));
    }
    return FT_OK;
}

ft_status ft_program_backward(ft_program *p, const ft_tensor *x, const ft_tensor *y, double *loss) {
    FT_TRY(check_input(p, x));
    ft_tensor yh, yd, xd;
    FT_TRY(labels(p, y, x->shape[0], &yh, &yd));
    ft_status s = on_device(p, x, true, &xd);
    if (s == FT_OK) {
        *loss = 0;
        s = backward_batches(p, &xd, &yd, loss);
        ft_tensor_release(&xd);
    }
    ft_tensor_release(&yh);
    ft_tensor_release(&yd);
    return s;
}

ft_status ft_program_forward(ft_program *p, const ft_tensor *x, const ft_tensor *out) {
    FT_TRY(check_input(p, x));
    int64_t B = x->shape[0];
    const ft_node *last = &p->nodes[p->n - 1];
    FT_TRY(ft_check_shape("program", "out", out, 2, (int64_t[]){B, last->shape[0]}));
    FT_TRY(ft_check_output("program", "out", out));
    ft_tensor xd;
    FT_TRY(on_device(p, x, false, &xd));
    ft_status s = FT_OK;
    for (int64_t r0 = 0; s == FT_OK && r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        ft_tensor xm = rows_of(&xd, r0, rows), om = rows_of(out, r0, rows);
        s = forward(p, false, rows, &xm);
        if (s == FT_OK) {
            ft_tensor logits = node_out(p, false, p->n - 1, rows, &xm);
            s = ft_tensor_copy(&om, &logits, false);
        }
    }
    ft_tensor_release(&xd);
    return s;
}

/* Logits of x (where the program runs) for `rows` samples into the CPU
 * tensor `logits`, averaged with those of the horizontally mirrored images
 * when tta_flip is set; `other` is CPU space of logits' shape. */
static ft_status eval_logits(ft_program *p, const ft_tensor *x, int64_t rows, bool tta_flip, const ft_tensor *logits,
                             const ft_tensor *other) {
    FT_TRY(forward(p, false, rows, x));
    ft_tensor out = node_out(p, false, p->n - 1, rows, x);
    FT_TRY(ft_tensor_copy(logits, &out, false));
    if (!tta_flip)
        return FT_OK;
    if (x->ndim != 4)
        return ft_fail(FT_ERR_VALUE, "program: test-time flipping needs image inputs");
    ft_tensor mirror = *x, flipped;
    mirror.offset += (x->shape[3] - 1) * x->strides[3] * 4;
    mirror.strides[3] = -x->strides[3];
    FT_TRY(ft_tensor_empty(&flipped, 4, x->shape, FT_FLOAT32, p->device, false));
    ft_status s = ft_tensor_copy(&flipped, &mirror, false);
    if (s == FT_OK)
        s = forward(p, false, rows, &flipped);
    if (s == FT_OK) {
        out = node_out(p, false, p->n - 1, rows, &flipped);
        s = ft_tensor_copy(other, &out, false);
    }
    ft_tensor_release(&flipped);
    if (s == FT_OK)
        s = ft_add_forward(logits, logits, other, (ft_act){FT_ACT_NONE, 0});
    if (s == FT_OK) {
        float *l = (float *)ft_tensor_data(logits);
        for (int64_t k = 0; k < ft_tensor_numel(logits); k++)
            l[k] *= 0.5f;
    }
    return s;
}

/* ft_program_evaluate over x where the program runs and CPU labels y:
 * the loss and the argmax are taken on the CPU copy of the logits. */
static ft_status evaluate_batches(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool tta_flip,
                                  double *loss_sum, int64_t *correct, const ft_tensor *logits, const ft_tensor *other) {
    int64_t B = x->shape[0], classes = p->nodes[p->n - 1].shape[0];
    float loss_value;
    ft_tensor loss;
    FT_TRY(ft_tensor_borrow(&loss, &loss_value, 0, NULL, NULL, FT_FLOAT32, FT_CPU, false, ft_storage_unowned, NULL));
    ft_status s = FT_OK;
    for (int64_t r0 = 0; s == FT_OK && r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        ft_tensor xm = rows_of(x, r0, rows), ym = rows_of(y, r0, rows), lm = rows_of(logits, 0, rows),
                  om = rows_of(other, 0, rows);
        s = eval_logits(p, &xm, rows, tta_flip, &lm, &om);
        if (s == FT_OK)
            s = compute_loss(p, &loss, &lm, &ym, FT_REDUCTION_SUM, NULL);
        if (s != FT_OK)
            break;
        *loss_sum += loss_value;
        const float *l = (const float *)ft_tensor_data(&lm);
        for (int64_t r = 0; !p->loss.mse && r < rows; r++) {
            int64_t best = 0, label;
            for (int64_t c = 1; c < classes; c++)
                if (l[r * classes + c] > l[r * classes + best])
                    best = c;
            memcpy(&label, (const char *)ft_tensor_data(&ym) + r * ym.strides[0] * 8, 8);
            *correct += best == label;
        }
    }
    ft_tensor_release(&loss);
    return s;
}

ft_status ft_program_evaluate(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool tta_flip, double *loss_sum,
                              int64_t *correct) {
    FT_TRY(check_input(p, x));
    int64_t classes = p->nodes[p->n - 1].shape[0];
    ft_tensor yh, xd, logits, other;
    FT_TRY(labels(p, y, x->shape[0], &yh, NULL));
    ft_status s = on_device(p, x, true, &xd);
    if (s != FT_OK) {
        ft_tensor_release(&yh);
        return s;
    }
    int64_t shape[2] = {p->batch, classes};
    s = ft_tensor_empty(&logits, 2, shape, FT_FLOAT32, FT_CPU, false);
    if (s == FT_OK) {
        s = ft_tensor_empty(&other, 2, shape, FT_FLOAT32, FT_CPU, false);
        if (s == FT_OK) {
            s = evaluate_batches(p, &xd, &yh, tta_flip, loss_sum, correct, &logits, &other);
            ft_tensor_release(&other);
        }
        ft_tensor_release(&logits);
    }
    ft_tensor_release(&xd);
    ft_tensor_release(&yh);
    return s;
}
