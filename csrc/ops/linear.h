/* Fully connected layers (PyTorch's Linear) on oneDNN's matmul.
 *
 * Legend: N rows (the batch, any leading dimensions flattened by the
 * caller), I input features, O output features. float32, or bfloat16 inputs
 * and weights with float32 accumulation (and a float32 or bfloat16 weight
 * gradient: a matmul of two activations differentiates its second as one). */
#ifndef FT_OPS_LINEAR_H
#define FT_OPS_LINEAR_H

#include "core/tensor.h"
#include "kernels/activation.h"
#include "ops/gradient.h"

/* A 2-d operand as oneDNN's matmul sees it: dims and strides (in
 * elements), possibly a transposed view of a fasttrain tensor. */
typedef struct {
    int64_t dims[2], strides[2];
    int dtype;
    char *data;
} ft_matrix;

/* dst = act(src @ wei + bias), or dst += src @ wei with sum, as one oneDNN
 * matmul (planned for one thread with single_thread); bias (dst's columns)
 * may be NULL. */
ft_status ft_matmul(const ft_matrix *src, const ft_matrix *wei, const ft_matrix *dst, const float *bias, ft_act act,
                    bool sum, bool single_thread);

/* out (..., M, P) = (or += with sum) a (..., M, K) @ w (..., K, P) on the CPU: each of the matrices the leading
 * sizes index, any strides (a view of attention's heads), as one oneDNN matmul over dense copies of the
 * operands that are not contiguous. */
ft_status ft_matmul_batched(const ft_tensor *out, const ft_tensor *a, const ft_tensor *w, bool sum);

/* out (N, O) = act(x (N, I) @ w (O, I)^T + b (O)); b may be NULL. */
ft_status ft_linear_forward(const ft_tensor *out, const ft_tensor *x, const ft_tensor *w, const ft_tensor *b,
                            ft_act act);

/* Gradients from dout (N, O), the gradient of the pre-activation output.
 * dx (N, I), dw (O, I), db (O) may each be NULL; each is written (=), or
 * added to (+=) as `acc` says (ops/gradient.h). */
ft_status ft_linear_backward(const ft_tensor *dx, const ft_tensor *dw, const ft_tensor *db, const ft_tensor *dout,
                             const ft_tensor *x, const ft_tensor *w, ft_grad_acc acc);

#endif
