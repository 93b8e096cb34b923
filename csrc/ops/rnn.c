/* The LSTM cell's pointwise ops over column views of the gates: a gate is
 * the (N, H) view of its columns, so each op is one strided pointwise loop
 * (ops/pointwise.h). The cell's backward runs as two loops (f with c_prev,
 * then i with g): one would need more operands than a loop takes.
 *
 * Every formula uses the activations of kernels/activation.h and explicit
 * fmaf where a product is added, as cuda/pointwise.cu does, so that both
 * devices compute the same bits. */
#include "ops/rnn.h"

#include "kernels/activation.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
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
            c[e] = fmaf(ft_sigmoidf(f[e]), cp[e], ft_sigmoidf(i[e]) * ft_tanhf(g[e]));
    else
        FT_SIMD_FOR(e, n)
            c[e] = ft_sigmoidf(i[e]) * ft_tanhf(g[e]);
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
                v[e] = dc[e] * cp[e] * (s[e] * (1.0f - s[e]));
            ft_pw_put(p[o->a] + at, v, m, o->acc_a);
        }
        if (o->b >= 0) {
            FT_SIMD_FOR(e, m)
                v[e] = dc[e] * s[e];
            ft_pw_put(p[o->b] + at, v, m, o->acc_b);
        }
    }
}

/* di = dc tanh(g) sigmoid'(i), dg = dc sigmoid(i) tanh'(g); inputs dc, i, g after the outputs. */
FT_VEC_CLONES static void cell_ig_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                         const void *ctx) {
    bool acc = *(const bool *)ctx;
    _Alignas(64) float vi[TILE], vg[TILE];
    for (int64_t at = 0; at < n; at += TILE) {
        int64_t m = n - at < TILE ? n - at : TILE;
        const float *dc = p[2] + at, *i = p[3] + at, *g = p[4] + at;
        FT_SIMD_FOR(e, m) {
            float s = ft_sigmoidf(i[e]), t = ft_tanhf(g[e]);
            vi[e] = dc[e] * t * (s * (1.0f - s));
            vg[e] = dc[e] * s * fmaf(-t, t, 1.0f);
        }
        ft_pw_put(p[0] + at, vi, m, acc);
        ft_pw_put(p[1] + at, vg, m, acc);
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
        ft_pw_loop l = {.nops = 5, .nout = 2, .t = {&di, &dg, dc, &i, &g}, .read_outputs = accumulate_gates,
                        .fn = cell_ig_kernel, .ctx = &accumulate_gates};
        ft_pw_run(&l);
    }
    return FT_OK;
}

/* ---- h = sigmoid(o) tanh(c) ---- */

FT_VEC_CLONES static void hidden_fwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                            const void *ctx) {
    float *h = p[0];
    const float *o = p[1], *c = p[2];
    FT_SIMD_FOR(e, n)
        h[e] = ft_sigmoidf(o[e]) * ft_tanhf(c[e]);
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

/* do = dh tanh(c) sigmoid'(o), dc = dh sigmoid(o) tanh'(c); inputs dh, o, c after the outputs. */
FT_VEC_CLONES static void hidden_bwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0,
                                            const void *vctx) {
    const outs2 *q = vctx;
    int in = (q->a >= 0) + (q->b >= 0);
    _Alignas(64) float vo[TILE], vc[TILE];
    for (int64_t at = 0; at < n; at += TILE) {
        int64_t m = n - at < TILE ? n - at : TILE;
        const float *dh = p[in] + at, *o = p[in + 1] + at, *c = p[in + 2] + at;
        FT_SIMD_FOR(e, m) {
            float s = ft_sigmoidf(o[e]), t = ft_tanhf(c[e]);
            vo[e] = dh[e] * t * (s * (1.0f - s));
            vc[e] = dh[e] * s * fmaf(-t, t, 1.0f);
        }
        if (q->a >= 0)
            ft_pw_put(p[q->a] + at, vo, m, q->acc_a);
        if (q->b >= 0)
            ft_pw_put(p[q->b] + at, vc, m, q->acc_b);
    }
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
    run_outs2(hidden_bwd_kernel, dgates ? &dgo : NULL, dc, accumulate_gates, accumulate_c, dh, &o, c);
    return FT_OK;
}
