/* Dropout. Legend: n elements of contiguous float arrays; W the Philox words
 * of a chunk of CHUNK elements (4 per block). */
#include "ops/dropout.h"

#include <math.h>

#include "kernels/philox.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"

#define CHUNK 256

typedef struct {
    uint64_t seed, offset;
    int64_t span;
    uint32_t threshold; /* keep when (word >> 8) >= threshold */
    float scale;
    bool accumulate;
} dropout_ctx;

/* Words of Philox blocks [b0, b0 + nb) into w (4 nb). */
FT_VEC_CLONES
static void philox_words(uint32_t *w, uint64_t seed, uint64_t b0, int64_t nb) {
    FT_SIMD_FOR(j, nb) {
        ft_philox_block r = ft_philox(seed, 0, b0 + (uint64_t)j);
        w[4 * j] = r.v[0];
        w[4 * j + 1] = r.v[1];
        w[4 * j + 2] = r.v[2];
        w[4 * j + 3] = r.v[3];
    }
}

/* w[i] = the word of element idx[i]: word idx % 4 of block offset + idx / 4. */
FT_VEC_CLONES
static void indexed_words(uint32_t *w, const int64_t *idx, uint64_t seed, uint64_t offset, int64_t n) {
    FT_SIMD_FOR(i, n) {
        ft_philox_block r = ft_philox(seed, 0, offset + (uint64_t)(idx[i] >> 2));
        int64_t k = idx[i] & 3;
        w[i] = k == 0 ? r.v[0] : k == 1 ? r.v[1] : k == 2 ? r.v[2] : r.v[3];
    }
}

FT_VEC_CLONES
static void apply_mask(float *y, const float *x, const uint32_t *w, int64_t n, uint32_t threshold, float scale,
                       bool accumulate) {
    if (accumulate)
        FT_SIMD_FOR(i, n) y[i] += x[i] * ((w[i] >> 8) >= threshold ? scale : 0.0f);
    else
        FT_SIMD_FOR(i, n) y[i] = x[i] * ((w[i] >> 8) >= threshold ? scale : 0.0f);
}

static void dropout_kernel(float *const *p, int64_t n, const int64_t *idx, int64_t idx0, const void *vctx) {
    const dropout_ctx *c = vctx;
    float *y = p[0];
    const float *x = p[1];
    uint32_t w[CHUNK + 8];
    if (idx || c->span > 1) { /* draws not consecutive: one block each */
        int64_t draw[CHUNK];
        for (int64_t off = 0; off < n; off += CHUNK) {
            int64_t m = n - off < CHUNK ? n - off : CHUNK;
            for (int64_t k = 0; k < m; k++)
                draw[k] = (idx ? idx[off + k] : idx0 + off + k) / c->span;
            indexed_words(w, draw, c->seed, c->offset, m);
            apply_mask(y + off, x + off, w, m, c->threshold, c->scale, c->accumulate);
        }
        return;
    }
    for (int64_t off = 0; off < n; off += CHUNK) {
        int64_t m = n - off < CHUNK ? n - off : CHUNK;
        int64_t first = idx0 + off, b0 = first >> 2, b1 = (first + m - 1) >> 2;
        philox_words(w, c->seed, c->offset + (uint64_t)b0, b1 - b0 + 1);
        apply_mask(y + off, x + off, w + (first & 3), m, c->threshold, c->scale, c->accumulate);
    }
}

void ft_dropout_factors(float *z, const ft_dropout_params *p, int64_t first, int64_t n) {
    uint32_t w[CHUNK + 8], threshold = ft_dropout_threshold(p->p);
    float scale = ft_dropout_scale(p->p);
    for (int64_t off = 0; off < n; off += CHUNK) {
        int64_t m = n - off < CHUNK ? n - off : CHUNK, at = first + off, b0 = at >> 2;
        philox_words(w, p->seed, p->offset + (uint64_t)b0, ((at + m - 1) >> 2) - b0 + 1);
        const uint32_t *wk = w + (at & 3);
        float *zk = z + off;
        FT_SIMD_FOR(k, m)
            zk[k] = (wk[k] >> 8) >= threshold ? scale : 0.0f;
    }
}

uint64_t ft_dropout_blocks(int64_t numel) { return numel > 0 ? ((uint64_t)numel + 3) / 4 : 0; }

static ft_status run(const char *op, bool backward, const ft_tensor *out, const char *out_arg, const ft_tensor *inp,
                     const char *inp_arg, const ft_dropout_params *p, bool accumulate) {
    if (!(p->p >= 0.0 && p->p <= 1.0))
        return ft_fail(FT_ERR_VALUE, "%s: dropout probability has to be between 0 and 1, but got %g", op, p->p);
    if (p->span < 1)
        return ft_fail(FT_ERR_VALUE, "%s: span must be at least 1, got %lld", op, (long long)p->span);
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on(op, inp_arg, inp, dev, inp_arg, true));
    FT_TRY(ft_check_float_on(op, out_arg, out, dev, inp_arg, true));
    FT_TRY(ft_check_shape_as(op, out_arg, out, inp));
    FT_TRY(ft_check_output(op, out_arg, out));
    FT_TRY(ft_check_alias(op, out_arg, out, inp_arg, inp));
    if (dev.type == FT_DEV_CUDA) {
        if (backward)
            FT_CUDA_DISPATCH(op, dropout_backward, out, inp, p, accumulate);
        FT_CUDA_DISPATCH(op, dropout_forward, out, inp, p);
    }
    dropout_ctx c = {p->seed, p->offset, p->span, ft_dropout_threshold(p->p), ft_dropout_scale(p->p), accumulate};
    ft_pw_loop l = {.nops = 2, .nout = 1, .t = {out, inp}, .read_outputs = accumulate, .need_index = true,
                    .fn = dropout_kernel, .ctx = &c};
    ft_pw_run(&l);
    return FT_OK;
}

ft_status ft_dropout_forward(const ft_tensor *out, const ft_tensor *inp, const ft_dropout_params *p) {
    return run("dropout", false, out, "out", inp, "inp", p, false);
}

ft_status ft_dropout_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_dropout_params *p,
                              bool accumulate) {
    return run("dropout_backward", true, dinp, "dinp", dout, "dout", p, accumulate);
}
