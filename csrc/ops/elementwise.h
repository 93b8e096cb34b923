/* Binary pointwise ops and concatenation: add (the residual sum, with any
 * activation fused: out = act(a + b)), mul, and concat.
 *
 * Legend: (...) the one shape shared by every operand of add and mul (no
 * broadcasting); for concat, D is the size of the concatenated dimension.
 * float32 or bfloat16, any strides, computed in float.
 * Gradient rule: a gradient output is written (=) unless its accumulate flag
 * is set, then added to (+=); a NULL gradient output is skipped. */
#ifndef FT_OPS_ELEMENTWISE_H
#define FT_OPS_ELEMENTWISE_H

#include <stdbool.h>

#include "core/tensor.h"
#include "kernels/activation.h"

/* out (...) = act(a (...) + b (...)); act FT_ACT_NONE for a plain add.
 * out may be a or b itself (in place). */
ft_status ft_add_forward(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b, ft_act act);

/* With g = dout (...) * act'(a + b): da (...) = g, db (...) = g.
 * act' comes from the forward output `out` when ft_act_grad_uses_output(act)
 * and out is given, else from a + b recomputed (then a and b are needed);
 * FT_ACT_NONE needs neither. da or db may be dout itself. */
ft_status ft_add_backward(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                          const ft_tensor *b, const ft_tensor *out, ft_act act, bool accumulate_a,
                          bool accumulate_b);

/* out (...) = a (...) * b (...); out may be a or b itself. */
ft_status ft_mul_forward(const ft_tensor *out, const ft_tensor *a, const ft_tensor *b);

/* da (...) = dout * b (needs b), db (...) = dout * a (needs a). */
ft_status ft_mul_backward(const ft_tensor *da, const ft_tensor *db, const ft_tensor *dout, const ft_tensor *a,
                          const ft_tensor *b, bool accumulate_a, bool accumulate_b);

/* out (..., D, ...) = the n inputs (..., D_i, ...) one after the other along
 * dimension `dim` (negative counts from the end; D = sum of D_i). An input
 * that already is its slice of out (a view of out's memory) is not copied. */
ft_status ft_concat_forward(const ft_tensor *out, const ft_tensor *const *inps, int n, int dim);

/* dinps[i] (..., D_i, ...) = (or +=) the slice of dout (..., D, ...) that
 * input i filled, sizes[i] = D_i (sum D); NULL entries are skipped. */
ft_status ft_concat_backward(const ft_tensor *const *dinps, const int64_t *sizes, int n, const ft_tensor *dout,
                             int dim, bool accumulate);

#endif
