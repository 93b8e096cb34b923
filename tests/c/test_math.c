/* The per-element math of the eager tensor ops (kernels/math.h) that the
 * CUDA kernels of cuda/math.cu run: broadcast walks and their offsets, the
 * casts into the compute dtype, integer wrap-around and division corner
 * cases, NumPy's float floor division, and reductions whose partials may
 * meet in any fixed order; then the entry points of ops/math.c on CPU
 * tensors, their reference loops. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/tensor.h"
#include "kernels/math.h"
#include "ops/math.h"

static ft_math_val ival(int64_t i) { return (ft_math_val){.i = i}; }
static ft_math_val fval(double f) { return (ft_math_val){.f = f}; }

static int64_t iop(ft_math_op op, int64_t a, int64_t b) {
    ft_math_val v[3] = {ival(a), ival(b), ival(0)};
    return ft_math_apply(op, FT_MATH_I64, v).i;
}

static double fop(ft_math_op op, bool single, double a, double b) {
    ft_math_val v[3] = {fval(a), fval(b), fval(0)};
    return ft_math_apply(op, single ? FT_MATH_F32 : FT_MATH_F64, v).f;
}

static void test_walks(void) {
    /* out (2, 3, 4) contiguous, an input (3, 1) broadcast: strides (0, 1, 0) */
    ft_math_walk w = {0};
    int64_t shape[] = {2, 3, 4}, out_st[] = {12, 4, 1}, in_st[] = {0, 1, 0};
    for (int d = 0; d < 3; d++) {
        int64_t s[FT_MATH_SLOTS] = {out_st[d], in_st[d], 0, 0};
        ft_math_walk_push(&w, shape[d], s);
    }
    CHECK(w.ndim == 3);
    for (int64_t i = 0; i < 24; i++) {
        int64_t off[FT_MATH_SLOTS];
        ft_math_offsets(&w, i, off);
        CHECKF(off[0] == i && off[1] == (i / 4) % 3, "element %lld: %lld %lld", (long long)i, (long long)off[0],
               (long long)off[1]);
    }
    /* dense dimensions merge into one run; size-1 dimensions vanish */
    ft_math_walk m = {0};
    int64_t s1[FT_MATH_SLOTS] = {20, 20, 0, 0}, s2[FT_MATH_SLOTS] = {5, 5, 0, 0}, s3[FT_MATH_SLOTS] = {1, 1, 0, 0};
    ft_math_walk_push(&m, 3, s1);
    ft_math_walk_push(&m, 1, s2);
    ft_math_walk_push(&m, 4, s2);
    ft_math_walk_push(&m, 5, s3);
    CHECK(m.ndim == 1 && m.shape[0] == 60); /* (3, 4, 5) dense: one run */
    int64_t off[FT_MATH_SLOTS];
    ft_math_offsets(&m, 59, off);
    CHECK(off[0] == 59 && off[1] == 59);
    /* a transposed input does not merge */
    ft_math_walk t = {0};
    int64_t a[FT_MATH_SLOTS] = {4, 1, 0, 0}, b[FT_MATH_SLOTS] = {1, 3, 0, 0};
    ft_math_walk_push(&t, 3, a);
    ft_math_walk_push(&t, 4, b);
    CHECK(t.ndim == 2);
    ft_math_offsets(&t, 5, off); /* (1, 1) */
    CHECK(off[0] == 5 && off[1] == 4);
}

static void test_casts(void) {
    float f = 0.1f;
    uint16_t bf;
    /* a float32 operand of a bfloat16 op is rounded to bfloat16 first */
    CHECK(ft_math_load(&f, FT_FLOAT32, FT_BFLOAT16).f == ft_bf16_to_f32(ft_f32_to_bf16(0.1f)));
    bf = ft_f32_to_bf16(1.5f);
    CHECK(ft_math_load(&bf, FT_BFLOAT16, FT_FLOAT32).f == 1.5);
    int64_t big = 1000;
    CHECK(ft_math_load(&big, FT_INT64, FT_INT8).i == -24);
    CHECK(ft_math_load(&big, FT_INT64, FT_UINT8).i == 232);
    double nan = NAN;
    CHECK(ft_math_load(&nan, FT_FLOAT64, FT_INT32).i == 0);
    CHECK(ft_math_load(&nan, FT_FLOAT64, FT_BOOL).i == 1);
    uint64_t u = UINT64_MAX;
    CHECK(ft_math_load(&u, FT_UINT64, FT_UINT64).u == UINT64_MAX);
    int8_t out;
    ft_math_store(&out, FT_INT8, FT_MATH_I64, ival(200));
    CHECK(out == -56);
    uint8_t flag;
    ft_math_store(&flag, FT_BOOL, FT_MATH_I64, ival(2));
    CHECK(flag == 1);
}

static void test_integers(void) {
    CHECK(iop(FT_MATH_ADD, INT64_MAX, 1) == INT64_MIN);
    CHECK(iop(FT_MATH_NEG, INT64_MIN, 0) == INT64_MIN);
    CHECK(iop(FT_MATH_ABS, INT64_MIN, 0) == INT64_MIN);
    CHECK(iop(FT_MATH_DIV_FLOOR, INT64_MIN, -1) == INT64_MIN);
    CHECK(iop(FT_MATH_DIV_TRUNC, INT64_MIN, -1) == INT64_MIN);
    CHECK(iop(FT_MATH_REMAINDER, INT64_MIN, -1) == 0);
    CHECK(iop(FT_MATH_DIV_FLOOR, -7, 2) == -4 && iop(FT_MATH_DIV_TRUNC, -7, 2) == -3);
    CHECK(iop(FT_MATH_REMAINDER, -7, 2) == 1 && iop(FT_MATH_REMAINDER, 7, -2) == -1);
    CHECK(iop(FT_MATH_DIV_FLOOR, 5, 0) == 0 && iop(FT_MATH_REMAINDER, 5, 0) == 0);
    CHECK(iop(FT_MATH_POW, 3, 4) == 81 && iop(FT_MATH_POW, 2, 64) == 0);
    CHECK(iop(FT_MATH_POW, 1, -3) == 1 && iop(FT_MATH_POW, -1, -3) == -1 && iop(FT_MATH_POW, -1, -2) == 1);
    CHECK(iop(FT_MATH_POW, 2, -1) == 0);
    CHECK(iop(FT_MATH_LT, -1, 0) == 1 && iop(FT_MATH_GE, -1, 0) == 0);
    CHECK(iop(FT_MATH_LOGICAL_NOT, 1, 0) == 0 && iop(FT_MATH_BITWISE_NOT, 0, 0) == -1);
    ft_math_val u[3] = {{.u = UINT64_MAX}, {.u = 2}, {.u = 0}};
    CHECK(ft_math_apply(FT_MATH_DIV_FLOOR, FT_MATH_U64, u).u == UINT64_MAX / 2);
    CHECK(ft_math_apply(FT_MATH_GT, FT_MATH_U64, u).i == 1); /* unsigned, not -1 < 2 */
}

static void test_floats(void) {
    /* NumPy's floor_divide and remainder */
    CHECK(fop(FT_MATH_DIV_FLOOR, false, 7.0, -2.0) == -4.0 && fop(FT_MATH_REMAINDER, false, 7.0, -2.0) == -1.0);
    CHECK(signbit(fop(FT_MATH_REMAINDER, false, 4.0, -2.0)));  /* -0.0: b's sign */
    CHECK(fop(FT_MATH_DIV_FLOOR, false, -0.5, 2.0) == -1.0);
    CHECK(isinf(fop(FT_MATH_DIV_FLOOR, false, 1.0, 0.0)) && isnan(fop(FT_MATH_REMAINDER, false, 1.0, 0.0)));
    CHECK(fop(FT_MATH_DIV_TRUNC, false, -7.0, 2.0) == -3.0);
    /* NaN wins maximum and minimum, from either side */
    CHECK(isnan(fop(FT_MATH_MAXIMUM, false, NAN, 1.0)) && isnan(fop(FT_MATH_MINIMUM, false, 1.0, NAN)));
    /* float32 arithmetic: every step rounded */
    CHECK(fop(FT_MATH_ADD, true, 1.0, 1e-8) == 1.0 && fop(FT_MATH_ADD, false, 1.0, 1e-8) != 1.0);
    CHECK(fop(FT_MATH_DIV, true, 1.0, 3.0) == (double)(1.0f / 3.0f));
    CHECK(fop(FT_MATH_RSQRT, true, 2.0, 0) == (double)(1.0f / sqrtf(2.0f)));
    CHECK(fop(FT_MATH_SIGMOID, false, 0.0, 0) == 0.5 && fop(FT_MATH_SIGMOID, false, -1000.0, 0) == 0.0);
    CHECK(fop(FT_MATH_RELU, false, -2.0, 0) == 0.0 && isnan(fop(FT_MATH_RELU, false, NAN, 0)));
    ft_math_val c[3] = {fval(5.0), fval(-1.0), fval(2.0)};
    CHECK(ft_math_apply(FT_MATH_CLAMP, FT_MATH_F64, c).f == 2.0);
    ft_math_val w[3] = {ival(0), fval(1.0), fval(2.0)};
    CHECK(ft_math_apply(FT_MATH_WHERE, FT_MATH_I64, w).f == 2.0);
}

static void test_reductions(void) {
    /* the first maximum wins whatever order the partials meet in, NaN above all */
    double xs[] = {1.0, 3.0, 2.0, 3.0, -1.0};
    ft_red_acc fwd = ft_red_init(FT_RED_MAX), back = ft_red_init(FT_RED_MAX);
    for (int k = 0; k < 5; k++)
        fwd = ft_red_step(FT_RED_MAX, FT_MATH_F64, fwd, fval(xs[k]), k, 0);
    for (int k = 4; k >= 0; k--)
        back = ft_red_step(FT_RED_MAX, FT_MATH_F64, back, fval(xs[k]), k, 0);
    CHECK(fwd.idx == 1 && back.idx == 1 && fwd.v.f == 3.0);
    ft_red_acc withnan = ft_red_step(FT_RED_MIN, FT_MATH_F64, ft_red_init(FT_RED_MIN), fval(NAN), 3, 0);
    withnan = ft_red_step(FT_RED_MIN, FT_MATH_F64, withnan, fval(-5.0), 0, 0);
    CHECK(withnan.idx == 3 && isnan(withnan.v.f));
    ft_red_acc a = ft_red_step(FT_RED_ALL, FT_MATH_F64, ft_red_init(FT_RED_ALL), fval(NAN), 0, 0);
    CHECK(a.v.i == 1);
    ft_red_acc s = ft_red_step(FT_RED_SUM, FT_MATH_I64, ft_red_init(FT_RED_SUM), ival(INT64_MAX), 0, 0);
    s = ft_red_step(FT_RED_SUM, FT_MATH_I64, s, ival(1), 1, 0);
    CHECK(s.v.i == INT64_MIN);
}

static void test_entry_points(void) {
    /* int8 (2, 3) // a broadcast row of int8, on the CPU reference loop */
    ft_tensor a, b, out;
    int64_t sa[] = {2, 3}, sb[] = {3};
    CHECK_OK(ft_tensor_empty(&a, 2, sa, FT_INT8, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&b, 1, sb, FT_INT8, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&out, 2, sa, FT_INT8, FT_CPU, false));
    int8_t *pa = (int8_t *)ft_tensor_data(&a), *pb = (int8_t *)ft_tensor_data(&b);
    int8_t va[] = {-128, 7, -7, 100, -1, 5}, vb[] = {-1, 2, -3};
    memcpy(pa, va, sizeof va);
    memcpy(pb, vb, sizeof vb);
    ft_math_arg args[2] = {{.t = &a}, {.t = &b}};
    CHECK_OK(ft_math_pointwise(&out, FT_MATH_DIV_FLOOR, FT_INT8, args, 2));
    int8_t want[] = {-128, 3, 2, -100, -1, -2};
    CHECK(!memcmp(ft_tensor_data(&out), want, sizeof want));
    /* a scalar wraps into the compute dtype: 1000 is -24 in int8 */
    ft_math_arg sc[2] = {{.t = &a}, {.t = NULL, .s = {.kind = FT_SCALAR_INT, .i = 1000}}};
    CHECK_OK(ft_math_pointwise(&out, FT_MATH_ADD, FT_INT8, sc, 2));
    CHECK(((int8_t *)ft_tensor_data(&out))[1] == (int8_t)(7 - 24));
    /* out of the wrong dtype, a shape that does not broadcast, a float-only op */
    CHECK_STATUS(ft_math_pointwise(&out, FT_MATH_EQ, FT_INT8, args, 2), FT_ERR_DTYPE);
    ft_math_arg bad[2] = {{.t = &out}, {.t = &a}};
    CHECK_STATUS(ft_math_pointwise(&b, FT_MATH_ADD, FT_INT8, bad, 2), FT_ERR_SHAPE);
    CHECK_STATUS(ft_math_pointwise(&out, FT_MATH_EXP, FT_INT8, args, 1), FT_ERR_DTYPE);
    CHECK_STATUS(ft_math_pointwise(&out, FT_MATH_ADD, FT_INT8, args, 1), FT_ERR_VALUE);

    /* argmax over dimension 1 (keepdim form (2, 1)) */
    ft_tensor vals, idx;
    int64_t sr[] = {2, 1};
    CHECK_OK(ft_tensor_empty(&vals, 2, sr, FT_INT8, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&idx, 2, sr, FT_INT64, FT_CPU, false));
    CHECK_OK(ft_math_reduce(&vals, &idx, &a, FT_RED_MAX, FT_INT8, 0));
    int64_t *pi = (int64_t *)ft_tensor_data(&idx);
    int8_t *pv = (int8_t *)ft_tensor_data(&vals);
    CHECK(pv[0] == 7 && pi[0] == 1 && pv[1] == 100 && pi[1] == 0);
    CHECK_STATUS(ft_math_reduce(&vals, &idx, &a, FT_RED_SUM, FT_INT8, 0), FT_ERR_VALUE);
    CHECK_STATUS(ft_math_reduce(&vals, NULL, &a, FT_RED_MEAN, FT_INT8, 0), FT_ERR_DTYPE);
    CHECK_STATUS(ft_math_reduce(&b, NULL, &a, FT_RED_SUM, FT_INT8, 0), FT_ERR_SHAPE);
    ft_tensor_release(&a);
    ft_tensor_release(&b);
    ft_tensor_release(&out);
    ft_tensor_release(&vals);
    ft_tensor_release(&idx);
}

int main(void) {
    test_walks();
    test_casts();
    test_integers();
    test_floats();
    test_reductions();
    test_entry_points();
    return check_main_result("test_math");
}
