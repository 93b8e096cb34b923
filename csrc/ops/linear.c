#include "ops/linear.h"

#include <omp.h>
#include <string.h>

#include "core/settings.h"
#include "kernels/convert.h"
#include "ops/activation.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/gradient.h"
#include "ops/onednn.h"
#include "ops/reduce.h"

/* Fixed slices of the deterministic path (see conv2d.c). */
#define DET_CHUNKS 8

static ft_matrix as_is(const ft_tensor *t) {
    return (ft_matrix){{t->shape[0], t->shape[1]}, {t->strides[0], t->strides[1]}, t->dtype, ft_tensor_data(t)};
}

static ft_matrix transposed(const ft_tensor *t) {
    return (ft_matrix){{t->shape[1], t->shape[0]}, {t->strides[1], t->strides[0]}, t->dtype, ft_tensor_data(t)};
}

typedef struct {
    bool bias, sum, single_thread;
    int act, nd; /* nd: 2, or 3 for a batch of matrices */
    float alpha;
    int64_t src[6], wei[6], dst[6]; /* nd dims then nd strides */
    int dt_src, dt_wei, dt_dst;
} mm_key;

static void put(int64_t *k, const ft_matrix *o) {
    memcpy(k, o->dims, sizeof o->dims);
    memcpy(k + 2, o->strides, sizeof o->strides);
}

typedef struct {
    dnnl_memory_desc_t src, wei, dst, bias;
} mm_mds;

static ft_status make_mds(mm_mds *m, const mm_key *k) {
    FT_TRY(ft_dnnl_md_strided(&m->src, (ft_dtype)k->dt_src, k->nd, k->src, k->src + k->nd));
    FT_TRY(ft_dnnl_md_strided(&m->wei, (ft_dtype)k->dt_wei, k->nd, k->wei, k->wei + k->nd));
    FT_TRY(ft_dnnl_md_strided(&m->dst, (ft_dtype)k->dt_dst, k->nd, k->dst, k->dst + k->nd));
    if (k->nd != 2) /* a batch of matrices takes no bias */
        return FT_OK;
    int64_t bdims[2] = {1, k->dst[1]}, bstrides[2] = {k->dst[1], 1};
    return ft_dnnl_md_strided(&m->bias, FT_FLOAT32, 2, bdims, bstrides);
}

static ft_status build(dnnl_primitive_desc_t *pd, const void *arg) {
    const mm_key *k = arg;
    mm_mds m;
    FT_TRY(make_mds(&m, k));
    dnnl_engine_t engine;
    FT_TRY(ft_dnnl_engine(&engine));
    dnnl_matmul_desc_t md;
    FT_TRY(ft_dnnl_check(dnnl_matmul_desc_init(&md, &m.src, &m.wei, k->bias ? &m.bias : NULL, &m.dst), "linear"));
    dnnl_primitive_attr_t attr;
    FT_TRY(ft_dnnl_attr(&attr));
    ft_status s = FT_OK;
    if (k->act || k->sum) {
        dnnl_post_ops_t po;
        s = ft_dnnl_check(dnnl_post_ops_create(&po), "linear post-ops");
        if (s == FT_OK && k->sum) /* dst += the product: how gradients accumulate */
            s = ft_dnnl_check(dnnl_post_ops_append_sum(po, 1.0f), "linear sum post-op");
        if (s == FT_OK && k->act)
            s = ft_dnnl_append_act(po, (ft_act){(ft_act_kind)k->act, k->alpha});
        if (s == FT_OK)
            s = ft_dnnl_check(dnnl_primitive_attr_set_post_ops(attr, po), "linear post-ops");
        dnnl_post_ops_destroy(po);
    }
    if (s == FT_OK) {
        int threads = omp_get_max_threads();
        if (k->single_thread)
            omp_set_num_threads(1);
        s = ft_dnnl_check(dnnl_primitive_desc_create(pd, &md, attr, engine, NULL), "linear primitive");
        if (k->single_thread)
            omp_set_num_threads(threads);
    }
    dnnl_primitive_attr_destroy(attr);
    return s;
}

ft_status ft_matmul(const ft_matrix *src, const ft_matrix *wei, const ft_matrix *dst, const float *bias, ft_act act,
                    bool sum, bool single_thread) {
    mm_key k;
    memset(&k, 0, sizeof k);
    k.nd = 2;
    put(k.src, src);
    put(k.wei, wei);
    put(k.dst, dst);
    k.dt_src = src->dtype, k.dt_wei = wei->dtype, k.dt_dst = dst->dtype;
    k.bias = bias != NULL;
    k.act = act.kind;
    k.alpha = act.alpha;
    k.sum = sum;
    k.single_thread = single_thread;
    const ft_dnnl_prim *prim = NULL;
    FT_TRY(ft_dnnl_get(&prim, &k, sizeof k, build, &k));
    mm_mds m;
    FT_TRY(make_mds(&m, &k));
    ft_dnnl_arg args[4] = {{DNNL_ARG_SRC, &m.src, src->data},
                           {DNNL_ARG_WEIGHTS, &m.wei, wei->data},
                           {DNNL_ARG_DST, &m.dst, dst->data},
                           {DNNL_ARG_BIAS, &m.bias, (void *)bias}};
    return ft_dnnl_run(prim, bias ? 4 : 3, args);
}

static ft_matrix rows(const ft_matrix *o, int64_t r0, int64_t r1) {
    ft_matrix s = *o;
    s.dims[0] = r1 - r0;
    s.data += r0 * o->strides[0] * (int64_t)ft_dtype_get((ft_dtype)o->dtype)->itemsize;
    return s;
}

static ft_matrix cols(const ft_matrix *o, int64_t c0, int64_t c1) {
    ft_matrix s = *o;
    s.dims[1] = c1 - c0;
    s.data += c0 * o->strides[1] * (int64_t)ft_dtype_get((ft_dtype)o->dtype)->itemsize;
    return s;
}

/* Deterministic mode: each fixed slice of rows runs on one thread (with a
 * primitive planned for one thread), so every row is computed the same way
 * whatever the thread count. */
static ft_status matmul_rows(const ft_matrix *src, const ft_matrix *wei, const ft_matrix *dst, const float *bias,
                             ft_act act, bool sum) {
    if (!ft_deterministic())
        return ft_matmul(src, wei, dst, bias, act, sum, false);
    int64_t n = src->dims[0], chunks = n < DET_CHUNKS ? n : DET_CHUNKS;
    ft_error err[DET_CHUNKS];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t r0 = n * c / chunks, r1 = n * (c + 1) / chunks;
        ft_matrix s = rows(src, r0, r1), d = rows(dst, r0, r1);
        ft_error_keep(&err[c], ft_matmul(&s, wei, &d, bias, act, sum, true));
    }
    return ft_error_first(err, chunks);
}

/* A dense (B, R, C) view of t (..., R, C), B its leading sizes' product: t itself where it is contiguous, else
 * a contiguous copy of it (copied is then set; with `fill` false, its values are left to be written). */
static ft_status dense_batch(ft_tensor *v, const ft_tensor *t, bool fill, bool *copied) {
    *copied = !ft_tensor_is_contiguous(t);
    if (*copied) {
        FT_TRY(ft_tensor_empty(v, t->ndim, t->shape, t->dtype, FT_CPU, false));
        if (fill) {
            ft_status s = ft_tensor_copy(v, t, false);
            if (s != FT_OK) {
                ft_tensor_release(v);
                return s;
            }
        }
    } else {
        *v = *t;
    }
    int64_t B = 1, R = t->shape[t->ndim - 2], C = t->shape[t->ndim - 1];
    for (int i = 0; i < t->ndim - 2; i++)
        B *= t->shape[i];
    v->ndim = 3;
    v->shape[0] = B, v->shape[1] = R, v->shape[2] = C;
    v->strides[0] = R * C, v->strides[1] = C, v->strides[2] = 1;
    return FT_OK;
}

/* A (B, R, C) batch as a key's entries: dims, then strides. */
static void put_batch(int64_t *k, const ft_tensor *t) {
    memcpy(k, t->shape, 3 * sizeof *k);
    memcpy(k + 3, t->strides, 3 * sizeof *k);
}

/* out[b0:b1] = (or += with sum) a[b0:b1] @ w[b0:b1] of dense batches, as one oneDNN matmul. */
static ft_status batch_part(const ft_tensor *out, const ft_tensor *a, const ft_tensor *w, int64_t b0, int64_t b1,
                            bool sum, bool single_thread) {
    const ft_tensor *t[3] = {a, w, out};
    ft_tensor part[3];
    for (int i = 0; i < 3; i++) {
        part[i] = *t[i];
        part[i].shape[0] = b1 - b0;
        part[i].offset += b0 * t[i]->strides[0] * (int64_t)ft_dtype_get(t[i]->dtype)->itemsize;
    }
    mm_key k;
    memset(&k, 0, sizeof k);
    k.nd = 3, k.sum = sum, k.single_thread = single_thread;
    put_batch(k.src, &part[0]);
    put_batch(k.wei, &part[1]);
    put_batch(k.dst, &part[2]);
    k.dt_src = a->dtype, k.dt_wei = w->dtype, k.dt_dst = out->dtype;
    const ft_dnnl_prim *prim = NULL;
    FT_TRY(ft_dnnl_get(&prim, &k, sizeof k, build, &k));
    mm_mds m;
    FT_TRY(make_mds(&m, &k));
    ft_dnnl_arg args[3] = {{DNNL_ARG_SRC, &m.src, ft_tensor_data(&part[0])},
                           {DNNL_ARG_WEIGHTS, &m.wei, ft_tensor_data(&part[1])},
                           {DNNL_ARG_DST, &m.dst, ft_tensor_data(&part[2])}};
    return ft_dnnl_run(prim, 3, args);
}

ft_status ft_matmul_batched(const ft_tensor *out, const ft_tensor *a, const ft_tensor *w, bool sum) {
    ft_device cpu = ft_op_device(a);
    if (cpu.type != FT_DEV_CPU)
        return ft_fail(FT_ERR_DEVICE, "matmul: a batched matmul runs on the CPU");
    FT_TRY(ft_check_float_on("matmul", "a", a, cpu, "a", true));
    FT_TRY(ft_check_float_on("matmul", "w", w, cpu, "a", true));
    FT_TRY(ft_check_float_on("matmul", "out", out, cpu, "a", true));
    FT_TRY(ft_check_output("matmul", "out", out));
    int nd = out->ndim;
    bool ok = nd >= 2 && a->ndim == nd && w->ndim == nd && a->dtype == w->dtype &&
              a->shape[nd - 1] == w->shape[nd - 2] && out->shape[nd - 2] == a->shape[nd - 2] &&
              out->shape[nd - 1] == w->shape[nd - 1];
    for (int i = 0; ok && i < nd - 2; i++)
        ok = a->shape[i] == out->shape[i] && w->shape[i] == out->shape[i];
    if (!ok)
        return ft_fail(FT_ERR_SHAPE, "matmul: takes (..., M, K) and (..., K, P) of one dtype to (..., M, P)");
    if (ft_tensor_numel(out) == 0)
        return FT_OK;
    ft_tensor d[3];
    bool copied[3] = {false, false, false};
    ft_status s = dense_batch(&d[0], a, true, &copied[0]);
    if (s == FT_OK)
        s = dense_batch(&d[1], w, true, &copied[1]);
    if (s == FT_OK)
        s = dense_batch(&d[2], out, sum, &copied[2]);
    if (s == FT_OK && !ft_deterministic()) {
        s = batch_part(&d[2], &d[0], &d[1], 0, d[2].shape[0], sum, false);
    } else if (s == FT_OK) { /* fixed parts of the batch, each on one thread: the same for any thread count */
        int64_t B = d[2].shape[0], parts = B < DET_CHUNKS ? B : DET_CHUNKS;
        ft_error err[DET_CHUNKS];
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < parts; c++)
            ft_error_keep(&err[c], batch_part(&d[2], &d[0], &d[1], B * c / parts, B * (c + 1) / parts, sum, true));
        s = ft_error_first(err, parts);
    }
    if (s == FT_OK && copied[2]) { /* back into out's own layout */
        ft_tensor v = d[2];
        v.ndim = out->ndim;
        memcpy(v.shape, out->shape, sizeof v.shape);
        ft_contiguous_strides(v.strides, v.ndim, v.shape);
        s = ft_tensor_copy(out, &v, false);
    }
    for (int i = 0; i < 3; i++)
        if (copied[i])
            ft_tensor_release(&d[i]);
    return s;
}

/* Every tensor on the device of the input x, float32 or 16-bit. */
static ft_status check(const char *arg, const ft_tensor *t, const ft_tensor *x, int64_t d0, int64_t d1) {
    FT_TRY(ft_check_float_on("linear", arg, t, ft_op_device(x), "input", true));
    return ft_check_shape("linear", arg, t, 2, (int64_t[]){d0, d1});
}

/* A float32 vector of n elements on x's device. */
static ft_status check1(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *x, int64_t n) {
    FT_TRY(ft_check_float_on(op, arg, t, ft_op_device(x), "input", false));
    return ft_check_shape(op, arg, t, 1, &n);
}

static ft_status check_inputs(const ft_tensor *x, const ft_tensor *w) {
    FT_TRY(ft_check_ndim("linear", "input", x, 2, "(N, I)"));
    FT_TRY(ft_check_ndim("linear", "weight", w, 2, "(O, I)"));
    if (x->shape[1] != w->shape[1])
        return ft_fail(FT_ERR_SHAPE, "linear: input has %lld features but weight expects %lld", (long long)x->shape[1],
                       (long long)w->shape[1]);
    FT_TRY(ft_check_float_on("linear", "input", x, ft_op_device(x), "input", true));
    FT_TRY(ft_check_float_on("linear", "weight", w, ft_op_device(x), "input", true));
    FT_TRY(ft_check_dtype_as("linear", "weight", w, "input", x));
    return FT_OK;
}

ft_status ft_linear_forward(const ft_tensor *out, const ft_tensor *x, const ft_tensor *w, const ft_tensor *b,
                            ft_act act) {
    FT_TRY(check_inputs(x, w));
    int64_t N = x->shape[0], O = w->shape[0];
    FT_TRY(check("out", out, x, N, O));
    FT_TRY(ft_check_output("linear", "out", out));
    if (b) {
        FT_TRY(check1("linear", "bias", b, x, O));
        if (b->strides[0] != 1 && O > 1)
            return ft_fail(FT_ERR_SHAPE, "linear: bias must be contiguous");
    }
    if (N == 0 || O == 0)
        return FT_OK;
    if (x->shape[1] == 0) /* an empty sum: out = act(b) */
        return ft_fail(FT_ERR_SHAPE, "linear: zero input features are not supported");
    if (ft_op_device(x).type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH("linear", linear_forward, out, x, w, b, act);
    ft_matrix src = as_is(x), wei = transposed(w), dst = as_is(out);
    bool after = !ft_dnnl_fuses(act);
    FT_TRY(matmul_rows(&src, &wei, &dst, b ? (const float *)ft_tensor_data(b) : NULL,
                       after ? (ft_act){FT_ACT_NONE, 0} : act, false));
    return after ? ft_activation_forward(out, out, act) : FT_OK;
}

/* dw (O, I) = (or += with accumulate) dout^T (O, N) @ x (N, I); deterministic
 * mode sums fixed slices of N in order. */
static ft_status weight_grad(const ft_tensor *dw, const ft_tensor *dout, const ft_tensor *x, bool accumulate) {
    ft_matrix src = transposed(dout), wei = as_is(x), dst = as_is(dw);
    if (!ft_deterministic())
        return ft_matmul(&src, &wei, &dst, NULL, (ft_act){FT_ACT_NONE, 0}, accumulate, false);
    int64_t N = x->shape[0], chunks = N < DET_CHUNKS ? N : DET_CHUNKS, wn = ft_tensor_numel(dw);
    ft_tensor parts;
    int64_t pshape[3] = {chunks, dw->shape[0], dw->shape[1]};
    FT_TRY(ft_tensor_empty(&parts, 3, pshape, FT_FLOAT32, FT_CPU, false));
    ft_error err[DET_CHUNKS];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t n0 = N * c / chunks, n1 = N * (c + 1) / chunks;
        ft_matrix part_src = cols(&src, n0, n1), part_wei = rows(&wei, n0, n1);
        ft_matrix part_dst = {{dw->shape[0], dw->shape[1]}, {dw->shape[1], 1}, FT_FLOAT32,
                              (char *)ft_tensor_data(&parts) + c * wn * 4};
        ft_error_keep(&err[c], ft_matmul(&part_src, &part_wei, &part_dst, NULL, (ft_act){FT_ACT_NONE, 0}, false, true));
    }
    ft_status s = ft_error_first(err, chunks);
    if (s == FT_OK) {
        const float *p = (const float *)ft_tensor_data(&parts);
        char *out = ft_tensor_data(dw);
        bool bf16 = dw->dtype == FT_BFLOAT16; /* a matmul's gradient of an activation */
        int64_t I = dw->shape[1];
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < wn; i++) {
            int64_t at = (i / I) * dw->strides[0] + (i % I) * dw->strides[1];
            float v = accumulate ? ft_float_at(out, bf16, at) : 0.0f;
            for (int64_t c = 0; c < chunks; c++)
                v += p[c * wn + i];
            if (bf16)
                ((uint16_t *)out)[at] = ft_f32_to_bf16(v);
            else
                ((float *)out)[at] = v;
        }
    }
    ft_tensor_release(&parts);
    return s;
}

ft_status ft_linear_backward(const ft_tensor *dx, const ft_tensor *dw, const ft_tensor *db, const ft_tensor *dout,
                             const ft_tensor *x, const ft_tensor *w, ft_grad_acc acc) {
    FT_TRY(check_inputs(x, w));
    int64_t N = x->shape[0], I = x->shape[1], O = w->shape[0];
    FT_TRY(check("grad_output", dout, x, N, O));
    if (dx) {
        FT_TRY(check("grad_input", dx, x, N, I));
        FT_TRY(ft_check_output("linear_backward", "grad_input", dx));
    }
    if (dw) {
        FT_TRY(check("grad_weight", dw, x, O, I));
        FT_TRY(ft_check_output("linear_backward", "grad_weight", dw));
    }
    if (db) {
        FT_TRY(check1("linear_backward", "grad_bias", db, x, O));
        FT_TRY(ft_check_output("linear_backward", "grad_bias", db));
    }
    if (dx && N && I && O == 0 && !acc.inp) /* empty sums */
        FT_TRY(ft_tensor_zero(dx));
    if (dw && O && I && N == 0 && !acc.weight)
        FT_TRY(ft_tensor_zero(dw));
    bool dx_work = dx && N && I && O, dw_work = dw && O && I && N;
    if (ft_op_device(x).type == FT_DEV_CUDA) { /* the backend writes: accumulation is staged */
        ft_grad_out gx = {0}, gw = {0}, gb = {0}; /* each ended, begun or not */
        const ft_tensor *dx_to, *dw_to, *db_to;
        FT_TRY(ft_grad_out_begin(&gx, dx_work ? dx : NULL, acc.inp, &dx_to));
        ft_status s = ft_grad_out_begin(&gw, dw_work ? dw : NULL, acc.weight, &dw_to);
        if (s == FT_OK)
            s = ft_grad_out_begin(&gb, dw_work ? db : NULL, acc.bias, &db_to);
        if (s == FT_OK && dx_to)
            s = FT_CUDA_CALL("linear_backward", linear_backward, dx_to, NULL, NULL, dout, x, w);
        if (s == FT_OK && dw_to) /* CUDA computes db with dw's product */
            s = FT_CUDA_CALL("linear_backward", linear_backward, NULL, dw_to, db_to, dout, x, w);
        s = ft_grad_out_end(&gb, ft_grad_out_end(&gw, ft_grad_out_end(&gx, s)));
        FT_TRY(s);
        return db && !dw_work ? ft_bias_grad(db, dout, acc.bias) : FT_OK;
    }
    if (dx_work) {
        ft_matrix src = as_is(dout), wei = as_is(w), dst = as_is(dx);
        FT_TRY(matmul_rows(&src, &wei, &dst, NULL, (ft_act){FT_ACT_NONE, 0}, acc.inp));
    }
    if (dw_work)
        FT_TRY(weight_grad(dw, dout, x, acc.weight));
    return db ? ft_bias_grad(db, dout, acc.bias) : FT_OK;
}
