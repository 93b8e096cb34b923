/* Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
 * easy as 1, 2, 3", SC'11), the generator of cuRAND and of PyTorch on CUDA.
 * A pure function of a 128-bit counter and a 64-bit key: any thread can draw
 * any element without touching shared state, so results do not depend on how
 * work is split. */
#ifndef FT_KERNELS_PHILOX_H
#define FT_KERNELS_PHILOX_H

#include <math.h>

#include "kernels/hd.h"

typedef struct {
    uint32_t v[4];
} ft_philox_block;

static inline FT_HD ft_philox_block ft_philox4x32_10(ft_philox_block ctr, uint32_t key0, uint32_t key1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr.v[0];
        uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr.v[2];
        ft_philox_block next = {{(uint32_t)(p1 >> 32) ^ ctr.v[1] ^ key0, (uint32_t)p1,
                                 (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ key1, (uint32_t)p0}};
        ctr = next;
        key0 += 0x9E3779B9u; /* golden ratio */
        key1 += 0xBB67AE85u; /* sqrt(3) - 1 */
    }
    return ctr;
}

/* fasttrain's use of the counter: words 0-1 count 128-bit blocks within a
 * stream, words 2-3 name the stream (0 for ft.Generator draws; the data
 * loader keys samples by epoch and index there). */
static inline FT_HD ft_philox_block ft_philox(uint64_t seed, uint64_t stream, uint64_t block) {
    ft_philox_block ctr = {{(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)}};
    return ft_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* Dropout's mask (ops/dropout.h): draw i keeps its element when the 24-bit
 * fraction of its word is at least p, (word >> 8) >= this threshold, and
 * scales it by 1 / (1 - p). */
static inline uint32_t ft_dropout_threshold(double p) { return (uint32_t)ceil(p * 16777216.0); }

static inline float ft_dropout_scale(double p) { return p < 1.0 ? (float)(1.0 / (1.0 - p)) : 0.0f; }

/* The factor of draw i of a dropout mask at (seed, offset): 0 or scale. */
static inline FT_HD float ft_dropout_factor(uint64_t seed, uint64_t offset, uint64_t i, uint32_t threshold,
                                            float scale) {
    ft_philox_block r = ft_philox(seed, 0, offset + (i >> 2));
    return (r.v[i & 3] >> 8) >= threshold ? scale : 0.0f;
}

/* [0, 1) with `bits` random bits (24 for float32, 11 float16, 8 bfloat16), so
 * that rounding to the target type can never give 1. */
static inline FT_HD float ft_uniform_f32(uint32_t x, int bits) {
    return (float)(x >> (32 - bits)) * (1.0f / (float)(1u << bits));
}

/* [0, 1) with 53 random bits from two words. */
static inline FT_HD double ft_uniform_f64(uint32_t lo, uint32_t hi) {
    uint64_t x = ((uint64_t)hi << 32 | lo) >> 11;
    return (double)x * (1.0 / 9007199254740992.0);
}

#endif
