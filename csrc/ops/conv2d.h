/* 2-d convolution (PyTorch's Conv2d) on oneDNN.
 *
 * Legend: N batch, C input channels, H W input size, K output channels,
 * G groups, R S kernel size, P Q output size.
 * Tensors may be in NCHW or channels-last (NHWC) memory: the layout is read
 * from the strides, and oneDNN runs on that layout directly. float32, or
 * bfloat16 inputs and weights with float32 accumulation. */
#ifndef FT_OPS_CONV2D_H
#define FT_OPS_CONV2D_H

#include "core/tensor.h"
#include "kernels/activation.h"
#include "ops/gradient.h"

typedef struct {
    int64_t stride[2];
    int64_t padding[2];
    int64_t dilation[2];
    int64_t groups;
} ft_conv2d_params;

/* Fusions oneDNN applies to the output as it is written. */
typedef struct {
    ft_act act; /* out = act(...) */
    bool sum;   /* out = act(conv + b + out): a residual added in place */
} ft_conv2d_fusion;

/* P and Q for an input of H x W and a kernel of R x S, or FT_ERR_SHAPE. */
ft_status ft_conv2d_out_size(int64_t *P, int64_t *Q, int64_t H, int64_t W, int64_t R, int64_t S,
                             const ft_conv2d_params *p);

/* out (N, K, P, Q) = fusion(conv(inp (N, C, H, W), w (K, C/G, R, S)) + b (K)); b may be NULL. */
ft_status ft_conv2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w, const ft_tensor *b,
                            const ft_conv2d_params *p, const ft_conv2d_fusion *fusion);

/* Gradients from dout (N, K, P, Q), the gradient of the convolution's own
 * output (before any fused activation: the caller applies its backward
 * first). Each of dinp (N, C, H, W), dw (K, C/G, R, S), db (K) may be NULL;
 * each is written (=), or added to (+=) as `acc` says (ops/gradient.h). */
ft_status ft_conv2d_backward(const ft_tensor *dinp, const ft_tensor *dw, const ft_tensor *db,
                             const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                             const ft_conv2d_params *p, ft_grad_acc acc);

/* Transposed convolution (PyTorch's ConvTranspose2d): the adjoint of the
 * convolution with the same parameters, run on the convolution's own
 * primitives. Its forward is that convolution's data gradient, its data
 * gradient the convolution, its weight gradient the convolution's weight
 * gradient with input and output exchanged.
 *
 * out (N, K, P, Q) = convT(inp (N, C, H, W), w (C, K/G, R, S)) + b (K), b may
 * be NULL; P and Q are any size the convolution maps back to H and W (the
 * caller's output_padding picks one). */
ft_status ft_conv_transpose2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w,
                                      const ft_tensor *b, const ft_conv2d_params *p);

/* Gradients from dout (N, K, P, Q): dinp (N, C, H, W), dw (C, K/G, R, S) and
 * db (K), each may be NULL, written or added to as `acc` says. */
ft_status ft_conv_transpose2d_backward(const ft_tensor *dinp, const ft_tensor *dw, const ft_tensor *db,
                                       const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                                       const ft_conv2d_params *p, ft_grad_acc acc);

#endif
