/* bfloat16 for CPU ops that compute on float32 memory: the op runs over
 * chunks of samples, each chunk's bfloat16 tensors converted into float32
 * buffers of their layout and, for outputs, back, while the chunk is in cache
 * (no pass over a whole tensor): for ops whose samples are independent
 * (pooling, upsampling, group norm). CUDA ops read and write 16-bit floats
 * in their kernels and never come here. */
#ifndef FT_OPS_CHUNKS_H
#define FT_OPS_CHUNKS_H

#include "core/tensor.h"

/* A tensor (N, ...) of the op's samples (NULL: absent). Outputs are written;
 * `read` outputs are read too (an accumulating backward). Tensors of other
 * dtypes are passed as their chunk's rows, unconverted. */
typedef struct {
    const ft_tensor *t;
    bool written, read;
} ft_chunk_arg;

/* The float32 op: ts[i] are args[i]'s chunks (NULL where absent), the
 * chunk's samples starting at sample `first`. */
typedef ft_status (*ft_chunk_op)(const ft_tensor *const *ts, int64_t first, const void *ctx);

/* Whether any of the n args is a 16-bit float. */
bool ft_chunks_needed(const ft_chunk_arg *args, int n);

/* Runs op over chunks of the args' N samples. */
ft_status ft_by_float_chunks(const ft_chunk_arg *args, int n, ft_chunk_op op, const void *ctx);

#endif
