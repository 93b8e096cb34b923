/* FT_HD marks the inline math that CPU loops and CUDA kernels both call. */
#ifndef FT_KERNELS_HD_H
#define FT_KERNELS_HD_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FT_HD __host__ __device__
#else
#define FT_HD
#endif

static inline FT_HD uint32_t ft_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline FT_HD float ft_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
