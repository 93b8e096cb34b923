#include "core/rng.h"

#include <math.h>

#include "kernels/convert.h"
#include "kernels/philox.h"

enum { DRAW_UNIFORM, DRAW_NORMAL, DRAW_RANDINT };

typedef struct {
    int kind;
    int bits; /* random bits per 32-bit float uniform */
    double a, b; /* uniform: low, high; normal: mean, std */
    double cap;  /* uniform: the largest value of the output dtype below high */
    int64_t low;
    uint64_t range;
} draw_params;

/* Draws below this many elements run on one thread. */
#define PARALLEL_ELEMS (1 << 15)

static inline uint64_t u64_of(uint32_t lo, uint32_t hi) { return (uint64_t)hi << 32 | lo; }

/* Writes the elements of block `blk` (at most `per` of them, `count` here). */
static void fill_block(void *buf, ft_dtype dt, const draw_params *p, uint64_t seed, uint64_t first_block,
                       int64_t blk, int per, int64_t count) {
    ft_philox_block r = ft_philox(seed, 0, first_block + (uint64_t)blk);
    int64_t base = blk * per;
    if (p->kind == DRAW_RANDINT) {
        int64_t *o = (int64_t *)buf + base;
        for (int j = 0; j < count; j++) {
            uint64_t x = u64_of(r.v[2 * j], r.v[2 * j + 1]);
            o[j] = (int64_t)((uint64_t)p->low + (uint64_t)(((unsigned __int128)x * p->range) >> 64));
        }
        return;
    }
    double u[4];
    int nu = dt == FT_FLOAT64 ? 2 : 4;
    for (int j = 0; j < nu; j++)
        u[j] = dt == FT_FLOAT64 ? ft_uniform_f64(r.v[2 * j], r.v[2 * j + 1]) : ft_uniform_f32(r.v[j], p->bits);
    double v[4];
    if (p->kind == DRAW_UNIFORM) {
        for (int j = 0; j < nu; j++) {
            /* low + u (high - low) can round up to high; keep [low, high). */
            double x = p->a + u[j] * (p->b - p->a);
            v[j] = x < p->cap ? x : p->cap;
        }
    } else {
        /* Box-Muller on pairs (u0, u1), (u2, u3): 1 - u0 lies in (0, 1]. */
        for (int j = 0; j < nu; j += 2) {
            double radius = sqrt(-2.0 * log(1.0 - u[j])), angle = 6.283185307179586 * u[j + 1];
            v[j] = p->a + p->b * radius * cos(angle);
            v[j + 1] = p->a + p->b * radius * sin(angle);
        }
    }
    for (int j = 0; j < count; j++) {
        if (dt == FT_FLOAT64)
            ((double *)buf)[base + j] = v[j];
        else
            ((float *)buf)[base + j] = (float)v[j];
    }
}

static ft_status draw(const ft_tensor *out, ft_rng_state *rng, const draw_params *p, ft_dtype natural, int per) {
    FT_TRY(ft_tensor_check_writable(out, "random fill"));
    int64_t n = ft_tensor_numel(out);
    bool direct = out->dtype == natural && ft_tensor_device(out).type == FT_DEV_CPU && ft_tensor_is_contiguous(out);
    ft_tensor tmp = {0};
    if (!direct)
        FT_TRY(ft_tensor_empty(&tmp, out->ndim, out->shape, natural, FT_CPU, false));
    void *buf = ft_tensor_data(direct ? out : &tmp);
    int64_t nblocks = (n + per - 1) / per;
    uint64_t seed = rng->seed, first = rng->offset;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_ELEMS)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t count = n - b * per < per ? n - b * per : per;
        fill_block(buf, natural, p, seed, first, b, per, count);
    }
    ft_status st = FT_OK;
    if (!direct) {
        st = ft_tensor_copy(out, &tmp, false);
        ft_tensor_release(&tmp);
    }
    if (st == FT_OK)
        rng->offset += (uint64_t)nblocks;
    return st;
}

static ft_status require_float(const ft_tensor *out, const char *op) {
    if (!ft_dtype_is_float(out->dtype))
        return ft_fail(FT_ERR_DTYPE, "%s needs a floating-point tensor, got %s", op, ft_dtype_get(out->dtype)->name);
    return FT_OK;
}

static int float_bits(ft_dtype dt) { return dt == FT_FLOAT16 ? 11 : dt == FT_BFLOAT16 ? 8 : 24; }

/* One step down from a 16-bit float's bit pattern (toward -inf). */
static uint16_t half_bits_down(uint16_t h) { return h == 0 || h == 0x8000 ? 0x8001 : (h & 0x8000) ? h + 1 : h - 1; }

/* The largest value of dtype dt below x (x itself when x is the lowest). */
static double largest_below(double x, ft_dtype dt) {
    switch (dt) {
    case FT_FLOAT64: return nextafter(x, -INFINITY);
    case FT_FLOAT32: {
        float f = (float)x;
        while ((double)f >= x)
            f = nextafterf(f, -INFINITY);
        return f;
    }
    default: {
        bool half = dt == FT_FLOAT16;
        uint16_t h = half ? ft_f64_to_f16(x) : ft_f32_to_bf16((float)x);
        while ((half ? ft_f16_to_f32(h) : ft_bf16_to_f32(h)) >= x)
            h = half_bits_down(h);
        return half ? ft_f16_to_f32(h) : ft_bf16_to_f32(h);
    }
    }
}

ft_status ft_rng_uniform(const ft_tensor *out, ft_rng_state *rng, double low, double high) {
    FT_TRY(require_float(out, "uniform_"));
    if (!(isfinite(low) && isfinite(high) && low <= high && isfinite(high - low)))
        return ft_fail(FT_ERR_VALUE, "uniform_ expects finite from <= to with a finite difference, got from=%g to=%g",
                       low, high);
    double cap = low < high ? largest_below(high, out->dtype) : low;
    draw_params p = {.kind = DRAW_UNIFORM, .bits = float_bits(out->dtype), .a = low, .b = high,
                     .cap = cap > low ? cap : low};
    ft_dtype natural = out->dtype == FT_FLOAT64 ? FT_FLOAT64 : FT_FLOAT32;
    return draw(out, rng, &p, natural, natural == FT_FLOAT64 ? 2 : 4);
}

ft_status ft_rng_normal(const ft_tensor *out, ft_rng_state *rng, double mean, double std) {
    FT_TRY(require_float(out, "normal_"));
    if (!(isfinite(mean) && isfinite(std) && std >= 0))
        return ft_fail(FT_ERR_VALUE, "normal_ expects a finite mean and std >= 0, got mean=%g std=%g", mean, std);
    draw_params p = {.kind = DRAW_NORMAL, .bits = 24, .a = mean, .b = std};
    ft_dtype natural = out->dtype == FT_FLOAT64 ? FT_FLOAT64 : FT_FLOAT32;
    return draw(out, rng, &p, natural, natural == FT_FLOAT64 ? 2 : 4);
}

/* The range of values of an integer dtype, as int64 (uint64's top is clipped,
 * which only matters for high > 2**63, which int64 arguments cannot ask for). */
static void int_range(ft_dtype dt, int64_t *lo, int64_t *hi) {
    const ft_dtype_info *info = ft_dtype_get(dt);
    if (dt == FT_BOOL) {
        *lo = 0, *hi = 1;
    } else if (info->dl_code == FT_DL_UINT) {
        *lo = 0, *hi = info->bits == 64 ? INT64_MAX : (int64_t)((UINT64_C(1) << info->bits) - 1);
    } else {
        *lo = info->bits == 64 ? INT64_MIN : -(INT64_C(1) << (info->bits - 1));
        *hi = info->bits == 64 ? INT64_MAX : (INT64_C(1) << (info->bits - 1)) - 1;
    }
}

ft_status ft_rng_randint(const ft_tensor *out, ft_rng_state *rng, int64_t low, int64_t high) {
    if (ft_dtype_is_complex(out->dtype))
        return ft_fail(FT_ERR_DTYPE, "randint cannot fill a %s tensor", ft_dtype_get(out->dtype)->name);
    if (low >= high)
        return ft_fail(FT_ERR_VALUE, "randint expects low < high, got low=%lld high=%lld", (long long)low,
                       (long long)high);
    if (!ft_dtype_is_float(out->dtype)) {
        int64_t lo, hi;
        int_range(out->dtype, &lo, &hi);
        if (low < lo || high - 1 > hi)
            return ft_fail(FT_ERR_VALUE, "randint range [%lld, %lld) does not fit %s", (long long)low,
                           (long long)high, ft_dtype_get(out->dtype)->name);
    }
    draw_params p = {.kind = DRAW_RANDINT, .low = low, .range = (uint64_t)high - (uint64_t)low};
    return draw(out, rng, &p, FT_INT64, 2);
}

ft_status ft_rng_randperm(const ft_tensor *out, ft_rng_state *rng) {
    if (out->ndim != 1)
        return ft_fail(FT_ERR_SHAPE, "randperm fills a 1-d tensor, got %d dimensions", out->ndim);
    if (ft_dtype_is_complex(out->dtype) || out->dtype == FT_BOOL)
        return ft_fail(FT_ERR_DTYPE, "randperm cannot fill a %s tensor", ft_dtype_get(out->dtype)->name);
    FT_TRY(ft_tensor_check_writable(out, "randperm"));
    int64_t n = out->shape[0], lo, hi;
    if (!ft_dtype_is_float(out->dtype)) {
        int_range(out->dtype, &lo, &hi);
        if (n - 1 > hi)
            return ft_fail(FT_ERR_VALUE, "randperm(%lld) does not fit %s", (long long)n, ft_dtype_get(out->dtype)->name);
    }
    ft_tensor tmp;
    FT_TRY(ft_tensor_empty(&tmp, 1, &n, FT_INT64, FT_CPU, false));
    int64_t *a = (int64_t *)ft_tensor_data(&tmp);
    for (int64_t i = 0; i < n; i++)
        a[i] = i;
    /* Draw k swaps a[n-1-k] with a uniform earlier-or-same position; two draws per block. */
    ft_philox_block r = {{0}};
    for (int64_t k = 0; k + 1 < n; k++) {
        if (k % 2 == 0)
            r = ft_philox(rng->seed, 0, rng->offset + (uint64_t)(k / 2));
        int lane = (int)(k % 2) * 2;
        uint64_t i = (uint64_t)(n - 1 - k);
        uint64_t j = (uint64_t)(((unsigned __int128)u64_of(r.v[lane], r.v[lane + 1]) * (i + 1)) >> 64);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    ft_status st = ft_tensor_copy(out, &tmp, false);
    ft_tensor_release(&tmp);
    if (st == FT_OK)
        rng->offset += (uint64_t)(n > 1 ? n / 2 : 0);
    return st;
}
