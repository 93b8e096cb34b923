#include "ops/reduce.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/gradient.h"

/* Rows per partial sum: the partials, not the threads, fix the order. */
#define CHUNK 256

static inline float load(const char *p, ft_dtype dt) {
    if (dt == FT_BFLOAT16) {
        uint16_t b;
        memcpy(&b, p, 2);
        return ft_bf16_to_f32(b);
    }
    float f;
    memcpy(&f, p, 4);
    return f;
}

ft_status ft_channel_sums(double *sums, double *sq, const float *shift, const ft_tensor *t) {
    if (t->ndim != 2 && t->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "channel sums need a 2-d or 4-d tensor, got %d dimensions", t->ndim);
    if (t->dtype != FT_FLOAT32 && t->dtype != FT_BFLOAT16)
        return ft_fail(FT_ERR_DTYPE, "channel sums need float32 or bfloat16, got %s", ft_dtype_get(t->dtype)->name);
    int64_t C = t->shape[1];
    /* Rows are every index but the channel: (n, h, w) flattened. */
    int64_t H = t->ndim == 4 ? t->shape[2] : 1, W = t->ndim == 4 ? t->shape[3] : 1;
    int64_t sH = t->ndim == 4 ? t->strides[2] : 0, sW = t->ndim == 4 ? t->strides[3] : 0;
    int64_t rows = t->shape[0] * H * W, nchunks = (rows + CHUNK - 1) / CHUNK;
    int64_t isz = (int64_t)ft_dtype_get(t->dtype)->itemsize;
    const char *base = ft_tensor_data(t);
    double *part = calloc((size_t)(nchunks ? nchunks : 1) * (size_t)C * 2, sizeof *part); /* (chunks, 2, C) */
    if (!part)
        return ft_fail(FT_ERR_NOMEM, "out of memory for channel sums");
#pragma omp parallel for schedule(static) if (rows * C > 32768)
    for (int64_t k = 0; k < nchunks; k++) {
        double *ps = part + k * 2 * C, *pq = ps + C;
        int64_t end = (k + 1) * CHUNK < rows ? (k + 1) * CHUNK : rows;
        for (int64_t r = k * CHUNK; r < end; r++) {
            int64_t n = r / (H * W), hw = r % (H * W);
            const char *row = base + (n * t->strides[0] + (hw / W) * sH + (hw % W) * sW) * isz;
            for (int64_t c = 0; c < C; c++) {
                double x = load(row + c * t->strides[1] * isz, t->dtype) - (shift ? shift[c] : 0.0f);
                ps[c] += x;
                pq[c] += x * x;
            }
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double s = 0, q = 0;
        for (int64_t k = 0; k < nchunks; k++) {
            s += part[k * 2 * C + c];
            q += part[k * 2 * C + C + c];
        }
        sums[c] = s;
        if (sq)
            sq[c] = q;
    }
    free(part);
    return FT_OK;
}

ft_status ft_bias_grad(const ft_tensor *db, const ft_tensor *dout, bool accumulate) {
    const char *op = "bias_grad";
    ft_device dev = ft_op_device(dout);
    FT_TRY(ft_check_float(op, "dout", dout, true));
    FT_TRY(ft_check_float_on(op, "db", db, dev, "dout", false));
    if (dout->ndim != 2 && dout->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "%s: dout must be (N, C) or (N, C, H, W), got %d dimensions", op, dout->ndim);
    FT_TRY(ft_check_shape(op, "db", db, 1, &dout->shape[1]));
    FT_TRY(ft_check_output(op, "db", db));
    if (dev.type == FT_DEV_CUDA) {
        ft_grad_out g;
        const ft_tensor *to;
        FT_TRY(ft_grad_out_begin(&g, db, accumulate, &to));
        return ft_grad_out_end(&g, FT_CUDA_CALL(op, bias_grad, to, dout));
    }
    int64_t C = db->shape[0];
    double *sums = malloc((size_t)(C ? C : 1) * sizeof *sums);
    if (!sums)
        return ft_fail(FT_ERR_NOMEM, "out of memory for a bias gradient");
    ft_status s = ft_channel_sums(sums, NULL, NULL, dout);
    float *out = (float *)ft_tensor_data(db);
    for (int64_t c = 0; s == FT_OK && c < C; c++)
        out[c * db->strides[0]] = accumulate ? out[c * db->strides[0]] + (float)sums[c] : (float)sums[c];
    free(sums);
    return s;
}
