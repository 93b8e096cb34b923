/* The CPU ops of fasttrain's own loops under the sanitizers: the elementary
 * functions of kernels/activation.h against libm in double, the vectorised
 * loops against the scalar kernels (bitwise), every layout path of the
 * pointwise engine, pooling, softmax, the losses, group norm, embedding and
 * upsampling on odd shapes, strides, bfloat16 and empty tensors, and the
 * error paths. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/convert.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/groupnorm.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/softmax.h"
#include "ops/upsample.h"

#define SHAPE(...) ((int64_t[]){__VA_ARGS__})

static uint64_t lcg = 12345;
static float frand(void) { /* uniform in [-3, 3) */
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) / 16777216.0 * 6.0 - 3.0);
}

static ft_tensor make(int ndim, const int64_t *shape, ft_dtype dt) {
    ft_tensor t;
    if (ft_tensor_empty(&t, ndim, shape, dt, FT_CPU, false) != FT_OK) {
        fprintf(stderr, "ft_tensor_empty: %s\n", ft_last_error());
        exit(2);
    }
    return t;
}

static int64_t offset_of(const ft_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    return off;
}

static float get(const ft_tensor *t, const int64_t *idx) {
    int64_t off = offset_of(t, idx);
    if (t->dtype == FT_BFLOAT16)
        return ft_bf16_to_f32(((uint16_t *)ft_tensor_data(t))[off]);
    return ((float *)ft_tensor_data(t))[off];
}

static void set(const ft_tensor *t, const int64_t *idx, float v) {
    int64_t off = offset_of(t, idx);
    if (t->dtype == FT_BFLOAT16)
        ((uint16_t *)ft_tensor_data(t))[off] = ft_f32_to_bf16(v);
    else
        ((float *)ft_tensor_data(t))[off] = v;
}

/* Advances a multi-index in C order; false after the last. */
static bool next(int64_t *idx, const ft_tensor *t) {
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (++idx[d] < t->shape[d])
            return true;
        idx[d] = 0;
    }
    return false;
}

static int64_t numel(const ft_tensor *t) { return ft_tensor_numel(t); }

static void fill_random(const ft_tensor *t) {
    int64_t idx[FT_MAX_DIMS] = {0};
    if (numel(t))
        do
            set(t, idx, frand());
        while (next(idx, t));
}

/* A 4-d (N, C, H, W) tensor stored NHWC. */
static ft_tensor make_nhwc(const int64_t *s, ft_dtype dt) {
    ft_tensor base = make(4, SHAPE(s[0], s[2], s[3], s[1]), dt), v;
    int64_t C = s[1], W = s[3], H = s[2];
    CHECK_OK(ft_tensor_view(&v, &base, 4, s, SHAPE(H * W * C, 1, W * C, C), base.offset));
    ft_tensor_release(&base);
    return v;
}

/* Every other element of a tensor twice as wide in the last dimension. */
static ft_tensor make_strided(int ndim, const int64_t *s, ft_dtype dt) {
    int64_t wide[FT_MAX_DIMS], st[FT_MAX_DIMS];
    memcpy(wide, s, (size_t)ndim * sizeof *s);
    wide[ndim - 1] *= 2;
    ft_tensor base = make(ndim, wide, dt), v;
    memcpy(st, base.strides, sizeof st);
    st[ndim - 1] = 2;
    CHECK_OK(ft_tensor_view(&v, &base, ndim, s, st, base.offset));
    ft_tensor_release(&base);
    return v;
}

/* a[...] == b[...] over their shared shape (NaN equal to NaN, -0 to 0). */
static bool same_values(const ft_tensor *a, const ft_tensor *b) {
    int64_t idx[FT_MAX_DIMS] = {0};
    if (!numel(a))
        return true;
    do {
        float x = get(a, idx), y = get(b, idx);
        if (!(x == y || (isnan(x) && isnan(y)))) {
            fprintf(stderr, "  differ: %.9g vs %.9g\n", x, y);
            return false;
        }
    } while (next(idx, a));
    return true;
}

static void copy_values(const ft_tensor *dst, const ft_tensor *src) { CHECK_OK(ft_tensor_copy(dst, src, false)); }

/* ---- elementary functions ---- */

static double rel(double got, double want) { return want == 0 ? fabs(got) : fabs(got - want) / fabs(want); }

static void test_elementary(void) {
    double worst_exp = 0, worst_tanh = 0, worst_cdf = 0, worst_tail = 0;
    for (double x = -87.0; x <= 88.5; x += 0.00137) {
        float xf = (float)x;
        worst_exp = fmax(worst_exp, rel(ft_expf(xf), exp((double)xf)));
    }
    for (double x = -12.0; x <= 12.0; x += 0.000731) {
        float xf = (float)x;
        worst_tanh = fmax(worst_tanh, rel(ft_tanhf(xf), tanh((double)xf)));
        worst_cdf = fmax(worst_cdf, fabs(ft_normcdff(xf) - 0.5 * erfc(-(double)xf / sqrt(2.0))));
    }
    for (double x = -9.0; x <= 0.0; x += 0.000913) {
        float xf = (float)x;
        worst_tail = fmax(worst_tail, rel(ft_normcdff(xf), 0.5 * erfc(-(double)xf / sqrt(2.0))));
    }
    CHECKF(worst_exp < 2.5e-7, "exp relative error %.3g", worst_exp);
    CHECKF(worst_tanh < 2.5e-7, "tanh relative error %.3g", worst_tanh);
    CHECKF(worst_cdf < 1.5e-7, "normal cdf absolute error %.3g", worst_cdf);
    CHECKF(worst_tail < 8e-6, "normal cdf lower-tail relative error %.3g", worst_tail);
    CHECK(ft_expf(-200.0f) == 0.0f && isinf(ft_expf(100.0f)) && isnan(ft_expf(NAN)));
    CHECK(ft_expf(-100.0f) > 0.0f && ft_expf(-100.0f) < 1e-43f); /* gradual underflow */
    CHECK(ft_tanhf(30.0f) == 1.0f && ft_tanhf(-30.0f) == -1.0f && isnan(ft_tanhf(NAN)));
    CHECK(ft_sigmoidf(-200.0f) == 0.0f && ft_sigmoidf(200.0f) == 1.0f);
    CHECK(ft_relu(-0.0f) == 0.0f && isnan(ft_relu(NAN)));
    for (int k = 0; k < FT_NUM_ACTS; k++) {
        ft_act a = {(ft_act_kind)k, 0.1f};
        if (ft_act_grad_uses_output(a))
            for (float x = -4.0f; x <= 4.0f; x += 0.37f) {
                float gi = ft_act_grad_from_input(a, x), go = ft_act_grad_from_output(a, ft_act_forward(a, x));
                CHECKF(fabsf(gi - go) < 2e-6f, "act %d at %g: %g vs %g", k, x, gi, go);
            }
    }
}

/* ---- the vectorised loops equal the scalar kernels, over every layout path ---- */

static void test_activation_paths(void) {
    const int64_t *s = SHAPE(3, 5, 7, 9);
    ft_tensor x = make(4, s, FT_FLOAT32);
    fill_random(&x);
    for (int k = 0; k < FT_NUM_ACTS; k++) {
        ft_act a = {(ft_act_kind)k, 0.05f};
        ft_tensor y = make(4, s, FT_FLOAT32), want = make(4, s, FT_FLOAT32);
        int64_t idx[4] = {0};
        do
            set(&want, idx, ft_act_forward(a, get(&x, idx)));
        while (next(idx, &x));
        CHECK_OK(ft_activation_forward(&y, &x, a));
        CHECKF(same_values(&y, &want), "act %d contiguous", k);
        ft_tensor xs = make_strided(4, s, FT_FLOAT32), xl = make_nhwc(s, FT_FLOAT32);
        copy_values(&xs, &x);
        copy_values(&xl, &x);
        ft_tensor ys = make_strided(4, s, FT_FLOAT32);
        CHECK_OK(ft_activation_forward(&ys, &xs, a));
        CHECKF(same_values(&ys, &want), "act %d strided", k);
        CHECK_OK(ft_activation_forward(&xl, &xl, a)); /* in place, channels-last */
        CHECKF(same_values(&xl, &want), "act %d nhwc in place", k);
        /* backward from the input through bfloat16 tiles */
        ft_tensor xb = make(4, s, FT_BFLOAT16), gb = make(4, s, FT_BFLOAT16), g = make(4, s, FT_FLOAT32);
        copy_values(&xb, &x);
        CHECK_OK(ft_activation_backward(&gb, &x, &xb, NULL, a, false));
        memset(idx, 0, sizeof idx);
        bool ok = true;
        do {
            float exact = get(&x, idx) * ft_act_grad_from_input(a, get(&xb, idx));
            float want_g = ft_bf16_to_f32(ft_f32_to_bf16(exact));
            ok &= want_g == get(&gb, idx) || (isnan(want_g) && isnan(get(&gb, idx))); /* pow of x < 0 */
        } while (next(idx, &x));
        CHECKF(ok, "act %d bfloat16 backward", k);
        CHECK_OK(ft_activation_backward(&g, &x, &x, NULL, a, false));
        CHECK_OK(ft_activation_backward(&g, &x, &x, NULL, a, true));
        ft_tensor_release(&y), ft_tensor_release(&want), ft_tensor_release(&xs), ft_tensor_release(&xl);
        ft_tensor_release(&ys), ft_tensor_release(&xb), ft_tensor_release(&gb), ft_tensor_release(&g);
    }
    ft_tensor_release(&x);
}

static void test_elementwise_and_dropout(void) {
    const int64_t *s = SHAPE(2, 6, 5, 3);
    ft_tensor a = make(4, s, FT_FLOAT32), b = make_nhwc(s, FT_FLOAT32), o1 = make(4, s, FT_FLOAT32),
              o2 = make_strided(4, s, FT_FLOAT32), da = make(4, s, FT_FLOAT32), db = make(4, s, FT_FLOAT32);
    fill_random(&a);
    fill_random(&b);
    ft_act gelu = {FT_ACT_GELU, 0};
    CHECK_OK(ft_add_forward(&o1, &a, &b, gelu));
    CHECK_OK(ft_add_forward(&o2, &a, &b, (ft_act){FT_ACT_NONE, 0}));
    CHECK_OK(ft_activation_forward(&o2, &o2, gelu));
    CHECK(same_values(&o1, &o2));
    CHECK_OK(ft_add_backward(&da, &db, &o1, &a, &b, NULL, gelu, false, false));
    CHECK(same_values(&da, &db));
    CHECK_OK(ft_mul_backward(&da, &db, &o1, &a, &b, false, true));
    CHECK_STATUS(ft_add_backward(&da, &da, &o1, &a, &b, NULL, gelu, false, false), FT_ERR_VALUE);
    /* concat along channels of mixed layouts, then split back */
    ft_tensor cat = make_nhwc(SHAPE(2, 12, 5, 3), FT_FLOAT32);
    const ft_tensor *parts[2] = {&a, &b};
    CHECK_OK(ft_concat_forward(&cat, parts, 2, 1));
    ft_tensor g0 = make(4, s, FT_FLOAT32), g1 = make_strided(4, s, FT_FLOAT32);
    const ft_tensor *grads[2] = {&g0, &g1};
    CHECK_OK(ft_concat_backward(grads, SHAPE(6, 6), 2, &cat, 1, false));
    CHECK(same_values(&g0, &a) && same_values(&g1, &b));
    /* dropout: the same mask for every layout, regenerated by backward */
    ft_dropout_params dp = {0.3, 42, 5, 1};
    CHECK_OK(ft_dropout_forward(&o1, &a, &dp));
    copy_values(&b, &a);
    CHECK_OK(ft_dropout_forward(&b, &b, &dp));
    CHECK(same_values(&o1, &b));
    CHECK_OK(ft_dropout_backward(&o2, &a, &dp, false));
    CHECK(same_values(&o1, &o2));
    dp.p = 1.5;
    CHECK_STATUS(ft_dropout_forward(&o1, &a, &dp), FT_ERR_VALUE);
    ft_tensor_release(&a), ft_tensor_release(&b), ft_tensor_release(&o1), ft_tensor_release(&o2);
    ft_tensor_release(&da), ft_tensor_release(&db), ft_tensor_release(&cat), ft_tensor_release(&g0);
    ft_tensor_release(&g1);
}

/* ---- pooling: NCHW and NHWC agree bitwise over many parameter sets ---- */

static void test_pool_layouts(void) {
    for (int trial = 0; trial < 60; trial++) {
        int64_t N = 1 + trial % 2, C = 1 + trial % 5 * 17, H = 3 + trial % 7, W = 2 + trial % 9;
        ft_pool2d_params p = {{1 + trial % 3, 1 + (trial / 3) % 3}, {1 + trial % 2, 1 + (trial / 2) % 3},
                              {0, 0}, {1 + (trial / 5) % 2, 1}, trial % 4 == 1, trial % 3 != 0, 0};
        p.padding[0] = p.kernel[0] / 2 * (trial % 2);
        p.padding[1] = p.kernel[1] / 2;
        int64_t P, Q;
        if (ft_pool2d_out_size(&P, &Q, H, W, &p, "max_pool2d") != FT_OK)
            continue;
        const int64_t *s = SHAPE(N, C, H, W), *os = SHAPE(N, C, P, Q);
        ft_tensor x = make(4, s, FT_FLOAT32), xl = make_nhwc(s, FT_FLOAT32);
        fill_random(&x);
        copy_values(&xl, &x);
        ft_tensor o = make(4, os, FT_FLOAT32), ol = make_nhwc(os, FT_FLOAT32), i64 = make(4, os, FT_INT64),
                  i32 = make(4, os, FT_INT32), d = make(4, s, FT_FLOAT32), dl = make_nhwc(s, FT_FLOAT32);
        CHECK_OK(ft_max_pool2d_forward(&o, &i64, &x, &p));
        CHECK_OK(ft_max_pool2d_forward(&ol, &i32, &xl, &p));
        CHECKF(same_values(&o, &ol), "max pool trial %d", trial);
        CHECK_OK(ft_max_pool2d_backward(&d, &o, &i64, false));
        CHECK_OK(ft_max_pool2d_backward(&dl, &ol, &i32, false));
        CHECKF(same_values(&d, &dl), "max pool backward trial %d", trial);
        p.dilation[0] = 1;
        if (ft_pool2d_out_size(&P, &Q, H, W, &p, "avg_pool2d") == FT_OK && P == o.shape[2] && Q == o.shape[3]) {
            CHECK_OK(ft_avg_pool2d_forward(&o, &x, &p));
            CHECK_OK(ft_avg_pool2d_forward(&ol, &xl, &p));
            CHECKF(same_values(&o, &ol), "avg pool trial %d", trial);
            CHECK_OK(ft_avg_pool2d_backward(&d, &o, &p, false));
            CHECK_OK(ft_avg_pool2d_backward(&dl, &ol, &p, true));
            CHECK_OK(ft_avg_pool2d_backward(&dl, &ol, &p, false));
            CHECKF(same_values(&d, &dl), "avg pool backward trial %d", trial);
        }
        CHECK_OK(ft_adaptive_avg_pool2d_forward(&o, &x));
        CHECK_OK(ft_adaptive_avg_pool2d_forward(&ol, &xl));
        CHECKF(same_values(&o, &ol), "adaptive avg trial %d", trial);
        CHECK_OK(ft_adaptive_max_pool2d_forward(&o, &i64, &x));
        CHECK_OK(ft_adaptive_max_pool2d_backward(&dl, &o, &i64, false));
        ft_tensor_release(&x), ft_tensor_release(&xl), ft_tensor_release(&o), ft_tensor_release(&ol);
        ft_tensor_release(&i64), ft_tensor_release(&i32), ft_tensor_release(&d), ft_tensor_release(&dl);
    }
    /* bad indices are reported, never written through */
    ft_tensor x = make(4, SHAPE(1, 1, 4, 4), FT_FLOAT32), o = make(4, SHAPE(1, 1, 2, 2), FT_FLOAT32),
              i = make(4, SHAPE(1, 1, 2, 2), FT_INT64);
    fill_random(&x);
    ft_pool2d_params p = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, true, 0};
    CHECK_OK(ft_max_pool2d_forward(&o, &i, &x, &p));
    ((int64_t *)ft_tensor_data(&i))[3] = 16;
    CHECK_STATUS(ft_max_pool2d_backward(&x, &o, &i, false), FT_ERR_INDEX);
    ((int64_t *)ft_tensor_data(&i))[3] = -7;
    CHECK_STATUS(ft_max_pool2d_backward(&x, &o, &i, false), FT_ERR_INDEX);
    p.padding[0] = 2;
    CHECK_STATUS(ft_max_pool2d_forward(&o, &i, &x, &p), FT_ERR_VALUE);
    ft_tensor_release(&x), ft_tensor_release(&o), ft_tensor_release(&i);
}

/* ---- softmax and cross entropy on strided, bfloat16 and degenerate rows ---- */

static void test_softmax_and_losses(void) {
    const int64_t *s = SHAPE(3, 37, 2, 5);
    ft_tensor x = make(4, s, FT_FLOAT32), xs = make_strided(4, s, FT_FLOAT32), y = make(4, s, FT_FLOAT32),
              ys = make_nhwc(s, FT_FLOAT32), g = make(4, s, FT_FLOAT32), gs = make_strided(4, s, FT_FLOAT32);
    fill_random(&x);
    copy_values(&xs, &x);
    for (int dim = -4; dim < 4; dim++) {
        CHECK_OK(ft_log_softmax_forward(&y, &x, dim));
        CHECK_OK(ft_log_softmax_forward(&ys, &xs, dim));
        CHECKF(same_values(&y, &ys), "log_softmax dim %d", dim);
        CHECK_OK(ft_softmax_backward(&g, &x, &y, dim, false));
        CHECK_OK(ft_softmax_backward(&gs, &xs, &ys, dim, false));
        CHECKF(same_values(&g, &gs), "softmax backward dim %d", dim);
    }
    CHECK_STATUS(ft_softmax_forward(&y, &x, 4), FT_ERR_INDEX);
    /* cross entropy over (N, C, d1, d2) in two layouts, all options on */
    ft_tensor tg = make(3, SHAPE(3, 2, 5), FT_INT32), loss = make(0, SHAPE(0), FT_FLOAT32),
              loss2 = make(0, SHAPE(0), FT_FLOAT32), w = make(1, SHAPE(37), FT_FLOAT32);
    int32_t *tv = (int32_t *)ft_tensor_data(&tg);
    for (int i = 0; i < 30; i++)
        tv[i] = i % 7 == 3 ? -1 : (i * 11) % 37;
    fill_random(&w);
    ft_cross_entropy_params cp = {FT_REDUCTION_MEAN, -1, 0.2};
    CHECK_OK(ft_cross_entropy_forward(&loss, &g, &x, &tg, &w, &cp));
    CHECK_OK(ft_cross_entropy_forward(&loss2, &gs, &xs, &tg, &w, &cp));
    CHECK(same_values(&loss, &loss2) && same_values(&g, &gs));
    CHECK_OK(ft_cross_entropy_backward(&gs, &loss, &xs, &tg, &w, &cp, false));
    tv[7] = 37;
    CHECK_STATUS(ft_cross_entropy_forward(&loss, &g, &x, &tg, &w, &cp), FT_ERR_INDEX);
    /* one class, empty batch */
    ft_tensor x1 = make(2, SHAPE(4, 1), FT_FLOAT32), t1 = make(1, SHAPE(4), FT_INT64),
              g1 = make(2, SHAPE(4, 1), FT_FLOAT32);
    fill_random(&x1);
    memset(ft_tensor_data(&t1), 0, 4 * sizeof(int64_t));
    CHECK_OK(ft_cross_entropy_forward(&loss, &g1, &x1, &t1, NULL, &cp));
    CHECK(fabsf(*(float *)ft_tensor_data(&loss)) < 1e-6f);
    ft_tensor x0 = make(2, SHAPE(0, 5), FT_BFLOAT16), t0 = make(1, SHAPE(0), FT_INT64);
    CHECK_OK(ft_cross_entropy_forward(&loss, NULL, &x0, &t0, NULL, &cp));
    CHECK(isnan(*(float *)ft_tensor_data(&loss)));
    /* mse: layouts agree bitwise, mean of nothing is NaN */
    CHECK_OK(ft_mse_loss_forward(&loss, &x, &xs, FT_REDUCTION_SUM));
    CHECK(*(float *)ft_tensor_data(&loss) == 0.0f);
    CHECK_OK(ft_mse_loss_forward(&loss, &x, &y, FT_REDUCTION_MEAN));
    CHECK_OK(ft_mse_loss_forward(&loss2, &xs, &ys, FT_REDUCTION_MEAN));
    CHECK(same_values(&loss, &loss2));
    CHECK_OK(ft_mse_loss_backward(&g, &gs, &loss, &x, &y, FT_REDUCTION_MEAN, false, false));
    ft_tensor_release(&x), ft_tensor_release(&xs), ft_tensor_release(&y), ft_tensor_release(&ys);
    ft_tensor_release(&g), ft_tensor_release(&gs), ft_tensor_release(&tg), ft_tensor_release(&loss);
    ft_tensor_release(&loss2), ft_tensor_release(&w), ft_tensor_release(&x1), ft_tensor_release(&t1);
    ft_tensor_release(&g1), ft_tensor_release(&x0), ft_tensor_release(&t0);
}

/* ---- group norm, embedding, nearest upsampling ---- */

/* |a - b| <= tol (1 + |b|) everywhere. */
static bool close_values(const ft_tensor *a, const ft_tensor *b, float tol) {
    int64_t idx[FT_MAX_DIMS] = {0};
    if (!numel(a))
        return true;
    do {
        float x = get(a, idx), y = get(b, idx);
        if (!(fabsf(x - y) <= tol * (1.0f + fabsf(y)))) {
            fprintf(stderr, "  differ: %.9g vs %.9g\n", x, y);
            return false;
        }
    } while (next(idx, a));
    return true;
}

static void test_group_norm(void) {
    const int64_t *s = SHAPE(2, 6, 3, 5);
    ft_tensor x = make(4, s, FT_FLOAT32), xl = make_nhwc(s, FT_FLOAT32), y = make(4, s, FT_FLOAT32),
              yl = make_nhwc(s, FT_FLOAT32), dx = make(4, s, FT_FLOAT32), dxl = make_nhwc(s, FT_FLOAT32),
              w = make(1, SHAPE(6), FT_FLOAT32), b = make(1, SHAPE(6), FT_FLOAT32), m = make(2, SHAPE(2, 3), FT_FLOAT32),
              r = make(2, SHAPE(2, 3), FT_FLOAT32), ml = make(2, SHAPE(2, 3), FT_FLOAT32),
              rl = make(2, SHAPE(2, 3), FT_FLOAT32), dw = make(1, SHAPE(6), FT_FLOAT32),
              db = make(1, SHAPE(6), FT_FLOAT32), dw2 = make(1, SHAPE(6), FT_FLOAT32),
              db2 = make(1, SHAPE(6), FT_FLOAT32);
    fill_random(&x), fill_random(&w), fill_random(&b);
    copy_values(&xl, &x);
    CHECK_OK(ft_group_norm_forward(&y, &m, &r, &x, &w, &b, 3, 1e-5));
    CHECK_OK(ft_group_norm_forward(&yl, &ml, &rl, &xl, &w, &b, 3, 1e-5));
    CHECK(close_values(&yl, &y, 1e-5f) && close_values(&ml, &m, 1e-6f) && close_values(&rl, &r, 1e-5f));
    /* without weight and bias each group of the output has mean 0 and variance 1 */
    CHECK_OK(ft_group_norm_forward(&dx, NULL, NULL, &x, NULL, NULL, 2, 1e-5));
    double sum = 0, sq = 0;
    for (int i = 0; i < 45; i++) {
        float v = ((float *)ft_tensor_data(&dx))[i];
        sum += v, sq += (double)v * v;
    }
    CHECK(fabs(sum / 45) < 1e-5 && fabs(sq / 45 - 1) < 1e-3);
    CHECK_OK(ft_group_norm_backward(&dx, &dw, &db, &y, &x, &m, &r, &w, 3, (ft_grad_acc){false, false, false}));
    CHECK_OK(ft_group_norm_backward(&dxl, &dw2, &db2, &yl, &xl, &m, &r, &w, 3, (ft_grad_acc){false, false, false}));
    CHECK(close_values(&dxl, &dx, 1e-4f) && close_values(&dw2, &dw, 1e-4f) && close_values(&db2, &db, 1e-4f));
    /* accumulating twice gives twice the parameter gradients */
    CHECK_OK(ft_group_norm_backward(NULL, &dw2, &db2, &yl, &xl, &m, &r, &w, 3, (ft_grad_acc){false, true, true}));
    for (int c = 0; c < 6; c++) {
        float a = ((float *)ft_tensor_data(&db))[c], a2 = ((float *)ft_tensor_data(&db2))[c];
        CHECKF(fabsf(a2 - 2 * a) <= 1e-4f * (1 + fabsf(a)), "group norm accumulated dbias %d", c);
    }
    CHECK_STATUS(ft_group_norm_forward(&y, &m, &r, &x, &w, &b, 4, 1e-5), FT_ERR_VALUE);
    CHECK_STATUS(ft_group_norm_forward(&yl, &m, &r, &x, &w, &b, 3, 1e-5), FT_ERR_SHAPE);
    CHECK_STATUS(ft_group_norm_backward(&dx, NULL, NULL, &y, &x, NULL, NULL, NULL, 3, (ft_grad_acc){0}), FT_ERR_VALUE);
    ft_tensor_release(&x), ft_tensor_release(&xl), ft_tensor_release(&y), ft_tensor_release(&yl);
    ft_tensor_release(&dx), ft_tensor_release(&dxl), ft_tensor_release(&w), ft_tensor_release(&b);
    ft_tensor_release(&m), ft_tensor_release(&r), ft_tensor_release(&ml), ft_tensor_release(&rl);
    ft_tensor_release(&dw), ft_tensor_release(&db), ft_tensor_release(&dw2), ft_tensor_release(&db2);
}

/* ft_matmul_batched: a strided (transposed) operand against a float64 product, += with sum, and refusals. */
static void test_matmul_batched(void) {
    ft_tensor a = make(3, SHAPE(2, 3, 4), FT_FLOAT32), wt = make(3, SHAPE(2, 5, 4), FT_FLOAT32),
              out = make(3, SHAPE(2, 3, 5), FT_FLOAT32), ids = make(3, SHAPE(2, 3, 5), FT_INT64),
              small = make(3, SHAPE(2, 3, 4), FT_FLOAT32);
    fill_random(&a);
    fill_random(&wt);
    ft_tensor w = wt; /* (2, 4, 5): the transposed view */
    w.shape[1] = 4, w.shape[2] = 5, w.strides[1] = 1, w.strides[2] = 4;
    CHECK_OK(ft_matmul_batched(&out, &a, &w, false));
    const float *av = (const float *)ft_tensor_data(&a), *wv = (const float *)ft_tensor_data(&wt);
    float *ov = (float *)ft_tensor_data(&out);
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 3; m++)
            for (int p = 0; p < 5; p++) {
                double want = 0;
                for (int k = 0; k < 4; k++)
                    want += (double)av[(b * 3 + m) * 4 + k] * wv[(b * 5 + p) * 4 + k];
                CHECKF(fabs(ov[(b * 3 + m) * 5 + p] - want) < 1e-5, "matmul_batched %d %d %d", b, m, p);
            }
    float first = ov[0];
    CHECK_OK(ft_matmul_batched(&out, &a, &w, true));
    CHECK(fabsf(ov[0] - 2 * first) < 1e-5f);
    CHECK_STATUS(ft_matmul_batched(&small, &a, &w, false), FT_ERR_SHAPE);
    CHECK_STATUS(ft_matmul_batched(&ids, &a, &w, false), FT_ERR_DTYPE);
    CHECK(fabsf(ov[0] - 2 * first) < 1e-5f); /* the refusals wrote nothing */
    ft_tensor *all[5] = {&a, &wt, &out, &ids, &small};
    for (int i = 0; i < 5; i++)
        ft_tensor_release(all[i]);
}

static void test_embedding(void) {
    ft_tensor w = make(2, SHAPE(7, 33), FT_FLOAT32), ids = make(2, SHAPE(2, 5), FT_INT64),
              out = make(3, SHAPE(2, 5, 33), FT_FLOAT32), dw = make(2, SHAPE(7, 33), FT_FLOAT32);
    fill_random(&w);
    int64_t *id = (int64_t *)ft_tensor_data(&ids);
    const int64_t vals[10] = {3, 1, 3, 0, 6, 3, 2, 1, 1, 3};
    memcpy(id, vals, sizeof vals);
    CHECK_OK(ft_embedding_forward(&out, &ids, &w, -1));
    const float *wv = (const float *)ft_tensor_data(&w), *ov = (const float *)ft_tensor_data(&out);
    for (int t = 0; t < 10; t++)
        CHECKF(!memcmp(ov + t * 33, wv + vals[t] * 33, 33 * sizeof(float)), "embedding row %d", t);
    fill_random(&dw);
    CHECK_OK(ft_embedding_backward(&dw, &out, &ids, 1, false));
    const float *g = (const float *)ft_tensor_data(&dw);
    for (int d = 0; d < 33; d++) {
        float want3 = 0.0f;
        for (int t = 0; t < 10; t++)
            if (vals[t] == 3)
                want3 += ov[t * 33 + d];
        CHECKF(g[3 * 33 + d] == want3 && g[1 * 33 + d] == 0.0f && g[4 * 33 + d] == 0.0f, "embedding grad %d", d);
    }
    id[7] = 7;
    fill_random(&out);
    float before = ((float *)ft_tensor_data(&out))[0];
    CHECK_STATUS(ft_embedding_forward(&out, &ids, &w, -1), FT_ERR_INDEX);
    CHECK(((float *)ft_tensor_data(&out))[0] == before);
    CHECK_STATUS(ft_embedding_backward(&dw, &out, &ids, -1, true), FT_ERR_INDEX);
    CHECK_STATUS(ft_embedding_forward(&out, &ids, &w, 7), FT_ERR_VALUE);
    CHECK_STATUS(ft_embedding_forward(&out, &w, &w, -1), FT_ERR_DTYPE);
    ft_tensor_release(&w), ft_tensor_release(&ids), ft_tensor_release(&out), ft_tensor_release(&dw);
}

static void test_upsample(void) {
    const int64_t *s = SHAPE(2, 3, 4, 5), *bs = SHAPE(2, 3, 8, 15);
    ft_tensor x = make(4, s, FT_FLOAT32), xl = make_nhwc(s, FT_FLOAT32), y = make(4, bs, FT_FLOAT32),
              yl = make_nhwc(bs, FT_FLOAT32), ys = make_strided(4, bs, FT_FLOAT32), dx = make(4, s, FT_FLOAT32),
              dxl = make_nhwc(s, FT_FLOAT32);
    fill_random(&x);
    copy_values(&xl, &x);
    CHECK_OK(ft_upsample_nearest2d_forward(&y, &x, 2, 3));
    CHECK_OK(ft_upsample_nearest2d_forward(&yl, &xl, 2, 3));
    CHECK_OK(ft_upsample_nearest2d_forward(&ys, &xl, 2, 3));
    CHECK(same_values(&yl, &y) && same_values(&ys, &y));
    CHECK(get(&y, SHAPE(1, 2, 7, 14)) == get(&x, SHAPE(1, 2, 3, 4)));
    CHECK_OK(ft_upsample_nearest2d_backward(&dx, &y, 2, 3, false));
    CHECK_OK(ft_upsample_nearest2d_backward(&dxl, &ys, 2, 3, false));
    CHECK(same_values(&dxl, &dx));
    CHECK(fabsf(get(&dx, SHAPE(1, 1, 2, 3)) - 6 * get(&x, SHAPE(1, 1, 2, 3))) < 1e-5f);
    CHECK_OK(ft_upsample_nearest2d_backward(&dxl, &ys, 2, 3, true));
    CHECK(fabsf(get(&dxl, SHAPE(0, 2, 1, 0)) - 12 * get(&x, SHAPE(0, 2, 1, 0))) < 1e-5f);
    CHECK_STATUS(ft_upsample_nearest2d_forward(&y, &x, 3, 3), FT_ERR_SHAPE);
    CHECK_STATUS(ft_upsample_nearest2d_forward(&y, &x, 0, 3), FT_ERR_VALUE);
    ft_tensor_release(&x), ft_tensor_release(&xl), ft_tensor_release(&y), ft_tensor_release(&yl);
    ft_tensor_release(&ys), ft_tensor_release(&dx), ft_tensor_release(&dxl);
}

/* Bilinear: both layouts agree; with align_corners a ramp stays a ramp at
 * the output's positions; the backward is the forward's adjoint (<y, dy> =
 * <x, dx>), and the gather adds onto a held gradient. */
static void test_upsample_bilinear(void) {
    const int64_t *s = SHAPE(2, 3, 4, 5), *bs = SHAPE(2, 3, 7, 9);
    ft_tensor x = make(4, s, FT_FLOAT32), xl = make_nhwc(s, FT_FLOAT32), y = make(4, bs, FT_FLOAT32),
              yl = make_nhwc(bs, FT_FLOAT32), dy = make(4, bs, FT_FLOAT32), dx = make(4, s, FT_FLOAT32),
              dxl = make_nhwc(s, FT_FLOAT32);
    ft_bilinear2d_params ac = {0.0, 0.0, true}, half = {0.0, 0.0, false};
    for (int64_t h = 0; h < 4; h++)
        for (int64_t w = 0; w < 5; w++)
            set(&x, SHAPE(1, 2, h, w), (float)(3 * h + w));
    CHECK_OK(ft_upsample_bilinear2d_forward(&y, &x, &ac));
    for (int64_t p = 0; p < 7; p++)
        for (int64_t q = 0; q < 9; q++) /* input coordinates p 3/6 and q 4/8 */
            CHECK(fabsf(get(&y, SHAPE(1, 2, p, q)) - (3.0f * p / 2 + q / 2.0f)) < 1e-5f);
    fill_random(&x);
    copy_values(&xl, &x);
    fill_random(&dy);
    CHECK_OK(ft_upsample_bilinear2d_forward(&y, &x, &half));
    CHECK_OK(ft_upsample_bilinear2d_forward(&yl, &xl, &half));
    CHECK(same_values(&yl, &y));
    CHECK_OK(ft_upsample_bilinear2d_backward(&dx, &dy, &half, false));
    CHECK_OK(ft_upsample_bilinear2d_backward(&dxl, &dy, &half, false));
    CHECK(same_values(&dxl, &dx));
    double yy = 0, xx = 0;
    for (int64_t i = 0; i < ft_tensor_numel(&y); i++)
        yy += (double)((float *)ft_tensor_data(&y))[i] * ((float *)ft_tensor_data(&dy))[i];
    for (int64_t i = 0; i < ft_tensor_numel(&x); i++)
        xx += (double)((float *)ft_tensor_data(&x))[i] * ((float *)ft_tensor_data(&dx))[i];
    CHECK(fabs(yy - xx) < 1e-4 * (1 + fabs(yy)));
    CHECK_OK(ft_upsample_bilinear2d_backward(&dxl, &dy, &half, true));
    CHECK(fabsf(get(&dxl, SHAPE(1, 1, 2, 3)) - 2 * get(&dx, SHAPE(1, 1, 2, 3))) < 1e-5f);
    ft_bilinear2d_params bad = {-1.0, 0.0, false};
    CHECK_STATUS(ft_upsample_bilinear2d_forward(&y, &x, &bad), FT_ERR_VALUE);
    CHECK_STATUS(ft_upsample_bilinear2d_forward(&dx, &y, &half), FT_OK); /* downsampling is resampling too */
    ft_tensor_release(&x), ft_tensor_release(&xl), ft_tensor_release(&y), ft_tensor_release(&yl);
    ft_tensor_release(&dy), ft_tensor_release(&dx), ft_tensor_release(&dxl);
}

/* Attention of head (n, h) in double: out (Tq, D) and the gradients, the
 * probabilities in full. */
static void naive_attention(double *out, double *dq, double *dk, double *dv, const ft_tensor *q, const ft_tensor *k,
                            const ft_tensor *v, const ft_tensor *dout, int64_t n, int64_t h, double scale,
                            bool causal) {
    int64_t Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3];
    double *p = calloc((size_t)(Tq * Tk), sizeof *p), *dp = calloc((size_t)(Tq * Tk), sizeof *dp);
    for (int64_t i = 0; i < Tq; i++) {
        double m = -INFINITY, l = 0, delta = 0;
        for (int64_t j = 0; j < Tk; j++) {
            double s = 0;
            for (int64_t d = 0; d < D; d++)
                s += (double)get(q, SHAPE(n, h, i, d)) * get(k, SHAPE(n, h, j, d));
            p[i * Tk + j] = causal && j > i ? -INFINITY : s * scale;
            m = fmax(m, p[i * Tk + j]);
        }
        for (int64_t j = 0; j < Tk; j++)
            l += (p[i * Tk + j] = exp(p[i * Tk + j] - m));
        for (int64_t d = 0; d < D; d++) {
            out[i * D + d] = 0;
            for (int64_t j = 0; j < Tk; j++)
                out[i * D + d] += p[i * Tk + j] / l * get(v, SHAPE(n, h, j, d));
        }
        for (int64_t j = 0; j < Tk; j++) {
            p[i * Tk + j] /= l;
            dp[i * Tk + j] = 0;
            for (int64_t d = 0; d < D; d++)
                dp[i * Tk + j] += (double)get(dout, SHAPE(n, h, i, d)) * get(v, SHAPE(n, h, j, d));
            delta += p[i * Tk + j] * dp[i * Tk + j];
        }
        for (int64_t j = 0; j < Tk; j++)
            dp[i * Tk + j] = p[i * Tk + j] * (dp[i * Tk + j] - delta); /* dS */
    }
    for (int64_t d = 0; d < D; d++) {
        for (int64_t i = 0; i < Tq; i++) {
            dq[i * D + d] = 0;
            for (int64_t j = 0; j < Tk; j++)
                dq[i * D + d] += dp[i * Tk + j] * get(k, SHAPE(n, h, j, d)) * scale;
        }
        for (int64_t j = 0; j < Tk; j++) {
            dk[j * D + d] = dv[j * D + d] = 0;
            for (int64_t i = 0; i < Tq; i++) {
                dk[j * D + d] += dp[i * Tk + j] * get(q, SHAPE(n, h, i, d)) * scale;
                dv[j * D + d] += p[i * Tk + j] * get(dout, SHAPE(n, h, i, d));
            }
        }
    }
    free(p);
    free(dp);
}

/* Largest |got - want| / (1 + |want|) over head (n, h) of t. */
static double head_err(const ft_tensor *t, const double *want, int64_t n, int64_t h) {
    double e = 0;
    for (int64_t i = 0; i < t->shape[2]; i++)
        for (int64_t d = 0; d < t->shape[3]; d++) {
            double w = want[i * t->shape[3] + d];
            e = fmax(e, fabs(get(t, SHAPE(n, h, i, d)) - w) / (1 + fabs(w)));
        }
    return e;
}

static void test_attention(void) {
    enum { N = 1, H = 2, TQ = 70, TK = 67, D = 20 };
    ft_tensor q = make(4, SHAPE(N, H, TQ, D), FT_FLOAT32), k = make(4, SHAPE(N, H, TK, D), FT_FLOAT32),
              v = make(4, SHAPE(N, H, TK, D), FT_FLOAT32), dout = make(4, SHAPE(N, H, TQ, D), FT_FLOAT32);
    ft_tensor out = make(4, SHAPE(N, H, TQ, D), FT_FLOAT32), lse = make(3, SHAPE(N, H, TQ), FT_FLOAT32);
    ft_tensor dq = make(4, SHAPE(N, H, TQ, D), FT_FLOAT32), dk = make(4, SHAPE(N, H, TK, D), FT_FLOAT32),
              dv = make(4, SHAPE(N, H, TK, D), FT_FLOAT32), dq1 = make(4, SHAPE(N, H, TQ, D), FT_FLOAT32);
    fill_random(&q), fill_random(&k), fill_random(&v), fill_random(&dout);
    double *want = malloc(sizeof(double) * 4 * TQ * D);
    double *wq = want + TQ * D, *wk = wq + TQ * D, *wv = wk + TQ * D;
    int threads = omp_get_max_threads();
    /* causal or not; the last round with dropout (its values: tests/test_ops_attention.py) */
    for (int round = 0; round < 3; round++) {
        int causal = round == 1;
        ft_sdpa_params p = {0.3, causal, round == 2 ? 0.25 : 0.0, 7, 3};
        CHECK_OK(ft_sdpa_forward(&out, &lse, &q, &k, &v, &p));
        CHECK_OK(ft_sdpa_backward(&dq, &dk, &dv, NULL, &dout, &q, &k, &v, &out, &lse, &p, (ft_sdpa_acc){0}));
        for (int64_t h = 0; h < H && !p.dropout_p; h++) {
            naive_attention(want, wq, wk, wv, &q, &k, &v, &dout, 0, h, 0.3, causal);
            CHECKF(head_err(&out, want, 0, h) < 1e-5, "out, causal %d head %lld", causal, (long long)h);
            CHECKF(head_err(&dq, wq, 0, h) < 1e-4, "dq, causal %d head %lld", causal, (long long)h);
            CHECKF(head_err(&dk, wk, 0, h) < 1e-4, "dk, causal %d head %lld", causal, (long long)h);
            CHECKF(head_err(&dv, wv, 0, h) < 1e-4, "dv, causal %d head %lld", causal, (long long)h);
        }
        /* one thread computes dq within the key pass, more in a pass of its own: the same bits */
        omp_set_num_threads(1);
        CHECK_OK(ft_sdpa_backward(&dq1, &dk, &dv, NULL, &dout, &q, &k, &v, &out, &lse, &p, (ft_sdpa_acc){0}));
        omp_set_num_threads(threads);
        CHECK(memcmp(ft_tensor_data(&dq), ft_tensor_data(&dq1), sizeof(float) * N * H * TQ * D) == 0);
        /* accumulate adds the same contribution again */
        CHECK_OK(ft_sdpa_backward(&dq1, NULL, NULL, NULL, &dout, &q, &k, &v, &out, &lse, &p, (ft_sdpa_acc){true}));
        CHECK(fabsf(get(&dq1, SHAPE(0, 1, 5, 3)) - 2 * get(&dq, SHAPE(0, 1, 5, 3))) < 1e-5f);
    }
    /* a transposed (N, T, H, D) buffer as q: the same bits */
    ft_tensor qt = make(4, SHAPE(N, TQ, H, D), FT_FLOAT32), qv;
    CHECK_OK(ft_tensor_view(&qv, &qt, 4, SHAPE(N, H, TQ, D), SHAPE(TQ * H * D, D, H * D, 1), qt.offset));
    copy_values(&qv, &q);
    ft_sdpa_params p = {0, false};
    CHECK_OK(ft_sdpa_forward(&out, NULL, &q, &k, &v, &p));
    CHECK_OK(ft_sdpa_forward(&dq1, NULL, &qv, &k, &v, &p));
    CHECK(same_values(&out, &dq1));
    /* errors: D not unit stride, mismatched shapes, an output over an input */
    ft_tensor ks;
    CHECK_OK(ft_tensor_view(&ks, &k, 4, SHAPE(N, H, TK, D / 2), SHAPE(TK * D * H, TK * D, D, 2), k.offset));
    CHECK_STATUS(ft_sdpa_forward(&out, NULL, &q, &ks, &ks, &p), FT_ERR_SHAPE);
    CHECK_STATUS(ft_sdpa_forward(&out, NULL, &q, &k, &q, &p), FT_ERR_SHAPE);
    CHECK_STATUS(ft_sdpa_forward(&q, NULL, &q, &k, &v, &p), FT_ERR_VALUE);
    CHECK_STATUS(ft_sdpa_forward(&out, NULL, &q, &k, &v, &(ft_sdpa_params){0, false, 1.5, 0, 0}), FT_ERR_VALUE);
    CHECK_STATUS(ft_sdpa_backward(&dq, &dk, &dv, NULL, &dout, &q, &k, &v, &out, NULL, &p, (ft_sdpa_acc){0}),
                 FT_ERR_VALUE);
    free(want);
    ft_tensor *all[] = {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv, &dq1, &qt, &qv, &ks};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ft_tensor_release(all[i]);
}

/* sum_to against sums in double, in NHWC and strided layouts and into bfloat16; broadcast_to exactly. */
static void test_broadcasting(void) {
    const int64_t *s = SHAPE(2, 3, 4, 5), *r = SHAPE(2, 1, 4, 1);
    ft_tensor x = make_nhwc(s, FT_FLOAT32), sums = make(4, r, FT_FLOAT32), sums16 = make(4, r, FT_BFLOAT16),
              y = make_strided(4, s, FT_FLOAT32);
    fill_random(&x);
    CHECK_OK(ft_sum_to(&sums, &x, 0.5, false));
    CHECK_OK(ft_sum_to(&sums16, &x, 0.5, false));
    int64_t i[FT_MAX_DIMS] = {0};
    do {
        double want = 0;
        for (int64_t c = 0; c < 3; c++)
            for (int64_t w = 0; w < 5; w++)
                want += get(&x, (int64_t[]){i[0], c, i[2], w});
        want *= 0.5;
        CHECKF(rel(get(&sums, i), want) < 1e-6, "sum_to [%lld, 0, %lld, 0]", (long long)i[0], (long long)i[2]);
        CHECKF(get(&sums16, i) == ft_bf16_to_f32(ft_f32_to_bf16((float)want)), "sum_to bfloat16");
    } while (next(i, &sums));
    float first = get(&sums, SHAPE(0, 0, 0, 0));
    CHECK_OK(ft_sum_to(&sums, &x, 0.5, true));
    CHECK(get(&sums, SHAPE(0, 0, 0, 0)) == 2 * first);

    CHECK_OK(ft_broadcast_to(&y, &sums, 2.0, false));
    memset(i, 0, sizeof i);
    do
        CHECKF(get(&y, i) == 2 * get(&sums, (int64_t[]){i[0], 0, i[2], 0}), "broadcast_to");
    while (next(i, &y));
    CHECK_OK(ft_broadcast_to(&y, &sums, 1.0, true));
    CHECK(get(&y, SHAPE(1, 2, 3, 4)) == 3 * get(&sums, SHAPE(1, 0, 3, 0)));

    ft_tensor wrong = make(4, SHAPE(2, 2, 4, 1), FT_FLOAT32), flat = make(2, SHAPE(2, 60), FT_FLOAT32);
    CHECK_STATUS(ft_sum_to(&wrong, &x, 1.0, false), FT_ERR_SHAPE);
    CHECK_STATUS(ft_broadcast_to(&x, &wrong, 1.0, false), FT_ERR_SHAPE);
    CHECK_STATUS(ft_sum_to(&flat, &x, 1.0, false), FT_ERR_SHAPE);
    float kept = get(&x, SHAPE(1, 2, 3, 4));
    CHECK_OK(ft_sum_to(&x, &x, 1.0, false)); /* the same view: in place, nothing summed */
    CHECK(get(&x, SHAPE(1, 2, 3, 4)) == kept);
    ft_tensor_release(&x), ft_tensor_release(&sums), ft_tensor_release(&sums16), ft_tensor_release(&y);
    ft_tensor_release(&wrong), ft_tensor_release(&flat);
}

/* sum_to over dense tensors whose summed dimensions are consecutive (a mean over tokens, each sample's sum): every
 * sum in C order in double, as the general loop's, so equal to that sum exactly; rows longer than its runs of 256
 * values, and bfloat16 values. */
static void test_dense_sums(void) {
    const int64_t *s = SHAPE(3, 7, 300), *outs[3] = {SHAPE(3, 1, 300), SHAPE(3, 1, 1), SHAPE(1, 1, 300)};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        ft_tensor x = make(3, s, bf16 ? FT_BFLOAT16 : FT_FLOAT32);
        fill_random(&x);
        for (int o = 0; o < 3; o++) {
            ft_tensor sums = make(3, outs[o], FT_FLOAT32);
            CHECK_OK(ft_sum_to(&sums, &x, 0.25, false));
            int64_t i[FT_MAX_DIMS] = {0};
            do {
                double want = 0;
                int64_t j[FT_MAX_DIMS] = {0};
                do {
                    bool summed = true;
                    for (int d = 0; d < 3; d++)
                        summed = summed && (outs[o][d] == 1 || j[d] == i[d]);
                    if (summed)
                        want += get(&x, j);
                } while (next(j, &x));
                CHECKF(get(&sums, i) == (float)(want * 0.25), "dense sum_to %d [%lld, %lld, %lld]", o,
                       (long long)i[0], (long long)i[1], (long long)i[2]);
            } while (next(i, &sums));
            ft_tensor_release(&sums);
        }
        ft_tensor_release(&x);
    }
}

int main(void) {
    test_elementary();
    test_activation_paths();
    test_elementwise_and_dropout();
    test_pool_layouts();
    test_softmax_and_losses();
    test_group_norm();
    test_matmul_batched();
    test_embedding();
    test_upsample();
    test_upsample_bilinear();
    test_attention();
    test_broadcasting();
    test_dense_sums();
    return check_main_result("test_ops");
}
