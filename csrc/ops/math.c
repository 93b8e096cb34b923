#include "ops/math.h"

#include <string.h>

#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

/* Indexed by ft_math_op and ft_red_op: the names _C takes. */
static const char *const op_names[FT_MATH_NUM_OPS] = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "bitwise_not", "logical_not",
    "add", "sub", "mul", "div", "trunc_divide", "floor_divide", "remainder", "pow", "maximum", "minimum",
    "bitwise_and", "bitwise_or", "bitwise_xor", "eq", "ne", "lt", "le", "gt", "ge", "where", "clamp"};
static const char *const red_names[FT_RED_NUM_OPS] = {"sum", "mean", "var", "std", "max", "min", "all", "any"};

ft_status ft_math_op_of(const char *name, ft_math_op *op) {
    for (int k = 0; k < FT_MATH_NUM_OPS; k++)
        if (!strcmp(name, op_names[k])) {
            *op = (ft_math_op)k;
            return FT_OK;
        }
    return ft_fail(FT_ERR_VALUE, "unknown elementwise op '%s'", name);
}

ft_status ft_red_op_of(const char *name, ft_red_op *op) {
    for (int k = 0; k < FT_RED_NUM_OPS; k++)
        if (!strcmp(name, red_names[k])) {
            *op = (ft_red_op)k;
            return FT_OK;
        }
    return ft_fail(FT_ERR_VALUE, "unknown reduction '%s'", name);
}

/* ---- checks ---- */

static ft_status check_dtype(const char *op, const char *what, ft_dtype dt) {
    if (!ft_dtype_valid((int)dt) || ft_dtype_is_complex(dt))
        return ft_fail(FT_ERR_DTYPE, "%s: %s must be a real or bool dtype, got %s", op, what,
                       ft_dtype_valid((int)dt) ? ft_dtype_get(dt)->name : "an invalid dtype code");
    return FT_OK;
}

/* Whether op is defined in compute's domain (the CPU path refuses the rest
 * before computing, with the messages of its own checks). */
static bool op_takes(ft_math_op op, ft_dtype compute) {
    bool is_float = ft_dtype_is_float(compute);
    switch (op) {
    case FT_MATH_EXP:
    case FT_MATH_LOG:
    case FT_MATH_SQRT:
    case FT_MATH_RSQRT:
    case FT_MATH_TANH:
    case FT_MATH_SIGMOID:
    case FT_MATH_DIV: return is_float;
    case FT_MATH_BITWISE_NOT:
    case FT_MATH_BITWISE_AND:
    case FT_MATH_BITWISE_OR:
    case FT_MATH_BITWISE_XOR: return !is_float;
    case FT_MATH_LOGICAL_NOT: return compute == FT_BOOL;
    case FT_MATH_NEG:
    case FT_MATH_ABS:
    case FT_MATH_RELU:
    case FT_MATH_SUB:
    case FT_MATH_DIV_FLOOR:
    case FT_MATH_REMAINDER:
    case FT_MATH_POW: return compute != FT_BOOL;
    default: return true;
    }
}

static const char *arg_name(ft_math_op op, int k) {
    static const char *const plain[] = {"input", "other"}, *const where[] = {"condition", "input", "other"},
                             *const clamp[] = {"input", "min", "max"};
    return op == FT_MATH_WHERE ? where[k] : op == FT_MATH_CLAMP ? clamp[k] : plain[k];
}

/* A scalar in compute's domain: cast to compute, or to float32 for a 16-bit
 * compute dtype (as the CPU path's np.array(x).astype(float32)). */
static ft_math_val scalar_value(ft_scalar s, ft_dtype compute) {
    ft_dtype to = compute == FT_FLOAT16 || compute == FT_BFLOAT16 ? FT_FLOAT32 : compute;
    ft_wide w = s.kind == FT_SCALAR_FLOAT ? ft_wide_f64(s.f) : s.kind == FT_SCALAR_UINT ? ft_wide_u64(s.u)
                                                                                        : ft_wide_i64(s.i);
    uint64_t buf;
    ft_store_wide(&buf, to, w);
    return ft_math_load(&buf, to, to);
}

/* ---- elementwise ---- */

/* The CPU loop of the float ops a program's nodes run (masked fills, comparisons, a mask's 0/1 floats) and of most
 * eager float math: typed loads along the walk's innermost dimension where each operand is bool or of the compute
 * dtype (float32, bfloat16; bool for a mask's logical ops), instead of the element function's casts through the
 * widest types. These ops round once in float, as the element function does, so the results are its own. */
static bool fast_op(ft_math_op op, ft_dtype compute) {
    if (compute == FT_BOOL)
        return op == FT_MATH_LOGICAL_NOT || op == FT_MATH_WHERE || op == FT_MATH_EQ || op == FT_MATH_NE;
    if (compute != FT_FLOAT32 && compute != FT_BFLOAT16)
        return false;
    switch (op) {
    case FT_MATH_NEG:
    case FT_MATH_ABS:
    case FT_MATH_RELU:
    case FT_MATH_ADD:
    case FT_MATH_SUB:
    case FT_MATH_MUL:
    case FT_MATH_DIV:
    case FT_MATH_MAXIMUM:
    case FT_MATH_MINIMUM:
    case FT_MATH_CLAMP:
    case FT_MATH_WHERE: return true;
    default: return ft_math_is_comparison(op);
    }
}

enum { FAST_BLOCK = 16384, FAST_RUN = 256 };

/* The element function's maximum and minimum: NaN wins. */
static inline float fast_max(float a, float b) { return a >= b || a != a ? a : b; }
static inline float fast_min(float a, float b) { return a <= b || a != a ? a : b; }

#define FAST_LOOP(expr)                                                                                              \
    for (int64_t j = 0; j < n; j++) {                                                                                \
        float x = a[j], y = b[j], z = c[j];                                                                          \
        (void)y, (void)z;                                                                                            \
        r[j] = (expr);                                                                                               \
    }                                                                                                                \
    break

/* r = op(a, b, c) over n values. */
static void fast_apply(ft_math_op op, float *r, const float *a, const float *b, const float *c, int64_t n) {
    switch (op) {
    case FT_MATH_WHERE: FAST_LOOP(x != 0 ? y : z);
    case FT_MATH_EQ: FAST_LOOP(x == y);
    case FT_MATH_NE: FAST_LOOP(x != y);
    case FT_MATH_LT: FAST_LOOP(x < y);
    case FT_MATH_LE: FAST_LOOP(x <= y);
    case FT_MATH_GT: FAST_LOOP(x > y);
    case FT_MATH_GE: FAST_LOOP(x >= y);
    case FT_MATH_LOGICAL_NOT: FAST_LOOP(x == 0);
    case FT_MATH_NEG: FAST_LOOP(-x);
    case FT_MATH_ABS: FAST_LOOP(fabsf(x));
    case FT_MATH_RELU: FAST_LOOP(fast_max(x, 0));
    case FT_MATH_ADD: FAST_LOOP(x + y);
    case FT_MATH_SUB: FAST_LOOP(x - y);
    case FT_MATH_MUL: FAST_LOOP(x * y);
    case FT_MATH_DIV: FAST_LOOP(x / y);
    case FT_MATH_MAXIMUM: FAST_LOOP(fast_max(x, y));
    case FT_MATH_MINIMUM: FAST_LOOP(fast_min(x, y));
    default: FAST_LOOP(fast_min(fast_max(x, y), z)); /* clamp */
    }
}

#undef FAST_LOOP

/* Elements [i0, i1) of m, FAST_RUN at a time along the innermost dimension. */
static void fast_block(const ft_math_map *m, int64_t i0, int64_t i1) {
    const ft_math_walk *w = &m->walk;
    int last = w->ndim - 1;
    int64_t inner = last >= 0 ? w->shape[last] : 1, size[FT_MATH_SLOTS], step[FT_MATH_SLOTS];
    const char *base[FT_MATH_SLOTS] = {m->out, m->in[0], m->in[1], m->in[2]};
    ft_dtype dt[FT_MATH_SLOTS] = {m->out_dtype, m->in_dtype[0], m->in_dtype[1], m->in_dtype[2]};
    float v[4][FAST_RUN] = {{0}};
    for (int k = 0; k < FT_MATH_SLOTS; k++) {
        size[k] = k == 0 || (k <= m->nin && base[k]) ? ft_math_itemsize(dt[k]) : 0;
        step[k] = last >= 0 ? w->st[k][last] * size[k] : 0;
    }
    for (int k = 0; k < m->nin; k++)
        if (!base[k + 1])
            for (int j = 0; j < FAST_RUN; j++)
                v[k + 1][j] = m->compute == FT_BOOL ? (float)m->scalar[k].i : (float)m->scalar[k].f;
    for (int64_t i = i0; i < i1;) {
        int64_t off[FT_MATH_SLOTS], n = inner - i % inner;
        n = n < i1 - i ? n : i1 - i;
        n = n < FAST_RUN ? n : FAST_RUN;
        ft_math_offsets(w, i, off);
        for (int k = 1; k <= m->nin; k++)
            if (base[k])
                ft_pw_gather(v[k], base[k] + off[k] * size[k], step[k], dt[k], n);
        fast_apply(m->op, v[0], v[1], v[2], v[3], n);
        ft_pw_scatter(m->out + off[0] * size[0], step[0], dt[0], v[0], n);
        i += n;
    }
}

/* Whether m's operands suit fast_block: each bool or of the compute dtype, out too. */
static bool fast_map(const ft_math_map *m) {
    if (!fast_op(m->op, m->compute) || (m->out_dtype != m->compute && m->out_dtype != FT_BOOL))
        return false;
    for (int k = 0; k < m->nin; k++)
        if (m->in[k] && m->in_dtype[k] != m->compute && m->in_dtype[k] != FT_BOOL)
            return false;
    return true;
}

ft_status ft_math_pointwise(const ft_tensor *out, ft_math_op op, ft_dtype compute, const ft_math_arg *args, int n) {
    if ((unsigned)op >= FT_MATH_NUM_OPS)
        return ft_fail(FT_ERR_VALUE, "unknown elementwise op %d", (int)op);
    const char *name = op_names[op];
    if (n != ft_math_arity(op))
        return ft_fail(FT_ERR_VALUE, "%s: takes %d operands, got %d", name, ft_math_arity(op), n);
    FT_TRY(check_dtype(name, "the compute dtype", compute));
    if (!op_takes(op, compute))
        return ft_fail(FT_ERR_DTYPE, "%s: not supported for %s", name, ft_dtype_get(compute)->name);
    ft_dtype want = ft_math_is_comparison(op) ? FT_BOOL : compute;
    if (out->dtype != want)
        return ft_fail(FT_ERR_DTYPE, "%s: out must be %s, got %s", name, ft_dtype_get(want)->name,
                       ft_dtype_get(out->dtype)->name);
    ft_device dev = ft_op_device(out);
    FT_TRY(ft_check_output(name, "out", out));
    ft_math_map m = {.op = op, .compute = compute, .out_dtype = out->dtype, .nin = n, .out = ft_tensor_data(out)};
    /* Each input's strides over out's dimensions: 0 where it broadcasts. */
    int64_t st[3][FT_MAX_DIMS] = {{0}};
    for (int k = 0; k < n; k++) {
        const ft_tensor *t = args[k].t;
        if (!t) {
            m.scalar[k] = scalar_value(args[k].s, compute);
            continue;
        }
        const char *arg = arg_name(op, k);
        FT_TRY(ft_check_on(name, arg, t, dev, "out"));
        FT_TRY(check_dtype(name, arg, t->dtype));
        FT_TRY(ft_check_alias(name, "out", out, arg, t));
        bool ok = t->ndim <= out->ndim;
        for (int d = 0; ok && d < t->ndim; d++) {
            int od = out->ndim - t->ndim + d;
            ok = t->shape[d] == out->shape[od] || t->shape[d] == 1;
            st[k][od] = t->shape[d] == 1 ? 0 : t->strides[d];
        }
        if (!ok) {
            char a[128], b[128];
            return ft_fail(FT_ERR_SHAPE, "%s: %s %s does not broadcast to out %s", name, arg,
                           ft_shape_str(a, sizeof a, t->ndim, t->shape),
                           ft_shape_str(b, sizeof b, out->ndim, out->shape));
        }
        m.in[k] = ft_tensor_data(t);
        m.in_dtype[k] = t->dtype;
    }
    m.n = ft_tensor_numel(out);
    if (m.n == 0)
        return FT_OK;
    for (int d = 0; d < out->ndim; d++) {
        int64_t s[FT_MATH_SLOTS] = {out->strides[d], st[0][d], st[1][d], st[2][d]};
        ft_math_walk_push(&m.walk, out->shape[d], s);
    }
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(name, math_pointwise, out, &m);
    if (fast_map(&m)) {
        int64_t blocks = (m.n + FAST_BLOCK - 1) / FAST_BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1)
        for (int64_t b = 0; b < blocks; b++)
            fast_block(&m, b * FAST_BLOCK, b * FAST_BLOCK + FAST_BLOCK < m.n ? b * FAST_BLOCK + FAST_BLOCK : m.n);
        return FT_OK;
    }
#pragma omp parallel for schedule(static) if (m.n > 32768)
    for (int64_t i = 0; i < m.n; i++)
        ft_math_map_element(&m, i);
    return FT_OK;
}

/* ---- reductions ---- */

ft_status ft_math_reduce(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp, ft_red_op op,
                         ft_dtype compute, double correction) {
    if ((unsigned)op >= FT_RED_NUM_OPS)
        return ft_fail(FT_ERR_VALUE, "unknown reduction %d", (int)op);
    const char *name = red_names[op];
    ft_device dev = ft_op_device(inp);
    FT_TRY(check_dtype(name, "the compute dtype", compute));
    FT_TRY(check_dtype(name, "inp", inp->dtype));
    FT_TRY(check_dtype(name, "out", out->dtype));
    bool extreme = op == FT_RED_MAX || op == FT_RED_MIN;
    if ((op == FT_RED_MEAN || op == FT_RED_VAR || op == FT_RED_STD) && !ft_dtype_is_float(compute))
        return ft_fail(FT_ERR_DTYPE, "%s: needs a floating compute dtype, got %s", name, ft_dtype_get(compute)->name);
    if ((op == FT_RED_VAR || op == FT_RED_STD) && compute != FT_FLOAT64)
        return ft_fail(FT_ERR_DTYPE, "%s: computes in float64, got %s", name, ft_dtype_get(compute)->name);
    if ((op == FT_RED_ALL || op == FT_RED_ANY) && out->dtype != FT_BOOL && out->dtype != FT_UINT8)
        return ft_fail(FT_ERR_DTYPE, "%s: out must be bool or uint8, got %s", name, ft_dtype_get(out->dtype)->name);
    FT_TRY(ft_check_on(name, "out", out, dev, "inp"));
    FT_TRY(ft_check_output(name, "out", out));
    FT_TRY(ft_check_alias(name, "out", out, "inp", inp));
    bool ok = out->ndim == inp->ndim;
    for (int d = 0; ok && d < out->ndim; d++)
        ok = out->shape[d] == inp->shape[d] || out->shape[d] == 1;
    if (!ok) {
        char a[128], b[128];
        return ft_fail(FT_ERR_SHAPE, "%s: out %s is no reduction of inp %s (out's sizes must be inp's or 1)", name,
                       ft_shape_str(a, sizeof a, out->ndim, out->shape),
                       ft_shape_str(b, sizeof b, inp->ndim, inp->shape));
    }
    if (indices) {
        if (!extreme)
            return ft_fail(FT_ERR_VALUE, "%s: gives no indices (only max and min do)", name);
        if (indices->dtype != FT_INT64)
            return ft_fail(FT_ERR_DTYPE, "%s: indices must be int64, got %s", name,
                           ft_dtype_get(indices->dtype)->name);
        FT_TRY(ft_check_on(name, "indices", indices, dev, "inp"));
        FT_TRY(ft_check_shape_as(name, "indices", indices, out));
        FT_TRY(ft_check_output(name, "indices", indices));
        FT_TRY(ft_check_alias(name, "indices", indices, "inp", inp));
        FT_TRY(ft_check_alias(name, "indices", indices, "out", out));
    }
    ft_math_reduction r = {.op = op, .compute = compute, .out_dtype = out->dtype, .inp_dtype = inp->dtype,
                           .out = ft_tensor_data(out), .inp = ft_tensor_data(inp), .correction = correction};
    if (indices)
        r.indices = (int64_t *)ft_tensor_data(indices);
    r.nout = ft_tensor_numel(out);
    r.count = 1;
    for (int d = 0; d < inp->ndim; d++) {
        if (out->shape[d] == inp->shape[d]) {
            int64_t s[FT_MATH_SLOTS] = {out->strides[d], inp->strides[d], indices ? indices->strides[d] : 0, 0};
            ft_math_walk_push(&r.outer, out->shape[d], s);
        } else {
            int64_t s[FT_MATH_SLOTS] = {0, inp->strides[d], 0, 0};
            ft_math_walk_push(&r.inner, inp->shape[d], s);
            r.count *= inp->shape[d];
        }
    }
    if (r.nout == 0)
        return FT_OK;
    if (extreme && r.count == 0)
        return ft_fail(FT_ERR_INDEX, "%s: the reduced dimensions of inp %s have no elements", name,
                       ft_shape_str((char[128]){0}, 128, inp->ndim, inp->shape));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(name, math_reduce, inp, &r);
    bool var = op == FT_RED_VAR || op == FT_RED_STD;
#pragma omp parallel for schedule(static) if (r.nout * r.count > 32768)
    for (int64_t o = 0; o < r.nout; o++) {
        double shift = var ? ft_math_reduce_mean(&r, ft_math_reduce_part(&r, FT_RED_SUM, o, 0, 1, 0.0)) : 0.0;
        ft_math_reduce_store(&r, o, ft_math_reduce_part(&r, op, o, 0, 1, shift));
    }
    return FT_OK;
}
