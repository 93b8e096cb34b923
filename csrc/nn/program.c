#include "nn/program.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "nn/node.h"
#include "ops/check.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
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
    ft_tensor loss_value;   /* () float32 */
    ft_tensor one;          /* () float32 1: the loss's own gradient */
    ft_tensor share;        /* () float32: a micro-batch's share of the batch's mean loss */
    bool *written;          /* (n) whether dout[i] holds a contribution of this micro-batch */
    /* Parameter gradients, each view once (tied weights share one): which
     * slot each node's dweight and dbias is, and whether the step wrote it. */
    int nslots;
    ft_tensor *slots;       /* (nslots) borrowed views */
    int *slot_of;           /* (n, 2) the slot of dweight and of dbias, or -1 */
    bool *slot_written;     /* (nslots) */
    uint64_t *dropout_at;   /* (n) the Philox offset of each dropout node's last mask */
    double *seconds;        /* (n, 2) time spent in each node's forward and backward */
    ft_tensor stats_backup; /* (bytes) uint8: the batch-norm running statistics before the current step */
    int64_t stats_bytes;
};

/* ---- shapes and buffers ---- */

static const ft_node_kind_info *row(const ft_program *p, int i) { return &ft_node_kinds[p->nodes[i].kind]; }

static bool is_image(const ft_node *nd) { return nd->ndim == 3; }

/* A (rows, ...) view at `offset` bytes of `arena` in the program's layout. */
static ft_tensor view_at(const ft_program *p, const ft_node *nd, ft_storage *arena, int64_t offset, int64_t rows,
                         ft_dtype dtype) {
    ft_tensor t = {.storage = arena, .offset = offset, .dtype = dtype, .ndim = nd->ndim + 1};
    t.shape[0] = rows;
    memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    if (is_image(nd) && p->channels_last && nd->kind != FT_NODE_RESHAPE) { /* a reshape keeps (C, H, W) order */
        int64_t C = nd->shape[0], H = nd->shape[1], W = nd->shape[2];
        int64_t s[4] = {H * W * C, 1, W * C, C};
        memcpy(t.strides, s, sizeof s);
    }
    return t;
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

/* Whether node i's output is its input's memory (no op runs). */
static bool is_view(const ft_program *p, int i, bool training) {
    const ft_node *nd = &p->nodes[i];
    const ft_node_kind_info *k = row(p, i);
    return k->is_view && k->is_view(nd, nd->ninputs ? &p->nodes[nd->inputs[0]] : NULL, p->channels_last, training);
}

/* Views in training share their input's gradient buffer too: a write to
 * theirs is a write to their input's. */
static bool shares_grad(const ft_program *p, int i) { return i > 0 && is_view(p, i, true); }

static int grad_owner(const ft_program *p, int i) {
    return shares_grad(p, i) ? grad_owner(p, p->nodes[i].inputs[0]) : i;
}

/* The last node that reads node i's output (training=false) or first writes
 * its gradient (training=true), looking through the views that read (or
 * write) on their input's behalf. Nodes come in topological order, so one
 * pass from the end settles every chain. */
static void last_users(const ft_program *p, bool training, int *last) {
    for (int i = p->n - 1; i >= 0; i--) {
        last[i] = i;
        for (int j = i + 1; j < p->n; j++)
            for (int k = 0; k < p->nodes[j].ninputs; k++)
                if (p->nodes[j].inputs[k] == i) {
                    bool through = training ? shares_grad(p, j) : is_view(p, j, false);
                    int user = through ? last[j] : j;
                    if (user > last[i])
                        last[i] = user;
                }
    }
}

static int64_t aux_bytes(const ft_program *p, int i) {
    const ft_node_kind_info *k = row(p, i);
    return k->aux_bytes ? k->aux_bytes(&p->nodes[i], p->batch) : 0;
}

static ft_status plan(ft_program *p, bool training, block *b, ft_storage **arena, int64_t *bytes) {
    int n = p->n;
    last_users(p, training, p->last_consumer);
    for (int i = 0; i < n; i++) {
        block *bi = &b[i * NBUF];
        memset(bi, 0, NBUF * sizeof *bi);
        int64_t out_bytes = p->batch * ft_node_numel(&p->nodes[i]) * 4;
        int64_t end = training ? 2 * n - i : (p->last_consumer[i] == i ? n : p->last_consumer[i]);
        if (!is_view(p, i, training) && p->nodes[i].kind != FT_NODE_PARAM)
            bi[OUT] = (block){out_bytes, i, end, 0};
        bi[AUX] = (block){aux_bytes(p, i), i, training ? 2 * n - i : i, 0};
        if (training && i > 0 && !shares_grad(p, i))
            bi[DOUT] = (block){out_bytes, p->last_consumer[i] == i ? n : 2 * n - p->last_consumer[i], 2 * n - i, 0};
    }
    int64_t size = place(b, n * NBUF);
    if (size < 0)
        return ft_fail(FT_ERR_NOMEM, "out of memory planning the activations");
    *bytes = size;
    return ft_storage_new(arena, (size_t)size, p->device, false);
}

/* A view's (rows, ...) look at its input's memory: a reshape is the only
 * view with a shape of its own. */
static ft_tensor seen_as(const ft_node *nd, ft_tensor t) {
    if (nd->kind == FT_NODE_RESHAPE) {
        t.ndim = nd->ndim + 1;
        memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
        ft_contiguous_strides(t.strides, t.ndim, t.shape);
    }
    return t;
}

/* A parameter node's value: its weight, the same for every sample. */
static ft_tensor broadcast_param(const ft_node *nd, int64_t rows) {
    ft_tensor t = nd->weight;
    t.ndim = nd->ndim + 1;
    t.shape[0] = rows;
    memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    t.strides[0] = 0;
    return t;
}

/* The output view of node i for `rows` samples (x for the input node). */
static ft_tensor node_out(const ft_program *p, bool training, int i, int64_t rows, const ft_tensor *x) {
    const ft_node *nd = &p->nodes[i];
    if (i == 0) {
        ft_tensor t = *x;
        t.shape[0] = rows;
        return t;
    }
    if (is_view(p, i, training))
        return seen_as(nd, node_out(p, training, nd->inputs[0], rows, x));
    if (nd->kind == FT_NODE_PARAM)
        return broadcast_param(nd, rows);
    const block *b = &(training ? p->train : p->eval)[i * NBUF + OUT];
    return view_at(p, nd, training ? p->train_arena : p->eval_arena, b->offset, rows, FT_FLOAT32);
}

static ft_tensor node_aux(const ft_program *p, bool training, int i) {
    const block *b = &(training ? p->train : p->eval)[i * NBUF + AUX];
    ft_tensor t = {.storage = training ? p->train_arena : p->eval_arena, .offset = b->offset, .dtype = FT_UINT8,
                   .ndim = 1, .shape = {b->bytes}, .strides = {1}};
    return t;
}

static ft_tensor node_dout(const ft_program *p, int i, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    if (shares_grad(p, i))
        return seen_as(nd, node_dout(p, nd->inputs[0], rows));
    return view_at(p, nd, p->train_arena, p->train[i * NBUF + DOUT].offset, rows, FT_FLOAT32);
}

static ft_tensor rows_of(const ft_tensor *t, int64_t r0, int64_t rows) {
    ft_tensor v = *t;
    v.shape[0] = rows;
    v.offset += r0 * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    return v;
}

/* ---- creation ---- */

static ft_status validate(const ft_program *p) {
    const ft_storage *grads = NULL;
    for (int i = 0; i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        if (nd->kind < 0 || nd->kind >= FT_NODE_NKINDS)
            return ft_fail(FT_ERR_VALUE, "program: node %d has an unknown kind %d", i, (int)nd->kind);
        const ft_node_kind_info *k = row(p, i);
        if ((i == 0) != (nd->kind == FT_NODE_INPUT))
            return ft_fail(FT_ERR_VALUE, "program: node 0, and only node 0, must be the input");
        if (nd->ninputs < k->min_inputs || nd->ninputs > k->max_inputs)
            return ft_fail(FT_ERR_VALUE, "program: node %d (%s) has %d inputs", i, k->name, nd->ninputs);
        for (int j = 0; j < nd->ninputs; j++) {
            if (nd->inputs[j] < 0 || nd->inputs[j] >= i)
                return ft_fail(FT_ERR_VALUE, "program: node %d reads node %d, which does not come before it", i,
                               nd->inputs[j]);
            int in_ndim = p->nodes[nd->inputs[j]].ndim;
            if (k->ndim && in_ndim != k->ndim)
                return ft_fail(FT_ERR_VALUE, "program: node %d (%s) needs %d-d samples, its input %d has %d", i,
                               k->name, k->ndim, j, in_ndim);
        }
        if (nd->ndim < 1 || nd->ndim > FT_NODE_MAX_DIMS)
            return ft_fail(FT_ERR_VALUE, "program: node %d has a %d-d per-sample shape", i, nd->ndim);
        for (int d = 0; d < nd->ndim; d++)
            if (nd->shape[d] < 1)
                return ft_fail(FT_ERR_VALUE, "program: node %d has an empty per-sample shape", i);
        const ft_node *in[FT_NODE_MAX_INPUTS + 1] = {NULL};
        for (int j = 0; j < nd->ninputs; j++)
            in[j] = &p->nodes[nd->inputs[j]];
        if (k->check)
            FT_TRY(k->check(nd, in));
        const ft_tensor *on[7] = {&nd->weight, &nd->bias, &nd->dweight, &nd->dbias, &nd->running_mean,
                                  &nd->running_var, &nd->num_batches};
        for (int j = 0; j < 7; j++)
            if (on[j]->storage && !ft_device_eq(ft_op_device(on[j]), p->device))
                return ft_fail(FT_ERR_DEVICE, "program: node %d has a parameter or buffer on another device than "
                                              "the model's flat parameters", i);
        const ft_tensor *g[2] = {&nd->dweight, &nd->dbias};
        for (int j = 0; j < 2; j++) {
            if (!g[j]->storage)
                continue;
            if (grads && g[j]->storage != grads)
                return ft_fail(FT_ERR_VALUE, "program: parameter gradients must share one flat buffer");
            grads = g[j]->storage;
        }
    }
    const ft_node *last = &p->nodes[p->n - 1];
    if (last->ndim != 1)
        return ft_fail(FT_ERR_VALUE, "program: the output must be (N, classes), got a per-sample shape of %d dims",
                       last->ndim);
    return FT_OK;
}

/* Numbers the distinct parameter gradient views (a tied weight's is one). */
static void number_slots(ft_program *p) {
    for (int i = 0; i < p->n; i++)
        for (int j = 0; j < 2; j++) {
            const ft_tensor *g = j ? &p->nodes[i].dbias : &p->nodes[i].dweight;
            int s = -1;
            for (int k = 0; g->storage && k < p->nslots && s < 0; k++)
                if (p->slots[k].offset == g->offset)
                    s = k;
            if (g->storage && s < 0) {
                s = p->nslots++;
                p->slots[s] = *g;
            }
            p->slot_of[2 * i + j] = s;
        }
}

void ft_program_destroy(ft_program *p) {
    if (!p)
        return;
    if (p->train_arena)
        ft_storage_release(p->train_arena);
    if (p->eval_arena)
        ft_storage_release(p->eval_arena);
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
    free(p->slots);
    free(p->slot_of);
    free(p->slot_written);
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
    size_t n = (size_t)nnodes;
    p->nodes = malloc(n * sizeof *p->nodes);
    p->last_consumer = malloc(n * sizeof *p->last_consumer);
    p->train = malloc(n * NBUF * sizeof *p->train);
    p->eval = malloc(n * NBUF * sizeof *p->eval);
    p->written = calloc(n, sizeof *p->written);
    p->slots = calloc(2 * n, sizeof *p->slots);
    p->slot_of = calloc(2 * n, sizeof *p->slot_of);
    p->slot_written = calloc(2 * n, sizeof *p->slot_written);
    p->dropout_at = calloc(n, sizeof *p->dropout_at);
    p->seconds = calloc(n * 2, sizeof *p->seconds);
    ft_status s = p->nodes && p->last_consumer && p->train && p->eval && p->written && p->slots && p->slot_of &&
                          p->slot_written && p->dropout_at && p->seconds
                      ? FT_OK
                      : ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
    if (s == FT_OK) {
        memcpy(p->nodes, nodes, n * sizeof *nodes);
        s = validate(p);
    }
    if (s == FT_OK) {
        number_slots(p);
        s = plan(p, true, p->train, &p->train_arena, &p->train_bytes);
    }
    if (s == FT_OK)
        s = plan(p, false, p->eval, &p->eval_arena, &p->eval_bytes);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->loss_value, 0, NULL, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->one, 0, NULL, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->share, 0, NULL, FT_FLOAT32, device, false);
    if (s == FT_OK)
        s = ft_tensor_fill(&p->one, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 1});
    for (int i = 0; s == FT_OK && i < nnodes; i++)
        if (nodes[i].kind == FT_NODE_BATCHNORM && nodes[i].running_mean.storage)
            p->stats_bytes += 8 * nodes[i].shape[0] + 8; /* mean, var, and the int64 count */
    if (s == FT_OK && p->stats_bytes)
        s = ft_tensor_empty(&p->stats_backup, 1, &p->stats_bytes, FT_UINT8, device, false);
    if (s != FT_OK) {
        ft_program_destroy(p);
        return s;
    }
    *out = p;
    return FT_OK;
}

int64_t ft_program_output_size(const ft_program *p) { return p->nodes[p->n - 1].shape[0]; }

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

/* The tensors node i reads and writes in a forward over `rows` samples. */
static ft_node_run run_of(const ft_program *p, bool training, int i, int64_t rows, const ft_tensor *x) {
    const ft_node *nd = &p->nodes[i];
    ft_node_run r = {.nd = nd, .training = training, .nin = nd->ninputs, .seed = p->seed};
    for (int k = 0; k < nd->ninputs; k++)
        r.in[k] = node_out(p, training, nd->inputs[k], rows, x);
    r.out = node_out(p, training, i, rows, x);
    r.aux = node_aux(p, training, i);
    r.mask_offset = p->dropout_at[i];
    return r;
}

static ft_status forward(ft_program *p, bool training, int64_t rows, const ft_tensor *x) {
    for (int i = 1; i < p->n; i++) {
        if (is_view(p, i, training) || !row(p, i)->forward)
            continue;
        double t0 = omp_get_wtime();
        if (p->nodes[i].kind == FT_NODE_DROPOUT) { /* each mask takes the next Philox blocks */
            p->dropout_at[i] = p->dropout_offset;
            p->dropout_offset += ft_dropout_blocks(rows * ft_node_numel(&p->nodes[i]));
        }
        ft_node_run r = run_of(p, training, i, rows, x);
        FT_TRY(row(p, i)->forward(&r));
        p->seconds[2 * i] += omp_get_wtime() - t0;
    }
    return FT_OK;
}

static ft_status check_input(const ft_program *p, const ft_tensor *x) {
    const ft_node *in = &p->nodes[0];
    int64_t want[FT_MAX_DIMS] = {x->ndim ? x->shape[0] : 0};
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

/* A parameter gradient of node i (j 0: weight, 1: bias) and its rule: added
 * when the step has written it already (a tied weight, a micro-batch after
 * the first). NULL for a frozen or absent parameter. */
static const ft_tensor *param_grad(ft_program *p, int i, int j, bool *acc) {
    int s = p->slot_of[2 * i + j];
    if (s < 0)
        return NULL;
    *acc = p->slot_written[s];
    p->slot_written[s] = true;
    return &p->slots[s];
}

static ft_status backward_node(ft_program *p, int i, int64_t rows, const ft_tensor *x) {
    const ft_node *nd = &p->nodes[i];
    if (!p->written[i] || shares_grad(p, i))
        return FT_OK; /* no gradient reaches it, or a view sharing its input's gradient */
    ft_node_run r = run_of(p, true, i, rows, x);
    r.dout = node_dout(p, i, rows);
    ft_tensor din[FT_NODE_MAX_INPUTS];
    bool any = false;
    for (int k = 0; k < nd->ninputs; k++) {
        int owner = grad_owner(p, nd->inputs[k]);
        if (owner == 0)
            continue; /* the batch needs no gradient */
        din[k] = node_dout(p, nd->inputs[k], rows);
        r.din[k] = &din[k];
        r.din_acc[k] = p->written[owner];
        p->written[owner] = true; /* an input read twice adds its second share */
        any = true;
    }
    r.dweight = param_grad(p, i, 0, &r.dweight_acc);
    r.dbias = param_grad(p, i, 1, &r.dbias_acc);
    if (!any && !r.dweight && !r.dbias)
        return FT_OK; /* frozen, and nothing before it trains */
    return row(p, i)->backward(&r);
}

/* The steps of ft_program_backward over x and y where the program runs. */
static ft_status backward_batches(ft_program *p, const ft_tensor *x, const ft_tensor *y, double *loss) {
    int64_t B = x->shape[0];
    FT_TRY(copy_statistics(p, true));
    memset(p->slot_written, 0, (size_t)p->nslots * sizeof *p->slot_written);
    for (int64_t r0 = 0; r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        ft_tensor xm = rows_of(x, r0, rows), ym = rows_of(y, r0, rows);
        FT_TRY(forward(p, true, rows, &xm));
        memset(p->written, 0, (size_t)p->n * sizeof *p->written);
        FT_TRY(loss_and_grad(p, rows, &ym, p->loss.sum ? 1.0 : (double)rows / (double)B, loss));
        if (!isfinite(*loss)) /* the caller refuses or skips this step: leave no trace of it */
            return copy_statistics(p, false);
        for (int i = p->n - 1; i > 0; i--) {
            double t0 = omp_get_wtime();
            FT_TRY(backward_node(p, i, rows, &xm));
            p->seconds[2 * i + 1] += omp_get_wtime() - t0;
        }
    }
    /* A parameter no gradient reached (its branch unused) gets zero, not the last step's. */
    for (int s = 0; s < p->nslots; s++)
        if (!p->slot_written[s])
            FT_TRY(ft_tensor_fill(&p->slots[s], (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0}));
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
