/* The LSTM cell's pointwise ops over column views of the gates: a gate is
 * the (N, H) view of its columns, so each op is one strided pointwise loop
 * (ops/pointwise.h). The cell's backward runs as two loops (f with c_prev,
 * then i with g): one would need more operands than a loop takes. Then a
 * whole layer over its steps (ft_lstm_forward / backward): on a GPU step by
 * step through these ops, on the CPU through one loop over a step's rows.
 * A whole GRU layer the same way, on the CPU (a GPU program unrolls its
 * steps into ops).
 *
 * The formulas are kernels/lstm.h's, which cuda/pointwise.cu uses too, so
 * that both devices compute the same bits. */
#include "ops/rnn.h"

#include <omp.h>
#include <string.h>

#include "kernels/convert.h"
#include "kernels/lstm.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/pointwise.h"

ft_tensor ft_lstm_gates(const ft_tensor *gates, int k0, int k1) {
    ft_tensor v = *gates;
    int64_t H = gates->shape[1] / 4;
    v.shape[1] = (k1 - k0) * H;
    v.offset += k0 * H * gates->strides[1] * (int64_t)ft_dtype_get(gates->dtype)->itemsize;
    return v;
}

static ft_tensor gate(const ft_tensor *gates, int k) { return ft_lstm_gates(gates, k, k + 1); }

/* gates (N, 4H) and the (N, H) tensors on its device; outputs writable and apart from the inputs. */
static ft_status check_cell(const char *op, const ft_tensor *gates, const ft_tensor *const *states,
                            const char *const *names, int n, int nout) {
    ft_device dev = ft_op_device(gates);
    FT_TRY(ft_check_float_on(op, "gates", gates, dev, "gates", true));
    FT_TRY(ft_check_ndim(op, "gates", gates, 2, "(N, 4H)"));
    if (gates->shape[1] % 4)
        return ft_fail(FT_ERR_SHAPE, "%s: gates must have 4H columns (i, f, g, o), got %lld", op,
                       (long long)gates->shape[1]);
    int64_t shape[2] = {gates->shape[0], gates->shape[1] / 4};
    for (int k = 0; k < n; k++) {
        if (!states[k])
            continue;
        FT_TRY(ft_check_float_on(op, names[k], states[k], dev, "gates", true));
        FT_TRY(ft_check_shape(op, names[k], states[k], 2, shape));
    }
    for (int k = 0; k < nout; k++) {
        if (!states[k])
            continue;
        FT_TRY(ft_check_output(op, names[k], states[k]));
        FT_TRY(ft_check_alias(op, names[k], states[k], "gates", gates));
        for (int j = nout; j < n; j++)
            if (states[j])
                FT_TRY(ft_check_alias(op, names[k], states[k], names[j], states[j]));
    }
    return FT_OK;
}

/* The gradient of gate k's columns in dgates (N, 4H): the same checks, and dgates apart from the inputs. */
static ft_status check_dgates(const char *op, const ft_tensor *dgates, const ft_tensor *gates,
                              const ft_tensor *const *in, const char *const *names, int n) {
    if (!dgates)
        return FT_OK;
    FT_TRY(ft_check_float_on(op, "dgates", dgates, ft_op_device(gates), "gates", true));
    FT_TRY(ft_check_shape_as(op, "dgates", dgates, gates));
    FT_TRY(ft_check_output(op, "dgates", dgates));
    FT_TRY(ft_check_alias(op, "dgates", dgates, "gates", gates));
    for (int k = 0; k < n; k++)
        if (in[k])
            FT_TRY(ft_check_alias(op, "dgates", dgates, names[k], in[k]));
    return FT_OK;
}

#define TILE 256 /* results computed into a tile, then stored (ft_pw_put) */

/* ---- c = sigmoid(f) c_prev + sigmoid(i) tanh(g) ---- */

FT_VEC_CLONES static void cell_fwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                          const void *ctx) {
    float *c = p[0];
    const float *i = p[1], *f = p[2], *g = p[3], *cp = *(const bool *)ctx ? p[4] : NULL;
    if (cp)
        FT_SIMD_FOR(e, n)
            c[e] = ft_lstm_c(i[e], f[e], g[e], cp[e], true);
    else
        FT_SIMD_FOR(e, n)
            c[e] = ft_lstm_c(i[e], 0.0f, g[e], 0.0f, false);
}

ft_status ft_lstm_cell_forward(const ft_tensor *c, const ft_tensor *gates, const ft_tensor *c_prev) {
    const char *op = "lstm_cell";
    const ft_tensor *states[] = {c, c_prev};
    const char *names[] = {"c", "c_prev"};
    FT_TRY(check_cell(op, gates, states, names, 2, 1));
    if (!c)
        return ft_fail(FT_ERR_VALUE, "%s: c is required", op);
    if (ft_op_device(gates).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, lstm_cell_forward, c, gates, c_prev);
    ft_tensor i = gate(gates, 0), f = gate(gates, 1), g = gate(gates, 2);
    bool prev = c_prev != NULL;
    ft_pw_loop l = {.nops = prev ? 5 : 4, .nout = 1, .t = {c, &i, &f, &g, c_prev}, .fn = cell_fwd_kernel,
                    .ctx = &prev};
    ft_pw_run(&l);
    return FT_OK;
}

/* Outputs [0, nout) of the backward loops, each optional, and their rule. */
typedef struct {
    int a, b; /* the two outputs' slots, -1 when absent */
    bool acc_a, acc_b;
} outs2;

/* The loop of kernel fn writing (or adding to) a and b, either NULL, from the inputs x, y and z. */
static void run_outs2(ft_pw_kernel fn, const ft_tensor *a, const ft_tensor *b, bool acc_a, bool acc_b,
                      const ft_tensor *x, const ft_tensor *y, const ft_tensor *z) {
    outs2 o = {-1, -1, acc_a, acc_b};
    ft_pw_loop l = {.read_outputs = (a && acc_a) || (b && acc_b), .fn = fn, .ctx = &o};
    if (a)
        o.a = l.nops, l.t[l.nops++] = a;
    if (b)
        o.b = l.nops, l.t[l.nops++] = b;
    l.nout = l.nops;
    l.t[l.nops++] = x, l.t[l.nops++] = y, l.t[l.nops++] = z;
    ft_pw_run(&l);
}

/* df = dc c_prev sigmoid'(f), dc_prev = dc sigmoid(f); inputs dc, f, c_prev after the outputs. */
FT_VEC_CLONES static void cell_f_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                        const void *vctx) {
    const outs2 *o = vctx;
    int in = (o->a >= 0) + (o->b >= 0);
    _Alignas(64) float s[TILE], v[TILE];
    for (int64_t at = 0; at < n; at += TILE) {
        int64_t m = n - at < TILE ? n - at : TILE;
        const float *dc = p[in] + at, *f = p[in + 1] + at, *cp = p[in + 2] + at;
        FT_SIMD_FOR(e, m)
            s[e] = ft_sigmoidf(f[e]);
        if (o->a >= 0) {
            FT_SIMD_FOR(e, m)
                v[e] = ft_lstm_dsigmoid(dc[e], cp[e], s[e]);
            ft_pw_put(p[o->a] + at, v, m, o->acc_a);
        }
        if (o->b >= 0) {
            FT_SIMD_FOR(e, m)
                v[e] = dc[e] * s[e];
            ft_pw_put(p[o->b] + at, v, m, o->acc_b);
        }
    }
}

/* The gradients of a and b in y = sigmoid(a) tanh(b), both halves of an LSTM step (c's sigmoid(i) tanh(g),
 * h = sigmoid(o) tanh(c)): da = dy tanh(b) sigmoid'(a), db = dy sigmoid(a) tanh'(b); inputs dy, a, b after
 * the outputs. */
FT_VEC_CLONES static void sig_tanh_bwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                              const void *vctx) {
    const outs2 *q = vctx;
    int in = (q->a >= 0) + (q->b >= 0);
    _Alignas(64) float va[TILE], vb[TILE];
    for (int64_t at = 0; at < n; at += TILE) {
        int64_t m = n - at < TILE ? n - at : TILE;
        const float *dy = p[in] + at, *a = p[in + 1] + at, *b = p[in + 2] + at;
        FT_SIMD_FOR(e, m) {
            float s = ft_sigmoidf(a[e]), t = ft_tanhf(b[e]);
            va[e] = ft_lstm_dsigmoid(dy[e], t, s);
            vb[e] = ft_lstm_dtanh(dy[e], s, t);
        }
        if (q->a >= 0)
            ft_pw_put(p[q->a] + at, va, m, q->acc_a);
        if (q->b >= 0)
            ft_pw_put(p[q->b] + at, vb, m, q->acc_b);
    }
}

ft_status ft_lstm_cell_backward(const ft_tensor *dgates, const ft_tensor *dc_prev, const ft_tensor *dc,
                                const ft_tensor *gates, const ft_tensor *c_prev, bool accumulate_gates,
                                bool accumulate_c_prev) {
    const char *op = "lstm_cell_backward";
    const ft_tensor *states[] = {dc_prev, dc, c_prev};
    const char *names[] = {"dc_prev", "dc", "c_prev"};
    if (!dc)
        return ft_fail(FT_ERR_VALUE, "%s: dc is required", op);
    if (dc_prev && !c_prev)
        return ft_fail(FT_ERR_VALUE, "%s: dc_prev needs c_prev", op);
    FT_TRY(check_cell(op, gates, states, names, 3, 1));
    FT_TRY(check_dgates(op, dgates, gates, states, names, 3));
    if (ft_op_device(gates).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, lstm_cell_backward, dgates, dc_prev, dc, gates, c_prev, accumulate_gates,
                         accumulate_c_prev);
    ft_tensor f = gate(gates, 1);
    if (dgates || dc_prev) {
        ft_tensor df = dgates ? gate(dgates, 1) : (ft_tensor){0};
        if (c_prev)
            run_outs2(cell_f_kernel, dgates ? &df : NULL, dc_prev, accumulate_gates, accumulate_c_prev, dc, &f,
                      c_prev);
        else if (!accumulate_gates) { /* f multiplied zeros */
            FT_TRY(ft_tensor_zero(&df));
        }
    }
    if (dgates) {
        ft_tensor di = gate(dgates, 0), dg = gate(dgates, 2), i = gate(gates, 0), g = gate(gates, 2);
        run_outs2(sig_tanh_bwd_kernel, &di, &dg, accumulate_gates, accumulate_gates, dc, &i, &g);
    }
    return FT_OK;
}

/* ---- h = sigmoid(o) tanh(c) ---- */

FT_VEC_CLONES static void hidden_fwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                            const void *ctx) {
    float *h = p[0];
    const float *o = p[1], *c = p[2];
    FT_SIMD_FOR(e, n)
        h[e] = ft_lstm_h(o[e], c[e]);
}

ft_status ft_lstm_hidden_forward(const ft_tensor *h, const ft_tensor *gates, const ft_tensor *c) {
    const char *op = "lstm_hidden";
    const ft_tensor *states[] = {h, c};
    const char *names[] = {"h", "c"};
    if (!h || !c)
        return ft_fail(FT_ERR_VALUE, "%s: h and c are required", op);
    FT_TRY(check_cell(op, gates, states, names, 2, 1));
    if (ft_op_device(gates).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, lstm_hidden_forward, h, gates, c);
    ft_tensor o = gate(gates, 3);
    ft_pw_loop l = {.nops = 3, .nout = 1, .t = {h, &o, c}, .fn = hidden_fwd_kernel};
    ft_pw_run(&l);
    return FT_OK;
}

ft_status ft_lstm_hidden_backward(const ft_tensor *dgates, const ft_tensor *dc, const ft_tensor *dh,
                                  const ft_tensor *gates, const ft_tensor *c, bool accumulate_gates,
                                  bool accumulate_c) {
    const char *op = "lstm_hidden_backward";
    const ft_tensor *states[] = {dc, dh, c};
    const char *names[] = {"dc", "dh", "c"};
    if (!dh || !c)
        return ft_fail(FT_ERR_VALUE, "%s: dh and c are required", op);
    FT_TRY(check_cell(op, gates, states, names, 3, 1));
    FT_TRY(check_dgates(op, dgates, gates, states, names, 3));
    if (!dgates && !dc)
        return FT_OK;
    if (ft_op_device(gates).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, lstm_hidden_backward, dgates, dc, dh, gates, c, accumulate_gates, accumulate_c);
    ft_tensor o = gate(gates, 3), dgo = dgates ? gate(dgates, 3) : (ft_tensor){0};
    run_outs2(sig_tanh_bwd_kernel, dgates ? &dgo : NULL, dc, accumulate_gates, accumulate_c, dh, &o, c);
    return FT_OK;
}

/* ---- a whole layer ---- */

static const ft_act no_act = {FT_ACT_NONE, 0};

/* Rows [r0, r1) of x (R, C). */
static ft_tensor block(const ft_tensor *x, int64_t r0, int64_t r1) {
    ft_tensor v = *x;
    v.shape[0] = r1 - r0;
    v.offset += r0 * x->strides[0] * (int64_t)ft_dtype_get(x->dtype)->itemsize;
    return v;
}

/* A time-major (T, N, C) x seen batch-major: (N, T, C). */
static ft_tensor batch_major(const ft_tensor *x) {
    ft_tensor v = *x;
    v.shape[0] = x->shape[1], v.shape[1] = x->shape[0];
    v.strides[0] = x->strides[1], v.strides[1] = x->strides[0];
    return v;
}

/* A contiguous (T, N, C) tensor as (T N, C) rows: a step's N rows follow the step before's. */
static ft_tensor all_rows(const ft_tensor *x) {
    ft_tensor v = *x;
    v.ndim = 2;
    v.shape[0] = x->shape[0] * x->shape[1], v.shape[1] = x->shape[2];
    v.strides[0] = x->shape[2], v.strides[1] = 1;
    return v;
}

/* A layer's saved (T, N, C) as n contiguous (T, N, widths[k]) parts, one after another (C their sum). */
static void split_saved(const ft_tensor *saved, int n, const int64_t *widths, ft_tensor *part) {
    int64_t T = saved->shape[0], N = saved->shape[1], at = 0;
    size_t item = ft_dtype_get(saved->dtype)->itemsize;
    for (int k = 0; k < n; k++) {
        ft_tensor *t = &part[k];
        *t = *saved;
        t->shape[2] = widths[k];
        t->strides[0] = N * widths[k], t->strides[1] = widths[k];
        t->offset += at * (int64_t)item;
        at += T * N * widths[k];
    }
}

/* The parts of an LSTM's saved (T, N, 6H): gates (T, N, 4H), then h and c (T, N, H). */
typedef struct {
    ft_tensor g, h, c;
} saved_parts;

static saved_parts parts_of(const ft_tensor *saved) {
    int64_t H = saved->shape[2] / 6;
    ft_tensor part[3];
    split_saved(saved, 3, (int64_t[]){4 * H, H, H}, part);
    return (saved_parts){part[0], part[1], part[2]};
}

/* A step's pointwise work on the CPU: one loop over its rows computes what the ops above compute in several
 * (gates += h W^T + b, then c and h; in the backward the gates' gradient and the cell state's), in the same
 * formulas and order, with values rounded where the ops would store them, so the bits are the same. A step
 * (N H elements) is too small for a loop of its own to split among threads; its rows are split instead. */

/* Rows of a (N, k) tensor whose rows are contiguous: row r at element r * rs. */
typedef struct {
    char *p;
    int64_t rs;
    bool bf16;
} rows_view;

static rows_view rows_view_of(const ft_tensor *t) {
    rows_view v = {NULL, 0, false};
    if (t && t->storage)
        v = (rows_view){ft_tensor_data(t), t->strides[0], t->dtype == FT_BFLOAT16};
    return v;
}

static char *row_at(const rows_view *v, int64_t r) { return v->p + r * v->rs * (v->bf16 ? 2 : 4); }

/* n values of row r from column j (buf holds them when converted). */
static const float *load(const rows_view *v, int64_t r, int64_t j, int64_t n, float *buf) {
    return ft_floats_in(row_at(v, r), v->bf16, j, n, buf);
}

/* The four gate columns (of H each) of row r, from column j: n values of each (buf holds them when
 * converted). */
static void load_gates(const rows_view *v, int64_t r, int64_t j, int64_t H, int64_t n, float buf[4][TILE],
                       const float *gate[4]) {
    for (int q = 0; q < 4; q++)
        gate[q] = load(v, r, q * H + j, n, buf[q]);
}

/* Stores n values x at row r, column j; x becomes what was stored (bfloat16 rounds), as a later op would
 * read it. */
static void store(const rows_view *v, int64_t r, int64_t j, int64_t n, float *x) {
    if (!v->bf16) {
        memcpy((float *)row_at(v, r) + j, x, (size_t)n * sizeof *x);
        return;
    }
    uint16_t *d = (uint16_t *)row_at(v, r) + j;
    for (int64_t e = 0; e < n; e++) {
        d[e] = ft_f32_to_bf16(x[e]);
        x[e] = ft_bf16_to_f32(d[e]);
    }
}

/* v: the step's gates, h W^T + b, h, c and the step before's c (p NULL: none). */
FT_VEC_CLONES static void forward_block(const rows_view *v, int64_t H, int64_t r0, int64_t r1) {
    const rows_view *g = &v[0], *hw = &v[1], *h = &v[2], *c = &v[3], *cp = &v[4];
    _Alignas(64) float x[4][TILE], ba[TILE], bb[TILE], bc[TILE], bh[TILE], bp[TILE];
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < H; j += TILE) {
            int64_t m = H - j < TILE ? H - j : TILE;
            for (int q = 0; q < 4; q++) {
                const float *a = load(g, r, q * H + j, m, ba), *b = load(hw, r, q * H + j, m, bb);
                FT_SIMD_FOR(e, m)
                    x[q][e] = a[e] + b[e];
                store(g, r, q * H + j, m, x[q]);
            }
            if (cp->p) {
                const float *pc = load(cp, r, j, m, bp);
                FT_SIMD_FOR(e, m)
                    bc[e] = ft_lstm_c(x[0][e], x[1][e], x[2][e], pc[e], true);
            } else {
                FT_SIMD_FOR(e, m)
                    bc[e] = ft_lstm_c(x[0][e], 0.0f, x[2][e], 0.0f, false);
            }
            store(c, r, j, m, bc);
            FT_SIMD_FOR(e, m)
                bh[e] = ft_lstm_h(x[3][e], bc[e]);
            store(h, r, j, m, bh);
        }
}

/* v: the step's gates, c, the step before's c (p NULL: none), the gates' gradient (written), h's gradient,
 * c's (added to: h's part) and the step before's c's (added to; p NULL: none). */
FT_VEC_CLONES static void backward_block(const rows_view *v, int64_t H, int64_t r0, int64_t r1) {
    const rows_view *g = &v[0], *c = &v[1], *cp = &v[2], *dg = &v[3], *dh = &v[4], *dc = &v[5], *dcp = &v[6];
    _Alignas(64) float bg[4][TILE], d[4][TILE], bc[TILE], bp[TILE], bdh[TILE], bdc[TILE], t[TILE], sf[TILE];
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < H; j += TILE) {
            int64_t m = H - j < TILE ? H - j : TILE;
            const float *gate[4];
            load_gates(g, r, j, H, m, bg, gate);
            const float *cc = load(c, r, j, m, bc), *gh = load(dh, r, j, m, bdh), *gc = load(dc, r, j, m, bdc);
            FT_SIMD_FOR(e, m) { /* h = sigmoid(o) tanh(c) */
                float s = ft_sigmoidf(gate[3][e]), th = ft_tanhf(cc[e]);
                d[3][e] = ft_lstm_dsigmoid(gh[e], th, s);
                t[e] = gc[e] + ft_lstm_dtanh(gh[e], s, th);
            }
            store(dc, r, j, m, t);
            FT_SIMD_FOR(e, m)
                sf[e] = ft_sigmoidf(gate[1][e]);
            if (cp->p) {
                const float *pc = load(cp, r, j, m, bp);
                FT_SIMD_FOR(e, m)
                    d[1][e] = ft_lstm_dsigmoid(t[e], pc[e], sf[e]);
            } else {
                FT_SIMD_FOR(e, m)
                    d[1][e] = 0.0f;
            }
            FT_SIMD_FOR(e, m) {
                float s = ft_sigmoidf(gate[0][e]), tg = ft_tanhf(gate[2][e]);
                d[0][e] = ft_lstm_dsigmoid(t[e], tg, s);
                d[2][e] = ft_lstm_dtanh(t[e], s, tg);
            }
            for (int q = 0; q < 4; q++)
                store(dg, r, q * H + j, m, d[q]);
            if (dcp->p) {
                const float *old = load(dcp, r, j, m, bp);
                FT_SIMD_FOR(e, m)
                    sf[e] = old[e] + t[e] * sf[e];
                store(dcp, r, j, m, sf);
            }
        }
}

#define MAX_PARTS 64
#define MIN_ROWS 8

/* fn over the N rows of the views v, split among the threads. */
static void over_rows(int64_t N, const rows_view *v, int64_t H,
                      void (*fn)(const rows_view *v, int64_t H, int64_t r0, int64_t r1)) {
    int64_t parts = omp_get_max_threads();
    parts = parts < N / MIN_ROWS ? parts : N / MIN_ROWS;
    parts = parts < MAX_PARTS ? parts : MAX_PARTS;
    if (parts <= 1) {
        fn(v, H, 0, N);
        return;
    }
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int64_t k = 0; k < parts; k++)
        fn(v, H, N * k / parts, N * (k + 1) / parts);
}

static ft_status scratch(ft_tensor *t, const ft_tensor *like, int ndim, const int64_t *shape, ft_dtype dtype) {
    return ft_tensor_empty(t, ndim, shape, dtype, ft_tensor_device(like), false);
}

/* x's columns [c0, c0 + k): its last dimension's. */
static ft_tensor cols(const ft_tensor *x, int64_t c0, int64_t k) {
    ft_tensor v = *x;
    int d = x->ndim - 1;
    v.shape[d] = k;
    v.offset += c0 * x->strides[d] * (int64_t)ft_dtype_get(x->dtype)->itemsize;
    return v;
}

static ft_status check_layer(const char *op, const ft_tensor *seq, const ft_tensor *saved, const ft_tensor *w) {
    FT_TRY(ft_check_float_on(op, "seq", seq, ft_op_device(seq), "seq", true));
    FT_TRY(ft_check_ndim(op, "seq", seq, 3, "(N, T, 2H)"));
    int64_t N = seq->shape[0], T = seq->shape[1], H = seq->shape[2] / 2;
    if (seq->shape[2] != 2 * H || H == 0)
        return ft_fail(FT_ERR_SHAPE, "%s: seq must have 2H > 0 columns (h, c), got %lld", op,
                       (long long)seq->shape[2]);
    FT_TRY(ft_check_float_on(op, "saved", saved, ft_op_device(seq), "seq", true));
    FT_TRY(ft_check_shape(op, "saved", saved, 3, (int64_t[]){T, N, 6 * H}));
    if (!ft_tensor_is_contiguous(saved))
        return ft_fail(FT_ERR_SHAPE, "%s: saved must be contiguous", op);
    return ft_check_shape(op, "weight", w, 2, (int64_t[]){4 * H, H});
}

/* One step's pointwise work: on a GPU as the ops. */
static ft_status forward_step(const ft_tensor *g, const ft_tensor *hw, const ft_tensor *h, const ft_tensor *c,
                              const ft_tensor *cp) {
    if (ft_op_device(g).type == FT_DEV_CUDA) {
        FT_TRY(ft_add_forward(g, g, hw, no_act));
        FT_TRY(ft_lstm_cell_forward(c, g, cp->storage ? cp : NULL));
        return ft_lstm_hidden_forward(h, g, c);
    }
    rows_view v[5] = {rows_view_of(g), rows_view_of(hw), rows_view_of(h), rows_view_of(c), rows_view_of(cp)};
    over_rows(g->shape[0], v, h->shape[1], forward_block);
    return FT_OK;
}

/* NULL, or an initial state or its gradient: (N, H) on the op's device, each row contiguous. */
static ft_status check_state(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *saved,
                             int64_t H) {
    if (!t)
        return FT_OK;
    FT_TRY(ft_check_float_on(op, arg, t, ft_op_device(saved), "saved", true));
    FT_TRY(ft_check_shape(op, arg, t, 2, (int64_t[]){saved->shape[1], H}));
    if (t->strides[1] != 1 && t->shape[1] > 1)
        return ft_fail(FT_ERR_SHAPE, "%s: the rows of %s must be contiguous", op, arg);
    return FT_OK;
}

ft_status ft_lstm_forward(const ft_tensor *seq, const ft_tensor *saved, const ft_tensor *gi, const ft_tensor *h0,
                          const ft_tensor *c0, const ft_tensor *w, const ft_tensor *b, bool reverse) {
    FT_TRY(check_layer("lstm", seq, saved, w));
    int64_t T = saved->shape[0], N = saved->shape[1], H = saved->shape[2] / 6;
    FT_TRY(ft_check_shape("lstm", "gi", gi, 3, (int64_t[]){N, T, 4 * H}));
    FT_TRY(check_state("lstm", "h0", h0, saved, H));
    FT_TRY(check_state("lstm", "c0", c0, saved, H));
    if (N == 0 || T == 0)
        return FT_OK;
    saved_parts p = parts_of(saved);
    ft_tensor gates = batch_major(&p.g), gr = all_rows(&p.g), hr = all_rows(&p.h), cr = all_rows(&p.c), hw,
              zero = {0};
    FT_TRY(ft_tensor_copy(&gates, gi, false));
    FT_TRY(scratch(&hw, saved, 2, (int64_t[]){N, 4 * H}, saved->dtype));
    ft_status s = FT_OK;
    if (!h0) { /* its product is b alone: one small product spares a branch per step */
        s = scratch(&zero, saved, 2, (int64_t[]){N, H}, w->dtype);
        if (s == FT_OK)
            s = ft_tensor_zero(&zero);
    }
    ft_tensor hp = h0 ? *h0 : zero, cp = c0 ? *c0 : (ft_tensor){0};
    for (int64_t k = 0; s == FT_OK && k < T; k++) {
        int64_t r = (reverse ? T - 1 - k : k) * N;
        ft_tensor g = block(&gr, r, r + N), h = block(&hr, r, r + N), c = block(&cr, r, r + N);
        s = ft_linear_forward(&hw, &hp, w, b, no_act);
        if (s == FT_OK)
            s = forward_step(&g, &hw, &h, &c, &cp);
        hp = h, cp = c;
    }
    ft_tensor_release(&hw);
    if (zero.storage)
        ft_tensor_release(&zero);
    ft_tensor hs = batch_major(&p.h), cs = batch_major(&p.c), seq_h = cols(seq, 0, H), seq_c = cols(seq, H, H);
    if (s == FT_OK)
        s = ft_tensor_copy(&seq_h, &hs, false);
    return s == FT_OK ? ft_tensor_copy(&seq_c, &cs, false) : s;
}

/* W's and b's gradients from every step's gates' gradient dg (T N, 4H) and the h each step read: the h rows
 * hr (T N, H) one step over, in one product, and h0 for the first step. */
static ft_status weight_grads(const ft_tensor *dw, const ft_tensor *db, const ft_tensor *dg, const ft_tensor *hr,
                              int64_t N, const ft_tensor *h0, const ft_tensor *w, bool reverse, ft_rnn_acc acc) {
    int64_t R = hr->shape[0], first = reverse ? R - N : 0;
    /* forward: step t's gates pair with step t - 1's h, rows [N, R) with [0, R - N); reverse: t + 1's */
    ft_tensor g = reverse ? block(dg, 0, R - N) : block(dg, N, R), h = reverse ? block(hr, N, R) : block(hr, 0, R - N);
    ft_grad_acc a = {false, acc.weight, acc.bias};
    if (R > N)
        FT_TRY(ft_linear_backward(NULL, dw, NULL, &g, &h, w, a));
    a.weight |= R > N;
    ft_tensor g0 = block(dg, first, first + N);
    if (h0)
        FT_TRY(ft_linear_backward(NULL, dw, NULL, &g0, h0, w, a));
    else if (R == N && dw && !acc.weight)
        FT_TRY(ft_tensor_zero(dw)); /* one step from h = 0: no product */
    return db ? ft_linear_backward(NULL, NULL, db, dg, hr, w, a) : FT_OK;
}

/* One step's pointwise work of the backward: on a GPU as the ops. */
static ft_status backward_step(const ft_tensor *g, const ft_tensor *c, const ft_tensor *cp, const ft_tensor *dg,
                               const ft_tensor *dh, const ft_tensor *dc, const ft_tensor *dcp) {
    if (ft_op_device(g).type == FT_DEV_CUDA) {
        FT_TRY(ft_lstm_hidden_backward(dg, dc, dh, g, c, false, true));
        return ft_lstm_cell_backward(dg, dcp->storage ? dcp : NULL, dc, g, cp->storage ? cp : NULL, false, true);
    }
    rows_view v[7] = {rows_view_of(g),  rows_view_of(c),  rows_view_of(cp), rows_view_of(dg),
                      rows_view_of(dh), rows_view_of(dc), rows_view_of(dcp)};
    over_rows(g->shape[0], v, c->shape[1], backward_block);
    return FT_OK;
}

ft_status ft_lstm_backward(const ft_tensor *dgi, const ft_tensor *dh0, const ft_tensor *dc0, const ft_tensor *dw,
                           const ft_tensor *db, const ft_tensor *dseq, const ft_tensor *saved, const ft_tensor *h0,
                           const ft_tensor *c0, const ft_tensor *w, bool reverse, ft_rnn_acc acc) {
    const char *op = "lstm_backward";
    FT_TRY(check_layer(op, dseq, saved, w));
    int64_t T = saved->shape[0], N = saved->shape[1], H = saved->shape[2] / 6;
    if (dgi)
        FT_TRY(ft_check_shape(op, "dgi", dgi, 3, (int64_t[]){N, T, 4 * H}));
    if ((dh0 && !h0) || (dc0 && !c0))
        return ft_fail(FT_ERR_VALUE, "%s: a gradient of h0 or c0 needs h0 or c0", op);
    const ft_tensor *states[] = {h0, c0, dh0, dc0};
    const char *names[] = {"h0", "c0", "dh0", "dc0"};
    for (int k = 0; k < 4; k++)
        FT_TRY(check_state(op, names[k], states[k], saved, H));
    if (N == 0 || T == 0) { /* empty sums */
        const ft_tensor *out[] = {dh0, dc0, dw, db};
        bool add[] = {acc.h0, acc.c0, acc.weight, acc.bias};
        for (int k = 0; k < 4; k++)
            if (out[k] && !add[k])
                FT_TRY(ft_tensor_zero(out[k]));
        return FT_OK;
    }
    saved_parts p = parts_of(saved);
    ft_tensor gr = all_rows(&p.g), hr = all_rows(&p.h), cr = all_rows(&p.c);
    /* time-major gradients: of h and of c (T, N, H), which each step adds what it passes back to, and of the
     * gates (T, N, 4H) */
    ft_tensor dH, dC = {0}, dG = {0};
    FT_TRY(scratch(&dH, saved, 3, (int64_t[]){T, N, H}, FT_FLOAT32));
    ft_tensor to = batch_major(&dH), from = cols(dseq, 0, H);
    ft_status s = ft_tensor_copy(&to, &from, false);
    if (s == FT_OK)
        s = scratch(&dC, saved, 3, (int64_t[]){T, N, H}, FT_FLOAT32);
    if (s == FT_OK) {
        to = batch_major(&dC), from = cols(dseq, H, H);
        s = ft_tensor_copy(&to, &from, false);
    }
    if (s == FT_OK)
        s = scratch(&dG, saved, 3, (int64_t[]){T, N, 4 * H}, saved->dtype);
    ft_tensor dhr = all_rows(&dH), dcr = all_rows(&dC), dgr = all_rows(&dG);
    for (int64_t k = T - 1; s == FT_OK && k >= 0; k--) {
        int64_t r = (reverse ? T - 1 - k : k) * N, rp = reverse ? r + N : r - N, rn = reverse ? r - N : r + N;
        ft_tensor g = block(&gr, r, r + N), c = block(&cr, r, r + N), dg = block(&dgr, r, r + N),
                  dh = block(&dhr, r, r + N), dc = block(&dcr, r, r + N);
        if (k < T - 1) { /* through W into the h this step gave the next */
            ft_tensor dnext = block(&dgr, rn, rn + N), h = block(&hr, r, r + N);
            s = ft_linear_backward(&dh, NULL, NULL, &dnext, &h, w, (ft_grad_acc){.inp = true});
        }
        ft_tensor cp = k > 0 ? block(&cr, rp, rp + N) : c0 ? *c0 : (ft_tensor){0};
        ft_tensor dcp = k > 0 ? block(&dcr, rp, rp + N) : dc0 && acc.c0 ? *dc0 : (ft_tensor){0};
        if (s == FT_OK)
            s = backward_step(&g, &c, &cp, &dg, &dh, &dc, &dcp);
    }
    if (s == FT_OK && dc0 && !acc.c0) { /* written: the first step's again, into dc0 alone */
        int64_t r = reverse ? (T - 1) * N : 0;
        ft_tensor g = block(&gr, r, r + N), dc = block(&dcr, r, r + N);
        s = ft_lstm_cell_backward(NULL, dc0, &dc, &g, c0, false, false);
    }
    if (s == FT_OK && dh0) {
        int64_t r = reverse ? (T - 1) * N : 0;
        ft_tensor first = block(&dgr, r, r + N);
        s = ft_linear_backward(dh0, NULL, NULL, &first, h0, w, (ft_grad_acc){.inp = acc.h0});
    }
    if (s == FT_OK && (dw || db))
        s = weight_grads(dw, db, &dgr, &hr, N, h0, w, reverse, acc);
    ft_tensor dgates = batch_major(&dG);
    if (s == FT_OK && dgi)
        s = acc.gi ? ft_add_forward(dgi, dgi, &dgates, no_act) : ft_tensor_copy(dgi, &dgates, false);
    ft_tensor *bufs[] = {&dH, &dC, &dG};
    for (int k = 0; k < 3; k++)
        if (bufs[k]->storage)
            ft_tensor_release(bufs[k]);
    return s;
}

/* ---- a whole GRU layer ---- */

/* v: the step's saved gates (r, z, n, hw_n; on entry gi's r, z and n), h W^T + b, h, and the step before's h
 * (zeros before the first step without h0). The eager layer's formulas, in its order, each op's result a float32,
 * so the float32 bits are the eager layer's. */
FT_VEC_CLONES static void gru_forward_block(const rows_view *v, int64_t H, int64_t r0, int64_t r1) {
    const rows_view *g = &v[0], *hw = &v[1], *h = &v[2], *hp = &v[3];
    _Alignas(64) float x[3][TILE], ba[TILE], bb[TILE], bh[TILE];
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < H; j += TILE) {
            int64_t m = H - j < TILE ? H - j : TILE;
            for (int q = 0; q < 2; q++) { /* r and z */
                const float *a = load(g, r, q * H + j, m, ba), *b = load(hw, r, q * H + j, m, bb);
                FT_SIMD_FOR(e, m)
                    x[q][e] = ft_sigmoidf(a[e] + b[e]);
                store(g, r, q * H + j, m, x[q]);
            }
            const float *a = load(g, r, 2 * H + j, m, ba), *b = load(hw, r, 2 * H + j, m, bb);
            FT_SIMD_FOR(e, m)
                x[2][e] = ft_tanhf(a[e] + x[0][e] * b[e]);
            store(g, r, 2 * H + j, m, x[2]);
            memcpy(bh, b, (size_t)m * sizeof *bh); /* hw_n, kept for the backward */
            store(g, r, 3 * H + j, m, bh);
            const float *p = load(hp, r, j, m, ba);
            FT_SIMD_FOR(e, m)
                bh[e] = (1.0f - x[1][e]) * x[2][e] + x[1][e] * p[e];
            store(h, r, j, m, bh);
        }
}

/* v: the step's saved gates, the step before's h (p NULL: zeros), this step's h's gradient (float32, whole),
 * the gradients of gi and of hw (written), and the step before's h's (float32, added to; p NULL: none). */
FT_VEC_CLONES static void gru_backward_block(const rows_view *v, int64_t H, int64_t r0, int64_t r1) {
    const rows_view *g = &v[0], *hp = &v[1], *dh = &v[2], *dgi = &v[3], *dhw = &v[4], *dhp = &v[5];
    _Alignas(64) float bg[4][TILE], d[4][TILE], bp[TILE], bd[TILE];
    if (!hp->p)
        memset(bp, 0, sizeof bp);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < H; j += TILE) {
            int64_t m = H - j < TILE ? H - j : TILE;
            const float *gate[4];
            load_gates(g, r, j, H, m, bg, gate);
            const float *gh = load(dh, r, j, m, bd), *p = hp->p ? load(hp, r, j, m, bp) : bp;
            const float *rg = gate[0], *z = gate[1], *n = gate[2], *hn = gate[3];
            FT_SIMD_FOR(e, m) {
                float dn = gh[e] * (1.0f - z[e]) * (1.0f - n[e] * n[e]); /* through n's tanh */
                d[0][e] = dn * hn[e] * (rg[e] * (1.0f - rg[e]));
                d[1][e] = gh[e] * (p[e] - n[e]) * (z[e] * (1.0f - z[e]));
                d[2][e] = dn;
                d[3][e] = dn * rg[e]; /* hw_n's */
            }
            for (int q = 0; q < 3; q++)
                store(dgi, r, q * H + j, m, d[q]);
            store(dhw, r, j, m, d[0]); /* hw's r and z columns are gi's; its n column is d[3] */
            store(dhw, r, H + j, m, d[1]);
            store(dhw, r, 2 * H + j, m, d[3]);
            if (dhp->p) {
                float *old = (float *)row_at(dhp, r) + j;
                FT_SIMD_FOR(e, m)
                    old[e] += gh[e] * z[e];
            }
        }
}

static ft_status check_gru(const char *op, const ft_tensor *seq, const ft_tensor *saved, const ft_tensor *w) {
    FT_TRY(ft_check_float_on(op, "seq", seq, ft_op_device(seq), "seq", true));
    if (ft_op_device(seq).type != FT_DEV_CPU)
        return ft_fail(FT_ERR_DEVICE, "%s: runs on the CPU (a GPU program unrolls a GRU's steps)", op);
    FT_TRY(ft_check_ndim(op, "seq", seq, 3, "(N, T, H)"));
    int64_t N = seq->shape[0], T = seq->shape[1], H = seq->shape[2];
    if (H == 0)
        return ft_fail(FT_ERR_SHAPE, "%s: seq must have H > 0 columns", op);
    FT_TRY(ft_check_float_on(op, "saved", saved, ft_op_device(seq), "seq", true));
    FT_TRY(ft_check_shape(op, "saved", saved, 3, (int64_t[]){T, N, 5 * H}));
    if (!ft_tensor_is_contiguous(saved))
        return ft_fail(FT_ERR_SHAPE, "%s: saved must be contiguous", op);
    return ft_check_shape(op, "weight", w, 2, (int64_t[]){3 * H, H});
}

/* A GRU's saved (T, N, 5H) as its gates (T, N, 4H) and h (T, N, H). */
static void gru_parts(const ft_tensor *saved, ft_tensor *part) {
    int64_t H = saved->shape[2] / 5;
    split_saved(saved, 2, (int64_t[]){4 * H, H}, part);
}

ft_status ft_gru_forward(const ft_tensor *seq, const ft_tensor *saved, const ft_tensor *gi, const ft_tensor *h0,
                         const ft_tensor *w, const ft_tensor *b, bool reverse) {
    FT_TRY(check_gru("gru", seq, saved, w));
    int64_t T = saved->shape[0], N = saved->shape[1], H = seq->shape[2];
    FT_TRY(ft_check_shape("gru", "gi", gi, 3, (int64_t[]){N, T, 3 * H}));
    FT_TRY(check_state("gru", "h0", h0, saved, H));
    if (N == 0 || T == 0)
        return FT_OK;
    ft_tensor part[2];
    gru_parts(saved, part);
    ft_tensor all = batch_major(&part[0]), gates = cols(&all, 0, 3 * H), gr = all_rows(&part[0]),
              hr = all_rows(&part[1]), hw, zero = {0};
    FT_TRY(ft_tensor_copy(&gates, gi, false));
    FT_TRY(scratch(&hw, saved, 2, (int64_t[]){N, 3 * H}, saved->dtype));
    ft_status s = FT_OK;
    if (!h0) { /* the state before the first step: its product is b alone, and z h_prev adds zeros, as the eager
                  layer's first step adds 0 */
        s = scratch(&zero, saved, 2, (int64_t[]){N, H}, w->dtype);
        if (s == FT_OK)
            s = ft_tensor_zero(&zero);
    }
    ft_tensor hp = h0 ? *h0 : zero;
    for (int64_t k = 0; s == FT_OK && k < T; k++) {
        int64_t r = (reverse ? T - 1 - k : k) * N;
        ft_tensor g = block(&gr, r, r + N), h = block(&hr, r, r + N);
        s = ft_linear_forward(&hw, &hp, w, b, no_act);
        if (s == FT_OK) {
            rows_view v[4] = {rows_view_of(&g), rows_view_of(&hw), rows_view_of(&h), rows_view_of(&hp)};
            over_rows(N, v, H, gru_forward_block);
        }
        hp = h;
    }
    ft_tensor_release(&hw);
    if (zero.storage)
        ft_tensor_release(&zero);
    ft_tensor hs = batch_major(&part[1]);
    return s == FT_OK ? ft_tensor_copy(seq, &hs, false) : s;
}

ft_status ft_gru_backward(const ft_tensor *dgi, const ft_tensor *dh0, const ft_tensor *dw, const ft_tensor *db,
                          const ft_tensor *dseq, const ft_tensor *saved, const ft_tensor *h0, const ft_tensor *w,
                          bool reverse, ft_rnn_acc acc) {
    const char *op = "gru_backward";
    FT_TRY(check_gru(op, dseq, saved, w));
    int64_t T = saved->shape[0], N = saved->shape[1], H = dseq->shape[2];
    if (dgi)
        FT_TRY(ft_check_shape(op, "dgi", dgi, 3, (int64_t[]){N, T, 3 * H}));
    if (dh0 && !h0)
        return ft_fail(FT_ERR_VALUE, "%s: a gradient of h0 needs h0", op);
    FT_TRY(check_state(op, "h0", h0, saved, H));
    FT_TRY(check_state(op, "dh0", dh0, saved, H));
    if (N == 0 || T == 0) { /* empty sums */
        const ft_tensor *out[] = {dh0, dw, db};
        bool add[] = {acc.h0, acc.weight, acc.bias};
        for (int k = 0; k < 3; k++)
            if (out[k] && !add[k])
                FT_TRY(ft_tensor_zero(out[k]));
        return FT_OK;
    }
    ft_tensor part[2];
    gru_parts(saved, part);
    ft_tensor gr = all_rows(&part[0]), hr = all_rows(&part[1]);
    /* time-major float32 gradients of h (T, N, H), to which each step adds what it passes back, and of h0 (N, H);
     * those of gi and hw (T, N, 3H), which differ in n's columns */
    ft_tensor dH, dI = {0}, dW = {0}, d0 = {0};
    FT_TRY(scratch(&dH, saved, 3, (int64_t[]){T, N, H}, FT_FLOAT32));
    ft_tensor to = batch_major(&dH);
    ft_status s = ft_tensor_copy(&to, dseq, false);
    if (s == FT_OK)
        s = scratch(&dI, saved, 3, (int64_t[]){T, N, 3 * H}, saved->dtype);
    if (s == FT_OK)
        s = scratch(&dW, saved, 3, (int64_t[]){T, N, 3 * H}, saved->dtype);
    if (s == FT_OK && dh0) {
        s = scratch(&d0, saved, 2, (int64_t[]){N, H}, FT_FLOAT32);
        if (s == FT_OK)
            s = acc.h0 ? ft_tensor_copy(&d0, dh0, false) : ft_tensor_zero(&d0);
    }
    ft_tensor dhr = all_rows(&dH), dir = all_rows(&dI), dwr = all_rows(&dW), none = {0};
    for (int64_t k = T - 1; s == FT_OK && k >= 0; k--) {
        int64_t r = (reverse ? T - 1 - k : k) * N, rp = reverse ? r + N : r - N, rn = reverse ? r - N : r + N;
        ft_tensor dh = block(&dhr, r, r + N);
        if (k < T - 1) { /* through W into the h this step gave the next */
            ft_tensor dnext = block(&dwr, rn, rn + N), h = block(&hr, r, r + N);
            s = ft_linear_backward(&dh, NULL, NULL, &dnext, &h, w, (ft_grad_acc){.inp = true});
        }
        ft_tensor g = block(&gr, r, r + N), dgi_k = block(&dir, r, r + N), dhw_k = block(&dwr, r, r + N),
                  hp = k > 0 ? block(&hr, rp, rp + N) : h0 ? *h0 : none,
                  dhp = k > 0 ? block(&dhr, rp, rp + N) : dh0 ? d0 : none;
        if (s == FT_OK) {
            rows_view v[6] = {rows_view_of(&g),     rows_view_of(&hp),    rows_view_of(&dh),
                              rows_view_of(&dgi_k), rows_view_of(&dhw_k), rows_view_of(&dhp)};
            over_rows(N, v, H, gru_backward_block);
        }
    }
    if (s == FT_OK && dh0) {
        int64_t r = reverse ? (T - 1) * N : 0;
        ft_tensor first = block(&dwr, r, r + N);
        s = ft_linear_backward(&d0, NULL, NULL, &first, h0, w, (ft_grad_acc){.inp = true});
        if (s == FT_OK)
            s = ft_tensor_copy(dh0, &d0, false);
    }
    if (s == FT_OK && (dw || db))
        s = weight_grads(dw, db, &dwr, &hr, N, h0, w, reverse, acc);
    ft_tensor dgates = batch_major(&dI);
    if (s == FT_OK && dgi)
        s = acc.gi ? ft_add_forward(dgi, dgi, &dgates, no_act) : ft_tensor_copy(dgi, &dgates, false);
    ft_tensor *bufs[] = {&dH, &dI, &dW, &d0};
    for (int k = 0; k < 4; k++)
        if (bufs[k]->storage)
            ft_tensor_release(bufs[k]);
    return s;
}
