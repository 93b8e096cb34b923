/* Activations: entry points, checks and the vectorised loops.
 *
 * Legend: n elements of contiguous float arrays; tensors all of inp's shape. */
#include "ops/activation.h"

#include <stdio.h>

#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

const char *ft_act_name(ft_act_kind kind) {
    switch (kind) {
    case FT_ACT_NONE: return "identity";
    case FT_ACT_RELU: return "relu";
    case FT_ACT_LEAKY_RELU: return "leaky_relu";
    case FT_ACT_GELU: return "gelu";
    case FT_ACT_GELU_TANH: return "gelu_tanh";
    case FT_ACT_SILU: return "silu";
    case FT_ACT_SIGMOID: return "sigmoid";
    case FT_ACT_TANH: return "tanh";
    case FT_ACT_HARDSWISH: return "hardswish";
    case FT_ACT_ABS: return "abs";
    case FT_ACT_SOFTPLUS: return "softplus";
    case FT_ACT_HUBER: return "huber";
    case FT_ACT_XLOGX: return "xlogx";
    case FT_ACT_EXP: return "exp";
    case FT_ACT_LOG: return "log";
    case FT_ACT_POW: return "pow";
    case FT_ACT_CLAMP_MIN: return "clamp_min";
    case FT_ACT_CLAMP_MAX: return "clamp_max";
    case FT_ACT_STD_SQRT: return "std_sqrt";
    case FT_ACT_LOG_FLOOR: return "log_floor";
    case FT_ACT_ERF: return "erf";
    case FT_ACT_SIN: return "sin";
    case FT_ACT_COS: return "cos";
    default: return "activation";
    }
}

/* ---- loops ---- */

FT_VEC_CLONES
void ft_act_forward_f32(float *y, const float *x, int64_t n, ft_act act) {
    float alpha = act.alpha;
    switch (act.kind) {
    case FT_ACT_RELU: FT_SIMD_FOR(i, n) y[i] = ft_relu(x[i]); break;
    case FT_ACT_LEAKY_RELU: FT_SIMD_FOR(i, n) y[i] = ft_leaky_relu(x[i], alpha); break;
    case FT_ACT_GELU: FT_SIMD_FOR(i, n) y[i] = ft_gelu(x[i]); break;
    case FT_ACT_GELU_TANH: FT_SIMD_FOR(i, n) y[i] = ft_gelu_tanh(x[i]); break;
    case FT_ACT_SILU: FT_SIMD_FOR(i, n) y[i] = ft_silu(x[i]); break;
    case FT_ACT_SIGMOID: FT_SIMD_FOR(i, n) y[i] = ft_sigmoidf(x[i]); break;
    case FT_ACT_TANH: FT_SIMD_FOR(i, n) y[i] = ft_tanhf(x[i]); break;
    case FT_ACT_HARDSWISH: FT_SIMD_FOR(i, n) y[i] = ft_hardswish(x[i]); break;
    case FT_ACT_ABS: FT_SIMD_FOR(i, n) y[i] = fabsf(x[i]); break;
    case FT_ACT_EXP: FT_SIMD_FOR(i, n) y[i] = ft_expf(x[i]); break;
    case FT_ACT_CLAMP_MIN: FT_SIMD_FOR(i, n) y[i] = ft_clamp_min(x[i], alpha); break;
    case FT_ACT_CLAMP_MAX: FT_SIMD_FOR(i, n) y[i] = ft_clamp_max(x[i], alpha); break;
    case FT_ACT_STD_SQRT: FT_SIMD_FOR(i, n) y[i] = sqrtf(x[i]); break;
    case FT_ACT_SOFTPLUS:
    case FT_ACT_HUBER:
    case FT_ACT_XLOGX:
    case FT_ACT_LOG:
    case FT_ACT_LOG_FLOOR:
    case FT_ACT_ERF:
    case FT_ACT_SIN:
    case FT_ACT_COS:
    case FT_ACT_POW: /* libm's log, pow, sqrt, erf, sin, cos: not vectorized */
        for (int64_t i = 0; i < n; i++)
            y[i] = ft_act_forward(act, x[i]);
        break;
    default:
        if (y != x)
            FT_SIMD_FOR(i, n) y[i] = x[i];
        break;
    }
}

/* dx = dy * G, or dx += dy * G, G an expression of element i. */
#define GRAD_LOOP(G)                                                     \
    do {                                                                 \
        if (accumulate)                                                  \
            FT_SIMD_FOR(i, n) dx[i] += dy[i] * (G);                      \
        else                                                             \
            FT_SIMD_FOR(i, n) dx[i] = dy[i] * (G);                       \
    } while (0)

/* dx = (C ? dy : dy * alpha), the select form of relu (alpha 0) and leaky relu. */
#define SELECT_LOOP(C)                                                                 \
    do {                                                                               \
        if (accumulate)                                                                \
            FT_SIMD_FOR(i, n) dx[i] += (C) ? dy[i] : (alpha == 0.0f ? 0.0f : dy[i] * alpha); \
        else                                                                           \
            FT_SIMD_FOR(i, n) dx[i] = (C) ? dy[i] : (alpha == 0.0f ? 0.0f : dy[i] * alpha);  \
    } while (0)

FT_VEC_CLONES
void ft_act_backward_f32(float *dx, const float *dy, const float *s, int64_t n, ft_act act, bool from_output,
                         bool accumulate) {
    float alpha = act.kind == FT_ACT_LEAKY_RELU ? act.alpha : 0.0f;
    switch (act.kind) {
    case FT_ACT_RELU:
    case FT_ACT_LEAKY_RELU:
        /* y > 0 exactly where x > 0 (alpha >= 0 when from the output) */
        SELECT_LOOP(s[i] > 0.0f);
        break;
    case FT_ACT_GELU: GRAD_LOOP(ft_gelu_grad(s[i])); break;
    case FT_ACT_GELU_TANH: GRAD_LOOP(ft_gelu_tanh_grad(s[i])); break;
    case FT_ACT_SILU: GRAD_LOOP(ft_silu_grad(s[i])); break;
    case FT_ACT_SIGMOID:
        if (from_output)
            GRAD_LOOP(s[i] * (1.0f - s[i]));
        else
            GRAD_LOOP(ft_sigmoid_grad(s[i]));
        break;
    case FT_ACT_TANH:
        if (from_output)
            GRAD_LOOP(1.0f - s[i] * s[i]);
        else
            GRAD_LOOP(ft_tanh_grad(s[i]));
        break;
    case FT_ACT_HARDSWISH: GRAD_LOOP(ft_hardswish_grad(s[i])); break;
    case FT_ACT_ABS: GRAD_LOOP(ft_sign(s[i])); break;
    case FT_ACT_SOFTPLUS: GRAD_LOOP(ft_sigmoidf(s[i])); break;
    case FT_ACT_HUBER: GRAD_LOOP(ft_huber_grad(s[i], act.alpha)); break;
    case FT_ACT_EXP: GRAD_LOOP(ft_expf(s[i])); break;
    case FT_ACT_CLAMP_MIN: GRAD_LOOP(ft_clamp_min_grad(s[i], act.alpha)); break;
    case FT_ACT_CLAMP_MAX: GRAD_LOOP(ft_clamp_max_grad(s[i], act.alpha)); break;
    case FT_ACT_STD_SQRT: GRAD_LOOP(ft_std_sqrt_grad(s[i])); break;
    case FT_ACT_ERF: GRAD_LOOP(ft_erf_grad(s[i])); break;
    case FT_ACT_SIN: GRAD_LOOP(cosf(s[i])); break;
    case FT_ACT_COS: GRAD_LOOP(-sinf(s[i])); break;
    case FT_ACT_XLOGX:
    case FT_ACT_LOG:
    case FT_ACT_LOG_FLOOR:
    case FT_ACT_POW:
        for (int64_t i = 0; i < n; i++)
            dx[i] = (accumulate ? dx[i] : 0.0f) + dy[i] * ft_act_grad_from_input(act, s[i]);
        break;
    default:
        if (accumulate)
            FT_SIMD_FOR(i, n) dx[i] += dy[i];
        else if (dx != dy)
            FT_SIMD_FOR(i, n) dx[i] = dy[i];
        break;
    }
}

/* ---- entry points ---- */

typedef struct {
    ft_act act;
    bool from_output, accumulate;
} act_ctx;

static void fwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const act_ctx *c = vctx;
    ft_act_forward_f32(p[0], p[1], n, c->act);
}

static void bwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const act_ctx *c = vctx;
    ft_act_backward_f32(p[0], p[1], p[2], n, c->act, c->from_output, c->accumulate);
}

static ft_status check_act(const char *op, ft_act act) {
    if ((int)act.kind < 0 || act.kind >= FT_NUM_ACTS)
        return ft_fail(FT_ERR_VALUE, "%s: unknown activation kind %d", op, (int)act.kind);
    if (act.alpha != act.alpha)
        return ft_fail(FT_ERR_VALUE, "%s: the activation parameter is NaN", op);
    if (act.kind == FT_ACT_HUBER && !(act.alpha > 0))
        return ft_fail(FT_ERR_VALUE, "%s: delta must be positive, got %g", op, (double)act.alpha);
    return FT_OK;
}

ft_status ft_activation_forward(const ft_tensor *out, const ft_tensor *inp, ft_act act) {
    const char *op = ft_act_name(act.kind);
    FT_TRY(check_act(op, act));
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on(op, "inp", inp, dev, "inp", true));
    FT_TRY(ft_check_float_on(op, "out", out, dev, "inp", true));
    FT_TRY(ft_check_shape_as(op, "out", out, inp));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "inp", inp));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, activation_forward, out, inp, act);
    act_ctx c = {act, false, false};
    ft_pw_loop l = {.nops = 2, .nout = 1, .t = {out, inp}, .fn = fwd_kernel, .ctx = &c};
    ft_pw_run(&l);
    return FT_OK;
}

ft_status ft_activation_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *inp,
                                 const ft_tensor *out, ft_act act, bool accumulate) {
    char op[48];
    snprintf(op, sizeof op, "%s_backward", ft_act_name(act.kind));
    FT_TRY(check_act(op, act));
    bool from_output = out && ft_act_grad_uses_output(act);
    const ft_tensor *saved = from_output ? out : inp;
    if (!saved) {
        if (ft_act_grad_uses_output(act))
            return ft_fail(FT_ERR_VALUE, "%s: needs the forward input inp or output out", op);
        return ft_fail(FT_ERR_VALUE, "%s: needs the forward input inp (the derivative of %s is not a function "
                                     "of its output%s)",
                       op, ft_act_name(act.kind), act.kind == FT_ACT_LEAKY_RELU ? " for a negative slope" : "");
    }
    const char *saved_arg = from_output ? "out" : "inp";
    ft_device dev = ft_op_device(dout);
    FT_TRY(ft_check_float_on(op, "dout", dout, dev, "dout", true));
    FT_TRY(ft_check_float_on(op, "dinp", dinp, dev, "dout", true));
    FT_TRY(ft_check_float_on(op, saved_arg, saved, dev, "dout", true));
    FT_TRY(ft_check_shape_as(op, "dinp", dinp, dout));
    FT_TRY(ft_check_shape_as(op, saved_arg, saved, dout));
    FT_TRY(ft_check_output(op, "dinp", dinp));
    FT_TRY(ft_check_alias(op, "dinp", dinp, "dout", dout));
    FT_TRY(ft_check_alias(op, "dinp", dinp, saved_arg, saved));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, activation_backward, dinp, dout, inp, out, act, accumulate);
    act_ctx c = {act, from_output, accumulate};
    ft_pw_loop l = {.nops = 3, .nout = 1, .t = {dinp, dout, saved}, .read_outputs = accumulate,
                    .fn = bwd_kernel, .ctx = &c};
    ft_pw_run(&l);
    return FT_OK;
}
