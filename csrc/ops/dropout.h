/* Dropout with masks from Philox, regenerated in backward instead of stored.
 *
 * Element i (in C order of the tensor's shape, whatever its memory layout)
 * is kept when u_j >= p for j = i / span, where u_j is the float32 uniform
 * that ft.rand would give at element j for the same (seed, offset): word
 * j % 4 of Philox block offset + j / 4 of stream 0, as a 24-bit fraction.
 * span 1 drops elements, a channel's H W drops channels (Dropout2d). The mask
 * is thus a pure function of (seed, offset, span, i): the same for any
 * thread count, layout or device, and reproduced exactly by backward from
 * the same parameters. The caller's generator advances its offset by
 * ft_dropout_blocks(numel / span).
 *
 * Legend: (...) the shape of inp. float32 or bfloat16, any strides.
 * Gradient rule: dinp is written (=), or added to (+=) with accumulate. */
#ifndef FT_OPS_DROPOUT_H
#define FT_OPS_DROPOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/tensor.h"

typedef struct {
    double p;        /* probability of zeroing an element, in [0, 1] */
    uint64_t seed;   /* Philox key */
    uint64_t offset; /* first Philox block */
    int64_t span;    /* consecutive elements (C order) kept or dropped together, at least 1 */
} ft_dropout_params;

/* Philox blocks a mask of numel draws uses: ceil(numel / 4). */
uint64_t ft_dropout_blocks(int64_t numel);

/* z[k] (n) = the factor of element first + k of a mask with span 1: 0, or
 * 1 / (1 - p) where kept (ops/attention.c's masks over probabilities). */
void ft_dropout_factors(float *z, const ft_dropout_params *p, int64_t first, int64_t n);

/* out (...) = inp (...) * keep / (1 - p) (inverted dropout; p = 0 copies,
 * p = 1 gives zeros). out may be inp itself. */
ft_status ft_dropout_forward(const ft_tensor *out, const ft_tensor *inp, const ft_dropout_params *p);

/* dinp (...) = dout (...) * keep / (1 - p), the same mask as the forward with
 * these parameters. dinp may be dout itself. */
ft_status ft_dropout_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_dropout_params *p,
                              bool accumulate);

#endif
