/* The strided loop behind every pointwise op (activations, add, mul,
 * dropout): operands of one shape, float32 or bfloat16, any strides.
 *
 * The kernel always sees contiguous float arrays of n elements. Where every
 * operand is float32 and the run is contiguous in all of them, those are
 * pointers into the tensors; otherwise the engine gathers each input (and,
 * with read_outputs, each output) into a float tile, converting bfloat16,
 * calls the kernel on the tiles and scatters the outputs back. Dimensions
 * are visited in the memory order of operand 0 (in C order for kernels that
 * need the element index) and merged wherever every operand allows, so NCHW,
 * NHWC and any other dense layout shared by the operands is one flat run. The work is split statically over the OpenMP
 * pool; pointwise results never depend on the split.
 *
 * Outputs may alias inputs only as the very same view (checked by the ops):
 * kernels must read element i of every input before writing element i. */
#ifndef FT_OPS_POINTWISE_H
#define FT_OPS_POINTWISE_H

#include <stdbool.h>

#include "core/tensor.h"
#include "kernels/simd.h"

#define FT_PW_MAX_OPS 6

/* p[0..nout) are outputs, p[nout..nops) inputs, each n floats. With
 * need_index, element i is element number idx0 + i of the tensors in C
 * (row-major) order, or idx[i] when idx is not NULL. */
typedef void (*ft_pw_kernel)(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *ctx);

typedef struct {
    int nops, nout;
    const ft_tensor *t[FT_PW_MAX_OPS]; /* all of t[0]'s shape */
    bool read_outputs;                 /* outputs are read too (accumulation) */
    bool need_index;
    ft_pw_kernel fn;
    const void *ctx;
} ft_pw_loop;

void ft_pw_run(const ft_pw_loop *l);

/* n values of dtype dt (float32, bfloat16, or bool as 0 and 1), `step` bytes apart, into floats and back. */
void ft_pw_gather(float *dst, const char *src, int64_t step, ft_dtype dt, int64_t n);
void ft_pw_scatter(char *dst, int64_t step, ft_dtype dt, const float *src, int64_t n);

/* For reductions with a fixed order: the loop's plan (false when it has no
 * elements), its element count, and a walk over elements [begin, end) of the
 * plan's order on the calling thread. Splitting [0, numel) into ranges that
 * do not depend on the thread count gives thread-count-independent sums. */
typedef struct {
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    int64_t st[FT_PW_MAX_OPS + 1][FT_MAX_DIMS]; /* bytes; row nops: the C-order index, in elements */
    char *base[FT_PW_MAX_OPS];
    ft_dtype dtype[FT_PW_MAX_OPS]; /* float32 or bfloat16 */
    bool direct; /* every operand float32 and the inner dimension contiguous in all */
} ft_pw_plan;

bool ft_pw_plan_make(ft_pw_plan *pl, const ft_pw_loop *l);
int64_t ft_pw_plan_numel(const ft_pw_plan *pl);
void ft_pw_walk(const ft_pw_loop *l, const ft_pw_plan *pl, int64_t begin, int64_t end);

/* y (n) = x, or += x with accumulate (the gradient rule): kernels compute a
 * tile of results, then store it so, which keeps both loops vectorized. */
FT_VEC_CLONES static inline void ft_pw_put(float *y, const float *x, int64_t n, bool accumulate) {
    if (accumulate)
        FT_SIMD_FOR(i, n) y[i] += x[i];
    else if (y != x)
        FT_SIMD_FOR(i, n) y[i] = x[i];
}

#endif
