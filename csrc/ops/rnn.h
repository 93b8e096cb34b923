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

/* A whole LSTM layer: the recurrence over T steps in one call. Step by step
 * (from the last to the first with reverse),
 *   gates_t = gi_t + h_prev W^T + b, then c_t and h_t as the ops above,
 * h_prev and c_prev the step before's (first h0 and c0; NULL: zeros).
 *   gi (N, T, 4H): every step's input projection x W_ih^T + b_ih;
 *   w (4H, H) W_hh, b (4H) b_hh or NULL;
 *   seq (N, T, 2H): each step's h (columns [0, H)) then c ([H, 2H));
 *   saved (T, N, 6H), contiguous: what the backward reads, every step's
 *   gates (T, N, 4H), then h (T, N, H), then c (T, N, H), one after another.
 * The steps run on saved, time-major, so that a step's rows are one block
 * (a batch-major step's rows lie T rows apart: strides of a power of two
 * that put them all in the same cache sets); gi and seq are copied once.
 * gi, seq, saved and w share a dtype (float32 or 16-bit); h0, c0 are (N, H). */
ft_status ft_lstm_forward(const ft_tensor *seq, const ft_tensor *saved, const ft_tensor *gi, const ft_tensor *h0,
                          const ft_tensor *c0, const ft_tensor *w, const ft_tensor *b, bool reverse);

/* Which of a layer's backward's gradients are added to (+=) rather than
 * written (c0: an LSTM's alone). */
typedef struct {
    bool gi, h0, c0, weight, bias;
} ft_rnn_acc;

/* The gradients of gi, h0, c0, w and b (each NULL when not wanted) from
 * dseq, the gradient of seq (h's and c's columns), running the steps the
 * other way. W's and b's come from one product over all steps. The
 * gradients of h and c carried between steps are float32; the gates' have
 * saved's dtype. */
ft_status ft_lstm_backward(const ft_tensor *dgi, const ft_tensor *dh0, const ft_tensor *dc0, const ft_tensor *dw,
                           const ft_tensor *db, const ft_tensor *dseq, const ft_tensor *saved, const ft_tensor *h0,
                           const ft_tensor *c0, const ft_tensor *w, bool reverse, ft_rnn_acc acc);

/* A whole GRU layer (PyTorch's GRU, gates in its order r, z, n): step by
 * step (from the last to the first with reverse),
 *   hw = h_prev W^T + b                 (N, 3H)
 *   r = sigmoid(gi_r + hw_r), z = sigmoid(gi_z + hw_z)
 *   n = tanh(gi_n + r hw_n), h = (1 - z) n + z h_prev
 * h_prev the step before's h (first h0; NULL: zeros).
 *   gi (N, T, 3H): every step's input projection x W_ih^T + b_ih;
 *   w (3H, H) W_hh, b (3H) b_hh or NULL;
 *   seq (N, T, H): each step's h;
 *   saved (T, N, 5H), contiguous: what the backward reads, every step's
 *   r, z, n and hw_n (T, N, 4H), then h (T, N, H).
 * Time-major steps, gi and seq copied once, as ft_lstm_forward. gi, seq,
 * saved and w share a dtype (float32 or 16-bit); h0 is (N, H). */
ft_status ft_gru_forward(const ft_tensor *seq, const ft_tensor *saved, const ft_tensor *gi, const ft_tensor *h0,
                         const ft_tensor *w, const ft_tensor *b, bool reverse);

/* The gradients of gi, h0, w and b (each NULL when not wanted) from dseq,
 * running the steps the other way; W's and b's from one product over all
 * steps. The gradient of h carried between steps is float32. */
ft_status ft_gru_backward(const ft_tensor *dgi, const ft_tensor *dh0, const ft_tensor *dw, const ft_tensor *db,
                          const ft_tensor *dseq, const ft_tensor *saved, const ft_tensor *h0, const ft_tensor *w,
                          bool reverse, ft_rnn_acc acc);

/* h (N, H) from gates (N, 4H) and c (N, H). */
ft_status ft_lstm_hidden_forward(const ft_tensor *h, const ft_tensor *gates, const ft_tensor *c);

/* dgates' o column and dc (either may be NULL) from dh. */
ft_status ft_lstm_hidden_backward(const ft_tensor *dgates, const ft_tensor *dc, const ft_tensor *dh,
                                  const ft_tensor *gates, const ft_tensor *c, bool accumulate_gates,
                                  bool accumulate_c);

#endif
