/* A node kind is a row of ft_node_kinds: what the program needs to plan it
 * (inputs, saved data, whether it is a view of its input) and to run it
 * (forward, backward). The program (nn/program.c) plans memory and walks the
 * node list; it prepares every tensor a row reads or writes, so a row only
 * calls its ops. Adding a kind is adding a row in nn/nodes.c and its name in
 * FT_NODE_KIND_LIST.
 *
 * Legend: N the rows of the (micro-)batch, (...) a node's per-sample shape. */
#ifndef FT_NN_NODE_H
#define FT_NN_NODE_H

#include "nn/program.h"

/* Rows [r0, r0 + rows) of t, samples first: a view. */
static inline ft_tensor ft_rows_of(const ft_tensor *t, int64_t r0, int64_t rows) {
    ft_tensor v = *t;
    v.shape[0] = rows;
    v.offset += r0 * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    return v;
}

/* Everything one forward or backward of one node reads and writes. */
typedef struct {
    const ft_node *nd;
    bool training; /* the training step: batch statistics, dropout, saved data */
    /* A forward run again in the backward (recomputation): the same values
     * and saved data as the step's first, but no state moves twice (batch
     * norm's running statistics and count). */
    bool replay;
    int nin;
    ft_tensor in[FT_NODE_MAX_INPUTS]; /* (N, ...) the inputs' outputs */
    ft_tensor out;                    /* (N, ...) */
    ft_tensor aux;                    /* (aux_bytes) uint8: what the node saves for its backward */
    /* backward */
    ft_tensor dout;                           /* (N, ...) the gradient of out; the row may overwrite it */
    const ft_tensor *din[FT_NODE_MAX_INPUTS]; /* the inputs' gradients, NULL where none is wanted */
    bool din_acc[FT_NODE_MAX_INPUTS];         /* the gradient rule for each: add (true) or write */
    const ft_tensor *dweight, *dbias;         /* NULL for a frozen or absent parameter */
    bool dweight_acc, dbias_acc;
    /* dropout: the Philox key, and where this node's mask starts */
    uint64_t seed, mask_offset; /* where the node's draws start in the program's Philox stream */
    double norm; /* losses: the batch's normalizer of this node's values (ft_node_reduction) */
} ft_node_run;

/* The dtype a kind runs in when the program computes in a low precision
 * (bfloat16): see the program's dtype plan (nn/program.c). */
typedef enum {
    FT_NODE_FLOAT32, /* float32 inputs and output only */
    FT_NODE_ANY,     /* any float inputs and output, computed in float: conversions happen as it runs */
    FT_NODE_LOW,     /* inputs, weights and output in the low precision, accumulating in float32 */
} ft_node_precision;

/* Where a kind's (C, H, W) output puts its elements in a channels-last
 * program. */
typedef enum {
    FT_LAYOUT_PROGRAM,  /* channels innermost */
    FT_LAYOUT_IN_ORDER, /* in the order of its shape: a reshape's values keep their order, a parameter's gradient
                           its weight's, and rows of classes or of an embedding are written whole */
    FT_LAYOUT_INPUT,    /* its input's: norms that read and write one layout take the one they are given */
    FT_LAYOUT_OF_IMAGES, /* in order when its input is an image, else the program's: a reshape keeps an image's
                            values in their order, and lays out others (a linear layer's, viewed as maps) as the
                            convolutions after it read them */
} ft_node_layout;

typedef struct {
    const char *name;
    int min_inputs, max_inputs;
    /* Runs on images (C, H, W): sequences (C, L) are presented to it as
     * (C, 1, L) images, and other ranks are refused (`images` 2), or passed
     * as they are (1: batch norm also takes (C,) features). */
    int images;
    /* The node's own fields and shape against its inputs' (NULL: none to
     * check; the ops check the rest when they run). */
    ft_status (*check)(const ft_node *nd, const ft_node *const *in);
    /* Bytes saved for the backward by a forward over `rows` samples whose
     * output is of `dtype` (the program's plan for the node). */
    int64_t (*aux_bytes)(const ft_node *nd, const ft_node *const *in, int64_t rows, ft_dtype dtype);
    /* Whether the output is the (first) input's memory seen anew, with no
     * op run; `in` is that input's node. NULL: never. */
    bool (*is_view)(const ft_node *nd, const ft_node *in, bool channels_last, bool training);
    ft_status (*forward)(const ft_node_run *r);
    ft_status (*backward)(const ft_node_run *r);
    /* Losses, and nodes reading the targets: checks the whole batch's
     * targets (B, ...) on the host (y; NULL when the node does not read
     * them) and gives the normalizer of a loss's reduction for a batch of B
     * samples (1 for a node that is not a loss). NULL: none to check. */
    ft_status (*prepare)(const ft_node *nd, const ft_node *const *in, const ft_tensor *y, int64_t batch,
                         double *norm);
    ft_node_precision precision;
    /* Whether the backward reads the inputs' values, and its own output's:
     * a buffer that no backward reads need not live until then (an
     * InPlace-ABN's input, a max pool's, the output of a conv without a
     * fused activation). NULL: it does. */
    bool (*reads_inputs)(const ft_node *nd);
    bool (*reads_output)(const ft_node *nd);
    /* The Philox blocks a forward over `rows` samples draws (dropout's mask,
     * noise), in the training step or not: each forward takes the next ones
     * from the program's stream, and a replay the same again. NULL: it
     * draws none. */
    uint64_t (*draws)(const ft_node *nd, const ft_node *const *in, int64_t rows, bool training);
    /* How its (C, H, W) output is laid out in a channels-last program. */
    ft_node_layout layout;
} ft_node_kind_info;

extern const ft_node_kind_info ft_node_kinds[FT_NODE_NKINDS];

/* The element count of a per-sample shape. */
int64_t ft_node_numel(const ft_node *nd);

#endif
