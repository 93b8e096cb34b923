/* The cast rules of copies between dtypes as FT_HD functions: the CUDA copy
 * kernel (cuda/copy.cu) and the math kernels (kernels/math.h) convert
 * through them, so that a value cast on the device has the bits the CPU's
 * copies give.
 *
 * Each element is loaded as a "wide" value (double, int64 or uint64 by the
 * source's kind), then stored converted to the destination dtype. Going
 * through one wide type per kind keeps the kernel to two switches instead of
 * a kernel per (src, dst) pair, and fixes the cast rules in one place; they
 * must give the CPU's results bit for bit:
 *   - bool, float16, bfloat16, float32, float64 load as double; int8..int64
 *     and uint8..uint32 as int64; uint64 as uint64.
 *   - to bool: value != 0, so NaN is true.
 *   - to an integer from int64/uint64: C conversion, which wraps.
 *   - to an integer from double: NaN is 0; saturate to the destination's
 *     range, then C conversion (the value fits).
 *   - to float16: ft_f64_to_f16; to bfloat16: ft_f32_to_bf16((float)v);
 *     integers reach float16 and float64 through double, float32 and
 *     bfloat16 by one C conversion to float (through double, an int64 above
 *     2^53 would be rounded twice).
 */
#ifndef FT_KERNELS_CAST_H
#define FT_KERNELS_CAST_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "kernels/convert.h"

typedef enum { FT_WIDE_F64, FT_WIDE_I64, FT_WIDE_U64 } ft_wide_kind;

typedef struct {
    ft_wide_kind kind;
    union {
        double f;
        int64_t i;
        uint64_t u;
    } v;
} ft_wide;

static inline FT_HD ft_wide ft_wide_f64(double f) {
    ft_wide w;
    w.kind = FT_WIDE_F64;
    w.v.f = f;
    return w;
}

static inline FT_HD ft_wide ft_wide_i64(int64_t i) {
    ft_wide w;
    w.kind = FT_WIDE_I64;
    w.v.i = i;
    return w;
}

static inline FT_HD ft_wide ft_wide_u64(uint64_t u) {
    ft_wide w;
    w.kind = FT_WIDE_U64;
    w.v.u = u;
    return w;
}

/* `p` points at one element of dtype `dt`, which is neither complex type. */
static inline FT_HD ft_wide ft_load_wide(const void *p, ft_dtype dt) {
    switch (dt) {
    case FT_BOOL:
        /* Read as a byte: a bool holding anything but 0 or 1 is undefined. */
        return ft_wide_f64(*(const uint8_t *)p != 0 ? 1.0 : 0.0);
    case FT_UINT8: return ft_wide_i64(*(const uint8_t *)p);
    case FT_INT8: return ft_wide_i64(*(const int8_t *)p);
    case FT_INT16: return ft_wide_i64(*(const int16_t *)p);
    case FT_INT32: return ft_wide_i64(*(const int32_t *)p);
    case FT_INT64: return ft_wide_i64(*(const int64_t *)p);
    case FT_UINT16: return ft_wide_i64(*(const uint16_t *)p);
    case FT_UINT32: return ft_wide_i64(*(const uint32_t *)p);
    case FT_UINT64: return ft_wide_u64(*(const uint64_t *)p);
    case FT_FLOAT16: return ft_wide_f64(ft_f16_to_f32(*(const uint16_t *)p));
    case FT_BFLOAT16: return ft_wide_f64(ft_bf16_to_f32(*(const uint16_t *)p));
    case FT_FLOAT32: return ft_wide_f64(*(const float *)p);
    case FT_FLOAT64: return ft_wide_f64(*(const double *)p);
    default: return ft_wide_i64(0); /* complex: the caller never gets here */
    }
}

static inline FT_HD double ft_wide_as_f64(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return (double)w.v.i;
    case FT_WIDE_U64: return (double)w.v.u;
    default: return w.v.f;
    }
}

static inline FT_HD float ft_wide_as_f32(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return (float)w.v.i;
    case FT_WIDE_U64: return (float)w.v.u;
    default: return (float)w.v.f;
    }
}

/* A double as an integer of [lo, hi] (at most int64's range): NaN is 0,
 * values outside saturate (C leaves out-of-range conversions undefined). */
static inline FT_HD int64_t ft_f64_to_range(double v, int64_t lo, int64_t hi) {
    if (v != v)
        return 0;
    if (v >= (double)hi + 1.0) /* exact: hi + 1 is a power of two */
        return hi;
    if (v < (double)lo)
        return lo;
    return (int64_t)v;
}

/* A double as a uint64: NaN and everything down from (-1, 0] give 0. */
static inline FT_HD uint64_t ft_f64_to_u64(double v) {
    if (!(v > 0))
        return 0;
    if (v >= 18446744073709551616.0) /* 2^64 */
        return UINT64_MAX;
    return (uint64_t)v;
}

/* An integer of [lo, hi] from w: integers as they are (the caller's
 * narrowing wraps them, as C and PyTorch do), a double saturated. */
static inline FT_HD int64_t ft_wide_as_range(ft_wide w, int64_t lo, int64_t hi) {
    switch (w.kind) {
    case FT_WIDE_I64: return w.v.i;
    case FT_WIDE_U64: return (int64_t)w.v.u;
    default: return ft_f64_to_range(w.v.f, lo, hi);
    }
}

static inline FT_HD uint64_t ft_wide_as_u64(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return (uint64_t)w.v.i;
    case FT_WIDE_U64: return w.v.u;
    default: return ft_f64_to_u64(w.v.f);
    }
}

static inline FT_HD bool ft_wide_nonzero(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return w.v.i != 0;
    case FT_WIDE_U64: return w.v.u != 0;
    default: return w.v.f != 0; /* true for NaN */
    }
}

/* `p` points at one element of dtype `dt`, which is neither complex type. */
static inline FT_HD void ft_store_wide(void *p, ft_dtype dt, ft_wide w) {
    switch (dt) {
    case FT_BOOL: *(uint8_t *)p = ft_wide_nonzero(w) ? 1 : 0; break;
    case FT_UINT8: *(uint8_t *)p = (uint8_t)ft_wide_as_range(w, 0, UINT8_MAX); break;
    case FT_INT8: *(int8_t *)p = (int8_t)ft_wide_as_range(w, INT8_MIN, INT8_MAX); break;
    case FT_INT16: *(int16_t *)p = (int16_t)ft_wide_as_range(w, INT16_MIN, INT16_MAX); break;
    case FT_INT32: *(int32_t *)p = (int32_t)ft_wide_as_range(w, INT32_MIN, INT32_MAX); break;
    case FT_INT64: *(int64_t *)p = ft_wide_as_range(w, INT64_MIN, INT64_MAX); break;
    case FT_UINT16: *(uint16_t *)p = (uint16_t)ft_wide_as_range(w, 0, UINT16_MAX); break;
    case FT_UINT32: *(uint32_t *)p = (uint32_t)ft_wide_as_range(w, 0, UINT32_MAX); break;
    case FT_UINT64: *(uint64_t *)p = ft_wide_as_u64(w); break;
    case FT_FLOAT16: *(uint16_t *)p = ft_f64_to_f16(ft_wide_as_f64(w)); break;
    case FT_BFLOAT16: *(uint16_t *)p = ft_f32_to_bf16(ft_wide_as_f32(w)); break;
    case FT_FLOAT32: *(float *)p = ft_wide_as_f32(w); break;
    case FT_FLOAT64: *(double *)p = ft_wide_as_f64(w); break;
    default: break; /* complex: the caller never gets here */
    }
}

#endif
