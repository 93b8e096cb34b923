#include "nn/program.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/math.h"
#include "nn/node.h"
#include "ops/check.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/reduce.h"

/* Arena blocks start on cache lines. */
#define ALIGN 64

/* One planned buffer: bytes, lifetime [first, last] in schedule steps (see
 * forward_step) and its place in the arena. */
typedef struct {
    int64_t bytes, first, last, offset;
} block;

/* The buffers of a node: its output, saved data and gradient, and the output
 * and saved data of its recomputation, when it has one. */
enum { OUT, AUX, DOUT, RE_OUT, RE_AUX, NBUF };

struct ft_program {
    int n;
    ft_node *nodes;
    int output;             /* the model's output node */
    int targets[FT_PROGRAM_MAX_TARGETS], ntargets; /* the targets' nodes (a multi-task loss reads several) */
    int64_t batch;
    bool channels_last;
    ft_device device;       /* where the parameters, the arenas and every op of a step are */
    uint64_t seed, dropout_offset;
    uint64_t rank_key;    /* mixed into seed by a distributed program's ranks (ft_program_set_rank) */
    uint64_t step_offset; /* dropout_offset when the last ft_program_backward began */
    ft_dtype compute;       /* float32, or the low precision of a mixed-precision program */
    ft_dtype *dtype;        /* (n) each node's output and gradient dtype (see plan_dtypes) */
    ft_tensor params;       /* the model's flat float32 parameters (a borrowed view) */
    ft_tensor low_params;   /* mixed precision: their copy in the compute dtype, which the nodes read */
    bool low_stale;         /* whether the params may have changed since low_params was written */
    /* (n) mixed precision: the float32 weight a node that reads it low finds
     * outside the params (a parameter another program trains), or empty; the
     * node reads a copy of its own, written before every run, since that
     * weight's owner may have changed it at any time. */
    ft_tensor *outside;
    int *last_consumer;     /* (n) the plan's last user of each node (see last_users) */
    int *read_from;         /* (n + 1) where each node's readers start in readers */
    int *readers;           /* the nodes that read each node, once per input they read it by, in node order */
    /* Recomputation: the node before whose backward each output is computed
     * again (-1: kept from the forward), and those recomputed, in the order
     * the backward recomputes them. */
    int *replay_at;
    int *replays, nreplays;
    bool in_backward;       /* the backward of a micro-batch runs: recomputed outputs are in their RE_ blocks */
    float loss_scale;       /* the backward's seed (ft_program_set_loss_scale) */
    block *train, *eval;    /* (n, NBUF) */
    ft_storage *train_arena, *eval_arena;
    int64_t train_bytes, eval_bytes;
    int ninputs;            /* nodes 0 .. ninputs - 1 */
    ft_tensor x[FT_PROGRAM_MAX_INPUTS], y[FT_PROGRAM_MAX_TARGETS]; /* the micro-batch being run (borrowed views) */
    double *norm;           /* (n) each loss node's normalizer for the batch being run */
    bool weightless;        /* evaluation: the final loss ignores every target of the batch, which counts for
                               nothing (its normalizer, 0, is run as 1 over shares of 0) */
    ft_tensor loss_value;   /* (1) float32: a micro-batch's loss */
    bool *trains;           /* (n) whether a node's value depends on a trained parameter (wants a gradient) */
    bool *ratio_pass;       /* (n) the nodes a ratio's denominator reads, run first over the whole batch, or NULL */
    bool *written;          /* (n) whether dout[i] holds a contribution of this micro-batch */
    /* Parameter gradients, each view once (tied weights share one): which
     * slot each node's dweight and dbias is, and whether the step wrote it. */
    int nslots;
    ft_tensor *slots;       /* (nslots) borrowed views */
    int *slot_of;           /* (n, 2) the slot of dweight and of dbias, or -1 */
    bool *slot_written;     /* (nslots) */
    int *slot_writers;      /* (nslots) the nodes that write each slot */
    int *slot_left;         /* (nslots) of them, those whose backward has not run in the last micro-batch */
    void (*slot_final)(void *ctx, int slot); /* told each slot that is final (ft_program_on_slot_final) */
    void *slot_final_ctx;
    uint64_t *dropout_at;   /* (n) the Philox offset of each drawing node's (dropout, noise) last draw */
    double *seconds;        /* (n, 2) time spent in each node's forward and backward */
    ft_tensor stats_backup; /* (bytes) uint8: the batch-norm running statistics before the current step */
    int64_t stats_bytes;
};

/* ---- shapes and buffers ---- */

static const ft_node_kind_info *row(const ft_program *p, int i) { return &ft_node_kinds[p->nodes[i].kind]; }

static bool is_image(const ft_node *nd) { return nd->ndim == 3; }

static bool is_input(const ft_program *p, int i) { return i < p->ninputs; }

/* Which of the targets node i is (its index in p->targets), or -1. */
static int target_of(const ft_program *p, int i) {
    for (int k = 0; k < p->ntargets; k++)
        if (p->targets[k] == i)
            return k;
    return -1;
}

static bool is_ratio(const ft_program *p, int i) {
    return p->nodes[i].kind == FT_NODE_SUM && p->nodes[i].reduction == FT_NODE_REDUCE_RATIO;
}

/* Whether node i's output is its input's memory (no op runs). */
static bool is_view(const ft_program *p, int i, bool training) {
    const ft_node *nd = &p->nodes[i];
    const ft_node_kind_info *k = row(p, i);
    return k->is_view && k->is_view(nd, nd->ninputs ? &p->nodes[nd->inputs[0]] : NULL, p->channels_last, training);
}

/* Whether node i's output is laid out in the order of its shape (else
 * channels innermost). A view's is its input's. */
static bool in_order(const ft_program *p, int i, bool training) {
    const ft_node *nd = &p->nodes[i];
    ft_node_layout layout = row(p, i)->layout;
    if (!is_image(nd) || !p->channels_last || layout == FT_LAYOUT_IN_ORDER || nd->common || /* a weight's order */
        (layout == FT_LAYOUT_OF_IMAGES && is_image(&p->nodes[nd->inputs[0]])))
        return true;
    if (!is_input(p, i) && (layout == FT_LAYOUT_INPUT || is_view(p, i, training)))
        return in_order(p, nd->inputs[0], training);
    return false;
}

/* The rows node i computes for a micro-batch of `rows` samples: one for a
 * common node. */
static int64_t rows_for(const ft_program *p, int i, int64_t rows) { return p->nodes[i].common ? 1 : rows; }

/* A (rows, ...) view of node i's output at `offset` bytes of `arena`. */
static ft_tensor view_at(const ft_program *p, int i, bool training, ft_storage *arena, int64_t offset, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    ft_tensor t = {.storage = arena, .offset = offset, .dtype = p->dtype[i], .ndim = nd->ndim + 1};
    t.shape[0] = rows;
    memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    if (!in_order(p, i, training)) {
        int64_t C = nd->shape[0], H = nd->shape[1], W = nd->shape[2];
        int64_t s[4] = {H * W * C, 1, W * C, C};
        memcpy(t.strides, s, sizeof s);
    }
    return t;
}

static int64_t round_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* A block's size and index: blocks by size, descending, equal sizes in
 * index order. */
typedef struct {
    int64_t bytes;
    int index;
} sized;

static int by_size(const void *a, const void *b) {
    const sized *x = a, *y = b;
    if (x->bytes != y->bytes)
        return (x->bytes < y->bytes) - (x->bytes > y->bytes);
    return (x->index > y->index) - (x->index < y->index);
}

/* Greedy placement: largest blocks first, each at the lowest offset free
 * during its lifetime (a sweep, in address order, over the placed blocks,
 * those alive meanwhile in the way). Returns the arena size, -1 out of
 * memory. */
static int64_t place(block *b, int nb) {
    size_t count = nb > 0 ? (size_t)nb : 1;
    sized *order = malloc(count * sizeof *order);
    int *placed = malloc(count * sizeof *placed); /* the blocks placed so far, by offset */
    int64_t size = 0;
    int np = 0;
    if (!order || !placed) {
        free(order), free(placed);
        return -1;
    }
    for (int i = 0; i < nb; i++)
        order[i] = (sized){b[i].bytes, i};
    qsort(order, (size_t)nb, sizeof *order, by_size);
    for (int k = 0; k < nb; k++) {
        block *x = &b[order[k].index];
        if (x->bytes == 0)
            continue;
        int64_t at = 0;
        for (int r = 0; r < np && b[placed[r]].offset < at + x->bytes; r++) {
            const block *y = &b[placed[r]];
            if (y->last >= x->first && x->last >= y->first && y->offset + y->bytes > at)
                at = round_up(y->offset + y->bytes);
        }
        x->offset = at;
        int lo = 0, hi = np; /* after the placed blocks at offsets up to at */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (b[placed[mid]].offset <= at)
                lo = mid + 1;
            else
                hi = mid;
        }
        memmove(placed + lo + 1, placed + lo, (size_t)(np - lo) * sizeof *placed);
        placed[lo] = order[k].index;
        np++;
        if (at + x->bytes > size)
            size = at + x->bytes;
    }
    free(order);
    free(placed);
    return size;
}

/* Views in training share their input's gradient buffer too: a write to
 * theirs is a write to their input's. */
static bool shares_grad(const ft_program *p, int i) { return !is_input(p, i) && is_view(p, i, true); }

static int grad_owner(const ft_program *p, int i) {
    return shares_grad(p, i) && p->nodes[i].ninputs ? grad_owner(p, p->nodes[i].inputs[0]) : i;
}

/* The last node that reads node i's output (training=false) or first writes
 * its gradient (training=true), looking through the views that read (or
 * write) on their input's behalf. Nodes come in topological order, so one
 * pass from the end settles every chain. */
static void last_users(const ft_program *p, bool training, int *last) {
    for (int i = p->n - 1; i >= 0; i--) {
        last[i] = i;
        for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++) {
            int j = p->readers[r];
            bool through = training ? shares_grad(p, j) : is_view(p, j, false);
            int user = through ? last[j] : j;
            if (user > last[i])
                last[i] = user;
        }
    }
}

/* The nodes node i reads (NULL after the last). */
static void inputs_of(const ft_program *p, int i, const ft_node **in) {
    const ft_node *nd = &p->nodes[i];
    for (int j = 0; j < FT_NODE_MAX_INPUTS; j++)
        in[j] = j < nd->ninputs ? &p->nodes[nd->inputs[j]] : NULL;
    in[FT_NODE_MAX_INPUTS] = NULL;
}

static int64_t aux_bytes(const ft_program *p, int i) {
    const ft_node *in[FT_NODE_MAX_INPUTS + 1];
    inputs_of(p, i, in);
    const ft_node_kind_info *k = row(p, i);
    return k->aux_bytes ? k->aux_bytes(&p->nodes[i], in, rows_for(p, i, p->batch), p->dtype[i]) : 0;
}

static int64_t output_bytes(const ft_program *p, int i) {
    return rows_for(p, i, p->batch) * ft_node_numel(&p->nodes[i]) * (int64_t)ft_dtype_get(p->dtype[i])->itemsize;
}

/* Whether node i's output is a buffer of its own (not its input's memory,
 * not a parameter's). */
static bool owns_output(const ft_program *p, int i, bool training) {
    return !is_view(p, i, training) && p->nodes[i].kind != FT_NODE_PARAM;
}

/* The schedule's steps: the forward of node i at 2i, the loss at 2n, the
 * backward of node i at 4n - 2i, and the recomputation of the outputs that
 * node e's backward is the first to need again just before it, at
 * 4n - 2e - 1. */
static int64_t forward_step(int i) { return 2 * (int64_t)i; }

static int64_t loss_step(const ft_program *p) { return 2 * (int64_t)p->n; }

static int64_t backward_step(const ft_program *p, int i) { return 4 * (int64_t)p->n - 2 * (int64_t)i; }

/* Whether node i's backward runs and reads its own output. */
static bool reads_own_output(const ft_program *p, int i) {
    const ft_node_kind_info *k = row(p, i);
    return p->trains[i] && (!k->reads_output || k->reads_output(&p->nodes[i]));
}

/* Whether node j's backward runs and reads its inputs. */
static bool reads_inputs(const ft_program *p, int j) {
    const ft_node_kind_info *k = row(p, j);
    return p->trains[j] && (!k->reads_inputs || k->reads_inputs(&p->nodes[j]));
}

static bool read_by_training(const ft_program *p, int i);

/* Whether a recomputation reads node i's output, directly or through views. */
static bool read_by_replay(const ft_program *p, int i) {
    for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++) {
        int j = p->readers[r];
        if (is_view(p, j, true) ? read_by_replay(p, j) : p->replay_at[j] >= 0)
            return true;
    }
    return false;
}

/* Gives every buffer of the training (or evaluation) step its lifetime in
 * b (n, NBUF) and places them; returns the arena's bytes, -1 when out of
 * memory. In training an output that a backward reads (its readers' or its
 * own) is kept until its own backward, which comes after its readers'; a
 * recomputed one only until its last reader's forward, and again from its
 * recomputation; one that no backward and no recomputation reads (a frozen
 * part's, read by frozen nodes only; a conv's read only by an InPlace-ABN or
 * a max pool) lives as in evaluation. What a node saves lives until its
 * backward. In evaluation an output lives until its last reader. */
static int64_t lay_out(const ft_program *p, bool training, block *b) {
    for (int i = 0; i < p->n; i++) {
        block *bi = &b[i * NBUF];
        memset(bi, 0, NBUF * sizeof *bi);
        int64_t out = output_bytes(p, i), aux = aux_bytes(p, i), born = forward_step(i);
        int last = p->last_consumer[i], again = training ? p->replay_at[i] : -1;
        bool kept = training && (reads_own_output(p, i) || i == p->output || i == p->n - 1 ||
                                 read_by_training(p, i) || read_by_replay(p, i));
        bool trains = training && p->trains[i]; /* its backward runs: what it saved lives until then */
        int64_t end = kept ? backward_step(p, i) : last == i ? loss_step(p) : forward_step(last);
        if (owns_output(p, i, training))
            bi[OUT] = (block){out, born, again < 0 ? end : forward_step(last), 0};
        bi[AUX] = (block){aux, born, (kept || trains) && again < 0 ? backward_step(p, i) : born, 0};
        if (again >= 0) {
            bi[RE_OUT] = (block){out, backward_step(p, again) - 1, end, 0};
            bi[RE_AUX] = (block){aux, backward_step(p, again) - 1, end, 0};
        }
        if (trains && !shares_grad(p, i))
            bi[DOUT] = (block){out, last == i ? loss_step(p) : backward_step(p, last), backward_step(p, i), 0};
    }
    return place(b, p->n * NBUF);
}

/* ---- recomputation ---- */

/* Whether a backward reads node i's output as its input, directly or
 * through views. */
static bool read_by_training(const ft_program *p, int i) {
    for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++) {
        int j = p->readers[r];
        if (is_view(p, j, true) ? read_by_training(p, j) : reads_inputs(p, j))
            return true;
    }
    return false;
}

/* Whether node i's output may be recomputed instead of kept: a buffer of
 * its own, computed by a forward, that a backward reads (one that none
 * reads is freed after its last reader's forward anyway), and neither the
 * model's output nor the loss, which the step reads after the forward. */
static bool droppable(const ft_program *p, int i) {
    return i != p->output && i < p->n - 1 && row(p, i)->forward && owns_output(p, i, true) &&
           (read_by_training(p, i) || reads_own_output(p, i));
}

/* Whether every node that reads node i's output (through views) is in segment s. */
static bool read_within(const ft_program *p, int i, const int *segment, int s) {
    for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++) {
        int j = p->readers[r];
        if (!(is_view(p, j, true) ? read_within(p, j, segment, s) : segment[j] == s))
            return false;
    }
    return true;
}

/* replay_at for the outputs `drop` says: each is computed again just before
 * the backward of the last node that needs it then, which is its last
 * reader, or for a reader recomputed itself that reader's recomputation
 * (a view passes its readers' needs on). Its readers' backwards and
 * recomputations all come later, so it can be computed from the outputs
 * kept or recomputed by then. */
static void replay_points(ft_program *p, const bool *drop) {
    for (int i = p->n - 1; !is_input(p, i); i--) {
        int at = -1;
        for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++) {
            int j = p->readers[r];
            int need = is_view(p, j, true) || drop[j] ? p->replay_at[j] : j;
            at = need > at ? need : at;
        }
        p->replay_at[i] = is_view(p, i, true) ? at : drop[i] ? (at > i ? at : i) : -1;
    }
    for (int i = 0; i < p->n; i++)
        if (!drop[i])
            p->replay_at[i] = -1;
}

/* About the floating-point operations one byte of memory traffic costs
 * the time of: 535 GFLOP/s over 70 GB/s on the build machine's CPU, about
 * 20 on an H100 in float32. */
#define FLOPS_PER_BYTE 8

/* What recomputing node i costs, in floating-point operations: its
 * arithmetic, or for a kind bound by memory (normalizations, activations,
 * additions) reading and writing about twice its output. */
static double replay_cost(const ft_program *p, int i) {
    double compute = p->nodes[i].flops * (double)p->batch;
    double traffic = 2.0 * FLOPS_PER_BYTE * (double)output_bytes(p, i);
    return compute > traffic ? compute : traffic;
}

static bool compute_bound(const ft_program *p, int i) {
    return p->nodes[i].flops * (double)p->batch > 2.0 * FLOPS_PER_BYTE * (double)output_bytes(p, i);
}

/* Chen et al.'s segments ("Training deep nets with sublinear memory
 * cost"), with the cuts where the fewest bytes cross: the model's nodes
 * 1..m cut into segments of at most `limit` bytes of outputs and saved data
 * (own; a larger node alone) minimizing the bytes kept across the cuts
 * (cross[c]: of the outputs up to c read after c). Every segment but the
 * last, whose backward follows its forward at once, is recomputed: drop
 * gets the outputs that only their own segment reads. best and from are
 * (m + 1) scratch. */
static void cut_segments(const ft_program *p, const int64_t *own, const int64_t *cross, int64_t limit,
                         int64_t *best, int *from, bool *drop) {
    int m = p->output;
    best[0] = 0;
    for (int c = 1; c <= m; c++) {
        best[c] = INT64_MAX;
        int64_t inside = 0;
        for (int s = c; s >= 1; s--) {
            inside += own[s];
            if (inside > limit && s < c)
                break;
            int64_t v = best[s - 1] + (c < m ? cross[c] : 0);
            if (v <= best[c]) /* among equals the longest segment: fewer cuts */
                best[c] = v, from[c] = s;
        }
    }
    memset(drop, 0, (size_t)p->n * sizeof *drop);
    for (int c = from[m] - 1; c >= 1; c = from[c] - 1)
        for (int i = from[c]; i <= c; i++)
            drop[i] = droppable(p, i) && p->last_consumer[i] <= c;
}

/* The training arena's bytes with the outputs `drop` says recomputed. */
static int64_t arena_with(ft_program *p, const bool *drop) {
    replay_points(p, drop);
    return lay_out(p, true, p->train);
}

/* Automatic recomputation into drop: with no budget (< 0) about sqrt(N)
 * segments of equal bytes for the model's N nodes with buffers; with one,
 * the cheapest plan found within it. The candidates are the segments of
 * every limit from the whole model down to one node, in steps of 0.8; the
 * cheapest that fits then keeps the compute-bound outputs it recomputes
 * (convolutions, linear layers, attention) as long as the budget allows,
 * those that cost the most per byte first: what is left to recompute is
 * mostly the cheap nodes between them. */
static ft_status choose_automatic(ft_program *p, int64_t budget, bool *drop) {
    int m = p->output, n = p->n;
    int64_t *own = calloc((size_t)m + 1, sizeof *own), *cross = calloc((size_t)m + 1, sizeof *cross);
    int64_t *best = malloc(((size_t)m + 1) * sizeof *best);
    int *from = malloc(((size_t)m + 1) * sizeof *from), *order = malloc((size_t)n * sizeof *order);
    bool *trial = calloc((size_t)n, sizeof *trial);
    ft_status s = own && cross && best && from && order && trial
                      ? FT_OK
                      : ft_fail(FT_ERR_NOMEM, "out of memory planning recomputation");
    int64_t total = 0, smallest = INT64_MAX;
    int count = 0;
    for (int i = 1; s == FT_OK && i <= m; i++) {
        if (!owns_output(p, i, true))
            continue;
        own[i] = output_bytes(p, i) + aux_bytes(p, i);
        total += own[i];
        smallest = own[i] > 0 && own[i] < smallest ? own[i] : smallest;
        count++;
        for (int c = i; c < p->last_consumer[i] && c < m; c++)
            cross[c] += output_bytes(p, i);
    }
    if (s == FT_OK && budget < 0) {
        int k = (int)ceil(sqrt((double)count));
        cut_segments(p, own, cross, total / (k > 0 ? k : 1), best, from, drop);
        /* segments that shrink nothing (a net whose peak is in the backward
         * anyway) would only cost time: then everything is kept */
        int64_t with = arena_with(p, drop), without = arena_with(p, trial);
        if (with < 0 || without < 0)
            s = ft_fail(FT_ERR_NOMEM, "out of memory planning recomputation");
        else if (with >= without)
            memset(drop, 0, (size_t)n * sizeof *drop);
    } else if (s == FT_OK) {
        memset(drop, 0, (size_t)n * sizeof *drop);
        int64_t least = arena_with(p, drop);
        double cheapest = least <= budget ? 0 : INFINITY;
        for (double limit = (double)total; least >= 0 && cheapest > 0; limit *= 0.8) {
            cut_segments(p, own, cross, (int64_t)limit, best, from, trial);
            int64_t size = arena_with(p, trial);
            double cost = 0;
            for (int i = 0; i < n; i++)
                cost += trial[i] ? replay_cost(p, i) : 0;
            if (size >= 0 && size <= budget && cost < cheapest) {
                cheapest = cost;
                memcpy(drop, trial, (size_t)n * sizeof *drop);
            }
            least = size < least ? size : least;
            if (limit < (double)smallest)
                break;
        }
        if (least < 0)
            s = ft_fail(FT_ERR_NOMEM, "out of memory planning recomputation");
        else if (isinf(cheapest))
            s = ft_fail(FT_ERR_VALUE, "program: a recompute budget of %lld bytes is below the least training arena "
                                      "the planner finds for this model and batch: %lld bytes (%.1f MiB)",
                        (long long)budget, (long long)least, (double)least / (1 << 20));
        int count_bound = 0;
        for (int i = 0; s == FT_OK && i < n; i++)
            if (drop[i] && compute_bound(p, i)) {
                int j = count_bound++;
                for (; j > 0 && replay_cost(p, order[j - 1]) / (double)output_bytes(p, order[j - 1]) <
                               replay_cost(p, i) / (double)output_bytes(p, i);
                     j--)
                    order[j] = order[j - 1];
                order[j] = i;
            }
        for (int k = 0; s == FT_OK && k < count_bound; k++) {
            drop[order[k]] = false;
            int64_t size = arena_with(p, drop);
            if (size < 0)
                s = ft_fail(FT_ERR_NOMEM, "out of memory planning recomputation");
            else if (size > budget)
                drop[order[k]] = true;
        }
    }
    free(own);
    free(cross);
    free(best);
    free(from);
    free(order);
    free(trial);
    return s;
}

/* replay_at and replays for `rc` (NULL: every output is kept). */
static ft_status choose_recomputation(ft_program *p, const ft_recompute *rc) {
    bool *drop = calloc((size_t)p->n, sizeof *drop);
    if (!drop)
        return ft_fail(FT_ERR_NOMEM, "out of memory planning recomputation");
    ft_status s = FT_OK;
    if (rc && rc->segment)
        for (int i = 0; i < p->n; i++)
            drop[i] = rc->segment[i] >= 0 && droppable(p, i) && read_within(p, i, rc->segment, rc->segment[i]);
    else if (rc && rc->automatic)
        s = choose_automatic(p, rc->budget, drop);
    replay_points(p, drop);
    free(drop);
    p->nreplays = 0; /* by replay point from the last, each point's in forward order */
    for (int e = p->n - 1; e > 0; e--)
        for (int i = 1; i <= e; i++)
            if (p->replay_at[i] == e)
                p->replays[p->nreplays++] = i;
    return s;
}

/* Plans an arena; allocates it where `arena` is given (the training arena
 * waits for the first training run: a program that only evaluates, as the
 * eval-mode twin of a forward that branches on its mode, never holds it). */
static ft_status plan(ft_program *p, bool training, const ft_recompute *rc, block *b, ft_storage **arena,
                      int64_t *bytes) {
    last_users(p, training, p->last_consumer);
    if (training)
        FT_TRY(choose_recomputation(p, rc));
    int64_t size = lay_out(p, training, b);
    if (size < 0)
        return ft_fail(FT_ERR_NOMEM, "out of memory planning the activations");
    *bytes = size;
    return arena ? ft_storage_new(arena, (size_t)size, p->device, false) : FT_OK;
}

/* A view's (rows, ...) look at its input's memory: a reshape is the only
 * view with a shape of its own. */
static ft_tensor seen_as(const ft_node *nd, ft_tensor t) {
    if (nd->kind == FT_NODE_RESHAPE) {
        bool same_for_every_sample = t.strides[0] == 0; /* a parameter's value (broadcast_param) */
        t.ndim = nd->ndim + 1;
        memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
        ft_contiguous_strides(t.strides, t.ndim, t.shape);
        if (same_for_every_sample)
            t.strides[0] = 0;
    }
    return t;
}

/* A parameter node's value: its weight, the same for every sample, and
 * along every dimension but `dim` when it varies along that one only. */
static ft_tensor broadcast_param(const ft_node *nd, int64_t rows) {
    ft_tensor t = nd->weight;
    t.ndim = nd->ndim + 1;
    t.shape[0] = rows;
    memcpy(t.shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    t.strides[0] = 0;
    for (int d = 0; nd->dim >= 0 && d < nd->ndim; d++)
        t.strides[1 + d] = d == nd->dim;
    return t;
}

/* Which block holds node i's output (OUT) or saved data (AUX) now: in the
 * backward, a recomputed node's second. */
static int block_now(const ft_program *p, bool training, int i, int k) {
    if (!training || !p->in_backward || p->replay_at[i] < 0)
        return k;
    return k == OUT ? RE_OUT : RE_AUX;
}

/* The output view of node i for `rows` samples (the micro-batch for the
 * input and the target nodes). */
static ft_tensor node_out(const ft_program *p, bool training, int i, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    int k = target_of(p, i);
    rows = rows_for(p, i, rows);
    if (is_input(p, i) || k >= 0) {
        ft_tensor t = is_input(p, i) ? p->x[i] : p->y[k];
        t.shape[0] = rows;
        return t;
    }
    if (is_view(p, i, training))
        return seen_as(nd, node_out(p, training, nd->inputs[0], rows));
    if (nd->kind == FT_NODE_PARAM)
        return broadcast_param(nd, rows);
    const block *b = &(training ? p->train : p->eval)[i * NBUF + block_now(p, training, i, OUT)];
    return view_at(p, i, training, training ? p->train_arena : p->eval_arena, b->offset, rows);
}

static ft_tensor node_aux(const ft_program *p, bool training, int i) {
    const block *b = &(training ? p->train : p->eval)[i * NBUF + block_now(p, training, i, AUX)];
    ft_tensor t = {.storage = training ? p->train_arena : p->eval_arena, .offset = b->offset, .dtype = FT_UINT8,
                   .ndim = 1, .shape = {b->bytes}, .strides = {1}};
    return t;
}

static ft_tensor node_dout(const ft_program *p, int i, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    rows = rows_for(p, i, rows);
    if (shares_grad(p, i))
        return seen_as(nd, node_dout(p, nd->inputs[0], rows));
    return view_at(p, i, true, p->train_arena, p->train[i * NBUF + DOUT].offset, rows);
}

/* ---- creation ---- */

/* Node i's place among the common nodes: a common node reads common nodes
 * only (or is a parameter node) and is neither an input, a target, the
 * output nor the loss; another node reads one only by an expand, which
 * repeats it over the samples, or as its weight input, whose shape it takes
 * as its weight's. */
static ft_status check_common(ft_program *p, int i) {
    ft_node *nd = &p->nodes[i];
    if (nd->weight_input) {
        int w = nd->weight_input == nd->ninputs - 1 ? nd->inputs[nd->weight_input] : -1;
        if ((nd->kind != FT_NODE_CONV2D && nd->kind != FT_NODE_CONV_TRANSPOSE2D && nd->kind != FT_NODE_LINEAR) ||
            w < 0 || !p->nodes[w].common || nd->weight.storage || nd->dweight.storage)
            return ft_fail(FT_ERR_VALUE, "program: node %d's weight input must be its last input (not its first), a "
                                         "common node, read by a conv2d, conv_transpose2d or linear node that has no "
                                         "weight parameter", i);
        const ft_node *v = &p->nodes[w];
        nd->weight = (ft_tensor){.dtype = FT_FLOAT32, .ndim = v->ndim}; /* the shape, for the checks */
        memcpy(nd->weight.shape, v->shape, sizeof v->shape);
        ft_contiguous_strides(nd->weight.strides, nd->weight.ndim, nd->weight.shape);
    }
    for (int j = 0; j < nd->ninputs; j++) {
        bool common = p->nodes[nd->inputs[j]].common;
        if (nd->common ? !common : common && nd->kind != FT_NODE_EXPAND && (!nd->weight_input || j != nd->weight_input))
            return ft_fail(FT_ERR_VALUE, "program: node %d (%s) reads node %d, %s", i, row(p, i)->name,
                           nd->inputs[j], nd->common ? "which is not common, as a common node"
                                                     : "a common node, other than by an expand or as its weight");
    }
    if (nd->common && (nd->kind == FT_NODE_INPUT || nd->kind == FT_NODE_TARGET || i == p->output || i == p->n - 1 ||
                       (!nd->ninputs && nd->kind != FT_NODE_PARAM)))
        return ft_fail(FT_ERR_VALUE, "program: node %d (%s) cannot be common: a common node is computed from "
                                     "parameters alone", i, row(p, i)->name);
    return FT_OK;
}

static ft_status validate(ft_program *p) {
    const ft_storage *grads = NULL;
    for (int i = 0; i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        if (nd->kind < 0 || nd->kind >= FT_NODE_NKINDS)
            return ft_fail(FT_ERR_VALUE, "program: node %d has an unknown kind %d", i, (int)nd->kind);
        const ft_node_kind_info *k = row(p, i);
        if (nd->kind == FT_NODE_INPUT && i == p->ninputs && i < FT_PROGRAM_MAX_INPUTS)
            p->ninputs++;
        else if (nd->kind == FT_NODE_INPUT || i == 0)
            return ft_fail(FT_ERR_VALUE, "program: the first nodes, and only they, must be the inputs (at most %d)",
                           FT_PROGRAM_MAX_INPUTS);
        int data_inputs = nd->ninputs - (nd->weight_input > 0);
        if (data_inputs < k->min_inputs || data_inputs > k->max_inputs)
            return ft_fail(FT_ERR_VALUE, "program: node %d (%s) has %d inputs", i, k->name, data_inputs);
        for (int j = 0; j < nd->ninputs; j++) {
            if (nd->inputs[j] < 0 || nd->inputs[j] >= i)
                return ft_fail(FT_ERR_VALUE, "program: node %d reads node %d, which does not come before it", i,
                               nd->inputs[j]);
            int in_ndim = p->nodes[nd->inputs[j]].ndim;
            if (k->images == 2 && j < data_inputs && (in_ndim < 2 || in_ndim > 3 || nd->ndim != in_ndim))
                return ft_fail(FT_ERR_VALUE, "program: node %d (%s) takes images (C, H, W) or sequences (C, L) to "
                               "the same rank, its input %d has %d dimensions", i, k->name, j, in_ndim);
        }
        if (nd->ndim < 0 || nd->ndim > FT_NODE_MAX_DIMS)
            return ft_fail(FT_ERR_VALUE, "program: node %d has a %d-d per-sample shape", i, nd->ndim);
        for (int d = 0; d < nd->ndim; d++)
            if (nd->shape[d] < 1)
                return ft_fail(FT_ERR_VALUE, "program: node %d has an empty per-sample shape", i);
        FT_TRY(check_common(p, i));
        const ft_node *in[FT_NODE_MAX_INPUTS + 1];
        inputs_of(p, i, in);
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
    if (p->output < p->ninputs || p->output >= p->n - 1)
        return ft_fail(FT_ERR_VALUE, "program: the output must be a node before the loss");
    if (p->nodes[p->n - 1].ndim != 0)
        return ft_fail(FT_ERR_VALUE, "program: the last node must be the loss, one value per sample");
    for (int i = 0; i < p->n; i++)
        if (p->nodes[i].kind == FT_NODE_TARGET) {
            if (p->ntargets == FT_PROGRAM_MAX_TARGETS || i <= p->output)
                return ft_fail(FT_ERR_VALUE, "program: at most %d target nodes, after the output",
                               FT_PROGRAM_MAX_TARGETS);
            p->targets[p->ntargets++] = i;
        }
    return FT_OK;
}

/* Numbers the distinct parameter gradient views (a tied weight's is one)
 * and marks the nodes that depend on one. */
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
            p->trains[i] |= s >= 0;
            if (s >= 0)
                p->slot_writers[s]++;
        }
    /* a kind with neither a backward nor a view's shared gradient (detach,
     * one-hot) passes none to its inputs */
    for (int i = 0; i < p->n; i++)
        for (int k = 0; k < p->nodes[i].ninputs && (row(p, i)->backward || row(p, i)->is_view); k++)
            p->trains[i] |= p->trains[p->nodes[i].inputs[k]];
}

/* Whether node i's output is its first input's output seen anew (always or
 * in one mode): it has that output's dtype. */
static bool mirrors(const ft_program *p, int i) { return row(p, i)->is_view && p->nodes[i].ninputs > 0; }

static int source(const ft_program *p, int i) { return mirrors(p, i) ? source(p, p->nodes[i].inputs[0]) : i; }

/* Whether node i is a model output only the loss reads (an auxiliary head). */
static bool read_by_loss_only(const ft_program *p, int i) {
    for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++)
        if (p->readers[r] <= p->output)
            return false;
    return p->read_from[i] < p->read_from[i + 1];
}

/* Whether a LOW kind reads node i. */
static bool read_by_low(const ft_program *p, int i) {
    for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++)
        if (row(p, p->readers[r])->precision == FT_NODE_LOW)
            return true;
    return false;
}

/* Whether every reader of node i, through the views that show it, computes in the low precision (a convolution, a
 * matmul), which would round it there anyway: it may then be rounded where it is written (an input as it is copied
 * in). Read by any other op (a normalization written in forward, x - 1000) it stays float32 (see plan_dtypes). */
static bool read_by_low_only(const ft_program *p, int i) {
    for (int r = p->read_from[i]; r < p->read_from[i + 1]; r++) {
        int j = p->readers[r];
        if (mirrors(p, j) ? !read_by_low_only(p, j) : row(p, j)->precision != FT_NODE_LOW)
            return false;
    }
    return true;
}

/* Each node's dtype (of its output and of its gradient). In a mixed-precision
 * program the model's nodes compute in the low precision where their kind
 * can, and the loss's in float32, as does a model output that is no product
 * (the output, or the node a view of it shows; a sigmoid's probabilities:
 * one within 2^-9 of 1 would round to 1, and the loss's log(1 - p) to its
 * floor); a float input read only by LOW kinds is converted as it is copied
 * in, and a parameter node read by a LOW kind is its weight's low copy.
 * Another kind whose float inputs are all float32 computes in float32 too,
 * as torch.autocast runs the ops other than products in their inputs' dtype
 * (the ops between a float input and the first product: a slice, a mean,
 * x - 1000; copies of a float32 product, which a comparison with it would
 * find unequal once rounded), rounding its output only where LOW kinds
 * alone read it.
 * A float32-only kind needs float32 inputs and a LOW kind low ones: where
 * they meet, the producer (or the LOW reader) falls back to float32 until
 * every edge agrees. Dtypes only go from low to float32, so this ends. */
static void plan_dtypes(ft_program *p) {
    for (int i = 0; i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        ft_node_precision k = row(p, i)->precision;
        bool output = i == p->output || i == source(p, p->output); /* or what a view of it shows */
        bool low = p->compute != FT_FLOAT32 && !nd->common && /* a computed weight: float32, as the params */
                   (is_input(p, i)               ? nd->dtype == FT_FLOAT32 && read_by_low_only(p, i)
                    : nd->kind == FT_NODE_PARAM ? i <= p->output && read_by_low(p, i)
                                                : i <= p->output && k != FT_NODE_FLOAT32 &&
                                                      (k == FT_NODE_LOW || (!output && !read_by_loss_only(p, i))));
        p->dtype[i] = low ? p->compute : is_input(p, i) || target_of(p, i) >= 0 ? nd->dtype : FT_FLOAT32;
        if (nd->kind == FT_NODE_SLICE || nd->kind == FT_NODE_PERMUTE) { /* token ids or a mask moved about */
            ft_dtype in = p->dtype[source(p, nd->inputs[0])];
            if (in == FT_INT64 || in == FT_BOOL)
                p->dtype[i] = in;
        }
        if (nd->kind == FT_NODE_MATH && (ft_math_is_comparison((ft_math_op)nd->math_op) ||
                                         nd->math_op == FT_MATH_LOGICAL_NOT))
            p->dtype[i] = FT_BOOL; /* a mask */
    }
    for (bool changed = p->compute != FT_FLOAT32; changed;) {
        changed = false;
        for (int i = p->ninputs; i < p->n; i++) {
            ft_node_precision k = row(p, i)->precision;
            if (k == FT_NODE_ANY && !mirrors(p, i) && p->dtype[i] == p->compute && !read_by_low_only(p, i)) {
                bool all_float32 = true; /* of its float inputs */
                for (int j = 0; j < p->nodes[i].ninputs; j++) {
                    ft_dtype d = p->dtype[source(p, p->nodes[i].inputs[j])];
                    all_float32 &= d != p->compute;
                }
                if (all_float32) {
                    p->dtype[i] = FT_FLOAT32;
                    changed = true;
                }
            }
            if (mirrors(p, i) || k == FT_NODE_ANY)
                continue;
            bool wants_low = k == FT_NODE_LOW && p->dtype[i] == p->compute;
            for (int j = 0; j < p->nodes[i].ninputs; j++) {
                int s = source(p, p->nodes[i].inputs[j]);
                if (target_of(p, s) >= 0 || p->dtype[s] == FT_INT64 || p->dtype[s] == FT_BOOL)
                    continue;
                bool low = p->dtype[s] == p->compute;
                if (low && !wants_low) {
                    p->dtype[s] = FT_FLOAT32;
                    changed = true;
                } else if (!low && wants_low) {
                    p->dtype[i] = FT_FLOAT32;
                    changed = true;
                    break;
                }
            }
        }
    }
    for (int i = 0; i < p->n; i++)
        if (mirrors(p, i))
            p->dtype[i] = p->dtype[source(p, i)];
}

/* ratio_pass: each ratio's denominator and the nodes it depends on, which
 * ratio_norms runs (the inputs and the targets are only read) over the
 * whole batch before the step. They must hold no state a second run would move or draw differently
 * (batch norm, dropout, noise), and no gradient may reach the denominator. */
static ft_status plan_ratios(ft_program *p) {
    for (int r = 0; r < p->n; r++) {
        if (!is_ratio(p, r))
            continue;
        int d = p->nodes[r].inputs[1];
        if (p->trains[d])
            return ft_fail(FT_ERR_VALUE, "program: the denominator of a ratio loss (a masked mean's count) depends on "
                                         "a trained parameter; compute it from the targets or the inputs");
        if (!p->ratio_pass && !(p->ratio_pass = calloc((size_t)p->n, sizeof *p->ratio_pass)))
            return ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
        p->ratio_pass[d] = true;
    }
    for (int i = p->n - 1; p->ratio_pass && i >= p->ninputs; i--) {
        if (!p->ratio_pass[i])
            continue;
        ft_node_kind k = p->nodes[i].kind;
        if (k == FT_NODE_DROPOUT || k == FT_NODE_NOISE || k == FT_NODE_BATCHNORM)
            return ft_fail(FT_ERR_VALUE, "program: the denominator of a ratio loss (a masked mean's count) passes "
                                         "through a %s, which a first pass over the batch would run twice",
                           row(p, i)->name);
        for (int k2 = 0; k2 < p->nodes[i].ninputs; k2++)
            p->ratio_pass[p->nodes[i].inputs[k2]] = true;
    }
    return FT_OK;
}

/* Whether node i reads its weight in the low precision: a LOW node that runs
 * in it, or a parameter node that is low. */
static bool reads_low(const ft_program *p, int i) {
    return p->compute != FT_FLOAT32 && p->dtype[i] == p->compute &&
           (row(p, i)->precision == FT_NODE_LOW || p->nodes[i].kind == FT_NODE_PARAM);
}

/* Node i reads the float32 weight w, which is not in the params: where it
 * reads low, through its own copy (see outside). */
static ft_status read_outside(ft_program *p, int i, ft_tensor w) {
    ft_tensor *dst = &p->nodes[i].weight;
    if (!reads_low(p, i)) {
        *dst = w;
        return FT_OK;
    }
    if (!p->outside[i].storage) { /* allocated apart: a failure leaves the node as it was */
        ft_tensor copy;
        FT_TRY(ft_tensor_empty(&copy, w.ndim, w.shape, p->compute, p->device, false));
        *dst = copy;
    }
    p->outside[i] = w;
    return FT_OK;
}

/* Points the weight of every node that reads it low at its copy: in
 * low_params for the params, its own for a weight outside them. */
static ft_status use_low_weights(ft_program *p) {
    if (p->compute == FT_FLOAT32)
        return FT_OK;
    int64_t numel = ft_tensor_numel(&p->params);
    FT_TRY(ft_tensor_empty(&p->low_params, 1, &numel, p->compute, p->device, false));
    size_t low = ft_dtype_get(p->compute)->itemsize;
    for (int i = 0; i < p->n; i++) {
        ft_tensor *w = &p->nodes[i].weight;
        if (!reads_low(p, i) || !w->storage)
            continue;
        if (w->dtype != FT_FLOAT32)
            return ft_fail(FT_ERR_VALUE, "program: node %d's weight is not float32", i);
        if (w->storage != p->params.storage) {
            FT_TRY(read_outside(p, i, *w));
            continue;
        }
        w->storage = p->low_params.storage;
        w->offset = (w->offset - p->params.offset) / 4 * (int64_t)low;
        w->dtype = p->compute;
    }
    p->low_stale = true;
    return FT_OK;
}

/* low_params = the params in the compute dtype, when they may have changed;
 * the weights outside them, always. */
static ft_status refresh_low_weights(ft_program *p) {
    for (int i = 0; i < p->n; i++)
        if (p->outside[i].storage)
            FT_TRY(ft_tensor_copy(&p->nodes[i].weight, &p->outside[i], false));
    if (!p->low_params.storage || !p->low_stale)
        return FT_OK;
    FT_TRY(ft_tensor_copy(&p->low_params, &p->params, false));
    p->low_stale = false;
    return FT_OK;
}

void ft_program_params_changed(ft_program *p) { p->low_stale = true; }

ft_status ft_program_move_weight(ft_program *p, int i, bool bias, const ft_tensor *w) {
    if (i < 0 || i >= p->n)
        return ft_fail(FT_ERR_INDEX, "program: no node %d", i);
    ft_node *nd = &p->nodes[i];
    const ft_tensor *now = bias ? &nd->bias : p->outside[i].storage ? &p->outside[i] : &nd->weight;
    const char *what = bias ? "bias" : "weight";
    if (!now->storage)
        return ft_fail(FT_ERR_VALUE, "program: node %d reads no %s", i, what);
    if (w->dtype != FT_FLOAT32 || w->ndim != now->ndim ||
        memcmp(w->shape, now->shape, (size_t)w->ndim * sizeof *w->shape))
        return ft_fail(FT_ERR_VALUE, "program: node %d's %s moved to a tensor of another shape or dtype", i, what);
    if (!ft_device_eq(ft_op_device(w), p->device))
        return ft_fail(FT_ERR_DEVICE, "program: node %d's %s moved to another device than the program's", i, what);
    if (bias) {
        nd->bias = *w;
        return FT_OK;
    }
    return read_outside(p, i, *w);
}

int ft_program_num_slots(const ft_program *p) { return p->nslots; }
const ft_tensor *ft_program_slot(const ft_program *p, int s) { return &p->slots[s]; }

void ft_program_on_slot_final(ft_program *p, void (*fn)(void *ctx, int slot), void *ctx) {
    p->slot_final = fn, p->slot_final_ctx = ctx;
}

const ft_tensor *ft_program_low_params(const ft_program *p) {
    return p->low_params.storage ? &p->low_params : NULL;
}

ft_dtype ft_program_node_dtype(const ft_program *p, int i) { return p->dtype[i]; }

void ft_program_destroy(ft_program *p) {
    if (!p)
        return;
    if (p->train_arena)
        ft_storage_release(p->train_arena);
    if (p->eval_arena)
        ft_storage_release(p->eval_arena);
    if (p->loss_value.storage)
        ft_tensor_release(&p->loss_value);
    if (p->stats_backup.storage)
        ft_tensor_release(&p->stats_backup);
    if (p->low_params.storage)
        ft_tensor_release(&p->low_params);
    for (int i = 0; p->outside && i < p->n; i++)
        if (p->outside[i].storage)
            ft_tensor_release(&p->nodes[i].weight);
    free(p->outside);
    free(p->dtype);
    free(p->ratio_pass);
    free(p->nodes);
    free(p->last_consumer);
    free(p->read_from);
    free(p->readers);
    free(p->replay_at);
    free(p->replays);
    free(p->train);
    free(p->eval);
    free(p->trains);
    free(p->written);
    free(p->norm);
    free(p->slots);
    free(p->slot_of);
    free(p->slot_written);
    free(p->slot_writers);
    free(p->slot_left);
    free(p->dropout_at);
    free(p->seconds);
    free(p);
}

/* readers and read_from from the nodes' inputs (each an earlier node: validate checked). */
static ft_status index_readers(ft_program *p) {
    int edges = 0;
    for (int j = 0; j < p->n; j++)
        edges += p->nodes[j].ninputs;
    p->read_from = calloc((size_t)p->n + 1, sizeof *p->read_from);
    p->readers = malloc((size_t)(edges ? edges : 1) * sizeof *p->readers);
    int *next = malloc((size_t)p->n * sizeof *next);
    if (!p->read_from || !p->readers || !next) {
        free(next);
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
    }
    for (int j = 0; j < p->n; j++)
        for (int k = 0; k < p->nodes[j].ninputs; k++)
            p->read_from[p->nodes[j].inputs[k] + 1]++;
    for (int i = 0; i < p->n; i++) {
        p->read_from[i + 1] += p->read_from[i];
        next[i] = p->read_from[i];
    }
    for (int j = 0; j < p->n; j++)
        for (int k = 0; k < p->nodes[j].ninputs; k++)
            p->readers[next[p->nodes[j].inputs[k]]++] = j;
    free(next);
    return FT_OK;
}

ft_status ft_program_create(ft_program **out, int nnodes, const ft_node *nodes, int output, int64_t batch,
                            bool channels_last, uint64_t seed, ft_device device, const ft_tensor *params,
                            ft_dtype compute, const ft_recompute *recompute) {
    if (nnodes < 3)
        return ft_fail(FT_ERR_VALUE, "program: a model needs an input, a layer and a loss");
    if (batch < 1)
        return ft_fail(FT_ERR_VALUE, "program: the batch size must be at least 1, got %lld", (long long)batch);
    if (compute != FT_FLOAT32 && compute != FT_BFLOAT16 && compute != FT_FLOAT16)
        return ft_fail(FT_ERR_DTYPE, "program: computes in float32, bfloat16 or float16 (dtype code %d given)",
                       (int)compute);
    if (compute != FT_FLOAT32 && (!params || params->dtype != FT_FLOAT32 || !ft_tensor_is_contiguous(params) ||
                                  params->ndim != 1))
        return ft_fail(FT_ERR_VALUE, "program: mixed precision needs the model's flat float32 parameters");
    ft_program *p = calloc(1, sizeof *p);
    if (!p)
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
    p->n = nnodes;
    p->batch = batch;
    p->channels_last = channels_last;
    p->device = device;
    p->seed = seed;
    p->loss_scale = 1.0f;
    p->compute = compute;
    if (params)
        p->params = *params;
    p->output = output;
    size_t n = (size_t)nnodes;
    p->nodes = malloc(n * sizeof *p->nodes);
    p->last_consumer = malloc(n * sizeof *p->last_consumer);
    p->replay_at = malloc(n * sizeof *p->replay_at);
    p->replays = malloc(n * sizeof *p->replays);
    p->train = malloc(n * NBUF * sizeof *p->train);
    p->eval = malloc(n * NBUF * sizeof *p->eval);
    p->trains = calloc(n, sizeof *p->trains);
    p->written = calloc(n, sizeof *p->written);
    p->norm = calloc(n, sizeof *p->norm);
    p->slots = calloc(2 * n, sizeof *p->slots);
    p->slot_of = calloc(2 * n, sizeof *p->slot_of);
    p->slot_written = calloc(2 * n, sizeof *p->slot_written);
    p->slot_writers = calloc(2 * n, sizeof *p->slot_writers);
    p->slot_left = calloc(2 * n, sizeof *p->slot_left);
    p->dropout_at = calloc(n, sizeof *p->dropout_at);
    p->seconds = calloc(n * 2, sizeof *p->seconds);
    p->dtype = calloc(n, sizeof *p->dtype);
    p->outside = calloc(n, sizeof *p->outside);
    ft_status s = p->nodes && p->last_consumer && p->replay_at && p->replays && p->train && p->eval && p->trains &&
                          p->written && p->norm && p->slots && p->slot_of && p->slot_written && p->slot_writers &&
                          p->slot_left && p->dropout_at && p->seconds && p->dtype && p->outside
                      ? FT_OK
                      : ft_fail(FT_ERR_NOMEM, "out of memory creating a program");
    if (s == FT_OK) {
        memcpy(p->nodes, nodes, n * sizeof *nodes);
        s = validate(p);
    }
    if (s == FT_OK)
        s = index_readers(p);
    if (s == FT_OK) {
        number_slots(p);
        plan_dtypes(p);
        s = plan_ratios(p);
    }
    if (s == FT_OK)
        s = use_low_weights(p);
    if (s == FT_OK)
        s = plan(p, true, recompute, p->train, NULL, &p->train_bytes);
    if (s == FT_OK)
        s = plan(p, false, NULL, p->eval, &p->eval_arena, &p->eval_bytes);
    if (s == FT_OK)
        s = ft_tensor_empty(&p->loss_value, 1, (int64_t[]){1}, FT_FLOAT32, device, false);
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

int ft_program_output_shape(const ft_program *p, int64_t *shape) {
    const ft_node *o = &p->nodes[p->output];
    memcpy(shape, o->shape, (size_t)o->ndim * sizeof *shape);
    return o->ndim;
}

const double *ft_program_seconds(const ft_program *p) { return p->seconds; }

void ft_program_memory(const ft_program *p, int64_t *train_bytes, int64_t *eval_bytes, int64_t *copy_bytes) {
    *train_bytes = p->train_bytes;
    *eval_bytes = p->eval_bytes;
    *copy_bytes = p->low_params.storage
                      ? ft_tensor_numel(&p->low_params) * (int64_t)ft_dtype_get(p->low_params.dtype)->itemsize
                      : 0;
}

void ft_program_node_bytes(const ft_program *p, int i, int64_t bytes[3]) {
    int kinds[3] = {OUT, AUX, DOUT};
    for (int k = 0; k < 3; k++)
        bytes[k] = p->train[i * NBUF + kinds[k]].bytes;
}

bool ft_program_recomputed(const ft_program *p, int i) { return p->replay_at[i] >= 0; }

bool ft_program_sums_loss(const ft_program *p) {
    bool any = false;
    for (int i = p->output + 1; i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        if (!row(p, i)->prepare || nd->reduction == FT_NODE_REDUCE_NONE)
            continue; /* no reduction over the batch */
        if (nd->reduction != FT_NODE_REDUCE_SUM)
            return false;
        any = true;
    }
    return any;
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

ft_status ft_program_undo(ft_program *p) {
    p->dropout_offset = p->step_offset;
    return copy_statistics(p, false);
}

void ft_program_dropout_state(const ft_program *p, uint64_t *seed, uint64_t *offset) {
    *seed = p->seed;
    *offset = p->dropout_offset;
}

void ft_program_set_dropout_state(ft_program *p, uint64_t seed, uint64_t offset) {
    p->seed = seed;
    p->dropout_offset = offset;
}

void ft_program_set_rank(ft_program *p, int rank) { p->rank_key = (uint64_t)rank * 0x9E3779B97F4A7C15ull; }

/* ---- forward ---- */

/* t as the rows of node i see it: a batch of sequences (N, C, L) as images
 * (N, C, 1, L) for the rows that run on images. */
static ft_tensor seen_by(const ft_program *p, int i, ft_tensor t) {
    if (!row(p, i)->images || t.ndim != 3)
        return t;
    t.ndim = 4;
    t.shape[3] = t.shape[2], t.strides[3] = t.strides[2];
    t.shape[2] = 1, t.strides[2] = t.strides[3] * t.shape[3];
    return t;
}

/* t, one row of a common node, in the shape of the weight `like`. */
static ft_tensor as_weight(ft_tensor t, const ft_tensor *like) {
    t.ndim = like->ndim;
    memcpy(t.shape, like->shape, sizeof t.shape);
    ft_contiguous_strides(t.strides, t.ndim, t.shape);
    return t;
}

/* Node i as its rows see it: `own`, a copy whose weight is the value of its
 * weight input, for a node that has one; else the node itself. */
static const ft_node *with_weight(const ft_program *p, bool training, int i, ft_node *own) {
    const ft_node *nd = &p->nodes[i];
    if (!nd->weight_input)
        return nd;
    *own = *nd;
    own->weight = as_weight(node_out(p, training, nd->inputs[nd->weight_input], 1), &nd->weight);
    return own;
}

/* The tensors node i reads and writes in a forward over `rows` samples; its
 * weight input, if it has one, is the weight of `own` (with_weight). */
static ft_node_run run_of(const ft_program *p, bool training, int i, int64_t rows, ft_node *own) {
    const ft_node *nd = &p->nodes[i];
    ft_node_run r = {.nd = with_weight(p, training, i, own), .training = training,
                     .nin = nd->ninputs - (nd->weight_input > 0), .seed = p->seed ^ p->rank_key, .norm = p->norm[i]};
    for (int k = 0; k < r.nin; k++)
        r.in[k] = seen_by(p, i, node_out(p, training, nd->inputs[k], rows));
    r.out = seen_by(p, i, node_out(p, training, i, rows));
    r.aux = node_aux(p, training, i);
    r.mask_offset = p->dropout_at[i];
    return r;
}

/* Node i's forward over `rows` samples, or its replay: a recomputation in
 * the backward, which takes what it drew the first time (a dropout's mask). */
static ft_status forward_node(ft_program *p, bool training, int i, int64_t rows, bool replay) {
    double t0 = omp_get_wtime();
    if (row(p, i)->draws && !replay) { /* each draw takes the next Philox blocks */
        const ft_node *in[FT_NODE_MAX_INPUTS + 1];
        inputs_of(p, i, in);
        p->dropout_at[i] = p->dropout_offset;
        p->dropout_offset += row(p, i)->draws(&p->nodes[i], in, rows_for(p, i, rows), training);
    }
    ft_node own;
    ft_node_run r = run_of(p, training, i, rows, &own);
    r.replay = replay;
    FT_TRY(row(p, i)->forward(&r));
    p->seconds[2 * i] += omp_get_wtime() - t0;
    return FT_OK;
}

/* Forward of nodes [from, to] over the micro-batch in p->x, p->y. */
static ft_status forward(ft_program *p, bool training, int64_t rows, int from, int to) {
    for (int i = from; i <= to; i++)
        if (!is_view(p, i, training) && row(p, i)->forward)
            FT_TRY(forward_node(p, training, i, rows, false));
    return FT_OK;
}

/* FT_ERR_SHAPE or FT_ERR_DTYPE unless t is a batch (B, ...) of node i's samples. */
static ft_status check_batch(const ft_program *p, int i, const char *arg, const ft_tensor *t, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    int64_t want[FT_MAX_DIMS] = {rows};
    memcpy(want + 1, nd->shape, (size_t)nd->ndim * sizeof *want);
    /* floating inputs of any width convert to the input buffer's dtype as they are copied (input_on_device) */
    bool float_input = is_input(p, i) && ft_dtype_is_float(nd->dtype);
    if (t->dtype != nd->dtype && !(float_input && ft_dtype_is_float(t->dtype)))
        return ft_fail(FT_ERR_DTYPE, "program: %s must be %s, got %s", arg,
                       float_input ? "floating (float32, bfloat16, float16 or float64)" : ft_dtype_get(nd->dtype)->name,
                       ft_dtype_get(t->dtype)->name);
    if (ft_check_shape("program", arg, t, nd->ndim + 1, want) == FT_OK)
        return FT_OK;
    if (t->ndim == nd->ndim + 1 && t->shape[0] != rows &&
        !memcmp(t->shape + 1, nd->shape, (size_t)nd->ndim * sizeof *nd->shape)) /* samples of the right shape */
        return ft_fail(FT_ERR_SHAPE, "program: the batch has %lld input samples and %lld %s (one each)",
                       (long long)rows, (long long)t->shape[0], arg);
    char sample[160], have[160]; /* of any batch size: what a sample is */
    return ft_fail(FT_ERR_SHAPE, "program: %s should be a batch of samples of shape %s, got %s",
                   arg, ft_shape_str(sample, sizeof sample, nd->ndim, nd->shape),
                   ft_shape_str(have, sizeof have, t->ndim, t->shape));
}

/* The checks of the batch's inputs x (ninputs tensors): shapes, dtypes, and one batch size, of at least one sample
 * unless empty_ok. */
static ft_status check_input(const ft_program *p, const ft_tensor *x, bool empty_ok) {
    for (int j = 0; j < p->ninputs; j++) {
        char arg[24] = "input";
        if (p->ninputs > 1)
            snprintf(arg, sizeof arg, "input %d", j);
        if (x[j].ndim < 1)
            return ft_fail(FT_ERR_SHAPE, "program: the %s must be a batch (N, ...) of samples, got a 0-d tensor", arg);
        if (x[j].shape[0] < 1 && !empty_ok)
            return ft_fail(FT_ERR_SHAPE, "program: the batch is empty");
        if (x[j].shape[0] != x[0].shape[0])
            return ft_fail(FT_ERR_SHAPE, "program: input %d has %lld samples, input 0 %lld", j,
                           (long long)x[j].shape[0], (long long)x[0].shape[0]);
        const ft_node *in = &p->nodes[j];
        if (x[j].ndim == 4 && in->ndim == 3 && x[j].shape[1] != in->shape[0] && x[j].shape[3] == in->shape[0] &&
            x[j].shape[1] == in->shape[1] && x[j].shape[2] == in->shape[2])
            return ft_fail(FT_ERR_SHAPE, "program: the batch's images are (N, H, W, C), channels last; the model "
                                         "takes (N, C, H, W): give x.transpose(0, 3, 1, 2)");
        if (x[j].ndim == 4 && in->ndim == 3 && x[j].shape[1] != in->shape[0]) /* grayscale JPEGs decode as RGB */
            return ft_fail(FT_ERR_SHAPE, "program: the batch's images have %lld channels, the model takes %lld (a "
                                         "fasttrain Loader decodes to what channels=%lld asks for)",
                           (long long)x[j].shape[1], (long long)in->shape[0], (long long)in->shape[0]);
        FT_TRY(check_batch(p, j, arg, &x[j], x[0].shape[0]));
    }
    return FT_OK;
}

/* A batch tensor of `dtype` where the program runs: t itself, or a copy in
 * t's layout. With `queued`, a copy from page-locked memory returns before
 * it is done: for callers that wait for the device (reading a loss) before
 * they return, and with it the caller's hold on t. The caller releases *out. */
static ft_status on_device(const ft_program *p, const ft_tensor *t, ft_dtype dtype, bool queued, ft_tensor *out) {
    if (ft_device_eq(ft_op_device(t), p->device) && t->dtype == dtype) {
        ft_tensor_share(out, t);
        return FT_OK;
    }
    return ft_tensor_to(out, t, dtype, p->device, false, queued, true);
}

/* Input j of a batch, x, where the program runs, as on_device, in its node's
 * dtype (converted as it is copied) and in the program's layout: images
 * copied to channels-last when the program is and to NCHW when it is not,
 * since oneDNN convolves mixed layouts with its slow reference kernels (and
 * other bits), and token ids contiguous, as an embedding reads them (slices
 * of a token stream are strided). */
static ft_status input_on_device(const ft_program *p, int j, const ft_tensor *x, bool queued, ft_tensor *out) {
    if (x->dtype == FT_INT64 && !ft_tensor_is_contiguous(x))
        return ft_tensor_to(out, x, x->dtype, p->device, false, false, false);
    ft_dtype dtype = p->dtype[j];
    bool nhwc = x->ndim == 4 && x->strides[1] == 1 && x->strides[3] == x->shape[1] &&
                x->strides[2] == x->shape[3] * x->shape[1];
    if (x->ndim != 4 || x->shape[1] == 1 || nhwc == p->channels_last)
        return on_device(p, x, dtype, queued, out);
    if (!p->channels_last) /* a channels-last batch into an NCHW program */
        return ft_tensor_to(out, x, dtype, p->device, false, queued, false);
    ft_tensor dev, nhwc_t;
    FT_TRY(on_device(p, x, x->dtype, false, &dev));
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    ft_status s = ft_tensor_empty(&nhwc_t, 4, (int64_t[]){N, H, W, C}, dtype, p->device, false);
    if (s == FT_OK) {
        nhwc_t.shape[1] = C, nhwc_t.shape[2] = H, nhwc_t.shape[3] = W;
        int64_t strides[4] = {H * W * C, 1, W * C, C};
        memcpy(nhwc_t.strides, strides, sizeof strides);
        s = ft_tensor_copy(&nhwc_t, &dev, false);
        if (s == FT_OK)
            *out = nhwc_t;
        else
            ft_tensor_release(&nhwc_t);
    }
    ft_tensor_release(&dev);
    return s;
}

static void release_inputs(const ft_program *p, ft_tensor *xd) {
    for (int j = 0; j < p->ninputs; j++)
        if (xd[j].storage)
            ft_tensor_release(&xd[j]);
}

/* Each input of the batch x where the program runs (input_on_device) into
 * xd (zeroed); the caller releases them (release_inputs), after a failure too. */
static ft_status inputs_on_device(const ft_program *p, const ft_tensor *x, bool queued, ft_tensor *xd) {
    for (int j = 0; j < p->ninputs; j++)
        FT_TRY(input_on_device(p, j, &x[j], queued, &xd[j]));
    return FT_OK;
}

/* The micro-batch of rows r0 .. r0 + rows of x and y (NULL: no targets) into p->x and p->y. */
static void take_rows(ft_program *p, const ft_tensor *x, const ft_tensor *y, int64_t r0, int64_t rows) {
    for (int j = 0; j < p->ninputs; j++)
        p->x[j] = ft_rows_of(&x[j], r0, rows);
    for (int k = 0; y && k < p->ntargets; k++)
        p->y[k] = ft_rows_of(&y[k], r0, rows);
}

/* Whether a normalizer of node i that is not positive makes the batch count
 * for nothing (weightless) rather than fail: in evaluation, of the final
 * loss (a batch of padding only). */
static bool weightless(ft_program *p, bool training, int i) {
    if (training || i != p->n - 1 || p->norm[i] != 0)
        return false;
    p->norm[i] = 1;
    p->weightless = true;
    return true;
}

/* Adds the batch of B samples and its loss to the tally's loss and weight:
 * a mean's loss weighs what it averages over, a sum's (ft_program_sums_loss)
 * adds as it is, and a loss of several terms weighs its samples (see
 * ft_tally). */
static void tally_loss(const ft_program *p, int64_t B, double loss, ft_tally *tally) {
    const ft_node *nd = &p->nodes[p->n - 1];
    bool mean = row(p, p->n - 1)->prepare && (nd->reduction == FT_NODE_REDUCE_MEAN ||
                                              nd->reduction == FT_NODE_REDUCE_BATCHMEAN ||
                                              nd->reduction == FT_NODE_REDUCE_RATIO);
    double w = p->weightless ? 0 : mean ? p->norm[p->n - 1] : (double)B;
    tally->loss += w ? loss * (ft_program_sums_loss(p) ? 1 : w) : 0;
    tally->weight += w;
}

/* The batch's targets checked (shape, dtype, and by each loss node its
 * values) and each loss node's normalizer for the batch. dev (one per
 * target) gets them where the program runs (nothing when the loss reads no
 * targets; the caller releases them, after a failure too); *host, when not
 * NULL, the first's contiguous copy on the CPU that the checks read (for
 * counting correct predictions; the caller releases it). Targets
 * (N,) for a target of per-sample shape (1,) are read as the column
 * (N, 1): one regression target per sample, as a user's y usually is
 * (PyTorch would broadcast (N, 1) against (N,) to an (N, N) loss). */
static ft_status prepare_targets(ft_program *p, const ft_tensor *y, int64_t rows, bool training, ft_tensor *dev,
                                 ft_tensor *host_out) {
    memset(dev, 0, FT_PROGRAM_MAX_TARGETS * sizeof *dev);
    p->weightless = false;
    if (p->ntargets && !y)
        return ft_fail(FT_ERR_VALUE, "program: the loss reads targets: give them");
    /* host: each target contiguous on the CPU, which the loss nodes' prepare reads */
    ft_tensor column[FT_PROGRAM_MAX_TARGETS], host[FT_PROGRAM_MAX_TARGETS] = {{0}};
    ft_status s = FT_OK;
    for (int k = 0; s == FT_OK && k < p->ntargets; k++) { /* none: a loss of the outputs alone ignores any y */
        const ft_node *t = &p->nodes[p->targets[k]];
        column[k] = y[k]; /* a view for this call: y's storage outlives it */
        if (y[k].ndim == 1 && t->ndim == 1 && t->shape[0] == 1) {
            column[k].ndim = 2;
            column[k].shape[1] = 1;
            column[k].strides[1] = 1;
        }
        s = check_batch(p, p->targets[k], t->dtype == FT_INT64 ? "labels" : "targets", &column[k], rows);
        if (s == FT_OK)
            s = ft_tensor_on_host(&host[k], &column[k], column[k].dtype);
    }
    for (int i = 0; s == FT_OK && i < p->n; i++) {
        if (!row(p, i)->prepare)
            continue;
        const ft_node *in[FT_NODE_MAX_INPUTS + 1];
        inputs_of(p, i, in);
        const ft_tensor *direct = NULL; /* the targets it reads directly, if any */
        for (int j = 0; j < p->nodes[i].ninputs && !direct; j++) {
            int k = target_of(p, p->nodes[i].inputs[j]);
            direct = k >= 0 ? &host[k] : NULL;
        }
        s = row(p, i)->prepare(&p->nodes[i], in, direct, rows, &p->norm[i]);
        if (s == FT_OK && !(p->norm[i] > 0) && !weightless(p, training, i))
            s = ft_fail(FT_ERR_VALUE, "program: every target of the batch is ignored: its mean loss is undefined");
    }
    for (int k = 0; s == FT_OK && k < p->ntargets; k++)
        s = on_device(p, &column[k], column[k].dtype, true, &dev[k]);
    for (int k = 0; k < p->ntargets; k++)
        if (s == FT_OK && host_out && k == 0)
            *host_out = host[0];
        else if (host[k].storage)
            ft_tensor_release(&host[k]);
    return s;
}

/* The value of a (1,) float32 tensor on any device (waits for a CUDA one). */
static ft_status scalar_value(const ft_tensor *t, double *v) {
    float f;
    ft_tensor host;
    FT_TRY(ft_tensor_borrow(&host, &f, 1, (int64_t[]){1}, (int64_t[]){1}, FT_FLOAT32, FT_CPU, false,
                            ft_storage_unowned, NULL));
    ft_status s = ft_tensor_copy(&host, t, false);
    ft_tensor_release(&host);
    *v = f;
    return s;
}

/* The micro-batch's share of the loss: the sum of the last node's values
 * (each sample's share of the batch's loss), added to *loss. */
static ft_status add_loss(ft_program *p, bool training, int64_t rows, double *loss) {
    ft_tensor values = node_out(p, training, p->n - 1, rows);
    values.ndim = 2;
    values.shape[1] = 1;
    values.strides[1] = 1;
    double v;
    FT_TRY(ft_bias_grad(&p->loss_value, &values, false));
    FT_TRY(scalar_value(&p->loss_value, &v));
    *loss += v;
    return FT_OK;
}

/* ---- backward ---- */

/* The label the class loss reading the targets ignores (INT64_MIN, which
 * no batch holds, when none does). */
static int64_t ignored_label(const ft_program *p) {
    for (int i = 0; i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        if ((nd->kind == FT_NODE_CROSS_ENTROPY || nd->kind == FT_NODE_NLL) && nd->inputs[1] == p->targets[0])
            return nd->ignore_index;
    }
    return INT64_MIN;
}

/* Adds to the tally the labels of the micro-batch that the loss does not
 * ignore and those whose argmax output (of the training or the evaluation
 * forward just run) is the label (y on the host), through `scores`
 * (batch, classes) on the CPU. */
static ft_status count_correct(ft_program *p, bool training, int64_t rows, const ft_tensor *y,
                               const ft_tensor *scores, ft_tally *tally) {
    int64_t classes = p->nodes[p->output].shape[0], ignored = ignored_label(p);
    ft_tensor out = node_out(p, training, p->output, rows), s = ft_rows_of(scores, 0, rows);
    FT_TRY(ft_tensor_copy(&s, &out, false));
    const float *l = (const float *)ft_tensor_data(&s);
    for (int64_t r = 0; r < rows; r++) {
        int64_t best = 0, label;
        for (int64_t c = 1; c < classes; c++)
            if (l[r * classes + c] > l[r * classes + best])
                best = c;
        memcpy(&label, (const char *)ft_tensor_data(y) + r * y->strides[0] * 8, 8);
        tally->labelled += label != ignored;
        tally->correct += label != ignored && best == label;
    }
    return FT_OK;
}

/* Whether evaluate counts correct predictions: a (classes,) output and class targets, the only ones. */
static bool classifies(const ft_program *p) {
    return p->ntargets == 1 && p->nodes[p->targets[0]].dtype == FT_INT64 && p->nodes[p->targets[0]].ndim == 0 &&
           p->nodes[p->output].ndim == 1;
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

static ft_status backward_node(ft_program *p, int i, int64_t rows) {
    const ft_node *nd = &p->nodes[i];
    if (!p->written[i] || shares_grad(p, i))
        return FT_OK; /* no gradient reaches it, or a view sharing its input's gradient */
    ft_node own;
    ft_node_run r = run_of(p, true, i, rows, &own);
    r.dout = seen_by(p, i, node_dout(p, i, rows));
    ft_tensor din[FT_NODE_MAX_INPUTS];
    bool any = false;
    for (int k = 0; k < nd->ninputs; k++) {
        int owner = grad_owner(p, nd->inputs[k]);
        if (!p->trains[owner])
            continue; /* the batch, the targets, a constant or a frozen branch: no gradient wanted */
        bool weight = nd->weight_input && k == nd->weight_input;
        din[k] = weight ? as_weight(node_dout(p, nd->inputs[k], 1), &nd->weight)
                        : seen_by(p, i, node_dout(p, nd->inputs[k], rows));
        bool acc = p->written[owner];
        p->written[owner] = true; /* an input read twice adds its second share */
        any = true;
        if (weight) {
            r.dweight = &din[k], r.dweight_acc = acc;
        } else {
            r.din[k] = &din[k], r.din_acc[k] = acc;
        }
    }
    if (!nd->weight_input)
        r.dweight = param_grad(p, i, 0, &r.dweight_acc);
    r.dbias = param_grad(p, i, 1, &r.dbias_acc);
    if (!any && !r.dweight && !r.dbias)
        return FT_OK;
    double t0 = omp_get_wtime();
    ft_status s = row(p, i)->backward(&r);
    p->seconds[2 * i + 1] += omp_get_wtime() - t0;
    return s;
}

/* Node i's backward in the last micro-batch has run: a slot it writes that
 * no node still to run writes is final, unless no gradient reached it (then
 * it is zeroed after the backward). */
static void slots_done(ft_program *p, int i) {
    for (int j = 0; j < 2; j++) {
        int s = p->slot_of[2 * i + j];
        if (s >= 0 && --p->slot_left[s] == 0 && p->slot_written[s])
            p->slot_final(p->slot_final_ctx, s);
    }
}

/* Each ratio's normalizer, the batch's sum of its denominator's values:
 * ratio_pass's nodes run over every micro-batch of x and y (where the
 * program runs) first, so that every micro-batch's loss divides by the
 * whole batch's count, as the batch's loss does. */
static ft_status ratio_norms(ft_program *p, bool training, const ft_tensor *x, const ft_tensor *y, int64_t B) {
    if (!p->ratio_pass)
        return FT_OK;
    for (int r = 0; r < p->n; r++)
        if (is_ratio(p, r))
            p->norm[r] = 0;
    for (int64_t r0 = 0; r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        take_rows(p, x, y, r0, rows);
        for (int i = 0; i < p->n; i++) { /* from the inputs: a denominator may be one */
            if (!p->ratio_pass[i])
                continue;
            if (!is_view(p, i, training) && row(p, i)->forward)
                FT_TRY(forward_node(p, training, i, rows, false));
            for (int r = i + 1; r < p->n; r++) { /* read now: later nodes of the pass may reuse its memory */
                if (!is_ratio(p, r) || p->nodes[r].inputs[1] != i)
                    continue;
                ft_tensor values = node_out(p, training, i, rows), host;
                FT_TRY(ft_tensor_on_host(&host, &values, FT_FLOAT32));
                const float *v = (const float *)ft_tensor_data(&host);
                for (int64_t k = 0; k < ft_tensor_numel(&host); k++)
                    p->norm[r] += v[k];
                ft_tensor_release(&host);
            }
        }
    }
    for (int r = 0; r < p->n; r++) {
        if (!is_ratio(p, r))
            continue;
        const ft_node *nd = &p->nodes[r];
        p->norm[r] = fmax(p->norm[r] + nd->count_offset, nd->count_floor);
        if (!(p->norm[r] > 0) && !weightless(p, training, r))
            return ft_fail(FT_ERR_VALUE, "program: the denominator of a ratio loss (a masked mean's count) is %g for "
                                         "this batch, not positive: a mean over no positions is undefined (guard "
                                         "it: mask.sum().clamp(min=1)); nothing was changed",
                           p->norm[r]);
    }
    return FT_OK;
}

/* The steps of ft_program_backward over x and y where the program runs;
 * with yh (the labels on the host) the correct predictions are counted
 * through `scores` into the tally. */
static ft_status backward_batches(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool accumulate,
                                  double *loss, const ft_tensor *yh, const ft_tensor *scores, ft_tally *tally) {
    int64_t B = x->shape[0];
    int last = p->n - 1;
    p->step_offset = p->dropout_offset;
    FT_TRY(copy_statistics(p, true)); /* first: a failure is undone (ft_program_undo) from this backup */
    FT_TRY(ratio_norms(p, true, x, y, B));
    memset(p->slot_written, accumulate, (size_t)p->nslots * sizeof *p->slot_written);
    for (int64_t r0 = 0; r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        take_rows(p, x, y, r0, rows);
        p->in_backward = false;
        FT_TRY(forward(p, true, rows, p->ninputs, p->output));
        if (yh) { /* the output is read here, before the loss's nodes may reuse its memory */
            ft_tensor ym = ft_rows_of(yh, r0, rows);
            FT_TRY(count_correct(p, true, rows, &ym, scores, tally));
        }
        FT_TRY(forward(p, true, rows, p->output + 1, last));
        FT_TRY(add_loss(p, true, rows, loss));
        if (!isfinite(*loss)) /* the caller refuses or skips this step: leave no trace of it */
            return ft_program_undo(p);
        if (!p->trains[last])
            continue; /* nothing trains */
        memset(p->written, 0, (size_t)p->n * sizeof *p->written);
        ft_tensor seed = node_dout(p, last, rows); /* d(batch loss) / d(each sample's share) */
        FT_TRY(ft_tensor_fill(&seed, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = p->loss_scale}));
        p->written[last] = true;
        p->in_backward = true;
        bool tell = p->slot_final && r0 + rows >= B;
        if (tell)
            memcpy(p->slot_left, p->slot_writers, (size_t)p->nslots * sizeof *p->slot_left);
        for (int i = last, next = 0; !is_input(p, i); i--) {
            for (; next < p->nreplays && p->replay_at[p->replays[next]] == i; next++)
                FT_TRY(forward_node(p, true, p->replays[next], rows, true));
            FT_TRY(backward_node(p, i, rows));
            if (tell)
                slots_done(p, i);
        }
    }
    /* A parameter no gradient reached (its branch unused) gets zero, not the last step's. */
    for (int s = 0; s < p->nslots; s++)
        if (!p->slot_written[s])
            FT_TRY(ft_tensor_zero(&p->slots[s]));
    return FT_OK;
}

/* (batch, classes) float32 on the CPU, where count_correct puts the scores. */
static ft_status scores_buffer(const ft_program *p, ft_tensor *out) {
    return ft_tensor_empty(out, 2, (int64_t[]){p->batch, p->nodes[p->output].shape[0]}, FT_FLOAT32, FT_CPU, false);
}

ft_status ft_program_set_loss_scale(ft_program *p, float scale) {
    if (!(scale > 0.0f && isfinite(scale)))
        return ft_fail(FT_ERR_VALUE, "program: the loss scale must be finite and positive, got %g", (double)scale);
    p->loss_scale = scale;
    return FT_OK;
}

/* The ids an embedding reads from an input, which its forward would
 * refuse only once the step runs (each input read on the host once). */
static ft_status check_ids(const ft_program *p, const ft_tensor *x) {
    ft_tensor ids[FT_PROGRAM_MAX_INPUTS] = {0};
    ft_status s = FT_OK;
    for (int i = 0; s == FT_OK && i < p->n; i++) {
        const ft_node *nd = &p->nodes[i];
        int j = nd->inputs[0];
        if (nd->kind != FT_NODE_EMBEDDING || !is_input(p, j))
            continue;
        if (!ids[j].storage)
            s = ft_tensor_on_host(&ids[j], &x[j], FT_INT64);
        if (s == FT_OK)
            s = ft_embedding_check_ids(&ids[j], nd->weight.shape[0]);
    }
    release_inputs(p, ids);
    return s;
}

/* Releases the targets prepare_targets put where the program runs. */
static void release_targets(ft_tensor *dev) {
    for (int k = 0; k < FT_PROGRAM_MAX_TARGETS; k++)
        if (dev[k].storage)
            ft_tensor_release(&dev[k]);
}

ft_status ft_program_check_batch(ft_program *p, const ft_tensor *x, const ft_tensor *y) {
    FT_TRY(check_input(p, x, false));
    ft_tensor yd[FT_PROGRAM_MAX_TARGETS];
    ft_status s = prepare_targets(p, y, x->shape[0], true, yd, NULL);
    release_targets(yd);
    return s == FT_OK ? check_ids(p, x) : s;
}

int ft_program_num_inputs(const ft_program *p) { return p->ninputs; }

int ft_program_num_targets(const ft_program *p) { return p->ntargets; }

ft_status ft_program_backward(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool accumulate, double *loss,
                              ft_tally *tally) {
    FT_TRY(check_input(p, x, false));
    if (x->shape[0] > p->batch) /* an id refused in a later micro-batch would leave the earlier ones' gradients */
        FT_TRY(check_ids(p, x));
    FT_TRY(refresh_low_weights(p));
    if (!p->train_arena)
        FT_TRY(ft_storage_new(&p->train_arena, (size_t)p->train_bytes, p->device, false));
    ft_tensor yd[FT_PROGRAM_MAX_TARGETS], xd[FT_PROGRAM_MAX_INPUTS] = {0}, yh = {0}, scores = {0};
    bool count = tally && classifies(p);
    ft_tally batch = {0};
    ft_status s = prepare_targets(p, y, x->shape[0], true, yd, count ? &yh : NULL);
    if (s == FT_OK)
        s = inputs_on_device(p, x, true, xd);
    if (s == FT_OK && count)
        s = scores_buffer(p, &scores);
    if (s == FT_OK) {
        *loss = 0;
        s = backward_batches(p, xd, p->ntargets ? yd : NULL, accumulate, loss, count ? &yh : NULL, &scores,
                             &batch);
        if (s != FT_OK) /* an op refused the batch midway (an embedding id out of range): leave no trace */
            ft_program_undo(p);
    }
    if (s == FT_OK && tally) {
        tally_loss(p, x->shape[0], *loss, tally);
        tally->correct += batch.correct;
        tally->labelled += batch.labelled;
    }
    release_inputs(p, xd);
    release_targets(yd);
    ft_tensor *held[2] = {&yh, &scores};
    for (int k = 0; k < 2; k++)
        if (held[k]->storage)
            ft_tensor_release(held[k]);
    return s;
}

ft_status ft_program_forward(ft_program *p, const ft_tensor *x, const ft_tensor *out) {
    FT_TRY(check_input(p, x, true));
    int64_t B = x->shape[0];
    const ft_node *o = &p->nodes[p->output];
    int64_t want[FT_MAX_DIMS] = {B};
    memcpy(want + 1, o->shape, (size_t)o->ndim * sizeof *want);
    FT_TRY(ft_check_float("program", "out", out, false));
    FT_TRY(ft_check_shape("program", "out", out, o->ndim + 1, want));
    FT_TRY(ft_check_output("program", "out", out));
    if (B == 0) /* nothing to compute, as a PyTorch forward of an empty batch */
        return FT_OK;
    FT_TRY(refresh_low_weights(p));
    ft_tensor xd[FT_PROGRAM_MAX_INPUTS] = {0};
    ft_status s = inputs_on_device(p, x, false, xd);
    for (int64_t r0 = 0; s == FT_OK && r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        ft_tensor om = ft_rows_of(out, r0, rows);
        take_rows(p, xd, NULL, r0, rows);
        s = forward(p, false, rows, p->ninputs, p->output);
        if (s == FT_OK) {
            ft_tensor o = node_out(p, false, p->output, rows);
            s = ft_tensor_copy(&om, &o, false);
        }
    }
    release_inputs(p, xd);
    return s;
}

/* The model's output for the micro-batch p->x averaged with that of its
 * horizontal mirror, left in the output node (`other`: space for one
 * output, where the program runs). */
static ft_status flip_average(ft_program *p, int64_t rows, const ft_tensor *other) {
    const ft_tensor x = p->x[0];
    if (x.ndim != 4 || p->ninputs > 1)
        return ft_fail(FT_ERR_VALUE, "program: test-time flipping needs one input, of images");
    ft_tensor out = node_out(p, false, p->output, rows), kept = ft_rows_of(other, 0, rows);
    FT_TRY(ft_tensor_copy(&kept, &out, false));
    ft_tensor mirror = x, flipped;
    mirror.offset += (x.shape[3] - 1) * x.strides[3] * (int64_t)ft_dtype_get(x.dtype)->itemsize;
    mirror.strides[3] = -x.strides[3];
    FT_TRY(ft_tensor_empty(&flipped, 4, x.shape, x.dtype, p->device, false));
    ft_status s = ft_tensor_copy(&flipped, &mirror, false);
    p->x[0] = flipped;
    if (s == FT_OK)
        s = forward(p, false, rows, 1, p->output);
    p->x[0] = x;
    ft_tensor_release(&flipped);
    if (s == FT_OK)
        s = ft_add_forward(&out, &out, &kept, (ft_act){FT_ACT_NONE, 0});
    if (s == FT_OK) {
        ft_tensor half = p->loss_value; /* 0.5, broadcast by zero strides */
        s = ft_tensor_fill(&half, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0.5f});
        half.ndim = out.ndim;
        memcpy(half.shape, out.shape, sizeof half.shape);
        memset(half.strides, 0, sizeof half.strides);
        if (s == FT_OK)
            s = ft_mul_forward(&out, &out, &half);
    }
    return s;
}

/* ft_program_evaluate over x and y where the program runs (yh: y on the
 * host), with `other` (batch, output) where the program runs and `scores`
 * (batch, classes) on the CPU. */
static ft_status evaluate_batches(ft_program *p, const ft_tensor *x, const ft_tensor *y, const ft_tensor *yh,
                                  bool tta_flip, ft_tally *tally, const ft_tensor *other, const ft_tensor *scores) {
    int64_t B = x->shape[0];
    double loss = 0;
    FT_TRY(ratio_norms(p, false, x, y, B));
    for (int64_t r0 = 0; r0 < B; r0 += p->batch) {
        int64_t rows = B - r0 < p->batch ? B - r0 : p->batch;
        take_rows(p, x, y, r0, rows);
        FT_TRY(forward(p, false, rows, p->ninputs, p->output));
        if (tta_flip)
            FT_TRY(flip_average(p, rows, other));
        if (classifies(p)) { /* the output is read here, before the loss's nodes may reuse its memory */
            ft_tensor ym = ft_rows_of(yh, r0, rows);
            FT_TRY(count_correct(p, false, rows, &ym, scores, tally));
        }
        FT_TRY(forward(p, false, rows, p->output + 1, p->n - 1));
        FT_TRY(add_loss(p, false, rows, &loss));
    }
    tally_loss(p, B, loss, tally);
    return FT_OK;
}

ft_status ft_program_evaluate(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool tta_flip, ft_tally *tally) {
    FT_TRY(check_input(p, x, false));
    FT_TRY(refresh_low_weights(p));
    ft_tensor yd[FT_PROGRAM_MAX_TARGETS], yh = {0}, xd[FT_PROGRAM_MAX_INPUTS] = {0}, other = {0}, scores = {0};
    ft_status s = prepare_targets(p, y, x->shape[0], false, yd, classifies(p) ? &yh : NULL);
    if (s == FT_OK)
        s = inputs_on_device(p, x, true, xd);
    const ft_node *o = &p->nodes[p->output];
    int64_t shape[FT_MAX_DIMS] = {p->batch};
    memcpy(shape + 1, o->shape, (size_t)o->ndim * sizeof *shape);
    if (s == FT_OK && tta_flip)
        s = ft_tensor_empty(&other, o->ndim + 1, shape, FT_FLOAT32, p->device, false);
    if (s == FT_OK && classifies(p))
        s = scores_buffer(p, &scores);
    if (s == FT_OK)
        s = evaluate_batches(p, xd, p->ntargets ? yd : NULL, &yh, tta_flip, tally, &other, &scores);
    release_inputs(p, xd);
    release_targets(yd);
    ft_tensor *held[3] = {&yh, &other, &scores};
    for (int k = 0; k < 3; k++)
        if (held[k]->storage)
            ft_tensor_release(held[k]);
    return s;
}
