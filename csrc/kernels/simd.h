/* Host loops vectorised for the CPU they run on: a function marked
 * FT_VEC_CLONES is compiled for AVX-512, AVX2+FMA and plain x86-64, the
 * version chosen at run time (the build itself targets plain x86-64). */
#ifndef FT_KERNELS_SIMD_H
#define FT_KERNELS_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(FT_NO_CLONES)
#define FT_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FT_VEC_CLONES
#endif

/* A loop over i in [0, n) without assumed dependencies between iterations. */
#define FT_SIMD_FOR(i, n) _Pragma("omp simd") for (int64_t i = 0; i < (n); i++)

#endif
