/* add (+ act), mul and concat.
 *
 * Legend: n elements of contiguous float arrays in the loops; CHUNK floats of
 * a stack buffer that keeps a fused intermediate in L1. */
#include "ops/elementwise.h"

#include <stdio.h>

#include "ops/activation.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

#define CHUNK 512

/* ---- loops ---- */

FT_VEC_CLONES
static void add_loop(float *y, const float *a, const float *b, int64_t n) { FT_SIMD_FOR(i, n) y[i] = a[i] + b[i]; }

FT_VEC_CLONES
static void mul_loop(float *y, const float *a, const float *b, int64_t n, bool accumulate) {
    if (accumulate)
        FT_SIMD_FOR(i, n) y[i] += a[i] * b[i];
    else
        FT_SIMD_FOR(i, n) y[i] = a[i] * b[i];
}

/* ---- add ---- */

typedef struct {
    ft_act act;
} add_fwd_ctx;

static void add_fwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const add_fwd_ctx *c = vctx;
    float *y = p[0];
    const float *a = p[1], *b = p[2];
    if (c->act.kind == FT_ACT_NONE) {
        add_loop(y, a, b, n);
        return;
    }
    for (int64_t off = 0; off < n; off += CHUNK) {
        int64_t m = n - off < CHUNK ? n - off : CHUNK;
        add_loop(y + off, a + off, b + off, m);
        ft_act_forward_f32(y + off, y + off, m, c->act);
    }
}

/* out = a (op) b: floating tensors of one shape on one device; out writable
 * and not partly overlapping a or b. */
static ft_status check_binary(const char *op, const ft_tensor *out, const ft_tensor *a, const ft_tensor *b,
                              ft_device dev) {
    FT_TRY(ft_check_float_on(op, "a", a, dev, "a", true));
    FT_TRY(ft_check_float_on(op, "b", b, dev, "a", true));
    FT_TRY(ft_check_float_on(op, "out", out, dev, "a", true));
    FT_TRY(ft_check_shape_as(op, "b", b, a));
    FT_TRY(ft_check_shape_as(op, "out", out, a));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "a", a));
    return ft_check_alias(op, "out", out, "b", b);
}

ft_status ft_add_forward(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b, ft_act act) {
    const char *op = "add";
    if ((int)act.kind < 0 || act.kind >= FT_NUM_ACTS)
        return ft_fail(FT_ERR_VALUE, "%s: unknown activation kind %d", op, (int)act.kind);
    ft_device dev = ft_op_device(a);
    FT_TRY(check_binary(op, out, a, b, dev));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, add_forward, out, a, b, act);
    add_fwd_ctx c = {act};
    ft_pw_loop l = {.nops = 3, .nout = 1, .t = {out, a, b}, .fn = add_fwd_kernel, .ctx = &c};
    ft_pw_run(&l);
    return FT_OK;
}

/* Operands: outputs [da][db], then dout, then the saved source: out, or a and b. */
typedef struct {
    ft_act act;
    int da, db, dout, s0, s1; /* operand slots, -1 when absent */
    bool from_output, acc_a, acc_b;
} add_bwd_ctx;

static void add_bwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const add_bwd_ctx *c = vctx;
    const float *dout = p[c->dout];
    float *da = c->da >= 0 ? p[c->da] : NULL, *db = c->db >= 0 ? p[c->db] : NULL;
    if (c->act.kind == FT_ACT_NONE) {
        /* db first: da may be dout itself, and with accumulate changes it */
        if (db)
            ft_pw_put(db, dout, n, c->acc_b);
        if (da)
            ft_pw_put(da, dout, n, c->acc_a);
        return;
    }
    _Alignas(64) float g[CHUNK], s[CHUNK];
    for (int64_t off = 0; off < n; off += CHUNK) {
        int64_t m = n - off < CHUNK ? n - off : CHUNK;
        const float *src = p[c->s0] + off;
        if (!c->from_output) {
            add_loop(s, p[c->s0] + off, p[c->s1] + off, m);
            src = s;
        }
        ft_act_backward_f32(g, dout + off, src, m, c->act, c->from_output, false);
        if (da)
            ft_pw_put(da + off, g, m, c->acc_a);
        if (db)
            ft_pw_put(db + off, g, m, c->acc_b);
    }
}

/* The checks of a backward's optional gradient output `d` against dout (on dev). */
static ft_status check_grad(const char *op, const char *arg, const ft_tensor *d, const ft_tensor *dout,
                            ft_device dev) {
    FT_TRY(ft_check_float_on(op, arg, d, dev, "dout", true));
    FT_TRY(ft_check_shape_as(op, arg, d, dout));
    FT_TRY(ft_check_output(op, arg, d));
    return ft_check_alias(op, arg, d, "dout", dout);
}

/* dout, and the gradients da and db (either may be NULL) a backward writes:
 * each like dout, and never sharing memory with each other. */
static ft_status check_grads(const char *op, const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout,
                             ft_device dev) {
    FT_TRY(ft_check_float_on(op, "dout", dout, dev, "dout", true));
    if (da)
        FT_TRY(check_grad(op, "da", da, dout, dev));
    if (db)
        FT_TRY(check_grad(op, "db", db, dout, dev));
    if (da && db && ft_tensor_numel(da) > 0 &&
        (ft_same_view(da, db) || ft_check_alias(op, "da", da, "db", db) != FT_OK))
        return ft_fail(FT_ERR_VALUE, "%s: da and db must not share memory", op);
    return FT_OK;
}

static ft_status check_saved(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *dout,
                             ft_device dev, const char *const *out_args, const ft_tensor *const *outs) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, "dout", true));
    FT_TRY(ft_check_shape_as(op, arg, t, dout));
    for (int i = 0; i < 2; i++)
        if (outs[i])
            FT_TRY(ft_check_alias(op, out_args[i], outs[i], arg, t));
    return FT_OK;
}

ft_status ft_add_backward(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                          const ft_tensor *b, const ft_tensor *out, ft_act act, bool accumulate_a,
                          bool accumulate_b) {
    const char *op = "add_backward";
    if ((int)act.kind < 0 || act.kind >= FT_NUM_ACTS)
        return ft_fail(FT_ERR_VALUE, "%s: unknown activation kind %d", op, (int)act.kind);
    ft_device dev = ft_op_device(dout);
    FT_TRY(check_grads(op, da, db, dout, dev));
    const char *out_args[2] = {"da", "db"};
    const ft_tensor *outs[2] = {da, db};
    if (!da && !db)
        return FT_OK;
    add_bwd_ctx c = {.act = act, .da = -1, .db = -1, .s0 = -1, .s1 = -1, .acc_a = accumulate_a,
                     .acc_b = accumulate_b};
    ft_pw_loop l = {.fn = add_bwd_kernel, .ctx = &c};
    if (da)
        c.da = l.nops, l.t[l.nops++] = da;
    if (db)
        c.db = l.nops, l.t[l.nops++] = db;
    l.nout = l.nops;
    l.read_outputs = (da && accumulate_a) || (db && accumulate_b);
    c.dout = l.nops, l.t[l.nops++] = dout;
    if (act.kind != FT_ACT_NONE) {
        c.from_output = out && ft_act_grad_uses_output(act);
        if (c.from_output) {
            FT_TRY(check_saved(op, "out", out, dout, dev, out_args, outs));
            c.s0 = l.nops, l.t[l.nops++] = out;
        } else {
            if (!a || !b)
                return ft_fail(FT_ERR_VALUE, "%s: the derivative of %s needs the inputs a and b%s", op,
                               ft_act_name(act.kind), ft_act_grad_uses_output(act) ? " or the output out" : "");
            FT_TRY(check_saved(op, "a", a, dout, dev, out_args, outs));
            FT_TRY(check_saved(op, "b", b, dout, dev, out_args, outs));
            c.s0 = l.nops, l.t[l.nops++] = a;
            c.s1 = l.nops, l.t[l.nops++] = b;
        }
    }
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, add_backward, da, db, dout, a, b, out, act, accumulate_a, accumulate_b);
    ft_pw_run(&l);
    return FT_OK;
}

/* ---- mul ---- */

static void mul_fwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    mul_loop(p[0], p[1], p[2], n, false);
}

ft_status ft_mul_forward(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b) {
    const char *op = "mul";
    ft_device dev = ft_op_device(a);
    FT_TRY(check_binary(op, out, a, b, dev));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, mul_forward, out, a, b);
    ft_pw_loop l = {.nops = 3, .nout = 1, .t = {out, a, b}, .fn = mul_fwd_kernel};
    ft_pw_run(&l);
    return FT_OK;
}

typedef struct {
    int da, db, dout, a, b;
    bool acc_a, acc_b;
} mul_bwd_ctx;

static void mul_bwd_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const mul_bwd_ctx *c = vctx;
    /* da may be dout or a itself, db dout or b: compute into a chunk first
     * when both are wanted, so that neither write is seen by the other. */
    if (c->da >= 0 && c->db >= 0) {
        _Alignas(64) float ga[CHUNK];
        for (int64_t off = 0; off < n; off += CHUNK) {
            int64_t m = n - off < CHUNK ? n - off : CHUNK;
            mul_loop(ga, p[c->dout] + off, p[c->b] + off, m, false);
            mul_loop(p[c->db] + off, p[c->dout] + off, p[c->a] + off, m, c->acc_b);
            ft_pw_put(p[c->da] + off, ga, m, c->acc_a);
        }
    } else if (c->da >= 0) {
        mul_loop(p[c->da], p[c->dout], p[c->b], n, c->acc_a);
    } else {
        mul_loop(p[c->db], p[c->dout], p[c->a], n, c->acc_b);
    }
}

ft_status ft_mul_backward(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                          const ft_tensor *b, bool accumulate_a, bool accumulate_b) {
    const char *op = "mul_backward";
    ft_device dev = ft_op_device(dout);
    FT_TRY(check_grads(op, da, db, dout, dev));
    const char *out_args[2] = {"da", "db"};
    const ft_tensor *outs[2] = {da, db};
    if (!da && !db)
        return FT_OK;
    if ((da && !b) || (db && !a))
        return ft_fail(FT_ERR_VALUE, "%s: da needs b and db needs a", op);
    mul_bwd_ctx c = {.da = -1, .db = -1, .a = -1, .b = -1, .acc_a = accumulate_a, .acc_b = accumulate_b};
    ft_pw_loop l = {.fn = mul_bwd_kernel, .ctx = &c};
    if (da)
        c.da = l.nops, l.t[l.nops++] = da;
    if (db)
        c.db = l.nops, l.t[l.nops++] = db;
    l.nout = l.nops;
    l.read_outputs = (da && accumulate_a) || (db && accumulate_b);
    c.dout = l.nops, l.t[l.nops++] = dout;
    if (db) {
        FT_TRY(check_saved(op, "a", a, dout, dev, out_args, outs));
        c.a = l.nops, l.t[l.nops++] = a;
    }
    if (da) {
        FT_TRY(check_saved(op, "b", b, dout, dev, out_args, outs));
        c.b = l.nops, l.t[l.nops++] = b;
    }
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, mul_backward, da, db, dout, a, b, accumulate_a, accumulate_b);
    ft_pw_run(&l);
    return FT_OK;
}

/* ---- concat ---- */

typedef struct {
    bool accumulate;
} copy_ctx;

static void copy_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const copy_ctx *c = vctx;
    ft_pw_put(p[0], p[1], n, c->accumulate);
}

/* The view of t that holds [start, start + size) along dim. */
static ft_tensor narrow(const ft_tensor *t, int dim, int64_t start, int64_t size) {
    ft_tensor v = *t;
    v.shape[dim] = size;
    if (size > 0)
        v.offset += start * t->strides[dim] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    return v;
}

static ft_status concat_dim(const char *op, int *dim, const ft_tensor *ref, int n) {
    if (n < 1)
        return ft_fail(FT_ERR_VALUE, "%s: needs at least one tensor", op);
    if (ref->ndim == 0)
        return ft_fail(FT_ERR_SHAPE, "%s: zero-dimensional tensors cannot be concatenated", op);
    if (*dim < -ref->ndim || *dim >= ref->ndim)
        return ft_fail(FT_ERR_INDEX, "%s: dim %d is out of range for %d-d tensors", op, *dim, ref->ndim);
    if (*dim < 0)
        *dim += ref->ndim;
    return FT_OK;
}

/* A part must have whole's shape except along dim. */
static ft_status check_part(const char *op, const char *arg, const ft_tensor *part, const ft_tensor *whole,
                            int dim, int64_t size) {
    int64_t want[FT_MAX_DIMS];
    for (int d = 0; d < whole->ndim; d++)
        want[d] = d == dim ? (size >= 0 ? size : part->shape[d]) : whole->shape[d];
    return ft_check_shape(op, arg, part, whole->ndim, want);
}

ft_status ft_concat_forward(const ft_tensor *out, const ft_tensor *const *inps, int n, int dim) {
    const char *op = "concat";
    ft_device dev = ft_op_device(out);
    FT_TRY(ft_check_float_on(op, "out", out, dev, "out", true));
    FT_TRY(concat_dim(op, &dim, out, n));
    FT_TRY(ft_check_output(op, "out", out));
    int64_t total = 0;
    char arg[32];
    for (int i = 0; i < n; i++) {
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (!inps[i])
            return ft_fail(FT_ERR_VALUE, "%s: %s is missing", op, arg);
        FT_TRY(ft_check_float_on(op, arg, inps[i], dev, "out", true));
        if (inps[i]->ndim != out->ndim)
            FT_TRY(ft_check_ndim(op, arg, inps[i], out->ndim, "(those of out)"));
        FT_TRY(check_part(op, arg, inps[i], out, dim, -1));
        total += inps[i]->shape[dim];
    }
    if (total != out->shape[dim])
        return ft_fail(FT_ERR_SHAPE, "%s: out has size %lld along dim %d but the inputs add up to %lld", op,
                       (long long)out->shape[dim], dim, (long long)total);
    /* every input either is its slice of out or does not overlap out */
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        ft_tensor slice = narrow(out, dim, start, inps[i]->shape[dim]);
        snprintf(arg, sizeof arg, "inputs[%d]", i);
        if (!ft_same_view(&slice, inps[i]))
            FT_TRY(ft_check_alias(op, "out", out, arg, inps[i]));
        start += inps[i]->shape[dim];
    }
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, concat_forward, out, inps, n, dim);
    copy_ctx c = {false};
    start = 0;
    for (int i = 0; i < n; i++) {
        ft_tensor slice = narrow(out, dim, start, inps[i]->shape[dim]);
        start += inps[i]->shape[dim];
        if (ft_same_view(&slice, inps[i]))
            continue;
        ft_pw_loop l = {.nops = 2, .nout = 1, .t = {&slice, inps[i]}, .fn = copy_kernel, .ctx = &c};
        ft_pw_run(&l);
    }
    return FT_OK;
}

ft_status ft_concat_backward(const ft_tensor *const *dinps, const int64_t *sizes, int n, const ft_tensor *dout,
                             int dim, bool accumulate) {
    const char *op = "concat_backward";
    ft_device dev = ft_op_device(dout);
    FT_TRY(ft_check_float_on(op, "dout", dout, dev, "dout", true));
    FT_TRY(concat_dim(op, &dim, dout, n));
    int64_t total = 0;
    char arg[32];
    for (int i = 0; i < n; i++) {
        snprintf(arg, sizeof arg, "sizes[%d]", i);
        if (sizes[i] < 0)
            return ft_fail(FT_ERR_VALUE, "%s: %s is negative (%lld)", op, arg, (long long)sizes[i]);
        total += sizes[i];
    }
    if (total != dout->shape[dim])
        return ft_fail(FT_ERR_SHAPE, "%s: dout has size %lld along dim %d but the sizes add up to %lld", op,
                       (long long)dout->shape[dim], dim, (long long)total);
    /* a gradient either is its own slice of dout (nothing to copy) or does
     * not overlap dout */
    total = 0;
    for (int i = 0; i < n; i++) {
        ft_tensor slice = narrow(dout, dim, total, sizes[i]);
        total += sizes[i];
        if (!dinps[i])
            continue;
        snprintf(arg, sizeof arg, "grads[%d]", i);
        FT_TRY(ft_check_float_on(op, arg, dinps[i], dev, "dout", true));
        FT_TRY(check_part(op, arg, dinps[i], dout, dim, sizes[i]));
        FT_TRY(ft_check_output(op, arg, dinps[i]));
        if (!accumulate && ft_same_view(&slice, dinps[i]))
            continue;
        FT_TRY(ft_check_alias(op, arg, dinps[i], "dout", dout));
    }
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, concat_backward, dinps, sizes, n, dout, dim, accumulate);
    copy_ctx c = {accumulate};
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        ft_tensor slice = narrow(dout, dim, start, sizes[i]);
        start += sizes[i];
        if (!dinps[i] || (!accumulate && ft_same_view(&slice, dinps[i])))
            continue;
        ft_pw_loop l = {.nops = 2, .nout = 1, .t = {dinps[i], &slice}, .read_outputs = accumulate,
                        .fn = copy_kernel, .ctx = &c};
        ft_pw_run(&l);
    }
    return FT_OK;
}
