/* conv2d through cuDNN's convolution API: forward, backward data and
 * backward filter, NCHW or channels-last (any positive strides), groups.
 *
 * Algorithms: with ft.backends.benchmark, cuDNN times its candidates for each
 * shape the first time it is seen (cudnnFind*, with cuDNN's own buffers) and
 * the fastest is kept; otherwise cuDNN's heuristics pick. Either way the
 * choice is cached per shape, and ft.use_deterministic_algorithms(True)
 * keeps only algorithms cuDNN reports deterministic. float32 runs with FMA
 * math unless ft.backends.allow_tf32; bfloat16 or float16 on tensor cores
 * with float accumulation when every operand of the pass has that dtype,
 * else in float32.
 *
 * The fused bias and activation are a kernel of their own after the
 * convolution (ft_cuda_bias_act): cuDNN's fused forward takes only ReLU and
 * one algorithm. The residual sum is the convolution's beta = 1. */
#include <cudnn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "backend.h"
#include "ops/cuda_ops.h"

static ft_status cudnn_check(cudnnStatus_t s, const char *what) {
    if (s == CUDNN_STATUS_SUCCESS)
        return FT_OK;
    ft_status status = s == CUDNN_STATUS_ALLOC_FAILED ? FT_ERR_NOMEM : FT_ERR_CUDA;
    return ft_cuda_fail(status, "%s failed: %s", what, cudnnGetErrorString(s));
}

static std::mutex lock;
static cudnnHandle_t handles[FT_MAX_CUDA_DEVICES];

/* The device's handle, created on first use, bound to the compute stream. */
static ft_status handle_of(cudnnHandle_t *h, int device) {
    std::lock_guard<std::mutex> g(lock);
    if (!handles[device]) {
        FT_TRY(cudnn_check(cudnnCreate(&handles[device]), "cudnnCreate"));
        FT_TRY(cudnn_check(cudnnSetStream(handles[device], FT_CUDA_STREAM), "cudnnSetStream"));
    }
    *h = handles[device];
    return FT_OK;
}

static cudnnDataType_t cudnn_dtype(ft_dtype dt) {
    return dt == FT_BFLOAT16 ? CUDNN_DATA_BFLOAT16 : dt == FT_FLOAT16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

/* True when every dimension of more than one element has a positive stride
 * that fits cuDNN's int (cuDNN takes any such strides for activations). */
static bool positive_strides(const ft_tensor *t) {
    for (int k = 0; k < 4; k++)
        if (t->shape[k] > 1 && (t->strides[k] <= 0 || t->strides[k] > INT32_MAX))
            return false;
    return true;
}

/* cuDNN's convolution takes one dtype for all its operands: a 16-bit float
 * only when every one is it, else float32, into which 16-bit floats convert
 * exactly (a 16-bit pass would round a float32 output). */
static ft_dtype pass_dtype(const ft_tensor *a, const ft_tensor *b, const ft_tensor *c) {
    bool low = (a->dtype == FT_BFLOAT16 || a->dtype == FT_FLOAT16) && b->dtype == a->dtype && c->dtype == a->dtype;
    return low ? a->dtype : FT_FLOAT32;
}

/* An activation operand (x, y, dx, dy): the tensor itself when cuDNN can
 * take it, else a contiguous staged copy in the compute dtype. */
struct operand {
    const ft_tensor *t;
    ft_cuda_scratch staged = {NULL, 0, 0};
    void *ptr = NULL;
    int64_t strides[4];

    ~operand() { ft_cuda_scratch_free(&staged); }

    /* copy: the values are read (an input, or an output summed into) */
    ft_status init(const ft_tensor *tensor, ft_dtype dtype, bool copy) {
        t = tensor;
        if (t->dtype == dtype && positive_strides(t)) {
            ptr = ft_tensor_data(t);
            /* a size-1 dimension's stride is free; keep the caller's unless
             * it is one cuDNN refuses */
            for (int k = 0; k < 4; k++)
                strides[k] = t->strides[k] > 0 && t->strides[k] <= INT32_MAX ? t->strides[k] : 1;
            return FT_OK;
        }
        FT_TRY(ft_cuda_stage(&staged, t, dtype, copy));
        ptr = staged.ptr;
        int64_t step = 1;
        for (int k = 3; k >= 0; k--) {
            strides[k] = step;
            step *= t->shape[k];
        }
        return FT_OK;
    }

    /* After the convolution wrote a staged output: move it into the tensor. */
    ft_status finish(ft_dtype dtype) { return staged.ptr ? ft_cuda_copy_back(t, staged.ptr, dtype) : FT_OK; }
};

/* A filter operand (w, dw): cuDNN takes only dense KCRS ("NCHW") or KRSC
 * ("NHWC") filters, and its fast kernels for channels-last activations want
 * a KRSC filter: a filter in the other order is staged (weights are small
 * next to activations). */
struct filter {
    ft_tensor view; /* the tensor, its dimensions in the memory order wanted */
    const ft_tensor *t;
    ft_cuda_scratch staged = {NULL, 0, 0};
    void *ptr = NULL;
    cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;

    ~filter() { ft_cuda_scratch_free(&staged); }

    /* nhwc: the activations are channels-last */
    ft_status init(const ft_tensor *tensor, ft_dtype dtype, bool copy, bool nhwc) {
        t = tensor;
        view = *t;
        if (nhwc) { /* (K, C, R, S) seen as (K, R, S, C) */
            const int perm[4] = {0, 2, 3, 1};
            for (int k = 0; k < 4; k++) {
                view.shape[k] = t->shape[perm[k]];
                view.strides[k] = t->strides[perm[k]];
            }
        }
        format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
        bool dense = true;
        int64_t step = 1;
        for (int k = 3; k >= 0; k--) {
            dense = dense && (view.shape[k] == 1 || view.strides[k] == step);
            step *= view.shape[k];
        }
        if (t->dtype == dtype && dense) {
            ptr = ft_tensor_data(t);
            return FT_OK;
        }
        FT_TRY(ft_cuda_stage(&staged, &view, dtype, copy));
        ptr = staged.ptr;
        return FT_OK;
    }

    ft_status finish(ft_dtype dtype) { return staged.ptr ? ft_cuda_copy_back(&view, staged.ptr, dtype) : FT_OK; }
};

/* Whether an activation operand is channels-last (NHWC memory order). */
static bool channels_last(const operand &a) { return a.strides[1] < a.strides[3]; }

/* The four descriptors of one convolution. */
struct descriptors {
    cudnnTensorDescriptor_t x = NULL, y = NULL;
    cudnnFilterDescriptor_t w = NULL;
    cudnnConvolutionDescriptor_t conv = NULL;

    ~descriptors() {
        if (x)
            cudnnDestroyTensorDescriptor(x);
        if (y)
            cudnnDestroyTensorDescriptor(y);
        if (w)
            cudnnDestroyFilterDescriptor(w);
        if (conv)
            cudnnDestroyConvolutionDescriptor(conv);
    }
};

static ft_status tensor_desc(cudnnTensorDescriptor_t *d, const operand &o, ft_dtype dtype) {
    FT_TRY(cudnn_check(cudnnCreateTensorDescriptor(d), "cudnnCreateTensorDescriptor"));
    const int64_t *n = o.t->shape, *s = o.strides;
    return cudnn_check(cudnnSetTensor4dDescriptorEx(*d, cudnn_dtype(dtype), (int)n[0], (int)n[1], (int)n[2],
                                                    (int)n[3], (int)s[0], (int)s[1], (int)s[2], (int)s[3]),
                       "cudnnSetTensor4dDescriptorEx");
}

static ft_status make_descriptors(descriptors *d, const operand &x, const filter &w, const operand &y,
                                  const ft_conv2d_params *p, ft_dtype dtype) {
    FT_TRY(tensor_desc(&d->x, x, dtype));
    FT_TRY(tensor_desc(&d->y, y, dtype));
    FT_TRY(cudnn_check(cudnnCreateFilterDescriptor(&d->w), "cudnnCreateFilterDescriptor"));
    const int64_t *k = w.t->shape;
    FT_TRY(cudnn_check(cudnnSetFilter4dDescriptor(d->w, cudnn_dtype(dtype), w.format, (int)k[0], (int)k[1],
                                                  (int)k[2], (int)k[3]),
                       "cudnnSetFilter4dDescriptor"));
    FT_TRY(cudnn_check(cudnnCreateConvolutionDescriptor(&d->conv), "cudnnCreateConvolutionDescriptor"));
    FT_TRY(cudnn_check(cudnnSetConvolution2dDescriptor(d->conv, (int)p->padding[0], (int)p->padding[1],
                                                       (int)p->stride[0], (int)p->stride[1], (int)p->dilation[0],
                                                       (int)p->dilation[1], CUDNN_CROSS_CORRELATION,
                                                       CUDNN_DATA_FLOAT),
                       "cudnnSetConvolution2dDescriptor"));
    FT_TRY(cudnn_check(cudnnSetConvolutionGroupCount(d->conv, (int)p->groups), "cudnnSetConvolutionGroupCount"));
    cudnnMathType_t math = dtype != FT_FLOAT32 ? CUDNN_TENSOR_OP_MATH
                           : ft_cuda_allow_tf32()   ? CUDNN_DEFAULT_MATH
                                                    : CUDNN_FMA_MATH;
    return cudnn_check(cudnnSetConvolutionMathType(d->conv, math), "cudnnSetConvolutionMathType");
}

/* cuDNN's descriptors take int: every size, stride and element count must fit. */
static ft_status check_int_range(const ft_tensor *const *ts, int n, const ft_conv2d_params *p) {
    for (int i = 0; i < n; i++) {
        if (!ts[i])
            continue;
        int64_t numel = 1;
        for (int k = 0; k < 4; k++)
            numel *= ts[i]->shape[k];
        if (numel > INT32_MAX)
            return ft_cuda_fail(FT_ERR_VALUE, "conv2d: a tensor of %lld elements exceeds cuDNN's limit of 2^31 - 1",
                                (long long)numel);
    }
    for (int k = 0; k < 2; k++)
        if (p->padding[k] > INT32_MAX || p->stride[k] > INT32_MAX || p->dilation[k] > INT32_MAX)
            return ft_cuda_fail(FT_ERR_VALUE, "conv2d: padding, stride and dilation must fit in 32 bits on CUDA");
    return FT_OK;
}

/* ---- algorithm choice, cached per shape ---- */

/* Everything the choice depends on. */
struct algo_key {
    char kind; /* 'F', 'D', 'W' */
    int device;
    int64_t x[8], w[4], y[8];
    int w_format;
    ft_conv2d_params p;
    ft_dtype dtype;
    bool tf32, deterministic, benchmark;
};

static std::map<std::string, int> algo_cache;

static algo_key key_of(char kind, const operand &x, const filter &w, const operand &y, const ft_conv2d_params *p,
                       ft_dtype dtype) {
    algo_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is compared as bytes */
    k.kind = kind;
    k.device = ft_tensor_device(x.t).index;
    for (int i = 0; i < 4; i++) {
        k.x[i] = x.t->shape[i];
        k.x[4 + i] = x.strides[i];
        k.w[i] = w.t->shape[i];
        k.y[i] = y.t->shape[i];
        k.y[4 + i] = y.strides[i];
    }
    k.w_format = (int)w.format;
    k.p = *p;
    k.dtype = dtype;
    k.tf32 = ft_cuda_allow_tf32();
    k.deterministic = ft_cuda_deterministic();
    k.benchmark = ft_cuda_benchmark() && !k.deterministic;
    return k;
}

#define MAX_ALGOS 16

/* Runs one pass (forward, backward data or backward filter) with the
 * algorithm cached for key k, or else (or when cuDNN turns it down for
 * these pointers) with the candidates search(perf, &n, find) lists (best
 * first: timed by cudnnFind* with find, cudnnGet*_v7's heuristic without,
 * and the heuristic's when Find fails) in order: a candidate cuDNN turns
 * down for these descriptors, or whose workspace does not fit in memory, is
 * skipped, and the first that runs is cached. workspace(algo, &bytes) and
 * run(algo, workspace, bytes) wrap the pass's cuDNN calls. */
template <typename Perf, typename Search, typename Workspace, typename Run>
static ft_status run_pass(const algo_key &k, const char *what, Search search, Workspace workspace, Run run) {
    std::string key((const char *)&k, sizeof k);
    int cached = -1;
    {
        std::lock_guard<std::mutex> g(lock);
        auto it = algo_cache.find(key);
        if (it != algo_cache.end())
            cached = it->second;
    }
    Perf perf[MAX_ALGOS];
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (bool searched = cached < 0; ; searched = true) {
        int n = 1;
        if (searched) {
            cudnnStatus_t found = search(perf, &n, k.benchmark);
            if (found != CUDNN_STATUS_SUCCESS && k.benchmark) /* Find allocates its own buffers, past the cache's
                                                                  hold on the device: the heuristic needs none */
                found = search(perf, &n, false);
            FT_TRY(cudnn_check(found, what));
        } else {
            perf[0].algo = (decltype(perf[0].algo))cached;
            perf[0].status = CUDNN_STATUS_SUCCESS;
            perf[0].determinism = CUDNN_DETERMINISTIC;
        }
        for (int i = 0; i < n; i++) {
            if (perf[i].status != CUDNN_STATUS_SUCCESS ||
                (k.deterministic && perf[i].determinism != CUDNN_DETERMINISTIC))
                continue;
            size_t bytes = 0;
            last = workspace(perf[i].algo, &bytes);
            if (last != CUDNN_STATUS_SUCCESS) /* this candidate only: another may serve */
                continue;
            ft_cuda_scratch ws;
            ft_status got = ft_cuda_scratch_alloc(&ws, bytes, k.device);
            if (got == FT_ERR_NOMEM) { /* a candidate with a smaller workspace may fit */
                last = CUDNN_STATUS_ALLOC_FAILED;
                continue;
            }
            FT_TRY(got);
            last = run(perf[i].algo, ws.ptr, bytes);
            ft_cuda_scratch_free(&ws);
            if (last == CUDNN_STATUS_NOT_SUPPORTED)
                continue;
            if (last == CUDNN_STATUS_SUCCESS && searched) {
                std::lock_guard<std::mutex> g(lock);
                algo_cache[key] = (int)perf[i].algo;
            }
            return cudnn_check(last, what);
        }
        if (searched)
            break;
    }
    if (last == CUDNN_STATUS_ALLOC_FAILED)
        return ft_cuda_fail(FT_ERR_NOMEM, "conv2d: out of device memory for the workspace of every %scuDNN algorithm "
                                          "(%s)", k.deterministic ? "deterministic " : "", what);
    return ft_cuda_fail(FT_ERR_CUDA, "conv2d: cuDNN has no %salgorithm for this convolution (%s: %s)",
                        k.deterministic ? "deterministic " : "", what, cudnnGetErrorString(last));
}

/* ---- the three passes ---- */

static const float one = 1.0f, zero = 0.0f;

static ft_status forward(cudnnHandle_t h, const operand &x, const filter &w, const operand &y,
                         const ft_conv2d_params *p, ft_dtype dtype, bool sum) {
    descriptors d;
    FT_TRY(make_descriptors(&d, x, w, y, p, dtype));
    algo_key k = key_of('F', x, w, y, p, dtype);
    return run_pass<cudnnConvolutionFwdAlgoPerf_t>(
        k, "cudnn convolution forward",
        [&](cudnnConvolutionFwdAlgoPerf_t *perf, int *n, bool find) {
            return find ? cudnnFindConvolutionForwardAlgorithm(h, d.x, d.w, d.conv, d.y, MAX_ALGOS, n, perf)
                        : cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, MAX_ALGOS, n, perf);
        },
        [&](cudnnConvolutionFwdAlgo_t a, size_t *bytes) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a, bytes);
        },
        [&](cudnnConvolutionFwdAlgo_t a, void *ws, size_t bytes) {
            return cudnnConvolutionForward(h, &one, d.x, x.ptr, d.w, w.ptr, d.conv, a, ws, bytes, sum ? &one : &zero,
                                           d.y, y.ptr);
        });
}

static ft_status backward_data(cudnnHandle_t h, const operand &dx, const filter &w, const operand &dy,
                               const ft_conv2d_params *p, ft_dtype dtype) {
    descriptors d;
    FT_TRY(make_descriptors(&d, dx, w, dy, p, dtype));
    algo_key k = key_of('D', dx, w, dy, p, dtype);
    return run_pass<cudnnConvolutionBwdDataAlgoPerf_t>(
        k, "cudnn convolution backward data",
        [&](cudnnConvolutionBwdDataAlgoPerf_t *perf, int *n, bool find) {
            return find
                       ? cudnnFindConvolutionBackwardDataAlgorithm(h, d.w, d.y, d.conv, d.x, MAX_ALGOS, n, perf)
                       : cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, MAX_ALGOS, n, perf);
        },
        [&](cudnnConvolutionBwdDataAlgo_t a, size_t *bytes) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, a, bytes);
        },
        [&](cudnnConvolutionBwdDataAlgo_t a, void *ws, size_t bytes) {
            return cudnnConvolutionBackwardData(h, &one, d.w, w.ptr, d.y, dy.ptr, d.conv, a, ws, bytes, &zero, d.x,
                                                dx.ptr);
        });
}

static ft_status backward_filter(cudnnHandle_t h, const operand &x, const filter &dw, const operand &dy,
                                 const ft_conv2d_params *p, ft_dtype dtype) {
    descriptors d;
    FT_TRY(make_descriptors(&d, x, dw, dy, p, dtype));
    algo_key k = key_of('W', x, dw, dy, p, dtype);
    return run_pass<cudnnConvolutionBwdFilterAlgoPerf_t>(
        k, "cudnn convolution backward filter",
        [&](cudnnConvolutionBwdFilterAlgoPerf_t *perf, int *n, bool find) {
            return find
                       ? cudnnFindConvolutionBackwardFilterAlgorithm(h, d.x, d.y, d.conv, d.w, MAX_ALGOS, n, perf)
                       : cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, MAX_ALGOS, n, perf);
        },
        [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, a, bytes);
        },
        [&](cudnnConvolutionBwdFilterAlgo_t a, void *ws, size_t bytes) {
            return cudnnConvolutionBackwardFilter(h, &one, d.x, x.ptr, d.y, dy.ptr, d.conv, a, ws, bytes, &zero, d.w,
                                                  dw.ptr);
        });
}

/* ---- entries ---- */

static ft_status conv2d_forward(const ft_tensor *out, const ft_tensor *inp, const ft_tensor *w, const ft_tensor *b,
                                const ft_conv2d_params *p, const ft_conv2d_fusion *fusion) {
    const ft_tensor *all[] = {out, inp, w};
    FT_TRY(check_int_range(all, 3, p));
    FT_TRY(ft_cuda_use_device(inp));
    cudnnHandle_t h;
    FT_TRY(handle_of(&h, ft_tensor_device(inp).index));
    ft_dtype dtype = pass_dtype(inp, w, out);
    bool sum = fusion && fusion->sum;
    operand x, y;
    filter wf;
    FT_TRY(x.init(inp, dtype, true));
    FT_TRY(wf.init(w, dtype, true, channels_last(x)));
    FT_TRY(y.init(out, dtype, sum));
    FT_TRY(forward(h, x, wf, y, p, dtype, sum));
    FT_TRY(y.finish(dtype));
    return ft_cuda_bias_act(out, b, 1, fusion ? fusion->act : ft_act{FT_ACT_NONE, 0.0f});
}

/* db is left to the entry point (ft_bias_grad, shared with linear). */
static ft_status conv2d_backward(const ft_tensor *dinp, const ft_tensor *dw, const ft_tensor *db,
                                 const ft_tensor *dout, const ft_tensor *inp, const ft_tensor *w,
                                 const ft_conv2d_params *p) {
    const ft_tensor *all[] = {dinp, dw, dout, inp, w};
    FT_TRY(check_int_range(all, 5, p));
    FT_TRY(ft_cuda_use_device(dout));
    cudnnHandle_t h;
    FT_TRY(handle_of(&h, ft_tensor_device(dout).index));
    /* the float32 dw the entry point demands makes the filter pass float32 */
    if (dinp) {
        ft_dtype dtype = pass_dtype(dinp, w, dout);
        operand dx, dy;
        filter wf;
        FT_TRY(dy.init(dout, dtype, true));
        FT_TRY(dx.init(dinp, dtype, false));
        FT_TRY(wf.init(w, dtype, true, channels_last(dx)));
        FT_TRY(backward_data(h, dx, wf, dy, p, dtype));
        FT_TRY(dx.finish(dtype));
    }
    if (dw) {
        ft_dtype wdtype = dw->dtype;
        operand x, dy_w;
        filter dwf;
        FT_TRY(x.init(inp, wdtype, true));
        FT_TRY(dy_w.init(dout, wdtype, true));
        FT_TRY(dwf.init(dw, wdtype, false, channels_last(x)));
        FT_TRY(backward_filter(h, x, dwf, dy_w, p, wdtype));
        FT_TRY(dwf.finish(wdtype));
    }
    return FT_OK;
}

void ft_cuda_register_conv(ft_cuda_ops *ops) {
    ops->conv2d_forward = conv2d_forward;
    ops->conv2d_backward = conv2d_backward;
}
