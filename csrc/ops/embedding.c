#include "ops/embedding.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "kernels/convert.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"

/* Elements below which an op runs on one thread. */
#define PARALLEL_WORK 32768
/* The backward's threads own column ranges of whole cache lines of floats. */
#define COL_ALIGN 16
/* What an embedding's V counts, in its id range error. */
#define WEIGHT_ROWS "a weight of %lld rows"

static ft_status check_ids(const char *op, const ft_tensor *ids, ft_device dev, const char *ref) {
    FT_TRY(ft_check_on(op, "ids", ids, dev, ref));
    if (ids->dtype != FT_INT64)
        return ft_fail(FT_ERR_DTYPE, "%s: ids must be int64, got %s", op, ft_dtype_get(ids->dtype)->name);
    if (ids->ndim >= FT_MAX_DIMS)
        return ft_fail(FT_ERR_SHAPE, "%s: ids may have at most %d dimensions, got %d", op, FT_MAX_DIMS - 1,
                       ids->ndim);
    if (!ft_tensor_is_contiguous(ids))
        return ft_fail(FT_ERR_SHAPE, "%s: ids must be contiguous", op);
    return FT_OK;
}

/* A float32 (V, D) table (weight or dweight), contiguous, on dev. */
static ft_status check_table(const char *op, const char *arg, const ft_tensor *t, ft_device dev, const char *ref) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, ref, false));
    FT_TRY(ft_check_ndim(op, arg, t, 2, "(V, D)"));
    if (!ft_tensor_is_contiguous(t))
        return ft_fail(FT_ERR_SHAPE, "%s: %s must be contiguous", op, arg);
    return FT_OK;
}

/* rows (T, D) of shape (*ids.shape, D): out or dout (float32 or a 16-bit float). */
static ft_status check_rows(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *ids, int64_t D,
                            ft_device dev, const char *ref) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, ref, true));
    int64_t shape[FT_MAX_DIMS];
    memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
    shape[ids->ndim] = D;
    FT_TRY(ft_check_shape(op, arg, t, ids->ndim + 1, shape));
    if (!ft_tensor_is_contiguous(t))
        return ft_fail(FT_ERR_SHAPE, "%s: %s must be contiguous", op, arg);
    return FT_OK;
}

static ft_status check_padding(const char *op, int64_t padding_idx, int64_t V) {
    if (padding_idx >= V)
        return ft_fail(FT_ERR_VALUE, "%s: padding_idx %lld must be within the %lld rows of the weight", op,
                       (long long)padding_idx, (long long)V);
    return FT_OK;
}

/* FT_ERR_INDEX naming the first id outside [0, V) ("ids[1, 3] = 70") and
 * what V counts (`of`: "a weight of %lld rows"), else FT_OK. */
static ft_status check_id_range(const char *op, const ft_tensor *ids, int64_t V, const char *of, ft_device dev) {
    int64_t pos = -1, value = 0, T = ft_tensor_numel(ids);
    if (T == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA) {
        FT_TRY(FT_CUDA_CALL(op, embedding_first_bad_id, ids, V, &pos, &value));
    } else {
        const int64_t *id = (const int64_t *)ft_tensor_data(ids);
        for (int64_t t = 0; t < T && pos < 0; t++)
            if (id[t] < 0 || id[t] >= V)
                pos = t, value = id[t];
    }
    if (pos < 0)
        return FT_OK;
    char at[256];
    size_t len = 0;
    at[0] = 0;
    int64_t idx[FT_MAX_DIMS], r = pos;
    for (int d = ids->ndim - 1; d >= 0; d--) {
        idx[d] = ids->shape[d] ? r % ids->shape[d] : 0;
        r = ids->shape[d] ? r / ids->shape[d] : 0;
    }
    for (int d = 0; d < ids->ndim && len < sizeof at; d++)
        len += (size_t)snprintf(at + len, sizeof at - len, "%s%lld", d ? ", " : "", (long long)idx[d]);
    char range[64];
    snprintf(range, sizeof range, of, (long long)V);
    return ft_fail(FT_ERR_INDEX, "%s: ids[%s] = %lld is out of range for %s (ids must be in [0, %lld))", op, at,
                   (long long)value, range, (long long)V);
}

ft_status ft_embedding_check_ids(const ft_tensor *ids, int64_t V) {
    return check_id_range("embedding", ids, V, WEIGHT_ROWS, ft_op_device(ids));
}

ft_status ft_embedding_forward(const ft_tensor *out, const ft_tensor *ids, const ft_tensor *weight,
                               int64_t padding_idx) {
    const char *op = "embedding";
    ft_device dev = ft_op_device(weight);
    FT_TRY(check_table(op, "weight", weight, dev, "weight"));
    FT_TRY(check_ids(op, ids, dev, "weight"));
    int64_t V = weight->shape[0], D = weight->shape[1], T = ft_tensor_numel(ids);
    FT_TRY(check_rows(op, "out", out, ids, D, dev, "weight"));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "weight", weight));
    FT_TRY(check_padding(op, padding_idx, V));
    FT_TRY(check_id_range(op, ids, V, WEIGHT_ROWS, dev));
    if (T * D == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, embedding_forward, out, ids, weight, padding_idx);
    const int64_t *id = (const int64_t *)ft_tensor_data(ids);
    const float *w = (const float *)ft_tensor_data(weight);
    void *y = ft_tensor_data(out);
    bool bf16 = out->dtype == FT_BFLOAT16;
#pragma omp parallel for schedule(static) if (T * D > PARALLEL_WORK)
    for (int64_t t = 0; t < T; t++) {
        if (bf16)
            ft_floats_out(y, true, t * D, D, w + id[t] * D);
        else
            memcpy((float *)y + t * D, w + id[t] * D, (size_t)D * sizeof(float));
    }
    return FT_OK;
}

ft_status ft_embedding_backward(const ft_tensor *dweight, const ft_tensor *dout, const ft_tensor *ids,
                                int64_t padding_idx, bool accumulate) {
    const char *op = "embedding_backward";
    ft_device dev = ft_op_device(dweight);
    FT_TRY(check_table(op, "grad_weight", dweight, dev, "grad_weight"));
    FT_TRY(ft_check_output(op, "grad_weight", dweight));
    FT_TRY(check_ids(op, ids, dev, "grad_weight"));
    int64_t V = dweight->shape[0], D = dweight->shape[1], T = ft_tensor_numel(ids);
    FT_TRY(check_rows(op, "grad_output", dout, ids, D, dev, "grad_weight"));
    FT_TRY(ft_check_alias(op, "grad_weight", dweight, "grad_output", dout));
    if (ft_same_view(dweight, dout))
        return ft_fail(FT_ERR_VALUE, "%s: grad_weight cannot be grad_output itself", op);
    FT_TRY(check_padding(op, padding_idx, V));
    FT_TRY(check_id_range(op, ids, V, WEIGHT_ROWS, dev));
    if (V * D == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, embedding_backward, dweight, dout, ids, padding_idx, accumulate);
    const int64_t *id = (const int64_t *)ft_tensor_data(ids);
    const void *g = ft_tensor_data(dout);
    bool bf16 = dout->dtype == FT_BFLOAT16;
    float *dw = (float *)ft_tensor_data(dweight);
#pragma omp parallel if ((V + T) * D > PARALLEL_WORK)
    {
        if (!accumulate) {
#pragma omp for schedule(static)
            for (int64_t v = 0; v < V; v++)
                memset(dw + v * D, 0, (size_t)D * sizeof *dw);
        }
        /* Each thread owns a range of columns of every row and adds the
         * rows of dout into them in position order: each element's sum has
         * the same order on any number of threads, and no two threads
         * write one element. */
        int nt = omp_get_num_threads(), k = omp_get_thread_num();
        int64_t share = (D + nt - 1) / nt;
        share = (share + COL_ALIGN - 1) / COL_ALIGN * COL_ALIGN;
        int64_t c0 = k * share < D ? k * share : D, c1 = c0 + share < D ? c0 + share : D;
        for (int64_t t = 0; t < T && c0 < c1; t++) {
            if (id[t] == padding_idx)
                continue;
            float *row = dw + id[t] * D;
            if (bf16)
                for (int64_t c = c0; c < c1; c++)
                    row[c] += ft_bf16_to_f32(((const uint16_t *)g)[t * D + c]);
            else
                for (int64_t c = c0; c < c1; c++)
                    row[c] += ((const float *)g)[t * D + c];
        }
    }
    return FT_OK;
}

ft_status ft_one_hot_forward(const ft_tensor *out, const ft_tensor *ids) {
    const char *op = "one_hot";
    ft_device dev = ft_op_device(out);
    FT_TRY(check_ids(op, ids, dev, "out"));
    FT_TRY(ft_check_float_on(op, "out", out, dev, "out", true));
    int64_t C = out->ndim ? out->shape[out->ndim - 1] : 0, T = ft_tensor_numel(ids);
    FT_TRY(check_rows(op, "out", out, ids, C, dev, "out"));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(check_id_range(op, ids, C, "%lld classes", dev));
    if (T * C == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, one_hot, out, ids);
    const int64_t *id = (const int64_t *)ft_tensor_data(ids);
    bool bf16 = out->dtype == FT_BFLOAT16;
    size_t row = (size_t)C * ft_dtype_get(out->dtype)->itemsize;
    char *y = (char *)ft_tensor_data(out);
#pragma omp parallel for schedule(static) if (T * C > PARALLEL_WORK)
    for (int64_t t = 0; t < T; t++) {
        memset(y + t * row, 0, row); /* 0.0 in float32 and bfloat16 */
        if (bf16)
            ((uint16_t *)y)[t * C + id[t]] = ft_f32_to_bf16(1.0f);
        else
            ((float *)y)[t * C + id[t]] = 1.0f;
    }
    return FT_OK;
}
