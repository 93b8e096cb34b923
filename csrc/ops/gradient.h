/* The gradient rule of every backward op: a gradient output is written (=)
 * unless its accumulate flag is set, then the op's contribution is added
 * (+=) to what the buffer holds. Ops with one gradient output take a
 * `bool accumulate`; those with an input's and their parameters' gradients
 * take an ft_grad_acc, since in a micro-batch after the first the
 * parameters' gradients add while the input's is fresh. Micro-batches, a tensor read by two
 * nodes (residual forks, tied weights) and repeated backward calls all
 * follow from it: nothing zeroes or stages a gradient before a backward.
 *
 * Most ops accumulate in their own loops. Where a library computes a
 * gradient and can only write it (oneDNN's convolution backward, the CUDA
 * backend's library calls), the op stages that output: ft_grad_out_begin
 * gives the tensor to write, which is dst itself unless accumulating, then a
 * temporary in dst's memory order (from the caching allocator, so its pages
 * are reused from step to step), and ft_grad_out_end adds it into dst. */
#ifndef FT_OPS_GRADIENT_H
#define FT_OPS_GRADIENT_H

#include <stdbool.h>

#include "core/tensor.h"

typedef struct {
    bool inp, weight, bias;
} ft_grad_acc;

typedef struct {
    const ft_tensor *dst;
    ft_tensor tmp; /* storage NULL when dst is written directly */
} ft_grad_out;

/* *write = where the op writes dst's contribution (NULL when dst is NULL). */
ft_status ft_grad_out_begin(ft_grad_out *g, const ft_tensor *dst, bool accumulate, const ft_tensor **write);

/* ft_grad_out_begin for an op whose kernel writes any float dtype: a 16-bit
 * dst is staged in float32, so that dst + contribution is rounded once, as
 * an op that accumulates in its own loop rounds it. */
ft_status ft_grad_out_begin_float(ft_grad_out *g, const ft_tensor *dst, bool accumulate, const ft_tensor **write);

/* After the op ran with status s: adds the staged contribution into dst
 * (when s is FT_OK) and frees it. Returns the first failure. */
ft_status ft_grad_out_end(ft_grad_out *g, ft_status s);

#endif
