/* The LSTM cell's formulas, shared by the CPU loops (ops/rnn.c) and the
 * CUDA kernels (cuda/pointwise.cu) so that both compute the same bits:
 * explicit fmaf only, and the activations of kernels/activation.h. Gates in
 * PyTorch's order (i, f, g, o). */
#ifndef FT_KERNELS_LSTM_H
#define FT_KERNELS_LSTM_H

#include "kernels/activation.h"

/* c = sigmoid(f) c_prev + sigmoid(i) tanh(g); without prev, c_prev is zero. */
static inline FT_HD float ft_lstm_c(float i, float f, float g, float c_prev, bool prev) {
    float ig = ft_sigmoidf(i) * ft_tanhf(g);
    return prev ? fmaf(ft_sigmoidf(f), c_prev, ig) : ig;
}

/* h = sigmoid(o) tanh(c). */
static inline FT_HD float ft_lstm_h(float o, float c) { return ft_sigmoidf(o) * ft_tanhf(c); }

/* d a sigmoid'(x), s = sigmoid(x): the gradient of a gate x whose sigmoid multiplied a. */
static inline FT_HD float ft_lstm_dsigmoid(float d, float a, float s) { return d * a * (s * (1.0f - s)); }

/* d s tanh'(x), t = tanh(x): the gradient of x whose tanh a sigmoid s multiplied. */
static inline FT_HD float ft_lstm_dtanh(float d, float s, float t) { return d * s * fmaf(-t, t, 1.0f); }

#endif
