#include "ops/reduce.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/gradient.h"
#include "ops/pointwise.h"

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

#define ROW_TILE 256

/* sums += one row of C channels at unit stride. */
FT_VEC_CLONES static void add_row(double *sums, const char *row, bool bf16, int64_t C) {
    if (!bf16) {
        const float *x = (const float *)row;
        FT_SIMD_FOR(c, C)
            sums[c] += x[c];
        return;
    }
    _Alignas(64) float buf[ROW_TILE];
    for (int64_t c0 = 0; c0 < C; c0 += ROW_TILE) {
        int64_t m = C - c0 < ROW_TILE ? C - c0 : ROW_TILE;
        const float *x = ft_floats_in(row, true, c0, m, buf);
        FT_SIMD_FOR(c, m)
            sums[c0 + c] += x[c];
    }
}

/* sums[c] = the sum of t over every dimension but 1, for t of 2 (N, C) or 4 (N, C, H, W) dimensions in any
 * layout, float32 or bfloat16, in double: each chunk of rows (every index but the channel's) summed in order,
 * then the chunks in order. */
static ft_status channel_sums(double *sums, const ft_tensor *t) {
    int64_t C = t->shape[1];
    int64_t H = t->ndim == 4 ? t->shape[2] : 1, W = t->ndim == 4 ? t->shape[3] : 1;
    int64_t sH = t->ndim == 4 ? t->strides[2] : 0, sW = t->ndim == 4 ? t->strides[3] : 0;
    int64_t rows = t->shape[0] * H * W, nchunks = (rows + CHUNK - 1) / CHUNK;
    int64_t isz = (int64_t)ft_dtype_get(t->dtype)->itemsize;
    bool bf16 = t->dtype == FT_BFLOAT16, dense = t->strides[1] == 1 || C == 1;
    const char *base = ft_tensor_data(t);
    double *part = calloc((size_t)(nchunks ? nchunks : 1) * (size_t)C, sizeof *part); /* (chunks, C) */
    if (!part)
        return ft_fail(FT_ERR_NOMEM, "out of memory for channel sums");
#pragma omp parallel for schedule(static) if (rows * C > 32768)
    for (int64_t k = 0; k < nchunks; k++) {
        double *ps = part + k * C;
        int64_t end = (k + 1) * CHUNK < rows ? (k + 1) * CHUNK : rows;
        for (int64_t r = k * CHUNK; r < end; r++) {
            int64_t n = r / (H * W), hw = r % (H * W);
            const char *row = base + (n * t->strides[0] + (hw / W) * sH + (hw % W) * sW) * isz;
            if (dense)
                add_row(ps, row, bf16, C);
            else
                for (int64_t c = 0; c < C; c++)
                    ps[c] += load(row + c * t->strides[1] * isz, t->dtype);
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double s = 0;
        for (int64_t k = 0; k < nchunks; k++)
            s += part[k * C + c];
        sums[c] = s;
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
    ft_status s = channel_sums(sums, dout);
    float *out = (float *)ft_tensor_data(db);
    for (int64_t c = 0; s == FT_OK && c < C; c++)
        out[c * db->strides[0]] = accumulate ? out[c * db->strides[0]] + (float)sums[c] : (float)sums[c];
    free(sums);
    return s;
}

/* ---- broadcasting ---- */

/* The shapes broadcast as the ops need: out's sizes are inp's or 1 when
 * `summed` (ft_sum_to), inp's are out's or 1 otherwise. */
static ft_status check_broadcast(const char *op, const ft_tensor *out, const ft_tensor *inp, bool summed) {
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on(op, "inp", inp, dev, "inp", true));
    FT_TRY(ft_check_float_on(op, "out", out, dev, "inp", true));
    FT_TRY(ft_check_output(op, "out", out));
    FT_TRY(ft_check_alias(op, "out", out, "inp", inp));
    const ft_tensor *small = summed ? out : inp, *large = summed ? inp : out;
    bool ok = out->ndim == inp->ndim;
    for (int d = 0; ok && d < out->ndim; d++)
        ok = small->shape[d] == large->shape[d] || small->shape[d] == 1;
    if (!ok) {
        char a[128], b[128];
        return ft_fail(FT_ERR_SHAPE, "%s: out %s and inp %s do not broadcast (%s)", op,
                       ft_shape_str(a, sizeof a, out->ndim, out->shape),
                       ft_shape_str(b, sizeof b, inp->ndim, inp->shape),
                       summed ? "out's sizes must be inp's or 1" : "inp's sizes must be out's or 1");
    }
    return FT_OK;
}

static inline void store(char *p, ft_dtype dt, float v) {
    if (dt == FT_BFLOAT16) {
        uint16_t b = ft_f32_to_bf16(v);
        memcpy(p, &b, 2);
    } else {
        memcpy(p, &v, 4);
    }
}

/* The sums of `count` consecutive runs of n values at a stride of `step` elements (acc[c] that of the run starting
 * at element c), each in order, in double. */
static void sum_runs(double *acc, const char *x, bool bf16, int64_t n, int64_t step, int64_t count) {
    for (int64_t c = 0; c < count; c++)
        acc[c] = 0;
    for (int64_t r = 0; r < n; r++) {
        if (bf16) {
            const uint16_t *v = (const uint16_t *)x + r * step;
            for (int64_t c = 0; c < count; c++)
                acc[c] += ft_bf16_to_f32(v[c]);
        } else {
            const float *v = (const float *)x + r * step;
            if (count == 1) {
                acc[0] += v[0];
                continue;
            }
            for (int64_t c = 0; c < count; c++)
                acc[c] += v[c];
        }
    }
}

/* ft_sum_to on the CPU where inp and out are dense and the summed dimensions consecutive (inp (A, R, K), out
 * (A, 1, K): a mean over tokens, the sum of each sample's values): the general loop's sums, in its order, K at a
 * time instead of one element at a time through the strides; false where the layout is another. */
static bool sum_block(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate) {
    enum { RUN = 256 };
    int nd = inp->ndim, first = nd, last = nd;
    for (int d = 0; d < nd; d++)
        if (out->shape[d] != inp->shape[d]) {
            first = first < nd ? first : d;
            last = d;
        }
    for (int d = first; d < last; d++)
        if (out->shape[d] == inp->shape[d] && inp->shape[d] != 1)
            return false;
    if (!ft_tensor_is_contiguous(inp) || !ft_tensor_is_contiguous(out))
        return false;
    int64_t A = 1, R = 1, K = 1;
    for (int d = 0; d < nd; d++)
        *(d < first ? &A : d <= last ? &R : &K) *= inp->shape[d];
    int64_t run = RUN; /* shorter where fewer outputs than threads would leave threads idle (a sum to (1, K)) */
    while (run > 16 && A * ((K + run - 1) / run) < omp_get_max_threads())
        run /= 2;
    int64_t runs = (K + run - 1) / run, jobs = A * runs;
    const char *src = ft_tensor_data(inp);
    char *dst = ft_tensor_data(out);
    bool bf16 = inp->dtype == FT_BFLOAT16;
    size_t isz = ft_dtype_get(inp->dtype)->itemsize, osz = ft_dtype_get(out->dtype)->itemsize;
#pragma omp parallel for schedule(static) if (A * R * K > 32768)
    for (int64_t j = 0; j < jobs; j++) {
        int64_t a = j / runs, k0 = j % runs * run, n = K - k0 < run ? K - k0 : run;
        double acc[RUN];
        sum_runs(acc, src + (size_t)(a * R * K + k0) * isz, bf16, R, K, n);
        for (int64_t k = 0; k < n; k++) {
            char *p = dst + (size_t)(a * K + k0 + k) * osz;
            float v = (float)(acc[k] * scale);
            store(p, out->dtype, accumulate ? load(p, out->dtype) + v : v);
        }
    }
    return true;
}

ft_status ft_sum_to(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate) {
    const char *op = "sum_to";
    FT_TRY(check_broadcast(op, out, inp, true));
    if (ft_op_device(inp).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, sum_to, out, inp, scale, accumulate);
    if (sum_block(out, inp, scale, accumulate))
        return FT_OK;
    int nd = inp->ndim, nred = 0, red[FT_MAX_DIMS];
    int64_t count = 1; /* inp elements per out element */
    for (int d = 0; d < nd; d++)
        if (out->shape[d] != inp->shape[d]) {
            red[nred++] = d;
            count *= inp->shape[d];
        }
    int64_t n = ft_tensor_numel(out);
    size_t isz = ft_dtype_get(inp->dtype)->itemsize, osz = ft_dtype_get(out->dtype)->itemsize;
    const char *src = ft_tensor_data(inp);
    char *dst = ft_tensor_data(out);
#pragma omp parallel for schedule(static) if (n * count > 32768)
    for (int64_t o = 0; o < n; o++) {
        int64_t rest = o, at_in = 0, at_out = 0;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t i = rest % out->shape[d];
            rest /= out->shape[d];
            at_in += i * inp->strides[d];
            at_out += i * out->strides[d];
        }
        /* The reduced dimensions in C order, an odometer over their indices. */
        int64_t idx[FT_MAX_DIMS] = {0}, off = at_in;
        double sum = 0;
        for (int64_t k = 0; k < count; k++) {
            sum += load(src + off * (int64_t)isz, inp->dtype);
            for (int r = nred - 1; r >= 0; r--) {
                int d = red[r];
                off += inp->strides[d];
                if (++idx[r] < inp->shape[d])
                    break;
                off -= idx[r] * inp->strides[d];
                idx[r] = 0;
            }
        }
        char *p = dst + at_out * (int64_t)osz;
        float v = (float)(sum * scale);
        store(p, out->dtype, accumulate ? load(p, out->dtype) + v : v);
    }
    return FT_OK;
}

typedef struct {
    float scale;
    bool accumulate;
} scaled_copy;

static void scaled_copy_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const scaled_copy *c = vctx;
    float *y = p[0];
    const float *x = p[1];
    if (c->accumulate)
        FT_SIMD_FOR(i, n) y[i] += c->scale * x[i];
    else
        FT_SIMD_FOR(i, n) y[i] = c->scale * x[i];
}

ft_status ft_broadcast_to(const ft_tensor *out, const ft_tensor *inp, double scale, bool accumulate) {
    const char *op = "broadcast_to";
    FT_TRY(check_broadcast(op, out, inp, false));
    if (ft_op_device(inp).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, broadcast_to, out, inp, scale, accumulate);
    ft_tensor expanded = *inp; /* read again for every index of a repeated dimension */
    for (int d = 0; d < inp->ndim; d++)
        if (inp->shape[d] != out->shape[d]) {
            expanded.shape[d] = out->shape[d];
            expanded.strides[d] = 0;
        }
    scaled_copy c = {(float)scale, accumulate};
    ft_pw_loop l = {.nops = 2, .nout = 1, .t = {out, &expanded}, .read_outputs = accumulate,
                    .fn = scaled_copy_kernel, .ctx = &c};
    ft_pw_run(&l);
    return FT_OK;
}
