/* Activations (relu, leaky_relu, gelu erf/tanh, silu, sigmoid, tanh) over
 * tensors of any shape and strides, float32 or bfloat16 (computed in float).
 * The scalar math is in kernels/activation.h.
 *
 * Legend: every tensor has the one shape of inp, written (...).
 * Gradient rule: a gradient output is written (=) unless `accumulate` is set,
 * then added to (+=). */
#ifndef FT_OPS_ACTIVATION_H
#define FT_OPS_ACTIVATION_H

#include <stdbool.h>

#include "core/tensor.h"
#include "kernels/activation.h"

/* "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "identity". */
const char *ft_act_name(ft_act_kind kind);

/* out (...) = act(inp (...)). out may be inp itself (in place). */
ft_status ft_activation_forward(const ft_tensor *out, const ft_tensor *inp, ft_act act);

/* dinp (...) = (or += with accumulate) dout (...) * act'(x).
 *
 * The derivative is taken from the forward output `out` when
 * ft_act_grad_uses_output(act) (relu, leaky_relu with alpha >= 0, sigmoid,
 * tanh: what an in-place forward leaves) and out is given, otherwise from the
 * forward input `inp`; the one not used may be NULL. dinp may be the very
 * same view as dout, inp or out (the gradient overwrites them in place). */
ft_status ft_activation_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *inp,
                                 const ft_tensor *out, ft_act act, bool accumulate);

/* ---- loops over contiguous float arrays, for fused ops ----
 * y, dx may be the same array as any input. */

/* y (n) = act(x (n)). */
void ft_act_forward_f32(float *y, const float *x, int64_t n, ft_act act);

/* dx (n) = (or +=) dy (n) * act'(.), the derivative taken from s (n): the
 * forward output when from_output (then ft_act_grad_uses_output(act) must
 * hold), else the forward input. relu and leaky_relu select rather than
 * multiply, as PyTorch does, so that 0 * inf gives 0. */
void ft_act_backward_f32(float *dx, const float *dy, const float *s, int64_t n, ft_act act, bool from_output,
                         bool accumulate);

#endif
