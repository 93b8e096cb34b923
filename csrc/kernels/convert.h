/* float16 and bfloat16 conversions, rounding to nearest even (IEEE 754, and
 * the results NumPy and PyTorch give). */
#ifndef FT_KERNELS_CONVERT_H
#define FT_KERNELS_CONVERT_H

#include "kernels/hd.h"

static inline FT_HD float ft_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f)
        return ft_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in float */
        float m = (float)mant * 5.9604644775390625e-8f;
        return sign ? -m : m;
    }
    return ft_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline FT_HD uint16_t ft_f32_to_f16(float f) {
    const uint32_t f32_inf = 255u << 23, f16_max = (127u + 16) << 23;
    /* Adding 2^-1 (as a float whose ulp is the half subnormal step) leaves a
     * subnormal half's bits at the bottom of the mantissa, rounded by the FPU. */
    const uint32_t denorm_magic = ((127u - 15) + (23 - 10) + 1) << 23;
    uint32_t u = ft_f32_bits(f);
    uint32_t sign = u & 0x80000000u;
    uint16_t o;
    u ^= sign;
    if (u >= f16_max) {
        o = u > f32_inf ? 0x7e00 : 0x7c00;
    } else if (u < (113u << 23)) {
        o = (uint16_t)(ft_f32_bits(ft_bits_f32(u) + ft_bits_f32(denorm_magic)) - denorm_magic);
    } else {
        uint32_t odd = (u >> 13) & 1;
        u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* Rounding a double to float with round-to-odd and then to half with
 * round-to-nearest-even gives the correctly rounded half: float keeps 13
 * more bits than half, more than the 2 the argument needs. */
static inline FT_HD uint16_t ft_f64_to_f16(double d) {
    float f = (float)d;
    uint32_t u = ft_f32_bits(f);
    if ((double)f != d && (u & 0x7fffffffu) != 0 && (u & 0x7f800000u) != 0x7f800000u && !(u & 1)) {
        int away = (f < 0) == ((double)f < d); /* |f| > |d| */
        u = away ? u - 1 : u + 1;
        f = ft_bits_f32(u);
    }
    return ft_f32_to_f16(f);
}

static inline FT_HD float ft_bf16_to_f32(uint16_t b) { return ft_bits_f32((uint32_t)b << 16); }

static inline FT_HD uint16_t ft_f32_to_bf16(float f) {
    uint32_t u = ft_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Host kernels that compute in float over float32 or bfloat16 (bf16)
 * arrays: element i, or runs of n floats at element i0 (float32 memory used
 * in place, bfloat16 through the caller's buffer). */
#ifndef __CUDACC__
#include <stdbool.h>
#include <stdint.h>

static inline float ft_float_at(const void *src, bool bf16, int64_t i) {
    return bf16 ? ft_bf16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
}

/* dst[i] = src[i] converted, for i < n: vectorised for the CPU they run on
 * (core/copy.c), as callers' own loops compiled for plain x86-64 are not. */
void ft_bf16_to_f32_run(float *dst, const uint16_t *src, int64_t n);
void ft_f32_to_bf16_run(uint16_t *dst, const float *src, int64_t n);

static inline const float *ft_floats_in(const void *src, bool bf16, int64_t i0, int64_t n, float *buf) {
    if (!bf16)
        return (const float *)src + i0;
    ft_bf16_to_f32_run(buf, (const uint16_t *)src + i0, n);
    return buf;
}

/* Where a kernel writes n results for dst at element i0: dst itself, or buf
 * (then ft_floats_out stores them). */
static inline float *ft_floats_at(void *dst, bool bf16, int64_t i0, float *buf) {
    return bf16 ? buf : (float *)dst + i0;
}

static inline void ft_floats_out(void *dst, bool bf16, int64_t i0, int64_t n, const float *buf) {
    if (bf16)
        ft_f32_to_bf16_run((uint16_t *)dst + i0, buf, n);
}
#endif

#endif
