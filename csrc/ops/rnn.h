/* The pointwise half of an LSTM step (PyTorch's LSTM and LSTMCell), fused:
 * the gates' activations and the cell's update in one pass over the gates
 * the products gave, gates (N, 4H) = x W_ih^T + b_ih + h W_hh^T + b_hh in
 * PyTorch's order (i, f, g, o):
 *   c = sigmoid(f) c_prev + sigmoid(i) tanh(g)   (c_prev NULL: zeros)
 *   h = sigmoid(o) tanh(c)
 * The two are ops of their own, so that a compiled program keeps c, the
 * state the next step reads, and h, the output, as two values. The
 * backwards recompute the activations from the gates; each writes the
 * gradient of the gate columns it reads (i, f and g; o), written (=) or
 * added to (+=) as `accumulate` says, and leaves the others.
 *
 * Legend: N rows, H the hidden size. float32 or bfloat16, any strides. */
#ifndef FT_OPS_RNN_H
#define FT_OPS_RNN_H

#include <stdbool.h>

#include "core/tensor.h"

/* Gates [k0, k1) of gates (N, 4H) (0 i, 1 f, 2 g, 3 o), or of their
 * gradient: the (N, (k1 - k0) H) view of their columns. */
ft_tensor ft_lstm_gates(const ft_tensor *gates, int k0, int k1);

/* c (N, H) from gates (N, 4H) and c_prev (N, H), or NULL. */
ft_status ft_lstm_cell_forward(const ft_tensor *c, const ft_tensor *gates, const ft_tensor *c_prev);

/* dgates' i, f and g columns and dc_prev (either may be NULL) from dc. */
ft_status ft_lstm_cell_backward(const ft_tensor *dgates, const ft_tensor *dc_prev, const ft_tensor *dc,
                                const ft_tensor *gates, const ft_tensor *c_prev, bool accumulate_gates,
                                bool accumulate_c_prev);

/* h (N, H) from gates (N, 4H) and c (N, H). */
ft_status ft_lstm_hidden_forward(const ft_tensor *h, const ft_tensor *gates, const ft_tensor *c);

/* dgates' o column and dc (either may be NULL) from dh. */
ft_status ft_lstm_hidden_backward(const ft_tensor *dgates, const ft_tensor *dc, const ft_tensor *dh,
                                  const ft_tensor *gates, const ft_tensor *c, bool accumulate_gates,
                                  bool accumulate_c);

#endif
