/* softmax and log_softmax along one dimension, forward and backward.
 *
 * Legend: (...) the shape of inp; D its size along `dim` (the rows are the
 * D elements that vary along dim). float32 or bfloat16 (rows are computed in
 * float), any strides. Each row is reduced by one thread in a fixed order
 * (16 running lanes, then a fixed tree: kernels/softmax.h, whose row math the
 * CUDA kernels share), so results are bitwise identical for any thread count. Gradient rule: dinp is written (=), or added to (+=)
 * with accumulate. */
#ifndef FT_OPS_SOFTMAX_H
#define FT_OPS_SOFTMAX_H

#include <stdbool.h>

#include "core/tensor.h"

/* out (...) = exp(x - max) / sum(exp(x - max)) along dim (negative dims count
 * from the end). out may be inp itself. */
ft_status ft_softmax_forward(const ft_tensor *out, const ft_tensor *inp, int dim);

/* dinp (...) = out * (dout - sum(dout * out)) along dim, from the forward's out. */
ft_status ft_softmax_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *out, int dim,
                              bool accumulate);

/* out (...) = x - max - log(sum(exp(x - max))) along dim. */
ft_status ft_log_softmax_forward(const ft_tensor *out, const ft_tensor *inp, int dim);

/* dinp (...) = dout - exp(out) * sum(dout) along dim. */
ft_status ft_log_softmax_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_tensor *out, int dim,
                                  bool accumulate);

/* ---- row loops over contiguous floats (n), shared with ops/loss.c ---- */

/* The maximum of the elements that are not NaN (-inf for none): a NaN in a
 * row reaches every result through exp(x - max) and the sum. */
float ft_row_max(const float *x, int64_t n);
/* e (n) = exp(x - shift) (e may be x, or NULL to only sum); returns the sum. */
float ft_row_exp_sum(float *e, const float *x, float shift, int64_t n);
/* sum of x; sum of x * y. */
float ft_row_sum(const float *x, int64_t n);
float ft_row_dot(const float *x, const float *y, int64_t n);

/* Column forms over R <= FT_COLS rows side by side: element d of row r at
 * x[d * stride + r]; one result per row. They compute exactly what the row
 * forms compute (the same lanes and order), so results do not depend on which
 * form a layout takes. */
#define FT_COLS 64
void ft_cols_max(float *m, const float *x, int64_t stride, int64_t D, int R);
/* s[r] = sum over d of exp(x - shift[r]), stored into e (stride estride) when e is not NULL. */
void ft_cols_exp_sum(float *s, float *e, int64_t estride, const float *x, int64_t stride, const float *shift,
                     int64_t D, int R);
/* s[r] = sum over d of x * y (y not NULL), x * w[d] (w not NULL), or x. */
void ft_cols_dot(float *s, const float *x, int64_t stride, const float *y, int64_t ystride, const float *w,
                 int64_t D, int R);

/* The rows of a shape along one dimension: the other dimensions in C order. */
typedef struct {
    int nd;
    int64_t shape[FT_MAX_DIMS];
    int64_t nrows;
} ft_rows;

/* skip: the dimension the rows run along (-1: none, every dimension indexes rows). */
void ft_rows_init(ft_rows *r, int ndim, const int64_t *shape, int skip);
/* dst = strides without dimension `skip` (-1: all of them). */
void ft_rows_strides(int64_t *dst, int ndim, const int64_t *strides, int skip);
/* The position of row `row` over the other dimensions; the next row's. */
void ft_rows_pos(const ft_rows *r, int64_t row, int64_t *pos);
void ft_rows_next(const ft_rows *r, int64_t *pos);
static inline int64_t ft_rows_offset(const ft_rows *r, const int64_t *pos, const int64_t *st) {
    int64_t off = 0;
    for (int d = 0; d < r->nd; d++)
        off += pos[d] * st[d];
    return off;
}

/* buf (n) = the n elements at p with element stride `stride`, float32 or
 * bfloat16; and back. */
void ft_row_load(float *buf, const void *p, int64_t stride, ft_dtype dt, int64_t n);
void ft_row_store(void *p, int64_t stride, ft_dtype dt, const float *buf, int64_t n, bool accumulate);

#endif
