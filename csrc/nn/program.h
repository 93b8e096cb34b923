/* A model compiled to a C program: the node list in topological order, the
 * activation memory planned by liveness, and the whole training step
 * (forward, loss, backward, optimizer update) as one call.
 *
 * Legend: N the batch (micro-batch) size; per-sample shapes have up to
 * FT_NODE_MAX_DIMS dimensions: (C, H, W) for images, (F,) for features,
 * (T, C) for sequences. Images live in channels-last memory
 * (NHWC strides under an (N, C, H, W) shape) or NCHW, as compiled.
 *
 * Gradients follow the ops' rule (ops/gradient.h): the first contribution to
 * a buffer in a step is written, later ones (another reader of the same
 * tensor, a tied weight, the next micro-batch) are added, so nothing is
 * zeroed or staged. */
#ifndef FT_NN_PROGRAM_H
#define FT_NN_PROGRAM_H

#include "core/tensor.h"
#include "kernels/activation.h"
#include "ops/batchnorm.h"
#include "ops/conv2d.h"
#include "ops/pool.h"
#include "ops/upsample.h"

#define FT_NODE_MAX_INPUTS 8
#define FT_PROGRAM_MAX_INPUTS 8  /* of a batch: the model's forward(x1, x2, ...) */
#define FT_PROGRAM_MAX_TARGETS 8 /* of a batch: a multi-task loss's (labels, boxes, ...) */
#define FT_NODE_MAX_DIMS (FT_MAX_DIMS - 1) /* per sample */

/* The kinds of node, each a row of ft_node_kinds (nn/node.h) that also
 * names it; the Python side reads names and numbers from the extension. */
typedef enum {
    FT_NODE_INPUT,
    FT_NODE_CONV2D,
    FT_NODE_LINEAR,
    FT_NODE_BATCHNORM,
    FT_NODE_ACT,
    FT_NODE_MAXPOOL,
    FT_NODE_AVGPOOL,
    FT_NODE_ADAPTIVE_AVGPOOL,
    FT_NODE_ADAPTIVE_MAXPOOL,
    FT_NODE_ADD,
    FT_NODE_CAT,     /* the inputs one after the other along per-sample dimension dim */
    FT_NODE_RESHAPE, /* the per-sample elements in the order (C, H, W) lists them, in a new shape */
    FT_NODE_DROPOUT,
    FT_NODE_IDENTITY,
    FT_NODE_LAYERNORM, /* over the trailing norm_dims dimensions of the per-sample shape */
    FT_NODE_MUL,       /* a * b, one shape */
    FT_NODE_SCALE,     /* x * scale */
    FT_NODE_PERMUTE,   /* the per-sample dimensions in the order perm lists them */
    FT_NODE_SLICE,     /* elements start, start + step, ... of per-sample dimension slice_dim */
    FT_NODE_PARAM,     /* a parameter (weight) as a value, the same for every sample */
    FT_NODE_TARGET,    /* the batch's targets (labels), a second input */
    FT_NODE_CROSS_ENTROPY, /* of logits (C,) and a class target (): each sample's loss, () */
    FT_NODE_NLL,       /* of log-probabilities (C,) and a class target (): each sample's loss, () */
    FT_NODE_SUM,       /* of every per-sample value: (), the batch's reduction of an elementwise loss; with the
                          ratio reduction over a second input's batch sum */
    FT_NODE_SOFTMAX,     /* along per-sample dimension dim */
    FT_NODE_LOG_SOFTMAX, /* along per-sample dimension dim */
    FT_NODE_GROUPNORM,   /* over groups of channels, (C, ...) samples */
    FT_NODE_EMBEDDING,   /* the weight's rows of int64 ids (...): (..., D) */
    FT_NODE_UPSAMPLE,    /* nearest, by integer factors: images (C, H, W) or sequences (C, L) */
    FT_NODE_MATMUL,      /* a (M, K) @ b (K, P) -> (M, P) per sample (a parameter node's b is every sample's) */
    FT_NODE_ATTENTION,   /* scaled dot-product attention of `groups` heads: queries (Tq, E), keys and values
                            (Tk, E) as three inputs, or one packed (T, 3E) projection, then optionally a bool
                            (Tk,) key mask (true: masked out); out (Tq, E) */
    FT_NODE_EXPAND,      /* the input repeated along the dimensions where it has size 1 and the node not */
    FT_NODE_SUM_DIMS,    /* scale * the sum over the dimensions where the node has size 1 and its input not */
    FT_NODE_ONE_HOT,     /* int64 class targets as rows of an identity: (d...) -> (d..., C) */
    FT_NODE_DETACH,      /* its input's values, through which no gradient passes (PyTorch's detach) */
    FT_NODE_UPSAMPLE_BILINEAR, /* to the node's size: images (C, H, W), or (C, L) sequences linearly */
    FT_NODE_NOISE,       /* N(0, 1), or U[0, 1) with `uniform`, drawn afresh each step, in its input's shape */
    FT_NODE_CONV_TRANSPOSE2D, /* the adjoint of conv2d with the node's conv params: images, or (C, L) sequences */
    FT_NODE_MATH,        /* math_op (ops/math.h) of the input and scale, or of its two inputs: a bool mask, or a
                            mask as floats; no gradient */
    FT_NODE_LSTM_CELL,   /* an LSTM step's cell state (H,) from its gates (4H,) and the last cell state, if any */
    FT_NODE_LSTM_HIDDEN, /* an LSTM step's output (H,) from its gates (4H,) and its cell state */
    FT_NODE_LSTM,        /* a whole LSTM layer (ops/rnn.h) with weight W_hh and bias b_hh: the input projections
                            (T, 4H), then optionally h0 and c0 (H,); out (T, 2H), each step's h then c */
    FT_NODE_GRU,         /* a whole GRU layer (ops/rnn.h) with weight W_hh and bias b_hh: the input projections
                            (T, 3H), then optionally h0 (H,); out (T, H), each step's h */
    FT_NODE_MASKED_FILL, /* the first input where the bool mask (the second input, of the node's sizes or 1; or the
                            weight, one bool mask for every sample) is false, scale where it holds; no gradient to
                            the mask */
    FT_NODE_NKINDS
} ft_node_kind;

/* A loss node's value for a sample is its loss divided by the batch's
 * normalizer, so that the losses of all samples (of every micro-batch) sum
 * to the batch's loss. */
typedef enum {
    FT_NODE_REDUCE_NONE,      /* 1: per-sample losses (a user's loss reduces them later) */
    FT_NODE_REDUCE_MEAN,      /* the batch size times the values per sample; for cross-entropy and nll the sum
                                 of the class weights of the samples not ignored, as PyTorch */
    FT_NODE_REDUCE_SUM,       /* 1 */
    FT_NODE_REDUCE_BATCHMEAN, /* the batch size */
    FT_NODE_REDUCE_RATIO,     /* sum: the batch's sum of the values of its second input (a masked mean's count),
                                 which no trained parameter, dropout or batch norm may reach */
} ft_node_reduction;

typedef struct {
    ft_node_kind kind;
    int ninputs;
    int inputs[FT_NODE_MAX_INPUTS]; /* indices of earlier nodes */
    int ndim;
    int64_t shape[FT_NODE_MAX_DIMS]; /* per sample */
    /* Parameters and their gradients: views into the model's flat buffers
     * (storage NULL when absent, and a gradient absent for a frozen
     * parameter). Every gradient shares one storage. */
    ft_tensor weight, bias, dweight, dbias, running_mean, running_var;
    ft_tensor num_batches; /* batch norm: () int64, counts training forwards as PyTorch's num_batches_tracked */
    ft_act act; /* fused into conv2d, linear, batchnorm and add; the op of FT_NODE_ACT */
    ft_conv2d_params conv;
    ft_batchnorm_params bn;
    ft_pool2d_params pool;
    double dropout_p;
    bool dropout_channels; /* Dropout1d/2d: a channel's elements are kept or dropped together */
    int norm_dims; /* layer norm */
    double eps;    /* layer norm */
    double scale;
    int perm[FT_NODE_MAX_DIMS];
    int slice_dim;
    int dim; /* softmax, log-softmax, cat; cross-entropy: the classes' (0, or the last: read in place) */
    int64_t groups;      /* group norm: the groups; attention: the heads */
    bool causal;         /* attention: query i sees keys j <= i */
    bool score_bias;     /* attention: its last input (H, Tq, Tk) is added to the scaled scores */
    bool reverse;        /* lstm, gru: the steps from the last to the first */
    int64_t padding_idx; /* embedding: a row that gets no gradient, or -1 */
    int64_t factor[2];   /* upsample: along H and W (along L: factor[1]) */
    ft_bilinear2d_params lerp; /* bilinear upsample */
    bool uniform;              /* noise */
    int math_op;               /* an ft_math_op */
    int64_t slice_start, slice_step;
    ft_dtype dtype;          /* the input's and the targets' */
    ft_node_reduction reduction; /* losses: how a sample's value is normalized over the batch */
    double label_smoothing;  /* cross-entropy */
    double count_offset, count_floor; /* ratio: the normalizer is max(the count + count_offset, count_floor) */
    int64_t ignore_index;    /* cross-entropy, nll */
    double flops;            /* of one sample's forward (a multiply-add counts two): what recomputing it costs */
    /* A value of the parameters and constants alone (w - w.mean(), a
     * weight's norm): computed once per micro-batch, as one row, from other
     * common nodes (or a parameter node marked so), and read by common
     * nodes, by an expand that repeats it over the samples, or as a layer's
     * weight. */
    bool common;
    /* conv2d, conv_transpose2d, linear: the input (the last, never 0)
     * whose value, a common node of the weight's shape, is the weight, its
     * gradient that input's; 0: the weight parameter. */
    int weight_input;
} ft_node;

/* Activation recomputation (gradient checkpointing): outputs a training
 * step does not keep from its forward for the backward, but computes again
 * from the kept ones just before the backward needs them. Either given by
 * segments, sets of nodes such as a module's (the outputs of a segment that
 * only nodes of the same segment read are recomputed; what other nodes
 * read is kept), or chosen by the planner (`automatic`): within `budget`
 * bytes of training arena at the least recomputation it finds, or with no
 * budget (-1) in about sqrt(N) segments of the model's N nodes. The model's
 * output and the loss are always kept. */
typedef struct {
    const int *segment; /* (nnodes) each node's segment, -1 for none; NULL when automatic */
    bool automatic;
    int64_t budget;
} ft_recompute;

typedef struct ft_program ft_program;

/* Plans the program for micro-batches of up to `batch` samples on
 * `device`, where every parameter must be and where its activations, and
 * every op of its steps, will be. The first nodes are the inputs (up to
 * FT_PROGRAM_MAX_INPUTS, and no input node after them); `output` is the
 * model's output (what forward and evaluate return, (classes,) per sample);
 * the last node is the loss, () per sample, computed from the output and
 * the targets (FT_NODE_TARGET nodes, up to FT_PROGRAM_MAX_TARGETS, after
 * `output`); the nodes after `output` are the loss's own. Batches may come from any device (a CUDA program copies CPU
 * batches over, without waiting when they are in page-locked memory). The
 * nodes are copied; their parameter views must outlive the program.
 *
 * `compute` FT_FLOAT32 runs every node in float32. FT_BFLOAT16 (or
 * FT_FLOAT16) is mixed precision: the model's nodes whose kinds can run in
 * it store their outputs and gradients in it, and convolutions and linear
 * layers multiply its copy of the weights, accumulating in float32; the
 * loss, normalization statistics and every parameter gradient stay float32.
 * `params` is then the model's flat float32 parameter buffer (every weight
 * a view into it), of which the program keeps that copy, and the batches
 * may come in the compute dtype too.
 *
 * `recompute` (NULL: none) trades compute for the training arena: see
 * ft_recompute. A budget below the least arena the planner can reach is
 * FT_ERR_VALUE, saying that least. */
ft_status ft_program_create(ft_program **out, int nnodes, const ft_node *nodes, int output, int64_t batch,
                            bool channels_last, uint64_t seed, ft_device device, const ft_tensor *params,
                            ft_dtype compute, const ft_recompute *recompute);
void ft_program_destroy(ft_program *p);

/* The program's copy of the params in the compute dtype (NULL in
 * float32): an optimizer that updates the params writes it as it goes
 * (ft_optimizer_set_copies), so the next step needs no conversion. */
const ft_tensor *ft_program_low_params(const ft_program *p);

/* Tells the program that the params were written by anything but an
 * optimizer writing its copy: its next step, forward or evaluation converts
 * them again. */
void ft_program_params_changed(ft_program *p);

/* Node i reads its weight (bias) from w from now on, a float32 tensor of the
 * same shape on the program's device: the parameter moved (another program's
 * compile took it into its flat buffer). A weight outside the params that the
 * node reads in the low precision is converted before every run. */
ft_status ft_program_move_weight(ft_program *p, int i, bool bias, const ft_tensor *w);

/* The gradient slots: the distinct views of the flat gradient buffer that
 * the backward writes (a tied weight's once). */
int ft_program_num_slots(const ft_program *p);
const ft_tensor *ft_program_slot(const ft_program *p, int s);

/* fn(ctx, s) is called within ft_program_backward, in its last micro-batch,
 * as soon as slot s holds its final value for the step (host order: a CUDA
 * program's ops may still be queued); a slot no gradient reaches is not
 * told. fn NULL: none. */
void ft_program_on_slot_final(ft_program *p, void (*fn)(void *ctx, int slot), void *ctx);

/* The dtype of node i's output and gradient (float32, or the compute dtype
 * where it runs in it). */
ft_dtype ft_program_node_dtype(const ft_program *p, int i);

/* The checks ft_program_backward makes of a batch before anything runs
 * (its shape and dtype, the targets' and their values), and the range of
 * the ids an embedding reads from the input, which the forward meets only
 * once it runs; nothing else: for ranks that agree on a batch before any of
 * them communicates. */
ft_status ft_program_check_batch(ft_program *p, const ft_tensor *x, const ft_tensor *y);

/* How many input nodes the program has. Every function taking a batch x
 * takes that many tensors at x, one (B, ...) batch for each input node in
 * node order, all of B samples. */
int ft_program_num_inputs(const ft_program *p);

/* How many target nodes the program has. Every function taking targets y
 * takes that many tensors at y (NULL when there are none), one (B, ...)
 * batch for each target node in node order. */
int ft_program_num_targets(const ft_program *p);

/* What a batch's loss and accuracy add to sums over batches, whose
 * quotients loss / weight and correct / labelled are the means over all of
 * them (as over one batch of them all; a loss summed over the batch adds
 * its sums, whose total is the one batch's). */
typedef struct {
    double loss;      /* the batch's loss times its weight; a sum's (reduction 'sum') as it is */
    double weight;    /* what the loss averages over: the final loss node's normalizer when it is a mean (the
                         class weights of the targets not ignored, a masked mean's count, the elements), else the
                         samples */
    int64_t correct;  /* a program that classifies ((classes,) outputs, class targets): the argmax predictions
                         equal to their label */
    int64_t labelled; /* the labels the class loss does not ignore */
} ft_tally;

/* Forward and backward of one batch x (B, ...) with targets y (B, ...) of
 * the target nodes' shapes and dtypes (NULL when the loss reads none; (B,)
 * for a target of per-sample shape (1,) is read as (B, 1)), split
 * into micro-batches of the planned size: parameter gradients are written
 * for the first and added for the others, so they hold the gradient of the
 * batch's loss; with `accumulate` they are added to from the first (the
 * gradients of several batches summed, as PyTorch's backward). *loss gets
 * the loss. Inputs and targets are checked before anything runs (and, for
 * a batch of several micro-batches, the ids an embedding reads from an
 * input): a bad batch changes nothing. A non-finite loss stops the step: the batch-norm running
 * statistics are put back as they were and *loss tells the caller. With
 * `tally` (may be NULL) the batch's is added to *tally (the training loss
 * and accuracy from the step's own forward). */
ft_status ft_program_backward(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool accumulate, double *loss,
                              ft_tally *tally);

/* What the backward starts from in place of 1, d(loss)/d(loss): loss
 * scaling, whose gradients come out multiplied by it. 1 until set;
 * FT_ERR_VALUE (and no change) unless finite and positive. */
ft_status ft_program_set_loss_scale(ft_program *p, float scale);

/* Puts back what the last ft_program_backward moved but the gradients: the
 * batch-norm running statistics (and batch counts) and the dropout stream,
 * for a step the caller drops. */
ft_status ft_program_undo(ft_program *p);

/* The Philox key and offset of the next dropout mask (checkpoints save them). */
void ft_program_dropout_state(const ft_program *p, uint64_t *seed, uint64_t *offset);
void ft_program_set_dropout_state(ft_program *p, uint64_t seed, uint64_t offset);

/* A distributed program's rank: its masks and noise are drawn under a key of
 * its own, mixed from the seed (which every rank and a checkpoint share) and
 * the rank, so that the ranks' rows do not all get the same masks. */
void ft_program_set_rank(ft_program *p, int rank);

/* Eval-mode forward (batch statistics off, dropout off, no activations
 * kept) of the model's nodes: out (B, ...) = the model's output; an empty
 * batch (B = 0) of the right per-sample shape computes nothing. */
ft_status ft_program_forward(ft_program *p, const ft_tensor *x, const ft_tensor *out);

/* Eval-mode loss and accuracy of one batch, added to *tally. A batch
 * whose every target the final loss ignores (padding only) adds nothing,
 * where a training step refuses it. With tta_flip the output is the
 * average of the images' and of their horizontal mirrors' (test-time
 * augmentation) before the loss reads it. */
ft_status ft_program_evaluate(ft_program *p, const ft_tensor *x, const ft_tensor *y, bool tta_flip, ft_tally *tally);

/* The model output's per-sample shape into shape; returns its rank. */
int ft_program_output_shape(const ft_program *p, int64_t *shape);

/* (n, 2): the seconds each node has spent in forward and in backward since
 * the program was created (a profile of where a step's time goes). */
const double *ft_program_seconds(const ft_program *p);

/* Bytes of the training and evaluation arenas and of the low-precision
 * copy of the params (0 in float32), for summary() and memory_plan(). */
void ft_program_memory(const ft_program *p, int64_t *train_bytes, int64_t *eval_bytes, int64_t *copy_bytes);

/* Bytes node i keeps in the training arena: its output (kept for its
 * backward), what it saves for its backward, and its output's gradient (0
 * for a view, which shares its input's). */
void ft_program_node_bytes(const ft_program *p, int i, int64_t bytes[3]);

/* Whether node i's output is recomputed in the backward instead of kept
 * (its bytes above are then held twice, briefly: in the forward until its
 * last reader, and from its recomputation until its backward). */
bool ft_program_recomputed(const ft_program *p, int i);

/* Whether the loss sums over the batch: every reduction of the loss's nodes
 * is a sum (reduction 'sum', scaled or added to others of its kind), so that
 * a tally of batches adds their losses as they are (see ft_tally). */
bool ft_program_sums_loss(const ft_program *p);

#endif
