#include "ops/chunks.h"

#include <string.h>

#define MAX_ARGS 8
#define CHUNK_ELEMS (1 << 20) /* large enough that the conversions run in parallel */

static bool low_float(const ft_tensor *t) { return t->dtype == FT_BFLOAT16; }

bool ft_chunks_needed(const ft_chunk_arg *args, int n) {
    for (int i = 0; i < n; i++)
        if (args[i].t && low_float(args[i].t))
            return true;
    return false;
}

/* Samples [n0, n0 + rows) of t. */
static ft_tensor samples(const ft_tensor *t, int64_t n0, int64_t rows) {
    ft_tensor v = *t;
    v.shape[0] = rows;
    v.offset += n0 * t->strides[0] * (int64_t)ft_dtype_get(t->dtype)->itemsize;
    return v;
}

/* A float32 tensor of t's shape for `rows` samples, in t's layout: channels-last for a 4-d
 * channels-last t, else contiguous. */
static ft_status float_like(ft_tensor *out, const ft_tensor *t, int64_t rows) {
    int64_t shape[FT_MAX_DIMS];
    memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
    shape[0] = rows;
    bool cl = t->ndim == 4 && t->shape[1] > 1 && t->strides[1] == 1;
    if (!cl)
        return ft_tensor_empty(out, t->ndim, shape, FT_FLOAT32, FT_CPU, false);
    int64_t C = shape[1], H = shape[2], W = shape[3];
    FT_TRY(ft_tensor_empty(out, 4, (int64_t[]){rows, H, W, C}, FT_FLOAT32, FT_CPU, false));
    int64_t strides[4] = {H * W * C, 1, W * C, C};
    memcpy(out->shape, shape, 4 * sizeof *shape);
    memcpy(out->strides, strides, sizeof strides);
    return FT_OK;
}

ft_status ft_by_float_chunks(const ft_chunk_arg *args, int n, ft_chunk_op op, const void *ctx) {
    if (n > MAX_ARGS)
        return ft_fail(FT_ERR_VALUE, "chunks: at most %d tensors", MAX_ARGS);
    int64_t N = 0, per = 0;
    for (int i = 0; i < n; i++)
        if (args[i].t) {
            N = args[i].t->shape[0];
            if (low_float(args[i].t) && N > 0)
                per += ft_tensor_numel(args[i].t) / N;
        }
    int64_t chunk = per > 0 && per < CHUNK_ELEMS ? CHUNK_ELEMS / per : 1;
    chunk = chunk < N ? chunk : N;
    ft_tensor buf[MAX_ARGS] = {{0}};
    bool low[MAX_ARGS] = {false};
    ft_status s = FT_OK;
    for (int i = 0; s == FT_OK && i < n; i++) {
        low[i] = args[i].t && low_float(args[i].t);
        if (low[i])
            s = float_like(&buf[i], args[i].t, chunk);
    }
    int64_t n0 = 0;
    do { /* once for an empty batch: the op still writes what it must (a gradient of zero) */
        int64_t rows = N - n0 < chunk ? N - n0 : chunk;
        ft_tensor part[MAX_ARGS], f[MAX_ARGS];
        const ft_tensor *ts[MAX_ARGS] = {NULL};
        for (int i = 0; s == FT_OK && i < n; i++) {
            if (!args[i].t)
                continue;
            part[i] = samples(args[i].t, n0, rows);
            f[i] = low[i] ? samples(&buf[i], 0, rows) : part[i];
            ts[i] = &f[i];
            if (low[i] && (!args[i].written || args[i].read))
                s = ft_tensor_copy(&f[i], &part[i], false);
        }
        if (s == FT_OK)
            s = op(ts, n0, ctx);
        for (int i = 0; s == FT_OK && i < n; i++)
            if (low[i] && args[i].written)
                s = ft_tensor_copy(&part[i], &f[i], false);
        n0 += rows;
    } while (s == FT_OK && n0 < N);
    for (int i = 0; i < n; i++)
        if (buf[i].storage)
            ft_tensor_release(&buf[i]);
    return s;
}
