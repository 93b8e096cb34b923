/* Embedding lookup (PyTorch's F.embedding) and its dense gradient.
 *
 * Legend: V the vocabulary (rows of the table), D the embedding size, T the
 * number of ids (the product of ids' shape). ids int64 of any shape, weight
 * (V, D) float32, out (*ids.shape, D); every tensor contiguous.
 * padding_idx is a row in [0, V), or negative for none: that row's
 * gradient is never computed (PyTorch's padding_idx). */
#ifndef FT_OPS_EMBEDDING_H
#define FT_OPS_EMBEDDING_H

#include <stdbool.h>

#include "core/tensor.h"

/* out (T, D) = weight[ids] (T). An id outside [0, V) is FT_ERR_INDEX, naming
 * its position and value, found before anything is written. The forward
 * reads the padding row like any other (PyTorch's). */
ft_status ft_embedding_forward(const ft_tensor *out, const ft_tensor *ids, const ft_tensor *weight,
                               int64_t padding_idx);

/* FT_ERR_INDEX naming the first of the contiguous ids (any shape) outside
 * [0, V), as the forward reports it; FT_OK when there is none. */
ft_status ft_embedding_check_ids(const ft_tensor *ids, int64_t V);

/* dweight (V, D) = (or += with accumulate) the sum of dout (T, D) rows over
 * the positions of each id; rows no id names (and the padding row) are
 * written 0, or left as they are with accumulate. The rows of each id are
 * added in position order, on any thread count: bitwise reproducible,
 * without atomics. */
ft_status ft_embedding_backward(const ft_tensor *dweight, const ft_tensor *dout, const ft_tensor *ids,
                                int64_t padding_idx, bool accumulate);

/* out (T, C) = 1 in the column of each id (T) and 0 elsewhere, as floats of
 * out's dtype (PyTorch's F.one_hot; the classes C are out's last
 * dimension). An id outside [0, C) is FT_ERR_INDEX, as the forward's. */
ft_status ft_one_hot_forward(const ft_tensor *out, const ft_tensor *ids);

#endif
