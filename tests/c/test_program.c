/* The compiled training program run from C alone (so that ASan and UBSan
 * watch its arenas, aliases and micro-batches): a small CNN with a residual
 * add, batch norm + ReLU, pooling, flatten and a linear layer.
 *
 * Checked: two backward passes of one batch are bitwise equal; a batch
 * split into micro-batches loses no part of the gradient; a step against
 * the gradient lowers the loss; bad labels and inputs are refused before
 * anything changes; outputs recomputed in the backward give the gradients
 * and statistics of kept ones in a smaller arena; eval-mode forward over
 * more samples than planned. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"
#include "nn/program.h"

enum { C0 = 2, C1 = 4, HW = 6, CLASSES = 3, N = 8 };

typedef struct {
    ft_tensor params, grads, rm, rv;
    ft_tensor w1, dw1, w2, dw2, g, dg, b, db, lw, dlw, lb, dlb;
} net;

/* A view of `numel` elements at `*at` of the flat buffer `flat`. */
static ft_tensor slice(const ft_tensor *flat, int64_t *at, int ndim, const int64_t *shape) {
    ft_tensor t = *flat;
    t.ndim = ndim;
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    ft_contiguous_strides(t.strides, ndim, shape);
    t.offset = *at * 4;
    *at += ft_tensor_numel(&t);
    return t;
}

static void make_net(net *m) {
    int64_t total = C1 * C0 * 9 + C1 * C1 * 9 + 2 * C1 + CLASSES * C1 + CLASSES;
    CHECK_OK(ft_tensor_empty(&m->params, 1, &total, FT_FLOAT32, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&m->grads, 1, &total, FT_FLOAT32, FT_CPU, false));
    ft_rng_state rng = {7, 0};
    CHECK_OK(ft_rng_uniform(&m->params, &rng, -0.4, 0.4));
    CHECK_OK(ft_tensor_fill(&m->grads, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0}));
    int64_t at = 0, at_g = 0;
    int64_t s1[4] = {C1, C0, 3, 3}, s2[4] = {C1, C1, 3, 3}, sc[1] = {C1}, sl[2] = {CLASSES, C1}, sb[1] = {CLASSES};
    m->w1 = slice(&m->params, &at, 4, s1), m->dw1 = slice(&m->grads, &at_g, 4, s1);
    m->w2 = slice(&m->params, &at, 4, s2), m->dw2 = slice(&m->grads, &at_g, 4, s2);
    m->g = slice(&m->params, &at, 1, sc), m->dg = slice(&m->grads, &at_g, 1, sc);
    m->b = slice(&m->params, &at, 1, sc), m->db = slice(&m->grads, &at_g, 1, sc);
    m->lw = slice(&m->params, &at, 2, sl), m->dlw = slice(&m->grads, &at_g, 2, sl);
    m->lb = slice(&m->params, &at, 1, sb), m->dlb = slice(&m->grads, &at_g, 1, sb);
    CHECK_OK(ft_tensor_empty(&m->rm, 1, sc, FT_FLOAT32, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&m->rv, 1, sc, FT_FLOAT32, FT_CPU, false));
    CHECK_OK(ft_tensor_fill(&m->rm, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0}));
    CHECK_OK(ft_tensor_fill(&m->rv, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 1}));
}

static ft_status make_program(ft_program **out, const net *m, int64_t batch, const ft_recompute *recompute) {
    ft_node nodes[11];
    memset(nodes, 0, sizeof nodes);
    ft_conv2d_params conv = {{1, 1}, {1, 1}, {1, 1}, 1};
    nodes[0] = (ft_node){.kind = FT_NODE_INPUT, .ndim = 3, .shape = {C0, HW, HW}, .dtype = FT_FLOAT32};
    nodes[1] = (ft_node){.kind = FT_NODE_CONV2D, .ninputs = 1, .inputs = {0}, .ndim = 3, .shape = {C1, HW, HW},
                         .weight = m->w1, .dweight = m->dw1, .conv = conv};
    nodes[2] = (ft_node){.kind = FT_NODE_BATCHNORM, .ninputs = 1, .inputs = {1}, .ndim = 3, .shape = {C1, HW, HW},
                         .weight = m->g, .dweight = m->dg, .bias = m->b, .dbias = m->db, .running_mean = m->rm,
                         .running_var = m->rv, .act = {FT_ACT_RELU, 0},
                         .bn = {.training = true, .eps = 1e-5, .momentum = 0.1}};
    nodes[3] = (ft_node){.kind = FT_NODE_CONV2D, .ninputs = 1, .inputs = {2}, .ndim = 3, .shape = {C1, HW, HW},
                         .weight = m->w2, .dweight = m->dw2, .conv = conv};
    nodes[4] = (ft_node){.kind = FT_NODE_ADD, .ninputs = 2, .inputs = {3, 2}, .ndim = 3, .shape = {C1, HW, HW},
                         .act = {FT_ACT_RELU, 0}};
    nodes[5] = (ft_node){.kind = FT_NODE_MAXPOOL, .ninputs = 1, .inputs = {4}, .ndim = 3, .shape = {C1, HW / 2, HW / 2},
                         .pool = {.kernel = {2, 2}, .stride = {2, 2}, .dilation = {1, 1}}};
    nodes[6] = (ft_node){.kind = FT_NODE_ADAPTIVE_AVGPOOL, .ninputs = 1, .inputs = {5}, .ndim = 3, .shape = {C1, 1, 1}};
    nodes[7] = (ft_node){.kind = FT_NODE_RESHAPE, .ninputs = 1, .inputs = {6}, .ndim = 1, .shape = {C1}};
    nodes[8] = (ft_node){.kind = FT_NODE_LINEAR, .ninputs = 1, .inputs = {7}, .ndim = 1, .shape = {CLASSES},
                         .weight = m->lw, .dweight = m->dlw, .bias = m->lb, .dbias = m->dlb};
    nodes[9] = (ft_node){.kind = FT_NODE_TARGET, .dtype = FT_INT64};
    nodes[10] = (ft_node){.kind = FT_NODE_CROSS_ENTROPY, .ninputs = 2, .inputs = {8, 9}, .label_smoothing = 0.1,
                          .ignore_index = -100, .reduction = FT_NODE_REDUCE_MEAN};
    return ft_program_create(out, 11, nodes, 8, batch, true, 1, FT_CPU, NULL, FT_FLOAT32, recompute);
}

static void copy_floats(float *dst, const ft_tensor *t) { memcpy(dst, ft_tensor_data(t), (size_t)ft_tensor_numel(t) * 4); }

int main(void) {
    net m;
    make_net(&m);
    int64_t xs[4] = {N, C0, HW, HW}, ys[1] = {N};
    ft_tensor x, y;
    CHECK_OK(ft_tensor_empty(&x, 4, xs, FT_FLOAT32, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&y, 1, ys, FT_INT64, FT_CPU, false));
    ft_rng_state rng = {3, 0};
    CHECK_OK(ft_rng_normal(&x, &rng, 0, 1));
    CHECK_OK(ft_rng_randint(&y, &rng, 0, CLASSES));
    int64_t P = ft_tensor_numel(&m.grads);
    float whole[256], again[256], stats[2 * C1];
    CHECK(P <= 256);

    ft_program *full = NULL, *half = NULL;
    CHECK_OK(make_program(&full, &m, N, NULL));
    CHECK_OK(make_program(&half, &m, N / 2, NULL));
    double loss_full = 0, loss_half = 0, loss_again = 0;
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_full, NULL));
    copy_floats(whole, &m.grads);
    ft_tally tally = {0}, again_tally = {0};
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_again, &tally));
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_again, &again_tally));
    /* training-mode argmax, counted in the step; the mean loss weighs the batch's samples */
    CHECK(tally.correct >= 0 && tally.correct <= N && tally.correct == again_tally.correct && tally.labelled == N);
    CHECK(tally.weight == N && tally.loss == loss_again * N);
    copy_floats(again, &m.grads);
    CHECK(loss_again == loss_full && memcmp(whole, again, (size_t)P * 4) == 0);
    CHECK(isfinite(loss_full) && loss_full > 0);
    /* Accumulating: a second batch's gradient added to the first's. */
    CHECK_OK(ft_program_backward(full, &x, &y, true, &loss_again, NULL));
    copy_floats(again, &m.grads);
    for (int k = 0; k < P; k++)
        CHECKF(again[k] == 2 * whole[k], "gradient %d: %g, twice %g", k, again[k], whole[k]);
    /* A loss scale of 4 (a power of two) multiplies every gradient by it exactly; a scale that is not finite
     * and positive is refused and changes nothing. */
    CHECK_OK(ft_program_set_loss_scale(full, 4.0f));
    CHECK_STATUS(ft_program_set_loss_scale(full, 0.0f), FT_ERR_VALUE);
    CHECK_STATUS(ft_program_set_loss_scale(full, NAN), FT_ERR_VALUE);
    CHECK_STATUS(ft_program_set_loss_scale(full, INFINITY), FT_ERR_VALUE);
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_again, NULL));
    copy_floats(again, &m.grads);
    CHECK(loss_again == loss_full);
    for (int k = 0; k < P; k++)
        CHECKF(again[k] == 4 * whole[k], "gradient %d: %g, four times %g", k, again[k], whole[k]);
    CHECK_OK(ft_program_set_loss_scale(full, 1.0f));

    /* Micro-batches: batch norm normalises each half by its own statistics,
     * so the gradients agree only roughly; the loss of the halves' mean is
     * close too. What must hold exactly is that no part is lost: the linear
     * bias gradient (the sum of the logits' gradients) is a plain sum. */
    CHECK_OK(ft_program_backward(half, &x, &y, false, &loss_half, NULL));
    CHECK(fabs(loss_half - loss_full) < 0.5);
    const float *dlb = (const float *)ft_tensor_data(&m.dlb);
    double sum = 0;
    for (int c = 0; c < CLASSES; c++)
        sum += dlb[c];
    CHECK(fabs(sum) < 1e-5); /* softmax gradients sum to zero per sample */

    /* A small step against the gradient lowers the loss. */
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_full, NULL));
    copy_floats(whole, &m.grads);
    float *w = (float *)ft_tensor_data(&m.params);
    for (int64_t k = 0; k < P; k++)
        w[k] -= 0.05f * whole[k];
    double loss_after = 0;
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_after, NULL));
    CHECKF(loss_after < loss_full, "loss %g -> %g", loss_full, loss_after);

    /* Bad labels: refused before the running statistics change. */
    copy_floats(stats, &m.rm);
    ((int64_t *)ft_tensor_data(&y))[3] = CLASSES;
    CHECK_STATUS(ft_program_backward(full, &x, &y, false, &loss_full, NULL), FT_ERR_INDEX);
    float now[C1];
    copy_floats(now, &m.rm);
    CHECK(memcmp(now, stats, sizeof now) == 0);
    ((int64_t *)ft_tensor_data(&y))[3] = -100; /* ignore_index is allowed */
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_full, NULL));

    /* Wrong input shape and dtype. */
    ft_tensor bad = x;
    bad.shape[2] = HW + 1;
    CHECK_STATUS(ft_program_backward(full, &bad, &y, false, &loss_full, NULL), FT_ERR_SHAPE);
    bad = x;
    bad.dtype = FT_INT32;
    CHECK_STATUS(ft_program_backward(full, &bad, &y, false, &loss_full, NULL), FT_ERR_DTYPE);

    /* Recomputation: the convolutions, the batch norm and the add as one
     * segment (the add's output, read by the pooling, is kept), and the
     * planner's choice; each backward from the same running statistics. */
    int segment[11] = {-1, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1};
    ft_recompute recomputes[2] = {{.segment = segment}, {.automatic = true, .budget = -1}};
    float rv0[C1], grads_kept[256], stats_kept[2 * C1], stats_now[2 * C1];
    copy_floats(stats, &m.rm);
    copy_floats(rv0, &m.rv);
    CHECK_OK(ft_program_backward(full, &x, &y, false, &loss_full, NULL));
    copy_floats(grads_kept, &m.grads);
    copy_floats(stats_kept, &m.rm);
    copy_floats(stats_kept + C1, &m.rv);
    int64_t kept_bytes, eval_bytes, copy_bytes;
    ft_program_memory(full, &kept_bytes, &eval_bytes, &copy_bytes);
    for (int r = 0; r < 2; r++) {
        ft_program *re = NULL;
        CHECK_OK(make_program(&re, &m, N, &recomputes[r]));
        int recomputed = 0;
        for (int i = 0; i < 11; i++)
            recomputed += ft_program_recomputed(re, i);
        /* The segment: the first conv's and the batch norm's outputs; not the
         * second conv's, which no backward reads (the add passes its gradient
         * through), so it is not kept anyway. The planner's sqrt segments
         * would not shrink this net's arena, whose peak is in the backward:
         * it keeps everything. */
        int64_t re_bytes;
        ft_program_memory(re, &re_bytes, &eval_bytes, &copy_bytes);
        if (r == 0)
            CHECKF(recomputed == 2 && ft_program_recomputed(re, 1) && ft_program_recomputed(re, 2) &&
                       re_bytes <= kept_bytes,
                   "segment: %d outputs, arena %lld, kept %lld", recomputed, (long long)re_bytes,
                   (long long)kept_bytes);
        else
            CHECKF(recomputed == 0 && re_bytes == kept_bytes, "automatic: %d outputs, arena %lld, kept %lld",
                   recomputed, (long long)re_bytes, (long long)kept_bytes);
        memcpy(ft_tensor_data(&m.rm), stats, sizeof stats[0] * C1);
        memcpy(ft_tensor_data(&m.rv), rv0, sizeof rv0);
        CHECK_OK(ft_program_backward(re, &x, &y, false, &loss_again, NULL));
        copy_floats(again, &m.grads);
        copy_floats(stats_now, &m.rm);
        copy_floats(stats_now + C1, &m.rv);
        CHECKF(loss_again == loss_full && memcmp(again, grads_kept, (size_t)P * 4) == 0 &&
                   memcmp(stats_now, stats_kept, sizeof stats_now) == 0,
               "recompute %d: loss %g, kept %g", r, loss_again, loss_full);
        ft_program_destroy(re);
    }
    ft_recompute tiny = {.automatic = true, .budget = 64};
    ft_program *none = NULL;
    CHECK_STATUS(make_program(&none, &m, N, &tiny), FT_ERR_VALUE);
    CHECK(none == NULL && strstr(ft_last_error(), "below the least training arena"));

    /* Eval-mode forward with batches larger than the plan. */
    int64_t os[2] = {N, CLASSES};
    ft_tensor out;
    CHECK_OK(ft_tensor_empty(&out, 2, os, FT_FLOAT32, FT_CPU, false));
    CHECK_OK(ft_program_forward(half, &x, &out));
    const float *o = (const float *)ft_tensor_data(&out);
    for (int k = 0; k < N * CLASSES; k++)
        CHECKF(isfinite(o[k]), "logit %d", k);

    ft_program_destroy(full);
    ft_program_destroy(half);
    ft_tensor_release(&out);
    ft_tensor_release(&x);
    ft_tensor_release(&y);
    ft_tensor_release(&m.params);
    ft_tensor_release(&m.grads);
    ft_tensor_release(&m.rm);
    ft_tensor_release(&m.rv);
    return check_main_result("test_program");
}
