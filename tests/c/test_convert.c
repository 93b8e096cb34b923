/* float16 and bfloat16 conversions of kernels/convert.h against a reference
 * written here from the formats' definitions: a half or bfloat16 pattern's
 * value by ldexp, and rounding by search for the nearest pattern. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "kernels/convert.h"

/* ---- reference ---------------------------------------------------------- */

/* The value of a binary16 pattern: 5 exponent bits (bias 15), 10 fraction bits. */
static double half_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

/* The value of a bfloat16 pattern: 8 exponent bits (bias 127), 7 fraction bits. */
static double bf16_value(uint16_t b) {
    int e = (b >> 7) & 0xff, m = b & 0x7f;
    double v = e == 0xff ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return b & 0x8000 ? -v : v;
}

typedef struct {
    double (*value)(uint16_t);
    uint16_t inf;     /* the pattern of +inf */
    double overflow;  /* where +inf begins for rounding: the next binade's first value */
} fmt16;

static const fmt16 HALF = {half_value, 0x7c00, 65536.0};
static const fmt16 BF16 = {bf16_value, 0x7f80, 0x1p128};

static double bound(const fmt16 *f, uint16_t k) { return k == f->inf ? f->overflow : f->value(k); }

/* d rounded to the nearest pattern, ties to the even pattern; NaN gives 0xffff. */
static uint16_t ref_round(const fmt16 *f, double d) {
    if (isnan(d))
        return 0xffff;
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    double a = fabs(d);
    if (a >= f->overflow)
        return f->inf | sign;
    unsigned lo = 0, hi = f->inf; /* bound(lo) <= a < bound(hi) */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (bound(f, (uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    if (bound(f, (uint16_t)lo) == a)
        return (uint16_t)(lo | sign);
    double twice = 2 * a, sum = bound(f, (uint16_t)lo) + bound(f, (uint16_t)hi); /* both exact */
    unsigned k = twice < sum ? lo : twice > sum ? hi : (lo & 1) ? hi : lo;
    return (uint16_t)(k | sign);
}

static int is_half_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int is_bf16_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* ---- float16 ------------------------------------------------------------ */

static void test_half_exhaustive(void) {
    int bad = 0;
    for (uint32_t i = 0; i < 65536 && bad < 10; i++) {
        uint16_t h = (uint16_t)i;
        float f = ft_f16_to_f32(h);
        double want = half_value(h);
        int ok;
        if (isnan(want)) {
            ok = isnan(f) && is_half_nan(ft_f32_to_f16(f)) && is_half_nan(ft_f64_to_f16((double)f)) &&
                 !!signbit(f) == !!(h & 0x8000);
        } else {
            ok = (double)f == want && !!signbit(f) == !!(h & 0x8000) && ft_f32_to_f16(f) == h &&
                 ft_f64_to_f16((double)f) == h;
        }
        CHECKF(ok, "half 0x%04x: to float %.9g (want %.9g), back 0x%04x / 0x%04x", h, (double)f, want,
               ft_f32_to_f16(f), ft_f64_to_f16((double)f));
        bad += !ok;
    }
}

static void test_half_known_values(void) {
    CHECK(ft_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(ft_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(ft_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(ft_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(ft_f16_to_f32(0x3c00) == 1.0f);
    CHECK(ft_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(ft_f16_to_f32(0xc000) == -2.0f);
    CHECK(ft_f16_to_f32(0x7c00) == INFINITY);
    CHECK(ft_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(ft_f16_to_f32(0x7e00)) && isnan(ft_f16_to_f32(0x7c01)) && isnan(ft_f16_to_f32(0xffff)));

    CHECK(ft_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(ft_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(ft_f32_to_f16(65520.0f) == 0x7c00); /* the tie between 65504 and 2^16 goes to the even one: inf */
    CHECK(ft_f32_to_f16(-65520.0f) == 0xfc00);
    CHECK(ft_f32_to_f16(1e6f) == 0x7c00);
    CHECK(ft_f32_to_f16(FLT_MAX) == 0x7c00);
    CHECK(ft_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(ft_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK(is_half_nan(ft_f32_to_f16(NAN)));
    CHECK(is_half_nan(ft_f32_to_f16(f32_of_bits(0x7f800001u)))); /* a NaN whose payload half drops */
    CHECK(is_half_nan(ft_f32_to_f16(f32_of_bits(0xffc00000u))));
    CHECK(ft_f32_to_f16(0x1p-24f) == 0x0001); /* smallest subnormal */
    CHECK(ft_f32_to_f16(0x1p-25f) == 0x0000); /* half of it: tie to even 0 */
    CHECK(ft_f32_to_f16(-0x1p-25f) == 0x8000);
    CHECK(ft_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(ft_f32_to_f16(3 * 0x1p-25f) == 0x0002); /* 1.5 ulp: tie to even 2 */
    CHECK(ft_f32_to_f16(5 * 0x1p-25f) == 0x0002); /* 2.5 ulp: tie to even 2 */
    CHECK(ft_f32_to_f16(1023 * 0x1p-24f) == 0x03ff);
    CHECK(ft_f32_to_f16(0x1p-14f) == 0x0400);
    CHECK(ft_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400); /* tie between 0x3ff and 0x400: even */
    CHECK(ft_f32_to_f16(1e-10f) == 0x0000);
    CHECK(ft_f32_to_f16(-1e-45f) == 0x8000);
    CHECK(ft_f32_to_f16(0.0f) == 0x0000);
    CHECK(ft_f32_to_f16(-0.0f) == 0x8000);
    CHECK(ft_f32_to_f16(1.0f) == 0x3c00);
    CHECK(ft_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00); /* tie: even 1.0 */
    CHECK(ft_f32_to_f16(1.0f + 0x1p-10f) == 0x3c01);
    CHECK(ft_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie: even 1+2^-9 */
    CHECK(ft_f32_to_f16(1.0f + 0x1p-11f + 0x1p-23f) == 0x3c01);
    CHECK(ft_f32_to_f16(0.1f) == 0x2e66);
    CHECK(ft_f32_to_f16(1.0f / 3) == 0x3555);
    CHECK(ft_f32_to_f16(-2.0f) == 0xc000);
    CHECK(ft_f32_to_f16(2047.0f) == 0x67ff);
    CHECK(ft_f32_to_f16(2049.0f) == 0x6800); /* tie between 2048 and 2050: even 2048 */
    CHECK(ft_f32_to_f16(2051.0f) == 0x6802); /* tie between 2050 and 2052: even 2052 */
}

/* Around every pair of neighbouring halves: the midpoint ties to the even
 * pattern, the floats on either side of it go to the nearer neighbour. */
static void test_half_midpoints(void) {
    int bad = 0;
    for (unsigned k = 0; k < 0x7c00 && bad < 10; k++) {
        double a = half_value((uint16_t)k), b = bound(&HALF, (uint16_t)(k + 1)), m = (a + b) / 2;
        uint16_t even = (uint16_t)(k & 1 ? k + 1 : k);
        float mf = (float)m; /* exact: 12 significant bits */
        for (int neg = 0; neg < 2; neg++) {
            uint16_t s = neg ? 0x8000 : 0;
            float sm = neg ? -mf : mf;
            double dm = neg ? -m : m;
            int ok = (double)mf == m && ft_f32_to_f16(sm) == (even | s) &&
                     ft_f32_to_f16(nextafterf(sm, 0.0f)) == (k | s) &&
                     ft_f32_to_f16(nextafterf(sm, neg ? -INFINITY : INFINITY)) == ((k + 1) | s) &&
                     ft_f64_to_f16(dm) == (even | s) && ft_f64_to_f16(nextafter(dm, 0.0)) == (k | s) &&
                     ft_f64_to_f16(nextafter(dm, neg ? -INFINITY : INFINITY)) == ((k + 1) | s);
            CHECKF(ok, "between halves 0x%04x and 0x%04x (sign %d): midpoint %.17g", k, k + 1, neg, dm);
            bad += !ok;
        }
    }
}

/* Doubles just off a midpoint whose float rounding lands on the midpoint
 * itself: rounding twice (double -> float -> half) would tie to even. */
static void test_f64_double_rounding(void) {
    const double eps[] = {0x1p-40, 0x1p-30, 0x1p-26};
    int bad = 0;
    for (unsigned k = 0; k < 0x7c00 && bad < 10; k++) {
        double a = half_value((uint16_t)k), b = bound(&HALF, (uint16_t)(k + 1)), m = (a + b) / 2;
        for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
            double up = m + m * eps[i], down = m - m * eps[i];
            if ((float)up != (float)m || (float)down != (float)m)
                continue; /* not a double-rounding case at this eps */
            int ok = ft_f64_to_f16(up) == k + 1 && ft_f64_to_f16(down) == k && ft_f64_to_f16(-up) == ((k + 1) | 0x8000) &&
                     ft_f64_to_f16(-down) == (k | 0x8000);
            CHECKF(ok, "0x%04x/0x%04x: %.17g -> 0x%04x (want 0x%04x), %.17g -> 0x%04x (want 0x%04x)", k, k + 1, up,
                   ft_f64_to_f16(up), k + 1, down, ft_f64_to_f16(down), k);
            bad += !ok;
        }
    }
    /* The classic cases, spelt out. */
    CHECK(ft_f64_to_f16(1.0 + 0x1p-11 + 0x1p-40) == 0x3c01); /* through float: 1+2^-11, a tie -> 0x3c00 */
    CHECK(ft_f64_to_f16(1.0 + 0x1p-11 - 0x1p-40) == 0x3c00);
    CHECK(ft_f64_to_f16(1.0 + 3 * 0x1p-11 - 0x1p-40) == 0x3c01); /* through float: tie -> 0x3c02 */
    CHECK(ft_f64_to_f16(0x1p-25 + 0x1p-60) == 0x0001);            /* through float: 2^-25, a tie -> 0 */
    CHECK(ft_f64_to_f16(-(0x1p-25 + 0x1p-60)) == 0x8001);
    CHECK(ft_f64_to_f16(65520.0 - 0x1p-20) == 0x7bff); /* through float: 65520 -> inf */
    CHECK(ft_f64_to_f16(65520.0) == 0x7c00);
    CHECK(ft_f64_to_f16(65520.0 + 0x1p-20) == 0x7c00);
    CHECK(ft_f64_to_f16(1e300) == 0x7c00);
    CHECK(ft_f64_to_f16(-1e300) == 0xfc00);
    CHECK(ft_f64_to_f16(1e-300) == 0x0000);
    CHECK(ft_f64_to_f16(-1e-300) == 0x8000);
    CHECK(ft_f64_to_f16(INFINITY) == 0x7c00);
    CHECK(is_half_nan(ft_f64_to_f16(NAN)));
    CHECK(ft_f64_to_f16(0.1) == 0x2e66);
}

static void test_half_random(void) {
    int bad = 0;
    for (int i = 0; i < 400000 && bad < 10; i++) {
        float f = f32_of_bits((uint32_t)next_random());
        uint16_t got = ft_f32_to_f16(f), want = ref_round(&HALF, (double)f);
        int ok = isnan(f) ? is_half_nan(got) : got == want;
        CHECKF(ok, "float %a -> 0x%04x, want 0x%04x", (double)f, got, want);
        bad += !ok;
    }
    /* Doubles with exponents around the half range, all 52 fraction bits random. */
    for (int i = 0; i < 400000 && bad < 10; i++) {
        uint64_t r = next_random();
        double d = ldexp(1.0 + (double)(r >> 12) * 0x1p-52, (int)(r % 48) - 30);
        if (r & 0x800)
            d = -d;
        uint16_t got = ft_f64_to_f16(d), want = ref_round(&HALF, d);
        CHECKF(got == want, "double %a -> 0x%04x, want 0x%04x", d, got, want);
        bad += got != want;
    }
}

/* ---- bfloat16 ----------------------------------------------------------- */

static void test_bf16_exhaustive(void) {
    int bad = 0;
    for (uint32_t i = 0; i < 65536 && bad < 10; i++) {
        uint16_t b = (uint16_t)i;
        float f = ft_bf16_to_f32(b);
        double want = bf16_value(b);
        int ok = isnan(want) ? isnan(f) && is_bf16_nan(ft_f32_to_bf16(f))
                             : (double)f == want && !!signbit(f) == !!(b & 0x8000) && ft_f32_to_bf16(f) == b;
        CHECKF(ok, "bfloat16 0x%04x: to float %.9g (want %.9g), back 0x%04x", b, (double)f, want, ft_f32_to_bf16(f));
        bad += !ok;
    }
}

static void test_bf16_rounding(void) {
    CHECK(ft_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(ft_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);     /* tie: even 1.0 */
    CHECK(ft_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82); /* tie: even 1+2^-6 */
    CHECK(ft_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
    CHECK(ft_f32_to_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80);
    CHECK(ft_f32_to_bf16(-1.0f - 0x1p-8f - 0x1p-20f) == 0xbf81);
    CHECK(ft_f32_to_bf16(0.1f) == 0x3dcd);
    CHECK(ft_f32_to_bf16(FLT_MAX) == 0x7f80); /* above the midpoint of the largest bfloat16 and 2^128 */
    CHECK(ft_f32_to_bf16(f32_of_bits(0x7f7f7fffu)) == 0x7f7f);
    CHECK(ft_f32_to_bf16(f32_of_bits(0x7f7f8000u)) == 0x7f80); /* tie, 0x7f7f is odd */
    CHECK(ft_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(ft_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(ft_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(ft_f32_to_bf16(0x1p-133f) == 0x0001); /* smallest subnormal bfloat16 */
    CHECK(ft_f32_to_bf16(0x1p-134f) == 0x0000); /* tie to even 0 */
    CHECK(ft_f32_to_bf16(3 * 0x1p-134f) == 0x0002);
    /* NaNs stay NaN (and keep their sign), even when the payload is only in the dropped bits. */
    CHECK(is_bf16_nan(ft_f32_to_bf16(NAN)));
    CHECK(is_bf16_nan(ft_f32_to_bf16(f32_of_bits(0x7f800001u))));
    CHECK(is_bf16_nan(ft_f32_to_bf16(f32_of_bits(0x7fffffffu))));
    CHECK(ft_f32_to_bf16(f32_of_bits(0xff800001u)) & 0x8000);
    CHECK(is_bf16_nan(ft_f32_to_bf16(f32_of_bits(0xff800001u))));

    int bad = 0;
    for (unsigned k = 0; k < 0x7f80 && bad < 10; k++) {
        double a = bf16_value((uint16_t)k), b = bound(&BF16, (uint16_t)(k + 1)), m = (a + b) / 2;
        float mf = (float)m; /* exact: 9 significant bits, and 2^-134 is a float subnormal */
        uint16_t even = (uint16_t)(k & 1 ? k + 1 : k);
        int ok = (double)mf == m && ft_f32_to_bf16(mf) == even && ft_f32_to_bf16(nextafterf(mf, 0.0f)) == k &&
                 ft_f32_to_bf16(nextafterf(mf, INFINITY)) == k + 1 && ft_f32_to_bf16(-mf) == (even | 0x8000);
        CHECKF(ok, "between bfloat16 0x%04x and 0x%04x: midpoint %a", k, k + 1, m);
        bad += !ok;
    }
    for (int i = 0; i < 400000 && bad < 10; i++) {
        float f = f32_of_bits((uint32_t)next_random());
        uint16_t got = ft_f32_to_bf16(f), want = ref_round(&BF16, (double)f);
        int ok = isnan(f) ? is_bf16_nan(got) : got == want;
        CHECKF(ok, "float %a -> bfloat16 0x%04x, want 0x%04x", (double)f, got, want);
        bad += !ok;
    }
}

int main(void) {
    test_half_exhaustive();
    test_half_known_values();
    test_half_midpoints();
    test_f64_double_rounding();
    test_half_random();
    test_bf16_exhaustive();
    test_bf16_rounding();
    return check_main_result("test_convert");
}
