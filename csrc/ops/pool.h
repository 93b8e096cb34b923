/* 2-d pooling: max, average, adaptive average and adaptive max (global
 * pooling is the adaptive 1 x 1 case), PyTorch's definitions.
 *
 * Legend: N batch, C channels, H W input size, P Q output size.
 * Tensors are 4-d (N, C, H, W) in any strides; the loops pick their order
 * from the strides: channels innermost (NHWC, channels_last: vectorised over
 * C) or W innermost (NCHW: one plane at a time). float32; the max-pool
 * indices are int64 (PyTorch's) or int32 and hold h * W + w, the position of
 * each maximum within its plane (-1 for a window with no input element).
 * Every output element is computed by one thread in a fixed order, so the
 * results do not depend on the thread count.
 *
 * Backward of max pooling uses the saved indices (it never re-reads the
 * input). Gradient rule: dinp is written (=), or added to (+=) with
 * accumulate. */
#ifndef FT_OPS_POOL_H
#define FT_OPS_POOL_H

#include <stdbool.h>

#include "core/tensor.h"

typedef struct {
    int64_t kernel[2], stride[2], padding[2], dilation[2]; /* (h, w); avg_pool2d needs dilation 1 */
    bool ceil_mode;
    bool count_include_pad;   /* avg_pool2d: padded zeros count in the divisor */
    int64_t divisor_override; /* avg_pool2d: the divisor when > 0 */
} ft_pool2d_params;

/* P, Q of max_pool2d or avg_pool2d (`op`) for an H x W input; FT_ERR_VALUE for
 * bad parameters, FT_ERR_SHAPE for an output smaller than 1 x 1. */
ft_status ft_pool2d_out_size(int64_t *P, int64_t *Q, int64_t H, int64_t W, const ft_pool2d_params *p,
                             const char *op);

/* out (N, C, P, Q) = the maximum of each window of inp (N, C, H, W) (NaN wins;
 * ties keep the first); indices (N, C, P, Q) its position, or NULL. */
ft_status ft_max_pool2d_forward(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp,
                                const ft_pool2d_params *p);

/* dinp (N, C, H, W) = (or +=) the sum of dout (N, C, P, Q) over the outputs
 * whose maximum each input element was, from indices (N, C, P, Q). */
ft_status ft_max_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                 bool accumulate);

/* out (N, C, P, Q) = the mean of each window of inp (N, C, H, W). */
ft_status ft_avg_pool2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_pool2d_params *p);

/* dinp (N, C, H, W) = (or +=) each dout (N, C, P, Q) / divisor spread over its window. */
ft_status ft_avg_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_pool2d_params *p,
                                 bool accumulate);

/* out (N, C, P, Q) = the mean over windows rows [floor(i H / P), ceil((i + 1) H / P))
 * by columns [floor(j W / Q), ceil((j + 1) W / Q)); P, Q from out's shape. */
ft_status ft_adaptive_avg_pool2d_forward(const ft_tensor *out, const ft_tensor *inp);
ft_status ft_adaptive_avg_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, bool accumulate);

/* The same windows, maximum; indices (N, C, P, Q) or NULL. */
ft_status ft_adaptive_max_pool2d_forward(const ft_tensor *out, const ft_tensor *indices, const ft_tensor *inp);
ft_status ft_adaptive_max_pool2d_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *indices,
                                          bool accumulate);

#endif
