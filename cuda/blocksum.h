/* Sums over a warp and over a block in a fixed order, so that every run
 * gives the same bits (the norms' statistics and parameter gradients). */
#ifndef FT_CUDA_BLOCKSUM_H
#define FT_CUDA_BLOCKSUM_H

/* The sum of (a, b) over the warp, in every lane. Each step adds the same
 * two values in both lanes of a pair (x + y == y + x), so all lanes end
 * with the same bits. */
static __device__ void ft_warp_sum2(double &a, double &b) {
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

/* The sum of (a, b) over a block of WARPS warps, in every thread; sh holds
 * 2 * WARPS doubles. Every thread of the block must call it. */
template <int WARPS> static __device__ void ft_block_sum2(double &a, double &b, double *sh) {
    ft_warp_sum2(a, b);
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        sh[warp] = a;
        sh[WARPS + warp] = b;
    }
    __syncthreads();
    a = 0, b = 0;
    for (int w = 0; w < WARPS; w++) {
        a += sh[w];
        b += sh[WARPS + w];
    }
    __syncthreads(); /* sh is free for the next call */
}

#endif
