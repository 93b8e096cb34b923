#include "ops/conv2d.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/settings.h"
#include "ops/activation.h"
#include "ops/autotune.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/gradient.h"
#include "ops/linear.h"
#include "ops/onednn.h"
#include "ops/reduce.h"

/* Batch chunks of the deterministic backward-weights path: a constant, so
 * the order of the final sum does not depend on the thread count. */
#define DET_CHUNKS 8
/* The im2col rows of the matmul route a thread converts at a time: they
 * stay in its L2 cache. */
#define GEMM_BLOCK_BYTES (256 * 1024)

ft_status ft_conv2d_out_size(int64_t *P, int64_t *Q, int64_t H, int64_t W, int64_t R, int64_t S,
                             const ft_conv2d_params *p) {
    for (int i = 0; i < 2; i++)
        if (p->stride[i] < 1 || p->dilation[i] < 1 || p->padding[i] < 0)
            return ft_fail(FT_ERR_VALUE, "conv2d: stride and dilation must be >= 1 and padding >= 0");
    int64_t eh = p->dilation[0] * (R - 1) + 1, ew = p->dilation[1] * (S - 1) + 1;
    int64_t ph = H + 2 * p->padding[0], pw = W + 2 * p->padding[1];
    if (ph < eh || pw < ew)
        return ft_fail(FT_ERR_SHAPE,
                       "conv2d: the padded input (%lld x %lld) is smaller than the dilated kernel (%lld x %lld)",
                       (long long)ph, (long long)pw, (long long)eh, (long long)ew);
    *P = (ph - eh) / p->stride[0] + 1;
    *Q = (pw - ew) / p->stride[1] + 1;
    return FT_OK;
}

/* Everything that identifies a primitive; zeroed before filling so that
 * padding bytes compare equal. */
typedef struct {
    char kind; /* 'F' forward, 'D' backward data, 'W' backward weights */
    bool bias, sum, single_thread;
    bool blocked; /* activations in oneDNN's own (blocked) layout, reordered from and to the caller's */
    bool automatic; /* oneDNN picks the algorithm (e.g. Winograd) instead of the direct one */
    int act, dt_src, dt_wei, dt_dst;
    float alpha;
    ft_conv2d_params p;
    int64_t src[8], wei[8], dst[8]; /* dims then strides */
} conv_key;

static void put_dims(int64_t *k, const ft_tensor *t) {
    memcpy(k, t->shape, 4 * sizeof *k);
    memcpy(k + 4, t->strides, 4 * sizeof *k);
}

/* The weight tensor as oneDNN sees it: (G, K/G, C/G, R, S) when grouped;
 * with `any`, in the layout the primitive prefers (plain weights make oneDNN
 * fall back to its reference convolution, hundreds of times slower). */
static ft_status weight_md(dnnl_memory_desc_t *md, ft_dtype dt, const int64_t *k, int64_t groups, bool any) {
    int64_t dims[5] = {groups, k[0] / groups, k[1], k[2], k[3]};
    int64_t strides[5] = {k[4] * (k[0] / groups), k[4], k[5], k[6], k[7]};
    int nd = groups == 1 ? 4 : 5;
    const int64_t *d = groups == 1 ? k : dims, *st = groups == 1 ? k + 4 : strides;
    return any ? ft_dnnl_md_any(md, dt, nd, d) : ft_dnnl_md_strided(md, dt, nd, d, st);
}

typedef struct {
    dnnl_memory_desc_t src, wei, bias, dst;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
} conv_mds;

/* The descriptors of the caller's tensors, or (for_primitive) those the
 * primitive is created with: weights always, and activations when
 * k->blocked, in the layout oneDNN prefers. */
static ft_status make_mds(conv_mds *m, const conv_key *k, bool for_primitive) {
    bool any = for_primitive && k->blocked;
    FT_TRY(any ? ft_dnnl_md_any(&m->src, (ft_dtype)k->dt_src, 4, k->src)
               : ft_dnnl_md_strided(&m->src, (ft_dtype)k->dt_src, 4, k->src, k->src + 4));
    FT_TRY(weight_md(&m->wei, (ft_dtype)k->dt_wei, k->wei, k->p.groups, for_primitive));
    FT_TRY(any ? ft_dnnl_md_any(&m->dst, (ft_dtype)k->dt_dst, 4, k->dst)
               : ft_dnnl_md_strided(&m->dst, (ft_dtype)k->dt_dst, 4, k->dst, k->dst + 4));
    int64_t K = k->wei[0], one = 1;
    FT_TRY(ft_dnnl_md_strided(&m->bias, FT_FLOAT32, 1, &K, &one));
    for (int i = 0; i < 2; i++) {
        m->strides[i] = k->p.stride[i];
        m->dilates[i] = k->p.dilation[i] - 1;
        m->pad_l[i] = k->p.padding[i];
        /* oneDNN wants the right padding that produces the output size exactly. */
        m->pad_r[i] = (k->dst[2 + i] - 1) * k->p.stride[i] + (k->wei[2 + i] - 1) * k->p.dilation[i] + 1 -
                      k->src[2 + i] - k->p.padding[i];
    }
    return FT_OK;
}

static dnnl_alg_kind_t algorithm(const conv_key *k) {
    return k->automatic ? dnnl_convolution_auto : dnnl_convolution_direct;
}

static ft_status forward_desc(dnnl_convolution_desc_t *cd, const conv_mds *m, const conv_key *k, bool bias) {
    return ft_dnnl_check(dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, algorithm(k),
                                                                    &m->src, &m->wei, bias ? &m->bias : NULL, &m->dst,
                                                                    m->strides, m->dilates, m->pad_l, m->pad_r),
                         "conv2d forward");
}

/* oneDNN 2.6's jit_1x1 backward-weights kernel of a strided 1x1
 * convolution (ResNet's downsample shortcut) writes outside its buffers
 * when the channels are not a multiple of 16 (seen at 8 and 12 channels,
 * odd batch sizes, 2 threads: heap corruption, then an abort), and its
 * bfloat16 backward-data kernel of a channels-last 1x1 convolution gives
 * wrong values for some planes when they are not (5 output channels over
 * 5 x 6 or 1 x 60 pixels: errors of the gradient's size): such a primitive
 * takes oneDNN's next implementation. */
static bool shuns_1x1(const conv_key *k) {
    bool one = k->wei[2] == 1 && k->wei[3] == 1, odd = k->src[1] % 16 != 0 || k->dst[1] % 16 != 0;
    return one && odd &&
           ((k->kind == 'W' && (k->p.stride[0] > 1 || k->p.stride[1] > 1)) ||
            (k->kind == 'D' && k->dt_dst == FT_BFLOAT16));
}

static ft_status create_without_1x1(dnnl_primitive_desc_t *pd, const_dnnl_op_desc_t desc,
                                     const_dnnl_primitive_attr_t attr, dnnl_engine_t engine,
                                     const_dnnl_primitive_desc_t hint) {
    dnnl_primitive_desc_iterator_t it;
    FT_TRY(ft_dnnl_check(dnnl_primitive_desc_iterator_create(&it, desc, attr, engine, hint), "conv2d primitive"));
    ft_status s = FT_OK;
    for (*pd = NULL; s == FT_OK && !*pd;) {
        dnnl_primitive_desc_t candidate = dnnl_primitive_desc_iterator_fetch(it);
        const char *impl = NULL;
        s = ft_dnnl_check(dnnl_primitive_desc_query(candidate, dnnl_query_impl_info_str, 0, &impl),
                          "conv2d primitive");
        if (s == FT_OK && !strstr(impl, "1x1")) /* jit_1x1, jit_bf16_1x1 */
            *pd = candidate;
        else
            dnnl_primitive_desc_destroy(candidate);
        if (s == FT_OK && !*pd && dnnl_primitive_desc_iterator_next(it) != dnnl_success)
            s = ft_fail(FT_ERR_VALUE, "conv2d: no kernel but jit_1x1 for this 1x1 convolution's backward");
    }
    dnnl_primitive_desc_iterator_destroy(it);
    return s;
}

static ft_status build(dnnl_primitive_desc_t *pd, const void *arg) {
    const conv_key *k = arg;
    conv_mds m, ahead;
    FT_TRY(make_mds(&m, k, true));
    ahead = m; /* the forward: a bfloat16 one's weights are bfloat16 when their gradient is float32 */
    FT_TRY(weight_md(&ahead.wei, (ft_dtype)k->dt_src, k->wei, k->p.groups, true));
    dnnl_engine_t engine;
    FT_TRY(ft_dnnl_engine(&engine));
    dnnl_primitive_attr_t attr;
    FT_TRY(ft_dnnl_attr(&attr));
    dnnl_convolution_desc_t fwd, cd;
    dnnl_primitive_desc_t hint = NULL;
    ft_status s = forward_desc(&fwd, &ahead, k, k->kind == 'F' && k->bias);
    if (s == FT_OK && k->kind == 'F' && (k->act || k->sum)) {
        dnnl_post_ops_t po;
        s = ft_dnnl_check(dnnl_post_ops_create(&po), "conv2d post-ops");
        if (s == FT_OK) {
            if (k->sum)
                s = ft_dnnl_check(dnnl_post_ops_append_sum(po, 1.0f), "conv2d sum post-op");
            if (s == FT_OK && k->act)
                s = ft_dnnl_append_act(po, (ft_act){(ft_act_kind)k->act, k->alpha});
            if (s == FT_OK)
                s = ft_dnnl_check(dnnl_primitive_attr_set_post_ops(attr, po), "conv2d post-ops");
            dnnl_post_ops_destroy(po);
        }
    }
    /* Backward primitives are created against a forward one (the hint). */
    if (s == FT_OK && k->kind != 'F')
        s = ft_dnnl_check(dnnl_primitive_desc_create(&hint, &fwd, NULL, engine, NULL), "conv2d forward hint");
    if (s == FT_OK && k->kind == 'D')
        s = ft_dnnl_check(dnnl_dilated_convolution_backward_data_desc_init(&cd, algorithm(k), &m.src, &m.wei,
                                                                           &m.dst, m.strides, m.dilates, m.pad_l,
                                                                           m.pad_r),
                          "conv2d backward data");
    if (s == FT_OK && k->kind == 'W')
        s = ft_dnnl_check(dnnl_dilated_convolution_backward_weights_desc_init(&cd, algorithm(k), &m.src,
                                                                              &m.wei, NULL, &m.dst, m.strides,
                                                                              m.dilates, m.pad_l, m.pad_r),
                          "conv2d backward weights");
    if (s == FT_OK) {
        /* The deterministic path runs each chunk on one thread: plan it for one. */
        int threads = omp_get_max_threads();
        if (k->single_thread)
            omp_set_num_threads(1);
        s = shuns_1x1(k) ? create_without_1x1(pd, &cd, attr, engine, hint)
                         : ft_dnnl_check(dnnl_primitive_desc_create(pd, k->kind == 'F' ? &fwd : &cd, attr, engine,
                                                                    hint),
                                         "conv2d primitive");
        if (k->single_thread)
            omp_set_num_threads(threads);
    }
    if (hint)
        dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* Size-1 dimensions make a tensor dense in NCHW and NHWC at once, with
 * arbitrary strides on those dimensions; oneDNN recognises (and has fast
 * kernels for) one layout at a time, so such a tensor is described in the
 * layout of the other operand. k holds dims then strides. */
static void match_layout(int64_t *k, bool channels_last) {
    int64_t C = k[1], H = k[2], W = k[3];
    int64_t nchw[4] = {C * H * W, H * W, W, 1}, nhwc[4] = {H * W * C, 1, W * C, C};
    const int64_t *want = channels_last ? nhwc : nchw;
    for (int i = 0; i < 4; i++)
        if (k[i] > 1 && k[4 + i] != want[i])
            return;
    memcpy(k + 4, want, sizeof nchw);
}

static bool is_channels_last(const int64_t *k) { return k[1] > 1 && k[5] == 1; }

/* Whether two activations of one convolution lie in different layouts, one
 * channels last and the other not (an image viewed from a flat vector, in
 * order, in a channels-last program): oneDNN then runs its reference
 * convolution, hundreds of times slower than a reorder. One of a single
 * channel or pixel is dense in both. */
static bool mixed_layouts(const ft_tensor *a, const ft_tensor *b) {
    int64_t ka[8], kb[8];
    put_dims(ka, a);
    put_dims(kb, b);
    return ka[1] > 1 && kb[1] > 1 && ka[2] * ka[3] > 1 && kb[2] * kb[3] > 1 &&
           is_channels_last(ka) != is_channels_last(kb);
}

/* *t, an activation the convolution reads, copied into tmp in like's layout
 * where theirs differ (mixed_layouts); *t then points at the copy, which the
 * caller releases (tmp->storage set). */
static ft_status relayout(const ft_tensor **t, const ft_tensor *like, ft_tensor *tmp) {
    memset(tmp, 0, sizeof *tmp);
    if (!mixed_layouts(*t, like))
        return FT_OK;
    FT_TRY(ft_tensor_empty_like(tmp, like, 4, (*t)->shape, (*t)->dtype, ft_op_device(*t)));
    ft_status s = ft_tensor_copy(tmp, *t, false);
    if (s != FT_OK) {
        ft_tensor_release(tmp);
        return s;
    }
    *t = tmp;
    return FT_OK;
}

static ft_status release_copy(ft_tensor *tmp, ft_status s) {
    if (tmp->storage)
        ft_tensor_release(tmp);
    return s;
}

static conv_key key_of(char kind, const ft_tensor *src, const ft_tensor *wei, const ft_tensor *dst,
                       const ft_conv2d_params *p) {
    conv_key k;
    memset(&k, 0, sizeof k);
    k.kind = kind;
    k.p = *p;
    k.dt_src = src->dtype;
    k.dt_wei = wei->dtype;
    k.dt_dst = dst->dtype;
    put_dims(k.src, src);
    put_dims(k.wei, wei);
    put_dims(k.dst, dst);
    bool cl = is_channels_last(k.dst) || (k.dst[1] == 1 && is_channels_last(k.src));
    match_layout(k.src, cl);
    match_layout(k.dst, cl);
    return k;
}

/* The tensors of one execution: src/dst are the input/output activations
 * (their gradients for 'D'), wei the weights (their gradient for 'W'). */
typedef struct {
    void *src, *wei, *dst, *bias;
} conv_data;

static ft_status run(const conv_key *k, const conv_data *d) {
    const ft_dnnl_prim *prim = NULL;
    FT_TRY(ft_dnnl_get(&prim, k, sizeof *k, build, k));
    conv_mds m;
    FT_TRY(make_mds(&m, k, false));
    ft_dnnl_arg args[4] = {
        {k->kind == 'D' ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC, &m.src, d->src},
        {k->kind == 'W' ? DNNL_ARG_DIFF_WEIGHTS : DNNL_ARG_WEIGHTS, &m.wei, d->wei},
        {k->kind == 'F' ? DNNL_ARG_DST : DNNL_ARG_DIFF_DST, &m.dst, d->dst},
        {DNNL_ARG_BIAS, &m.bias, d->bias},
    };
    return ft_dnnl_run(prim, d->bias ? 4 : 3, args);
}

typedef struct {
    conv_key k;
    const conv_data *d;
} tune_ctx;

static ft_status run_candidate(int c, void *arg) {
    tune_ctx *t = arg;
    t->k.blocked = c & 1;
    t->k.automatic = c >> 1;
    return run(&t->k, t->d);
}

/* With ft.backends.benchmark on, the first call of each shape times four
 * candidates, the caller's layout or oneDNN's blocked one (reorders
 * included) with the direct algorithm or the one oneDNN picks, and every
 * later call uses the fastest. Timing decides, so two runs may pick
 * differently and round differently: deterministic mode does not tune. An
 * op that adds into its output (the sum fusion) cannot be run repeatedly,
 * so it keeps the caller's layout. */
static ft_status execute(conv_key *k, const conv_data *d) {
    if (ft_benchmark() && !ft_deterministic() && !k->sum && !k->single_thread) {
        tune_ctx t = {*k, d};
        int choice;
        FT_TRY(ft_tune_pick(&choice, k, sizeof *k, 4, run_candidate, &t));
        k->blocked = choice & 1;
        k->automatic = choice >> 1;
    }
    return run(k, d);
}

static ft_status check_common(const ft_tensor *inp, const ft_tensor *w, int64_t *want_out, const ft_conv2d_params *p) {
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on("conv2d", "input", inp, dev, "input", true));
    FT_TRY(ft_check_float_on("conv2d", "weight", w, dev, "input", true));
    if (inp->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "conv2d: input must be 4-d (N, C, H, W), got %d dimensions", inp->ndim);
    if (w->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "conv2d: weight must be 4-d (K, C/groups, R, S), got %d dimensions", w->ndim);
    int64_t G = p->groups, C = inp->shape[1], K = w->shape[0];
    if (C == 0) /* oneDNN refuses it, saying only that it does */
        return ft_fail(FT_ERR_VALUE, "conv2d: zero input channels are not supported");
    if (G < 1 || C % G || K % G)
        return ft_fail(FT_ERR_VALUE, "conv2d: groups=%lld must divide input channels %lld and output channels %lld",
                       (long long)G, (long long)C, (long long)K);
    if (w->shape[1] != C / G)
        return ft_fail(FT_ERR_SHAPE, "conv2d: weight has %lld input channels per group, the input gives %lld",
                       (long long)w->shape[1], (long long)(C / G));
    if (inp->dtype != w->dtype)
        return ft_fail(FT_ERR_DTYPE, "conv2d: input is %s but weight is %s", ft_dtype_get(inp->dtype)->name,
                       ft_dtype_get(w->dtype)->name);
    int64_t P, Q;
    FT_TRY(ft_conv2d_out_size(&P, &Q, inp->shape[2], inp->shape[3], w->shape[2], w->shape[3], p));
    int64_t shape[4] = {inp->shape[0], K, P, Q};
    memcpy(want_out, shape, sizeof shape);
    return FT_OK;
}

ft_status ft_conv2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w, const ft_tensor *b,
                            const ft_conv2d_params *p, const ft_conv2d_fusion *fusion) {
    int64_t want[4];
    FT_TRY(check_common(inp, w, want, p));
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on("conv2d", "out", out, dev, "input", true));
    FT_TRY(ft_check_shape("conv2d", "out", out, 4, want));
    FT_TRY(ft_check_output("conv2d", "out", out));
    FT_TRY(ft_check_alias("conv2d", "out", out, "input", inp));
    if (b) {
        FT_TRY(ft_check_on("conv2d", "bias", b, dev, "input"));
        FT_TRY(ft_check_shape("conv2d", "bias", b, 1, &want[1]));
        if (b->dtype != FT_FLOAT32 || (b->strides[0] != 1 && want[1] > 1))
            return ft_fail(FT_ERR_DTYPE, "conv2d: bias must be a contiguous float32 tensor");
    }
    if (ft_tensor_numel(out) == 0)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH("conv2d", conv2d_forward, out, inp, w, b, p, fusion);
    ft_tensor copy;
    FT_TRY(relayout(&inp, out, &copy));
    conv_key k = key_of('F', inp, w, out, p);
    k.bias = b != NULL;
    ft_act act = fusion ? fusion->act : (ft_act){FT_ACT_NONE, 0};
    bool after = !ft_dnnl_fuses(act);
    if (fusion) {
        k.sum = fusion->sum;
        k.act = after ? FT_ACT_NONE : act.kind;
        k.alpha = after ? 0.0f : act.alpha;
    }
    conv_data d = {ft_tensor_data(inp), ft_tensor_data(w), ft_tensor_data(out), b ? ft_tensor_data(b) : NULL};
    FT_TRY(release_copy(&copy, execute(&k, &d)));
    return after ? ft_activation_forward(out, out, act) : FT_OK;
}

/* dw (K, C/G, R, S) of the batch inp/dout. */
static ft_status backward_weights(const ft_tensor *dw, const ft_tensor *dout, const ft_tensor *inp,
                                  const ft_conv2d_params *p, bool single_thread) {
    conv_key k = key_of('W', inp, dw, dout, p);
    k.single_thread = single_thread;
    conv_data d = {ft_tensor_data(inp), ft_tensor_data(dw), ft_tensor_data(dout), NULL};
    return execute(&k, &d);
}

/* The batch split into DET_CHUNKS slices, each slice's dw computed by one
 * thread, and the slices summed in order (onto dw's own values when
 * accumulating): identical for any thread count. */
static ft_status backward_weights_deterministic(const ft_tensor *dw, const ft_tensor *dout, const ft_tensor *inp,
                                                const ft_conv2d_params *p, bool accumulate) {
    int64_t N = inp->shape[0], chunks = N < DET_CHUNKS ? N : DET_CHUNKS;
    int64_t wn = ft_tensor_numel(dw);
    ft_tensor parts;
    int64_t pshape[5] = {chunks + 1, dw->shape[0], dw->shape[1], dw->shape[2], dw->shape[3]};
    FT_TRY(ft_tensor_empty(&parts, 5, pshape, FT_FLOAT32, FT_CPU, false));
    ft_error err[DET_CHUNKS];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t n0 = N * c / chunks, n1 = N * (c + 1) / chunks;
        ft_tensor in = *inp, out = *dout, part = *dw;
        in.shape[0] = out.shape[0] = n1 - n0;
        in.offset += n0 * inp->strides[0] * (int64_t)ft_dtype_get(inp->dtype)->itemsize;
        out.offset += n0 * dout->strides[0] * (int64_t)ft_dtype_get(dout->dtype)->itemsize;
        part.storage = parts.storage;
        part.offset = c * wn * 4;
        ft_contiguous_strides(part.strides, 4, dw->shape);
        ft_error_keep(&err[c], backward_weights(&part, &out, &in, p, true));
    }
    ft_status s = ft_error_first(err, chunks);
    /* the last slot of parts holds the sum, in dw's shape and dense order */
    ft_tensor sum = parts;
    sum.offset = chunks * wn * 4;
    sum.ndim = 4;
    memcpy(sum.shape, dw->shape, sizeof sum.shape);
    ft_contiguous_strides(sum.strides, 4, sum.shape);
    if (s == FT_OK && accumulate)
        s = ft_tensor_copy(&sum, dw, false);
    if (s == FT_OK) {
        float *part = (float *)ft_tensor_data(&parts), *acc = part + chunks * wn;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < wn; i++) {
            float v = accumulate ? acc[i] : 0.0f;
            for (int64_t c = 0; c < chunks; c++)
                v += part[c * wn + i];
            acc[i] = v;
        }
        s = ft_tensor_copy(dw, &sum, false);
    }
    ft_tensor_release(&parts);
    return s;
}

/* Whether the weight gradient goes by matmuls (backward_weights_gemm):
 * measured faster than oneDNN's own backward-weights kernel for bfloat16
 * channels-last convolutions of small output planes (at most 64 positions)
 * and at least 32 input channels, where the im2col rows are short enough
 * (at most 4 KB) that a block holds 64 of them; elsewhere oneDNN's is the
 * faster (docs/architecture.md). */
static bool weights_by_gemm(const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                            const ft_conv2d_params *p) {
    int64_t K = dout->shape[1], P = dout->shape[2], Q = dout->shape[3];
    int64_t row = w->shape[1] * w->shape[2] * w->shape[3] * 2;
    bool dense_cl = dout->strides[1] == 1 && dout->strides[3] == K && dout->strides[2] == Q * K &&
                    dout->strides[0] == P * Q * K;
    return inp->dtype == FT_BFLOAT16 && p->groups == 1 && inp->strides[1] == 1 && dense_cl && P * Q <= 64 &&
           inp->shape[1] >= 32 && row <= GEMM_BLOCK_BYTES / 64;
}

/* Rows [m0, m1) of the im2col matrix of an input x whose channels are
 * adjacent, for a kernel of dims = (R, S) and an output of (P, Q): row
 * m = (n, p, q), an output position, holds for each kernel tap (r, s) the
 * C input values it reads (zeros in the padding). */
static void im2col_rows(char *dst, const ft_tensor *x, const int64_t *dims, const ft_conv2d_params *p, int64_t m0,
                        int64_t m1) {
    int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3], R = dims[0], S = dims[1], P = dims[2], Q = dims[3];
    size_t item = (size_t)ft_dtype_get(x->dtype)->itemsize, run = (size_t)C * item;
    const char *src = ft_tensor_data(x);
    for (int64_t m = m0; m < m1; m++) {
        int64_t n = m / (P * Q), oh = m / Q % P, ow = m % Q;
        for (int64_t r = 0; r < R; r++) {
            int64_t h = oh * p->stride[0] - p->padding[0] + r * p->dilation[0];
            for (int64_t s = 0; s < S; s++, dst += run) {
                int64_t w = ow * p->stride[1] - p->padding[1] + s * p->dilation[1];
                if (h >= 0 && h < H && w >= 0 && w < W)
                    memcpy(dst, src + (n * x->strides[0] + h * x->strides[2] + w * x->strides[3]) * (int64_t)item, run);
                else
                    memset(dst, 0, run);
            }
        }
    }
}

/* dw by matmuls: dw (K, R S C) = dout^T (K, M) @ im2col(inp) (M, R S C),
 * over the M = N P Q output positions split into DET_CHUNKS fixed parts,
 * each one thread's, a block of im2col rows at a time; the parts are summed
 * in order, so the result does not depend on the thread count. */
static ft_status backward_weights_gemm(const ft_tensor *dw, const ft_tensor *dout, const ft_tensor *inp,
                                       const ft_conv2d_params *p, bool accumulate) {
    int64_t K = dw->shape[0], C = inp->shape[1], R = dw->shape[2], S = dw->shape[3];
    int64_t dims[4] = {R, S, dout->shape[2], dout->shape[3]};
    int64_t M = dout->shape[0] * dims[2] * dims[3], cols = R * S * C, wn = K * cols;
    int64_t item = ft_dtype_get(inp->dtype)->itemsize, block = GEMM_BLOCK_BYTES / (cols * item);
    int64_t parts = M < DET_CHUNKS ? M : DET_CHUNKS;
    /* the parts, then each thread's block of im2col rows: from the caching
     * allocator, as fresh pages would cost more than the matmuls here */
    int64_t per = (block * cols * item + 63) / 64 * 16, floats = parts * wn + omp_get_max_threads() * per;
    ft_tensor scratch;
    FT_TRY(ft_tensor_empty(&scratch, 1, &floats, FT_FLOAT32, FT_CPU, false));
    float *part = (float *)ft_tensor_data(&scratch);
    char *bufs = (char *)(part + parts * wn);
    ft_matrix dy = {{K, M}, {1, K}, dout->dtype, ft_tensor_data(dout)}; /* dout^T */
    ft_error err[DET_CHUNKS];
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < parts; c++) {
        char *buf = bufs + omp_get_thread_num() * per * 4;
        ft_matrix to = {{K, cols}, {cols, 1}, FT_FLOAT32, (char *)(part + c * wn)};
        ft_status s = FT_OK;
        for (int64_t m0 = M * c / parts, end = M * (c + 1) / parts, a = m0; s == FT_OK && a < end; a += block) {
            int64_t b = a + block < end ? a + block : end;
            im2col_rows(buf, inp, dims, p, a, b);
            ft_matrix src = {{K, b - a}, {1, K}, dy.dtype, dy.data + a * K * item};
            ft_matrix wei = {{b - a, cols}, {cols, 1}, inp->dtype, buf};
            s = ft_matmul(&src, &wei, &to, NULL, (ft_act){FT_ACT_NONE, 0}, a > m0, true);
        }
        ft_error_keep(&err[c], s);
    }
    ft_status s = ft_error_first(err, parts);
    if (s == FT_OK) { /* (K, R, S, C) parts onto dw (K, C, R, S) */
        float *out = (float *)ft_tensor_data(dw);
        const int64_t *ds = dw->strides;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < K; k++)
            for (int64_t r = 0; r < R; r++)
                for (int64_t sj = 0; sj < S; sj++) {
                    const float *from = part + k * cols + (r * S + sj) * C;
                    float *o = out + k * ds[0] + r * ds[2] + sj * ds[3];
                    for (int64_t ci = 0; ci < C; ci++) {
                        float v = accumulate ? o[ci * ds[1]] : 0.0f;
                        for (int64_t j = 0; j < parts; j++)
                            v += from[j * wn + ci];
                        o[ci * ds[1]] = v;
                    }
                }
    }
    ft_tensor_release(&scratch);
    return s;
}

ft_status ft_conv2d_backward(const ft_tensor *dinp, const ft_tensor *dw, const ft_tensor *db,
                             const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                             const ft_conv2d_params *p, ft_grad_acc acc) {
    int64_t want[4];
    FT_TRY(check_common(inp, w, want, p));
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on("conv2d", "grad_output", dout, dev, "input", true));
    FT_TRY(ft_check_shape("conv2d", "grad_output", dout, 4, want));
    if (dinp) {
        FT_TRY(ft_check_float_on("conv2d", "grad_input", dinp, dev, "input", true));
        FT_TRY(ft_check_shape("conv2d", "grad_input", dinp, 4, inp->shape));
        FT_TRY(ft_check_output("conv2d_backward", "grad_input", dinp));
    }
    if (dw) {
        FT_TRY(ft_check_float_on("conv2d", "grad_weight", dw, dev, "input", true));
        FT_TRY(ft_check_shape("conv2d", "grad_weight", dw, 4, w->shape));
        FT_TRY(ft_check_output("conv2d_backward", "grad_weight", dw));
        if (dw->dtype != FT_FLOAT32)
            return ft_fail(FT_ERR_DTYPE, "conv2d: grad_weight must be float32 (fp32 accumulation)");
    }
    if (db) {
        FT_TRY(ft_check_on("conv2d", "grad_bias", db, dev, "input"));
        FT_TRY(ft_check_shape("conv2d", "grad_bias", db, 1, &want[1]));
        if (db->dtype != FT_FLOAT32)
            return ft_fail(FT_ERR_DTYPE, "conv2d: grad_bias must be float32");
        FT_TRY(ft_check_output("conv2d_backward", "grad_bias", db));
    }
    bool empty = ft_tensor_numel(dout) == 0;
    if (empty) { /* an empty batch contributes nothing */
        if (!acc.inp && dinp)
            FT_TRY(ft_tensor_zero(dinp));
        if (!acc.weight && dw)
            FT_TRY(ft_tensor_zero(dw));
        return db && !acc.bias ? ft_tensor_zero(db) : FT_OK;
    }
    bool cuda = dev.type == FT_DEV_CUDA;
    ft_grad_out gx, gw;
    const ft_tensor *dx_to, *dw_to;
    FT_TRY(ft_grad_out_begin(&gx, dinp && ft_tensor_numel(dinp) > 0 ? dinp : NULL, acc.inp, &dx_to));
    bool gemm = !cuda && dw && weights_by_gemm(dout, inp, w, p); /* adds into dw itself, as the deterministic path */
    ft_status s = ft_grad_out_begin(&gw, dw, acc.weight && (cuda || !(ft_deterministic() || gemm)), &dw_to);
    if (s == FT_OK && cuda) {
        s = FT_CUDA_CALL("conv2d_backward", conv2d_backward, dx_to, dw_to, NULL, dout, inp, w, p);
    } else if (s == FT_OK) {
        ft_tensor copy;
        if (dx_to) {
            const ft_tensor *dy = dout;
            s = relayout(&dy, dx_to, &copy);
            conv_key k = key_of('D', dx_to, w, dy, p);
            conv_data d = {ft_tensor_data(dx_to), ft_tensor_data(w), ft_tensor_data(dy), NULL};
            s = release_copy(&copy, s == FT_OK ? execute(&k, &d) : s);
        }
        if (s == FT_OK && dw_to) { /* the one of inp and dout not channels last copied to be */
            const ft_tensor *x = inp, *dy = dout;
            s = dout->strides[1] == 1 ? relayout(&x, dout, &copy) : relayout(&dy, inp, &copy);
            if (s == FT_OK)
                s = gemm                  ? backward_weights_gemm(dw_to, dy, x, p, acc.weight)
                    : ft_deterministic() ? backward_weights_deterministic(dw_to, dy, x, p, acc.weight)
                                         : backward_weights(dw_to, dy, x, p, false);
            s = release_copy(&copy, s);
        }
    }
    s = ft_grad_out_end(&gw, ft_grad_out_end(&gx, s));
    FT_TRY(s);
    return db ? ft_bias_grad(db, dout, acc.bias) : FT_OK;
}

/* ---- transposed convolution ---- */

/* The checks in the transposed convolution's own terms: out (N, K, P, Q)
 * must be an input size the convolution takes back to inp's (H, W). */
static ft_status check_transposed(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w,
                                  const ft_conv2d_params *p) {
    const char *op = "conv_transpose2d";
    ft_device dev = ft_op_device(inp);
    FT_TRY(ft_check_float_on(op, "input", inp, dev, "input", true));
    FT_TRY(ft_check_float_on(op, "weight", w, dev, "input", true));
    FT_TRY(ft_check_float_on(op, "out", out, dev, "input", true));
    if (inp->ndim != 4 || w->ndim != 4 || out->ndim != 4)
        return ft_fail(FT_ERR_SHAPE, "%s: input, weight and output must be 4-d, got %d, %d and %d dimensions", op,
                       inp->ndim, w->ndim, out->ndim);
    for (int d = 0; d < 2; d++)
        if (p->stride[d] < 1 || p->dilation[d] < 1 || p->padding[d] < 0)
            return ft_fail(FT_ERR_VALUE, "%s: stride and dilation must be >= 1 and padding >= 0, got (%lld, %lld), "
                                         "(%lld, %lld) and (%lld, %lld)", op, (long long)p->stride[0],
                           (long long)p->stride[1], (long long)p->dilation[0], (long long)p->dilation[1],
                           (long long)p->padding[0], (long long)p->padding[1]);
    if (p->groups < 1 || w->shape[1] < 1)
        return ft_fail(FT_ERR_VALUE, "%s: groups (%lld) and the weight's output channels per group (%lld) must be "
                                     ">= 1", op, (long long)p->groups, (long long)w->shape[1]);
    int64_t G = p->groups, C = inp->shape[1];
    if (w->shape[0] != C)
        return ft_fail(FT_ERR_SHAPE, "%s: weight (C_in, C_out/groups, kH, kW) has %lld input channels, the input %lld",
                       op, (long long)w->shape[0], (long long)C);
    if (G < 1 || C % G || out->shape[1] != w->shape[1] * G || out->shape[0] != inp->shape[0])
        return ft_fail(FT_ERR_SHAPE, "%s: groups=%lld, input (%lld, %lld, ...) and weight (%lld, %lld, ...) do not "
                       "give an output of (%lld, %lld, ...)", op, (long long)G, (long long)inp->shape[0],
                       (long long)C, (long long)w->shape[0], (long long)w->shape[1], (long long)out->shape[0],
                       (long long)out->shape[1]);
    int64_t H, W;
    ft_status s = ft_conv2d_out_size(&H, &W, out->shape[2], out->shape[3], w->shape[2], w->shape[3], p);
    if (s != FT_OK || H != inp->shape[2] || W != inp->shape[3])
        return ft_fail(FT_ERR_SHAPE, "%s: an output of %lld x %lld is not one whose convolution gives the input's "
                       "%lld x %lld (output_padding must stay below the stride)", op, (long long)out->shape[2],
                       (long long)out->shape[3], (long long)inp->shape[2], (long long)inp->shape[3]);
    return FT_OK;
}

ft_status ft_conv_transpose2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w,
                                      const ft_tensor *b, const ft_conv2d_params *p) {
    FT_TRY(check_transposed(out, inp, w, p));
    FT_TRY(ft_check_output("conv_transpose2d", "out", out));
    FT_TRY(ft_check_apart("conv_transpose2d", "out", out, "input", inp));
    if (b) { /* the bias first, broadcast over out: the data gradient adds into it */
        FT_TRY(ft_check_float_on("conv_transpose2d", "bias", b, ft_op_device(inp), "input", false));
        FT_TRY(ft_check_shape("conv_transpose2d", "bias", b, 1, &out->shape[1]));
        ft_tensor spread = *b;
        spread.ndim = 4;
        memcpy(spread.shape, out->shape, sizeof out->shape);
        spread.strides[0] = spread.strides[2] = spread.strides[3] = 0, spread.strides[1] = b->strides[0];
        FT_TRY(ft_tensor_copy(out, &spread, false));
    }
    return ft_conv2d_backward(out, NULL, NULL, inp, out, w, p, (ft_grad_acc){.inp = b != NULL});
}

ft_status ft_conv_transpose2d_backward(const ft_tensor *dinp, const ft_tensor *dw, const ft_tensor *db,
                                       const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                                       const ft_conv2d_params *p, ft_grad_acc acc) {
    FT_TRY(check_transposed(dout, inp, w, p));
    if (dinp) {
        FT_TRY(ft_check_apart("conv_transpose2d_backward", "grad_input", dinp, "grad_output", dout));
        FT_TRY(ft_conv2d_forward(dinp, dout, w, NULL, p, &(ft_conv2d_fusion){.sum = acc.inp}));
    }
    if (dw)
        FT_TRY(ft_conv2d_backward(NULL, dw, NULL, inp, dout, w, p, acc));
    return db ? ft_bias_grad(db, dout, acc.bias) : FT_OK;
}
