/* Random tensors of core/rng.h: independence from the thread count, the
 * documented offset accounting, ranges and loose statistics, errors. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/rng.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static ft_tensor make(int64_t n, ft_dtype dt) {
    ft_tensor t = {0};
    if (ft_tensor_empty(&t, 1, &n, dt, FT_CPU, false) != FT_OK) {
        fprintf(stderr, "ft_tensor_empty failed: %s\n", ft_last_error());
        exit(2);
    }
    return t;
}

static double half_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

static double bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Element i of a float tensor as a double. */
static double at(const ft_tensor *t, int64_t i) {
    const char *p = ft_tensor_data(t) + i * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    switch (t->dtype) {
    case FT_FLOAT16: return half_value(*(const uint16_t *)p);
    case FT_BFLOAT16: return bf16_value(*(const uint16_t *)p);
    case FT_FLOAT32: return *(const float *)p;
    case FT_FLOAT64: return *(const double *)p;
    case FT_INT64: return (double)*(const int64_t *)p;
    case FT_INT32: return *(const int32_t *)p;
    case FT_INT16: return *(const int16_t *)p;
    case FT_INT8: return *(const int8_t *)p;
    case FT_UINT8: return *(const uint8_t *)p;
    case FT_BOOL: return *(const uint8_t *)p;
    case FT_UINT64: return (double)*(const uint64_t *)p;
    case FT_UINT16: return *(const uint16_t *)p;
    case FT_UINT32: return *(const uint32_t *)p;
    default: abort();
    }
}

enum { UNIFORM, NORMAL, RANDINT, RANDPERM };

static ft_status draw(int kind, const ft_tensor *t, ft_rng_state *rng) {
    switch (kind) {
    case UNIFORM: return ft_rng_uniform(t, rng, -1.5, 2.0);
    case NORMAL: return ft_rng_normal(t, rng, 0.5, 3.0);
    case RANDINT: return ft_rng_randint(t, rng, 3, 100);
    default: return ft_rng_randperm(t, rng);
    }
}

/* Above the parallel threshold, 1 and 2 threads give the same bytes and
 * advance the offset alike. */
static void test_thread_independence(void) {
    static const struct {
        int kind;
        ft_dtype dt;
    } cases[] = {{UNIFORM, FT_FLOAT32}, {UNIFORM, FT_FLOAT64}, {UNIFORM, FT_FLOAT16}, {UNIFORM, FT_BFLOAT16},
                 {NORMAL, FT_FLOAT32},  {NORMAL, FT_FLOAT64},  {NORMAL, FT_FLOAT16},  {RANDINT, FT_INT64},
                 {RANDINT, FT_INT32},   {RANDINT, FT_INT8},    {RANDINT, FT_FLOAT32}, {RANDPERM, FT_INT64},
                 {RANDPERM, FT_INT32}};
    const int64_t n = (1 << 17) + 3; /* odd, so that the last block is partial */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ft_tensor t[2];
        ft_rng_state rng[2];
        for (int k = 0; k < 2; k++) {
            omp_set_num_threads(k + 1);
            CHECK(omp_get_max_threads() == k + 1);
            t[k] = make(n, cases[c].dt);
            rng[k] = (ft_rng_state){.seed = 0x0123456789abcdefull, .offset = 1000};
            CHECK_OK(draw(cases[c].kind, &t[k], &rng[k]));
        }
        size_t bytes = (size_t)n * ft_dtype_get(cases[c].dt)->itemsize;
        CHECKF(memcmp(ft_tensor_data(&t[0]), ft_tensor_data(&t[1]), bytes) == 0, "case %zu (%s)", c,
               ft_dtype_get(cases[c].dt)->name);
        CHECK(rng[0].offset == rng[1].offset && rng[0].seed == rng[1].seed);
        ft_tensor_release(&t[0]);
        ft_tensor_release(&t[1]);
    }
    omp_set_num_threads(2);
}

/* rng.h: element i comes from block offset + i / E, E = 4 for floats of 32
 * bits or fewer and 2 for float64 and integers; the offset advances by the
 * blocks used. */
static void test_offsets(void) {
    static const struct {
        int kind;
        ft_dtype dt;
        int per;
    } cases[] = {{UNIFORM, FT_FLOAT32, 4}, {UNIFORM, FT_FLOAT16, 4}, {UNIFORM, FT_BFLOAT16, 4},
                 {UNIFORM, FT_FLOAT64, 2}, {NORMAL, FT_FLOAT32, 4},  {NORMAL, FT_FLOAT64, 2},
                 {RANDINT, FT_INT64, 2},   {RANDINT, FT_INT8, 2},    {RANDINT, FT_FLOAT32, 2},
                 {RANDINT, FT_UINT16, 2}};
    const int64_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 100001};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            ft_tensor t = make(sizes[s], cases[c].dt);
            ft_rng_state rng = {.seed = 42, .offset = 7};
            CHECK_OK(draw(cases[c].kind, &t, &rng));
            uint64_t blocks = (uint64_t)((sizes[s] + cases[c].per - 1) / cases[c].per);
            CHECKF(rng.offset == 7 + blocks && rng.seed == 42, "case %zu n=%lld: offset %llu, want %llu", c,
                   (long long)sizes[s], (unsigned long long)rng.offset, (unsigned long long)(7 + blocks));
            ft_tensor_release(&t);
        }
        /* Two draws in a row equal one draw of both sizes when the first
         * ends on a block boundary; otherwise the rest of its last block is
         * skipped. */
        int per = cases[c].per;
        int64_t n1 = 3 * per, n1_odd = 3 * per - 1, n2 = 5;
        ft_tensor all = make(n1 + n2, cases[c].dt), a = make(n1, cases[c].dt), b = make(n2, cases[c].dt);
        ft_tensor a_odd = make(n1_odd, cases[c].dt), b2 = make(n2, cases[c].dt);
        ft_rng_state r0 = {.seed = 5, .offset = 11}, r1 = r0, r2 = r0;
        CHECK_OK(draw(cases[c].kind, &all, &r0));
        CHECK_OK(draw(cases[c].kind, &a, &r1));
        CHECK_OK(draw(cases[c].kind, &b, &r1));
        CHECK_OK(draw(cases[c].kind, &a_odd, &r2));
        CHECK_OK(draw(cases[c].kind, &b2, &r2));
        int same = 1, same2 = 1;
        for (int64_t i = 0; i < n1 + n2; i++)
            same &= at(&all, i) == (i < n1 ? at(&a, i) : at(&b, i - n1));
        for (int64_t i = 0; i < n1_odd; i++)
            same2 &= at(&all, i) == at(&a_odd, i);
        for (int64_t i = 0; i < n2; i++)
            same2 &= at(&all, n1 + i) == at(&b2, i);
        CHECKF(same && same2, "case %zu: consecutive draws do not continue the stream", c);
        CHECK(r0.offset == r1.offset && r1.offset == r2.offset);
        ft_tensor *ts[] = {&all, &a, &b, &a_odd, &b2};
        for (size_t i = 0; i < 5; i++)
            ft_tensor_release(ts[i]);
    }
    /* randperm of n draws n - 1 swap positions, two per block. */
    const int64_t pn[] = {0, 1, 2, 3, 4, 5, 10, 11};
    for (size_t s = 0; s < sizeof pn / sizeof pn[0]; s++) {
        ft_tensor t = make(pn[s], FT_INT64);
        ft_rng_state rng = {.seed = 1, .offset = 3};
        CHECK_OK(ft_rng_randperm(&t, &rng));
        uint64_t want = 3 + (uint64_t)(pn[s] > 1 ? pn[s] / 2 : 0);
        CHECKF(rng.offset == want, "randperm n=%lld: offset %llu, want %llu", (long long)pn[s],
               (unsigned long long)rng.offset, (unsigned long long)want);
        ft_tensor_release(&t);
    }
    /* A value depends on its index only: a strided output gets what a
     * contiguous one does. */
    ft_tensor base = make(16, FT_FLOAT32), view, flat = make(8, FT_FLOAT32);
    CHECK_OK(ft_tensor_view(&view, &base, 1, SHAPE(8), SHAPE(2), 4));
    ft_rng_state r1 = {.seed = 9, .offset = 0}, r2 = r1;
    CHECK_OK(ft_rng_uniform(&view, &r1, 0, 1));
    CHECK_OK(ft_rng_uniform(&flat, &r2, 0, 1));
    for (int i = 0; i < 8; i++)
        CHECK(at(&view, i) == at(&flat, i));
    CHECK(r1.offset == r2.offset);
    /* Different seeds, different values. */
    ft_rng_state r3 = {.seed = 10, .offset = 0};
    CHECK_OK(ft_rng_uniform(&flat, &r3, 0, 1));
    CHECK(at(&view, 0) != at(&flat, 0) || at(&view, 1) != at(&flat, 1));
    ft_tensor_release(&view);
    ft_tensor_release(&base);
    ft_tensor_release(&flat);
}

static void moments(const ft_tensor *t, double *mean, double *var, double *lo, double *hi) {
    int64_t n = ft_tensor_numel(t);
    double s = 0, s2 = 0;
    *lo = INFINITY, *hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double v = at(t, i);
        s += v;
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++)
        s2 += (at(t, i) - *mean) * (at(t, i) - *mean);
    *var = s2 / (double)(n - 1);
}

static void test_uniform(void) {
    const int64_t n = 1 << 17;
    const ft_dtype dts[] = {FT_FLOAT32, FT_FLOAT64, FT_FLOAT16, FT_BFLOAT16};
    const double ranges[][2] = {{0, 1}, {-2, 3}, {-1e-3, 1e-3}, {-1e6, 5e6}};
    for (size_t d = 0; d < 4; d++) {
        for (size_t r = 0; r < 4; r++) {
            double low = ranges[r][0], high = ranges[r][1], w = high - low;
            if (dts[d] != FT_FLOAT32 && dts[d] != FT_FLOAT64 && r >= 2)
                continue; /* too coarse for 16-bit floats */
            ft_tensor t = make(n, dts[d]);
            ft_rng_state rng = {.seed = 1234 + r, .offset = 0};
            CHECK_OK(ft_rng_uniform(&t, &rng, low, high));
            double mean, var, lo, hi;
            moments(&t, &mean, &var, &lo, &hi);
            /* The mean's standard error is w / sqrt(12 n) = w * 0.0008; allow 6 of them. */
            CHECKF(lo >= low && hi < high, "%s [%g, %g): values span [%.17g, %.17g]", ft_dtype_get(dts[d])->name,
                   low, high, lo, hi);
            CHECKF(fabs(mean - (low + high) / 2) < 0.005 * w, "%s [%g, %g): mean %g", ft_dtype_get(dts[d])->name, low,
                   high, mean);
            CHECKF(fabs(var / (w * w / 12) - 1) < 0.03, "%s [%g, %g): variance %g, want %g",
                   ft_dtype_get(dts[d])->name, low, high, var, w * w / 12);
            CHECK(lo < low + 0.01 * w && hi > high - 0.01 * w); /* the whole range is used */
            ft_tensor_release(&t);
        }
    }
    /* low == high gives low everywhere. */
    ft_tensor t = make(100, FT_FLOAT64);
    ft_rng_state rng = {.seed = 1, .offset = 0};
    CHECK_OK(ft_rng_uniform(&t, &rng, 2.5, 2.5));
    for (int i = 0; i < 100; i++)
        CHECK(at(&t, i) == 2.5);
    ft_tensor_release(&t);
}

/* [low, high) must exclude high after rounding to the output dtype too:
 * in [1, 2) a float16 keeps 10 fraction bits, and low + u * (high - low)
 * with u = 1 - 2^-11 lies halfway between 2 - 2^-10 and 2; in [100, 101) a
 * float32 keeps 17 fraction bits, and u within 2^-18 of 1 rounds up to 101. */
static void test_uniform_excludes_high(void) {
    static const struct {
        ft_dtype dt;
        double low, high;
        int64_t n;
    } cases[] = {{FT_FLOAT16, 0, 1, 1 << 16},  {FT_BFLOAT16, 0, 1, 1 << 16}, {FT_FLOAT32, 0, 1, 1 << 20},
                 {FT_FLOAT16, 1, 2, 1 << 16},  {FT_BFLOAT16, 1, 2, 1 << 16}, {FT_FLOAT16, -1, 0, 1 << 16},
                 {FT_FLOAT32, 100, 101, 1 << 20}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n;
        ft_tensor t = make(n, cases[c].dt);
        ft_rng_state rng = {.seed = 77, .offset = 0};
        CHECK_OK(ft_rng_uniform(&t, &rng, cases[c].low, cases[c].high));
        int64_t at_high = 0, below = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = at(&t, i);
            at_high += v >= cases[c].high;
            below += v < cases[c].low;
        }
        CHECKF(at_high == 0 && below == 0, "uniform %s [%g, %g): %lld of %lld values equal high, %lld below low",
               ft_dtype_get(cases[c].dt)->name, cases[c].low, cases[c].high, (long long)at_high, (long long)n,
               (long long)below);
        ft_tensor_release(&t);
    }
    /* The widest finite range: high - low overflows double. */
    ft_tensor t = make(64, FT_FLOAT64);
    ft_rng_state rng = {.seed = 3, .offset = 0};
    ft_status st = ft_rng_uniform(&t, &rng, -1.7976931348623157e308, 1.7976931348623157e308);
    if (st == FT_OK) {
        int finite = 0;
        for (int i = 0; i < 64; i++)
            finite += isfinite(at(&t, i));
        CHECKF(finite == 64, "uniform float64 [-DBL_MAX, DBL_MAX): %d of 64 values finite (first %g)", finite,
               at(&t, 0));
    }
    ft_tensor_release(&t);
}

static void test_normal(void) {
    const int64_t n = 1 << 17;
    const ft_dtype dts[] = {FT_FLOAT32, FT_FLOAT64, FT_FLOAT16};
    for (size_t d = 0; d < 3; d++) {
        ft_tensor t = make(n, dts[d]);
        ft_rng_state rng = {.seed = 99, .offset = 5};
        CHECK_OK(ft_rng_normal(&t, &rng, 1.5, 2.0));
        double mean, var, lo, hi;
        moments(&t, &mean, &var, &lo, &hi);
        /* Standard errors: mean 2 / sqrt(n) = 0.0055, variance 4 sqrt(2 / n) = 0.016. */
        CHECKF(fabs(mean - 1.5) < 0.035, "%s: mean %g", ft_dtype_get(dts[d])->name, mean);
        CHECKF(fabs(var - 4.0) < 0.12, "%s: variance %g", ft_dtype_get(dts[d])->name, var);
        CHECK(isfinite(lo) && isfinite(hi) && lo < 1.5 - 6 && hi > 1.5 + 6);
        /* About 68.3% within one sigma. */
        int64_t within = 0;
        for (int64_t i = 0; i < n; i++)
            within += fabs(at(&t, i) - 1.5) < 2.0;
        CHECKF(fabs((double)within / (double)n - 0.6827) < 0.01, "%s: %g within one sigma",
               ft_dtype_get(dts[d])->name, (double)within / (double)n);
        ft_tensor_release(&t);
    }
    ft_tensor t = make(10, FT_FLOAT32);
    ft_rng_state rng = {.seed = 1, .offset = 0};
    CHECK_OK(ft_rng_normal(&t, &rng, -4.0, 0.0));
    for (int i = 0; i < 10; i++)
        CHECK(at(&t, i) == -4.0);
    ft_tensor_release(&t);
}

static void test_randint(void) {
    static const struct {
        ft_dtype dt;
        int64_t low, high;
    } cases[] = {{FT_INT64, -3, 5},     {FT_INT32, 0, 1},       {FT_INT8, -128, 128}, {FT_UINT8, 0, 256},
                 {FT_INT16, -1000, 1000}, {FT_FLOAT32, 0, 10},  {FT_FLOAT64, -5, 5},  {FT_BOOL, 0, 2},
                 {FT_UINT16, 65530, 65536}, {FT_INT64, INT64_MAX - 3, INT64_MAX}};
    const int64_t n = 1 << 16;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ft_tensor t = make(n, cases[c].dt);
        ft_rng_state rng = {.seed = 2024, .offset = 0};
        CHECK_OK(ft_rng_randint(&t, &rng, cases[c].low, cases[c].high));
        int64_t bad = 0, count_low = 0, count_top = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = at(&t, i);
            bad += !(v >= (double)cases[c].low && v <= (double)(cases[c].high - 1) && v == trunc(v));
            count_low += v == (double)cases[c].low;
            count_top += v == (double)(cases[c].high - 1);
        }
        CHECKF(bad == 0, "randint %s [%lld, %lld): %lld values out of range", ft_dtype_get(cases[c].dt)->name,
               (long long)cases[c].low, (long long)cases[c].high, (long long)bad);
        CHECK(count_low > 0 && count_top > 0); /* both ends are drawn */
        ft_tensor_release(&t);
    }
    /* int64 ends exactly. */
    ft_tensor t = make(4096, FT_INT64);
    ft_rng_state rng = {.seed = 3, .offset = 0};
    CHECK_OK(ft_rng_randint(&t, &rng, INT64_MAX - 3, INT64_MAX));
    int ok = 1;
    for (int i = 0; i < 4096; i++) {
        int64_t v = ((int64_t *)ft_tensor_data(&t))[i];
        ok &= v >= INT64_MAX - 3 && v < INT64_MAX;
    }
    CHECK(ok);
    CHECK_OK(ft_rng_randint(&t, &rng, INT64_MIN, INT64_MIN + 2));
    ok = 1;
    for (int i = 0; i < 4096; i++) {
        int64_t v = ((int64_t *)ft_tensor_data(&t))[i];
        ok &= v == INT64_MIN || v == INT64_MIN + 1;
    }
    CHECK(ok);
    CHECK_OK(ft_rng_randint(&t, &rng, INT64_MIN, INT64_MAX)); /* the widest range */
    ft_tensor_release(&t);

    /* Every value of a small range, about equally often: 70000 draws over 7 values. */
    ft_tensor u = make(70000, FT_INT32);
    CHECK_OK(ft_rng_randint(&u, &rng, 10, 17));
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        int32_t v = ((int32_t *)ft_tensor_data(&u))[i];
        if (v >= 10 && v < 17)
            counts[v - 10]++;
    }
    for (int k = 0; k < 7; k++)
        CHECKF(abs(counts[k] - 10000) < 500, "value %d drawn %d times of 70000", k + 10, counts[k]);
    ft_tensor_release(&u);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void test_randperm(void) {
    const int64_t sizes[] = {0, 1, 2, 3, 10, 1000, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        ft_tensor t = make(n, FT_INT64);
        ft_rng_state rng = {.seed = 8, .offset = 0};
        CHECK_OK(ft_rng_randperm(&t, &rng));
        int64_t *sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
        memcpy(sorted, ft_tensor_data(&t), (size_t)n * sizeof *sorted);
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_i64);
        int ok = 1, moved = 0;
        for (int64_t i = 0; i < n; i++) {
            ok &= sorted[i] == i;
            moved += ((int64_t *)ft_tensor_data(&t))[i] != i;
        }
        CHECKF(ok, "randperm(%lld) is not a permutation", (long long)n);
        if (n >= 10)
            CHECK(moved > n / 2);
        free(sorted);
        ft_tensor_release(&t);
    }
    /* int32 output, a strided view. */
    ft_tensor base = make(20, FT_INT32), v;
    CHECK_OK(ft_tensor_view(&v, &base, 1, SHAPE(10), SHAPE(2), 0));
    ft_rng_state rng = {.seed = 8, .offset = 0};
    CHECK_OK(ft_rng_randperm(&v, &rng));
    int seen = 0;
    for (int i = 0; i < 10; i++) {
        int32_t x = ((int32_t *)ft_tensor_data(&base))[2 * i];
        if (x >= 0 && x < 10)
            seen |= 1 << x;
    }
    CHECK(seen == 0x3ff);
    ft_tensor_release(&v);
    ft_tensor_release(&base);

    /* Fisher-Yates is uniform: the 24 permutations of 4 about equally often. */
    int counts[256] = {0};
    ft_tensor p = make(4, FT_INT64);
    rng = (ft_rng_state){.seed = 31337, .offset = 0};
    for (int k = 0; k < 24000; k++) {
        CHECK_OK(ft_rng_randperm(&p, &rng));
        int64_t *a = (int64_t *)ft_tensor_data(&p);
        counts[(a[0] & 3) << 6 | (a[1] & 3) << 4 | (a[2] & 3) << 2 | (a[3] & 3)]++;
    }
    int distinct = 0, lo = 24000, hi = 0;
    for (int i = 0; i < 256; i++)
        if (counts[i]) {
            distinct++;
            lo = counts[i] < lo ? counts[i] : lo;
            hi = counts[i] > hi ? counts[i] : hi;
        }
    CHECKF(distinct == 24 && lo > 850 && hi < 1150, "%d permutations, counts %d..%d", distinct, lo, hi);
    ft_tensor_release(&p);
}

static void test_errors(void) {
    ft_tensor f = make(8, FT_FLOAT32), i = make(8, FT_INT32), c = make(8, FT_COMPLEX64), b = make(8, FT_BOOL);
    ft_tensor m;
    CHECK_OK(ft_tensor_empty(&m, 2, SHAPE(2, 4), FT_INT64, FT_CPU, false));
    ft_rng_state rng = {.seed = 1, .offset = 17};

    CHECK_STATUS(ft_rng_uniform(&f, &rng, 2.0, 1.0), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_uniform(&f, &rng, NAN, 1.0), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_uniform(&f, &rng, 0.0, NAN), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_uniform(&f, &rng, 0.0, INFINITY), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_uniform(&f, &rng, -INFINITY, 0.0), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_uniform(&i, &rng, 0.0, 1.0), FT_ERR_DTYPE);
    CHECK_STATUS(ft_rng_uniform(&c, &rng, 0.0, 1.0), FT_ERR_DTYPE);
    CHECK_STATUS(ft_rng_normal(&f, &rng, 0.0, -1.0), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_normal(&f, &rng, NAN, 1.0), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_normal(&f, &rng, 0.0, INFINITY), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_normal(&i, &rng, 0.0, 1.0), FT_ERR_DTYPE);
    CHECK_STATUS(ft_rng_randint(&i, &rng, 5, 5), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_randint(&i, &rng, 6, 5), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_randint(&c, &rng, 0, 5), FT_ERR_DTYPE);
    CHECK_STATUS(ft_rng_randint(&b, &rng, 0, 3), FT_ERR_VALUE);
    ft_tensor u8 = make(8, FT_UINT8), i8 = make(8, FT_INT8);
    CHECK_STATUS(ft_rng_randint(&u8, &rng, 0, 257), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_randint(&u8, &rng, -1, 5), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_randint(&i8, &rng, -129, 0), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_randint(&i8, &rng, 0, 129), FT_ERR_VALUE);
    CHECK_STATUS(ft_rng_randperm(&m, &rng), FT_ERR_SHAPE);
    CHECK_STATUS(ft_rng_randperm(&b, &rng), FT_ERR_DTYPE);
    CHECK_STATUS(ft_rng_randperm(&c, &rng), FT_ERR_DTYPE);
    CHECK(rng.offset == 17); /* failures consume nothing */

    /* Read-only outputs. */
    float ro_data[8] = {0};
    int64_t ro_i[8] = {0};
    ft_tensor ro, roi;
    CHECK_OK(ft_tensor_borrow(&ro, ro_data, 1, SHAPE(8), SHAPE(1), FT_FLOAT32, FT_CPU, true, ft_storage_unowned, NULL));
    CHECK_OK(ft_tensor_borrow(&roi, ro_i, 1, SHAPE(8), SHAPE(1), FT_INT64, FT_CPU, true, ft_storage_unowned, NULL));
    CHECK_STATUS(ft_rng_uniform(&ro, &rng, 0, 1), FT_ERR_READONLY);
    CHECK_STATUS(ft_rng_normal(&ro, &rng, 0, 1), FT_ERR_READONLY);
    CHECK_STATUS(ft_rng_randint(&roi, &rng, 0, 10), FT_ERR_READONLY);
    CHECK_STATUS(ft_rng_randperm(&roi, &rng), FT_ERR_READONLY);
    CHECK(rng.offset == 17);
    for (int k = 0; k < 8; k++)
        CHECK(ro_data[k] == 0 && ro_i[k] == 0);

    ft_tensor *all[] = {&f, &i, &c, &b, &m, &u8, &i8, &ro, &roi};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        ft_tensor_release(all[k]);
}

int main(void) {
    test_thread_independence();
    test_offsets();
    test_uniform();
    test_uniform_excludes_high();
    test_normal();
    test_randint();
    test_randperm();
    test_errors();
    return check_main_result("test_rng");
}
