/* Scaled dot-product attention (PyTorch's scaled_dot_product_attention with
 * a causal mask, one masking keys out, or an additive bias), fused and memory-light: keys are taken
 * in blocks with an online softmax, so no (Tq, Tk) matrix of the whole
 * sequence is ever stored; the forward saves only each query row's
 * log-sum-exp, from which the backward recomputes the probabilities block by
 * block.
 *
 * Legend: N batch, H heads, Tq queries, Tk keys, D the head size. float32,
 * or on the CPU bfloat16 q, k, v, out and gradients (each its own; lse
 * float32). With every operand bfloat16 and AVX512-BF16 the products run in
 * bfloat16 pairs with float32 sums, else in float32. The N, H and T
 * dimensions may have any strides (a (N, T, H, D) tensor seen through a
 * transpose works without a copy); D must have unit stride. Each
 * output element is computed by one thread in a fixed order, so results are
 * bitwise identical for any thread count. */
#ifndef FT_OPS_ATTENTION_H
#define FT_OPS_ATTENTION_H

#include <stdbool.h>

#include "core/tensor.h"

/* Dropout on the probabilities (PyTorch's dropout_p) drops exactly what
 * ft_dropout_forward (ops/dropout.h) with (dropout_p, seed, offset) would
 * drop of the (N, H, Tq, Tk) tensor of probabilities, so it draws
 * ft_dropout_blocks(N H Tq Tk) Philox blocks; the backward regenerates the
 * mask from the same parameters. The row sums (lse) are those before
 * dropout. */
typedef struct {
    double scale;     /* multiplies q k^T; <= 0: 1 / sqrt(D) */
    bool causal;      /* query i sees keys j <= i (top-left aligned, PyTorch's is_causal) */
    double dropout_p; /* in [0, 1) */
    uint64_t seed, offset;
    /* (N, Tk) bool, true where a key is masked out (PyTorch's
     * key_padding_mask), on q's device; NULL: none. A query that sees no key
     * gets out 0 and lse -inf (PyTorch gives NaN). */
    const ft_tensor *key_mask;
    /* (N, H, Tq, Tk) float32 or bfloat16 added to the scaled scores (a
     * relative position bias, ALiBi's), on the CPU, with any strides (0
     * along N or H where it is the same for every sample or head); NULL:
     * none. Its values should be finite: a query whose every score is -inf
     * gets NaN. */
    const ft_tensor *bias;
} ft_sdpa_params;

/* The gradient rule (ops/gradient.h) per gradient output: false writes (=),
 * true adds (+=). */
typedef struct {
    bool q, k, v, bias;
} ft_sdpa_acc;

/* out (N, H, Tq, D) = softmax(q k^T * scale + mask) v, with q (N, H, Tq, D),
 * k and v (N, H, Tk, D); lse (N, H, Tq) = the log-sum-exp of each row of
 * q k^T * scale + mask (-inf for a row that sees no key, whose out is 0), or
 * NULL when no backward follows. */
ft_status ft_sdpa_forward(const ft_tensor *out, const ft_tensor *lse, const ft_tensor *q, const ft_tensor *k,
                          const ft_tensor *v, const ft_sdpa_params *p);

/* dq (N, H, Tq, D), dk and dv (N, H, Tk, D) from dout (N, H, Tq, D) and the
 * forward's out and lse, and with p->bias its gradient dbias (N, H, Tq, Tk)
 * (the scores' gradient, 0 where a key is not seen); each
 * gradient may be NULL (not computed) and is written or added to as `acc`
 * says. None may overlap an input or another gradient. */
ft_status ft_sdpa_backward(const ft_tensor *dq, const ft_tensor *dk, const ft_tensor *dv, const ft_tensor *dbias,
                           const ft_tensor *dout, const ft_tensor *q, const ft_tensor *k, const ft_tensor *v,
                           const ft_tensor *out, const ft_tensor *lse, const ft_sdpa_params *p, ft_sdpa_acc acc);

#endif
