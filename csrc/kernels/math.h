/* The per-element math of the eager tensor ops (python/fasttrain/_math.py)
 * on CUDA tensors: elementwise ops over broadcast operands of any dtype and
 * strides, and reductions over any set of dimensions. The CUDA kernels
 * (cuda/math.cu) and the CPU reference loops (ops/math.c) both run the
 * element functions at the end of this file, so the C tests and the CPU
 * comparison with NumPy check what the kernels compute.
 *
 * An op computes in one dtype, PyTorch's promoted one (the caller's choice),
 * held as an ft_math_val in one of four domains:
 *   - F32 for float32, bfloat16 and float16: a double rounded to float after
 *     every operation. For + - * / and sqrt that is float arithmetic exactly
 *     (double has more than twice float's precision plus two bits), so the
 *     results are the CPU path's, which computes 16-bit floats in float32 and
 *     rounds once when storing;
 *   - F64 for float64;
 *   - I64 for bool and every integer type but uint64, wrapping: a result
 *     modulo 2^64 stored into a narrower type is that result modulo its
 *     width, as NumPy computes in the narrow type itself;
 *   - U64 for uint64.
 * Tensor elements reach the compute dtype through the copies' cast rules
 * (kernels/cast.h), so a float32 operand of a bfloat16 op is rounded to
 * bfloat16 first, as the CPU path's `x.to(dt)`; scalars are converted once on
 * the host (ops/math.c). */
#ifndef FT_KERNELS_MATH_H
#define FT_KERNELS_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "core/dtype.h"
#include "kernels/cast.h"

typedef enum { FT_MATH_F32, FT_MATH_F64, FT_MATH_I64, FT_MATH_U64 } ft_math_kind;

typedef union {
    double f;
    int64_t i;
    uint64_t u;
} ft_math_val;

/* Elementwise ops: unary, binary (comparisons last, giving bool), ternary. */
typedef enum {
    FT_MATH_NEG,
    FT_MATH_ABS,
    FT_MATH_EXP,
    FT_MATH_LOG,
    FT_MATH_SQRT,
    FT_MATH_RSQRT,
    FT_MATH_TANH,
    FT_MATH_SIGMOID,
    FT_MATH_RELU,
    FT_MATH_BITWISE_NOT,
    FT_MATH_LOGICAL_NOT,
    FT_MATH_ADD,
    FT_MATH_SUB,
    FT_MATH_MUL,
    FT_MATH_DIV,
    FT_MATH_DIV_TRUNC,
    FT_MATH_DIV_FLOOR,
    FT_MATH_REMAINDER,
    FT_MATH_POW,
    FT_MATH_MAXIMUM,
    FT_MATH_MINIMUM,
    FT_MATH_BITWISE_AND,
    FT_MATH_BITWISE_OR,
    FT_MATH_BITWISE_XOR,
    FT_MATH_EQ,
    FT_MATH_NE,
    FT_MATH_LT,
    FT_MATH_LE,
    FT_MATH_GT,
    FT_MATH_GE,
    FT_MATH_WHERE, /* (condition, a, b) */
    FT_MATH_CLAMP, /* (x, min, max) */
    FT_MATH_NUM_OPS
} ft_math_op;

typedef enum { FT_RED_SUM, FT_RED_MEAN, FT_RED_VAR, FT_RED_STD, FT_RED_MAX, FT_RED_MIN, FT_RED_ALL, FT_RED_ANY,
               FT_RED_NUM_OPS } ft_red_op;

static inline FT_HD int ft_math_arity(ft_math_op op) {
    return op < FT_MATH_ADD ? 1 : op < FT_MATH_WHERE ? 2 : 3;
}

static inline FT_HD bool ft_math_is_comparison(ft_math_op op) { return op >= FT_MATH_EQ && op <= FT_MATH_GE; }

static inline FT_HD ft_math_kind ft_math_kind_of(ft_dtype dt) {
    switch (dt) {
    case FT_FLOAT16:
    case FT_BFLOAT16:
    case FT_FLOAT32: return FT_MATH_F32;
    case FT_FLOAT64: return FT_MATH_F64;
    case FT_UINT64: return FT_MATH_U64;
    default: return FT_MATH_I64;
    }
}

static inline FT_HD int64_t ft_math_itemsize(ft_dtype dt) {
    switch (dt) {
    case FT_BOOL:
    case FT_UINT8:
    case FT_INT8: return 1;
    case FT_INT16:
    case FT_UINT16:
    case FT_FLOAT16:
    case FT_BFLOAT16: return 2;
    case FT_INT32:
    case FT_UINT32:
    case FT_FLOAT32: return 4;
    default: return 8;
    }
}

/* ---- values in and out ---- */

/* Element p (of dtype src, not complex) cast to `compute`, in its domain. */
static inline FT_HD ft_math_val ft_math_load(const void *p, ft_dtype src, ft_dtype compute) {
    union {
        uint8_t u8;
        int8_t i8;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
        float f32;
        double f64;
    } c;
    c.u64 = 0; /* a complex compute dtype stores nothing: the entry points refuse it */
    ft_store_wide(&c, compute, ft_load_wide(p, src));
    ft_math_val v;
    switch (compute) {
    case FT_BOOL:
    case FT_UINT8: v.i = c.u8; break;
    case FT_INT8: v.i = c.i8; break;
    case FT_INT16: v.i = c.i16; break;
    case FT_INT32: v.i = c.i32; break;
    case FT_INT64: v.i = c.i64; break;
    case FT_UINT16: v.i = c.u16; break;
    case FT_UINT32: v.i = c.u32; break;
    case FT_UINT64: v.u = c.u64; break;
    case FT_FLOAT16: v.f = ft_f16_to_f32(c.u16); break;
    case FT_BFLOAT16: v.f = ft_bf16_to_f32(c.u16); break;
    case FT_FLOAT32: v.f = c.f32; break;
    default: v.f = c.f64; break;
    }
    return v;
}

/* *p (of dtype dst) = v of domain `kind`, by the cast rules (a 16-bit float
 * rounds once from the float value). */
static inline FT_HD void ft_math_store(void *p, ft_dtype dst, ft_math_kind kind, ft_math_val v) {
    ft_store_wide(p, dst, kind == FT_MATH_I64 ? ft_wide_i64(v.i) : kind == FT_MATH_U64 ? ft_wide_u64(v.u)
                                                                                         : ft_wide_f64(v.f));
}

static inline FT_HD bool ft_math_nonzero(ft_math_kind kind, ft_math_val v) {
    return kind == FT_MATH_I64 ? v.i != 0 : kind == FT_MATH_U64 ? v.u != 0 : v.f != 0; /* NaN is true */
}

/* ---- floating point ---- */

/* x rounded to float when the op computes in float32 (or a 16-bit float). */
static inline FT_HD double ft_math_round(double x, bool single) { return single ? (double)(float)x : x; }

/* NumPy's floor division and remainder of floats (npy_divmod): the quotient
 * snapped to the nearest integer from (a - fmod(a, b)) / b, the remainder
 * with b's sign; for b == 0, a / b and fmod(a, b). */
static inline FT_HD double ft_math_fdivmod(double a, double b, bool single, double *modulus) {
    double mod = fmod(a, b); /* exact, so also float's fmodf */
    if (b == 0) {
        *modulus = mod;
        return ft_math_round(a / b, single);
    }
    double div = ft_math_round(ft_math_round(a - mod, single) / b, single);
    if (mod != 0) {
        if ((b < 0) != (mod < 0)) {
            mod = ft_math_round(mod + b, single);
            div = ft_math_round(div - 1.0, single);
        }
    } else {
        mod = copysign(0.0, b);
    }
    double floordiv;
    if (div != 0) {
        floordiv = floor(div);
        if (ft_math_round(div - floordiv, single) > 0.5)
            floordiv = ft_math_round(floordiv + 1.0, single);
    } else {
        floordiv = copysign(0.0, ft_math_round(a / b, single));
    }
    *modulus = mod;
    return floordiv;
}

/* NumPy's maximum and minimum: NaN wins (the first operand's when both are). */
static inline FT_HD double ft_math_fmax(double a, double b) { return a >= b || a != a ? a : b; }
static inline FT_HD double ft_math_fmin(double a, double b) { return a <= b || a != a ? a : b; }

static inline FT_HD double ft_math_float_op(ft_math_op op, bool single, double a, double b, double c) {
    double mod;
    switch (op) {
    case FT_MATH_NEG: return -a;
    case FT_MATH_ABS: return fabs(a);
    case FT_MATH_EXP: return ft_math_round(exp(a), single);
    case FT_MATH_LOG: return ft_math_round(log(a), single);
    case FT_MATH_SQRT: return ft_math_round(sqrt(a), single);
    case FT_MATH_RSQRT: return ft_math_round(1.0 / ft_math_round(sqrt(a), single), single);
    case FT_MATH_TANH: return ft_math_round(tanh(a), single);
    case FT_MATH_SIGMOID: {
        /* exp(-|x|) never overflows; each branch is exact where it is taken */
        double e = ft_math_round(exp(-fabs(a)), single), d = ft_math_round(1.0 + e, single);
        return ft_math_round(a >= 0 ? 1.0 / d : e / d, single);
    }
    case FT_MATH_RELU: return ft_math_fmax(a, 0.0);
    case FT_MATH_ADD: return ft_math_round(a + b, single);
    case FT_MATH_SUB: return ft_math_round(a - b, single);
    case FT_MATH_MUL: return ft_math_round(a * b, single);
    case FT_MATH_DIV: return ft_math_round(a / b, single);
    case FT_MATH_DIV_TRUNC: return trunc(ft_math_round(a / b, single));
    case FT_MATH_DIV_FLOOR: return ft_math_fdivmod(a, b, single, &mod);
    case FT_MATH_REMAINDER: ft_math_fdivmod(a, b, single, &mod); return mod;
    case FT_MATH_POW: return ft_math_round(pow(a, b), single);
    case FT_MATH_MAXIMUM: return ft_math_fmax(a, b);
    case FT_MATH_MINIMUM: return ft_math_fmin(a, b);
    case FT_MATH_CLAMP: return ft_math_fmin(ft_math_fmax(a, b), c);
    default: return a; /* integer-only ops: the entry point refuses them */
    }
}

/* ---- integers ---- */

/* Signed arithmetic that wraps (through uint64: C leaves signed overflow
 * undefined), and division without the traps of INT64_MIN / -1. */
static inline FT_HD int64_t ft_math_wrap(uint64_t u) { return (int64_t)u; }

static inline FT_HD int64_t ft_math_ipow(int64_t a, int64_t b) {
    if (b < 0) /* PyTorch truncates: 1 stays 1, -1 alternates, every other base gives 0 */
        return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
    uint64_t r = 1, x = (uint64_t)a;
    for (uint64_t e = (uint64_t)b; e; e >>= 1, x *= x)
        if (e & 1)
            r *= x;
    return ft_math_wrap(r);
}

static inline FT_HD int64_t ft_math_int_op(ft_math_op op, int64_t a, int64_t b, int64_t c) {
    switch (op) {
    case FT_MATH_NEG: return ft_math_wrap(0 - (uint64_t)a);
    case FT_MATH_ABS: return a < 0 ? ft_math_wrap(0 - (uint64_t)a) : a;
    case FT_MATH_RELU: return a < 0 ? 0 : a;
    case FT_MATH_BITWISE_NOT: return ~a;
    case FT_MATH_LOGICAL_NOT: return a == 0;
    case FT_MATH_ADD: return ft_math_wrap((uint64_t)a + (uint64_t)b);
    case FT_MATH_SUB: return ft_math_wrap((uint64_t)a - (uint64_t)b);
    case FT_MATH_MUL: return ft_math_wrap((uint64_t)a * (uint64_t)b);
    /* A zero divisor gives 0, as NumPy, though the entry point's callers
     * refuse it first (ZeroDivisionError). */
    case FT_MATH_DIV_TRUNC:
        return b == 0 ? 0 : b == -1 ? ft_math_wrap(0 - (uint64_t)a) : a / b;
    case FT_MATH_DIV_FLOOR: {
        if (b == 0 || b == -1)
            return b == 0 ? 0 : ft_math_wrap(0 - (uint64_t)a);
        int64_t q = a / b;
        return a % b != 0 && (a < 0) != (b < 0) ? q - 1 : q;
    }
    case FT_MATH_REMAINDER: {
        if (b == 0 || b == -1)
            return 0;
        int64_t r = a % b;
        return r != 0 && (r < 0) != (b < 0) ? r + b : r;
    }
    case FT_MATH_POW: return ft_math_ipow(a, b);
    case FT_MATH_MAXIMUM: return a > b ? a : b;
    case FT_MATH_MINIMUM: return a < b ? a : b;
    case FT_MATH_BITWISE_AND: return a & b;
    case FT_MATH_BITWISE_OR: return a | b;
    case FT_MATH_BITWISE_XOR: return a ^ b;
    case FT_MATH_CLAMP: a = a > b ? a : b; return a < c ? a : c;
    default: return a; /* float-only ops: the entry point refuses them */
    }
}

static inline FT_HD uint64_t ft_math_uint_op(ft_math_op op, uint64_t a, uint64_t b, uint64_t c) {
    switch (op) {
    case FT_MATH_NEG: return 0 - a;
    case FT_MATH_BITWISE_NOT: return ~a;
    case FT_MATH_LOGICAL_NOT: return a == 0;
    case FT_MATH_ADD: return a + b;
    case FT_MATH_SUB: return a - b;
    case FT_MATH_MUL: return a * b;
    case FT_MATH_DIV_TRUNC:
    case FT_MATH_DIV_FLOOR: return b == 0 ? 0 : a / b;
    case FT_MATH_REMAINDER: return b == 0 ? 0 : a % b;
    case FT_MATH_POW: {
        uint64_t r = 1;
        for (; b; b >>= 1, a *= a)
            if (b & 1)
                r *= a;
        return r;
    }
    case FT_MATH_MAXIMUM: return a > b ? a : b;
    case FT_MATH_MINIMUM: return a < b ? a : b;
    case FT_MATH_BITWISE_AND: return a & b;
    case FT_MATH_BITWISE_OR: return a | b;
    case FT_MATH_BITWISE_XOR: return a ^ b;
    case FT_MATH_CLAMP: a = a > b ? a : b; return a < c ? a : c;
    default: return a; /* abs and relu of unsigned values, and float-only ops */
    }
}

/* ---- one element ---- */

/* The op on values of domain `kind`: a comparison gives 0 or 1 in I64, every
 * other op a value of `kind`. */
static inline FT_HD ft_math_val ft_math_apply(ft_math_op op, ft_math_kind kind, const ft_math_val *v) {
    ft_math_val r;
    if (op == FT_MATH_WHERE)
        return ft_math_nonzero(kind, v[0]) ? v[1] : v[2];
    if (ft_math_is_comparison(op)) {
        /* <0, 0 or >0 in the sense of a - b; NaN compares unordered */
        bool lt, gt, eq;
        if (kind == FT_MATH_I64)
            lt = v[0].i < v[1].i, gt = v[0].i > v[1].i, eq = v[0].i == v[1].i;
        else if (kind == FT_MATH_U64)
            lt = v[0].u < v[1].u, gt = v[0].u > v[1].u, eq = v[0].u == v[1].u;
        else
            lt = v[0].f < v[1].f, gt = v[0].f > v[1].f, eq = v[0].f == v[1].f;
        r.i = op == FT_MATH_EQ ? eq : op == FT_MATH_NE ? !eq : op == FT_MATH_LT ? lt : op == FT_MATH_LE ? lt || eq
            : op == FT_MATH_GT ? gt : gt || eq;
        return r;
    }
    int n = ft_math_arity(op);
    ft_math_val b = n > 1 ? v[1] : v[0], c = n > 2 ? v[2] : v[0];
    if (kind == FT_MATH_I64)
        r.i = ft_math_int_op(op, v[0].i, b.i, c.i);
    else if (kind == FT_MATH_U64)
        r.u = ft_math_uint_op(op, v[0].u, b.u, c.u);
    else
        r.f = ft_math_float_op(op, kind == FT_MATH_F32, v[0].f, b.f, c.f);
    return r;
}

/* ---- walks over strided operands ---- */

/* Up to FT_MATH_SLOTS operands visited together over `shape` in C order,
 * each with its own strides in elements (0 along a broadcast dimension). */
#define FT_MATH_SLOTS 4

typedef struct {
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    int64_t st[FT_MATH_SLOTS][FT_MAX_DIMS];
} ft_math_walk;

/* off[k] = the element offset in slot k of element i (C order). */
static inline FT_HD void ft_math_offsets(const ft_math_walk *w, int64_t i, int64_t *off) {
    for (int k = 0; k < FT_MATH_SLOTS; k++)
        off[k] = 0;
    for (int d = w->ndim - 1; d > 0; d--) {
        int64_t q = i / w->shape[d], idx = i - q * w->shape[d];
        i = q;
        for (int k = 0; k < FT_MATH_SLOTS; k++)
            off[k] += idx * w->st[k][d];
    }
    if (w->ndim > 0)
        for (int k = 0; k < FT_MATH_SLOTS; k++)
            off[k] += i * w->st[k][0];
}

/* Appends a dimension of `size` with the slots' strides st[k] to w: size-1
 * dimensions are dropped, and one that every slot steps over exactly from its
 * outer neighbour merges into it (a dense run needs no division). */
static inline void ft_math_walk_push(ft_math_walk *w, int64_t size, const int64_t *st) {
    if (size == 1)
        return;
    int m = w->ndim - 1;
    bool merge = m >= 0;
    for (int k = 0; merge && k < FT_MATH_SLOTS; k++)
        merge = w->st[k][m] == st[k] * size;
    if (merge) {
        w->shape[m] *= size;
    } else {
        m = w->ndim++;
        w->shape[m] = size;
    }
    for (int k = 0; k < FT_MATH_SLOTS; k++)
        w->st[k][m] = st[k];
}

/* An elementwise op: out = op(inputs), in the compute dtype. Slot 0 of the
 * walk is out, slot k + 1 input k; an input without data is the scalar
 * scalar[k] (already in the compute domain). */
typedef struct {
    ft_math_op op;
    ft_dtype compute, out_dtype;
    int nin;
    ft_math_walk walk;
    int64_t n;
    char *out;
    const char *in[3];
    ft_dtype in_dtype[3];
    ft_math_val scalar[3];
} ft_math_map;

static inline FT_HD void ft_math_map_element(const ft_math_map *m, int64_t i) {
    int64_t off[FT_MATH_SLOTS];
    ft_math_offsets(&m->walk, i, off);
    ft_math_val v[3];
    for (int k = 0; k < m->nin; k++)
        v[k] = m->in[k] ? ft_math_load(m->in[k] + off[k + 1] * ft_math_itemsize(m->in_dtype[k]), m->in_dtype[k],
                                       m->compute)
                        : m->scalar[k];
    ft_math_kind kind = ft_math_kind_of(m->compute);
    ft_math_store(m->out + off[0] * ft_math_itemsize(m->out_dtype), m->out_dtype,
                  ft_math_is_comparison(m->op) ? FT_MATH_I64 : kind, ft_math_apply(m->op, kind, v));
}

/* ---- reductions ---- */

/* A partial reduction: a sum (in double for floats, wrapping for integers),
 * an all / any flag, or an extreme and its position (idx < 0: none yet). */
typedef struct {
    ft_math_val v;
    int64_t idx;
} ft_red_acc;

static inline FT_HD ft_red_acc ft_red_init(ft_red_op op) {
    ft_red_acc a;
    a.v.u = 0; /* also +0.0 */
    a.idx = -1;
    if (op == FT_RED_ALL)
        a.v.i = 1;
    return a;
}

/* Whether x is a better maximum (or minimum) than y: NaN beats every
 * number, as NumPy's max and argmax. */
static inline FT_HD bool ft_red_better(bool max, ft_math_kind kind, ft_math_val x, ft_math_val y) {
    if (kind == FT_MATH_I64)
        return max ? x.i > y.i : x.i < y.i;
    if (kind == FT_MATH_U64)
        return max ? x.u > y.u : x.u < y.u;
    if (x.f != x.f)
        return y.f == y.f;
    return max ? x.f > y.f : x.f < y.f;
}

/* a and b combined. For extremes the result does not depend on the order
 * the partials meet: the better value wins, and between equal ones (or two
 * NaNs) the first position, so any fixed tree gives the first extreme. */
static inline FT_HD ft_red_acc ft_red_combine(ft_red_op op, ft_math_kind kind, ft_red_acc a, ft_red_acc b) {
    switch (op) {
    case FT_RED_MAX:
    case FT_RED_MIN: {
        if (a.idx < 0 || b.idx < 0)
            return a.idx < 0 ? b : a;
        bool max = op == FT_RED_MAX;
        if (ft_red_better(max, kind, b.v, a.v))
            return b;
        if (ft_red_better(max, kind, a.v, b.v))
            return a;
        return b.idx < a.idx ? b : a;
    }
    case FT_RED_ALL: a.v.i = a.v.i && b.v.i; return a;
    case FT_RED_ANY: a.v.i = a.v.i || b.v.i; return a;
    default:
        if (kind == FT_MATH_I64)
            a.v.i = ft_math_wrap((uint64_t)a.v.i + (uint64_t)b.v.i);
        else if (kind == FT_MATH_U64)
            a.v.u += b.v.u;
        else
            a.v.f += b.v.f;
        return a;
    }
}

/* acc with element v at position idx of the reduced dimensions (C order).
 * The variance's pass takes (v - shift)^2 in double. */
static inline FT_HD ft_red_acc ft_red_step(ft_red_op op, ft_math_kind kind, ft_red_acc acc, ft_math_val v,
                                           int64_t idx, double shift) {
    ft_red_acc e;
    e.v = v;
    e.idx = idx;
    if (op == FT_RED_ALL || op == FT_RED_ANY)
        e.v.i = ft_math_nonzero(kind, v);
    else if (op == FT_RED_VAR || op == FT_RED_STD)
        e.v.f = (v.f - shift) * (v.f - shift);
    return ft_red_combine(op, kind, acc, e);
}

/* A reduction of inp into out, where out has inp's dimensions with size 1
 * on the reduced ones. outer walks out's elements (slot 0: out, 1: inp,
 * 2: indices), inner the `count` elements each reduces (slot 1: inp), in C
 * order of the reduced dimensions. */
typedef struct {
    ft_red_op op;
    ft_dtype compute, out_dtype, inp_dtype;
    ft_math_walk outer, inner;
    int64_t nout, count;
    char *out;
    int64_t *indices; /* max and min with positions, else NULL */
    const char *inp;
    double correction; /* var and std: the divisor is max(count - correction, 0) */
} ft_math_reduction;

/* The partial of output o over its elements first, first + step, ... */
static inline FT_HD ft_red_acc ft_math_reduce_part(const ft_math_reduction *r, ft_red_op op, int64_t o,
                                                   int64_t first, int64_t step, double shift) {
    int64_t at[FT_MATH_SLOTS], off[FT_MATH_SLOTS];
    ft_math_offsets(&r->outer, o, at);
    ft_math_kind kind = ft_math_kind_of(r->compute);
    int64_t isz = ft_math_itemsize(r->inp_dtype);
    ft_red_acc acc = ft_red_init(op);
    for (int64_t k = first; k < r->count; k += step) {
        ft_math_offsets(&r->inner, k, off);
        ft_math_val v = ft_math_load(r->inp + (at[1] + off[1]) * isz, r->inp_dtype, r->compute);
        acc = ft_red_step(op, kind, acc, v, k, shift);
    }
    return acc;
}

/* The mean a variance pass is centred on, from the sum of the first pass. */
static inline FT_HD double ft_math_reduce_mean(const ft_math_reduction *r, ft_red_acc sum) {
    return sum.v.f / (double)r->count;
}

/* Writes output o from its whole reduction acc. */
static inline FT_HD void ft_math_reduce_store(const ft_math_reduction *r, int64_t o, ft_red_acc acc) {
    int64_t at[FT_MATH_SLOTS];
    ft_math_offsets(&r->outer, o, at);
    ft_math_kind kind = ft_math_kind_of(r->compute);
    if (r->op == FT_RED_MEAN) {
        acc.v.f = ft_math_reduce_mean(r, acc);
    } else if (r->op == FT_RED_VAR || r->op == FT_RED_STD) {
        double d = (double)r->count - r->correction;
        acc.v.f /= d > 0 ? d : 0.0;
        if (r->op == FT_RED_STD)
            acc.v.f = sqrt(acc.v.f);
    }
    bool flag = r->op == FT_RED_ALL || r->op == FT_RED_ANY;
    ft_math_store(r->out + at[0] * ft_math_itemsize(r->out_dtype), r->out_dtype, flag ? FT_MATH_I64 : kind, acc.v);
    if (r->indices)
        r->indices[at[2]] = acc.idx;
}

#endif
