/* linear through cuBLASLt: out = act(x w^T + b) with the bias and
 * tanh-GELU in the matmul's epilogue, and the two gradient products.
 *
 * cuBLASLt is column-major. A row-major (R, C) tensor with unit column
 * stride is, read column-major, its own transpose (C x R, ld = row stride);
 * with unit row stride it is itself (R x C, ld = column stride). So each
 * product is written as D^T = B^T A^T where that avoids copies, and only a
 * tensor with neither unit stride is staged contiguous first.
 *
 * float32 multiplies in float32 (CUBLAS_COMPUTE_32F) unless
 * ft.backends.allow_tf32; bfloat16 and float16 multiply on tensor cores and
 * accumulate in float32, writing float32 or the 16-bit dtype. The heuristic's
 * choice depends only on shapes, alignments and the fixed workspace size, so
 * results are the same on every run. */
#include <cublasLt.h>

#include <mutex>

#include "backend.h"
#include "ops/cuda_ops.h"

static ft_status lt_check(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS)
        return FT_OK;
    ft_status status = s == CUBLAS_STATUS_ALLOC_FAILED ? FT_ERR_NOMEM : FT_ERR_CUDA;
    return ft_cuda_fail(status, "%s failed: %s", what, cublasLtGetStatusString(s));
}

static std::mutex lock;
static cublasLtHandle_t handles[FT_MAX_CUDA_DEVICES];

static ft_status handle_of(cublasLtHandle_t *h, int device) {
    std::lock_guard<std::mutex> g(lock);
    if (!handles[device])
        FT_TRY(lt_check(cublasLtCreate(&handles[device]), "cublasLtCreate"));
    *h = handles[device];
    return FT_OK;
}

#define WORKSPACE (32u << 20)

static cudaDataType_t lt_dtype(ft_dtype dt) {
    return dt == FT_BFLOAT16 ? CUDA_R_16BF : dt == FT_FLOAT16 ? CUDA_R_16F : CUDA_R_32F;
}

/* A 2-d tensor as a column-major matrix: `stored_transposed` when the
 * column-major matrix is the tensor's transpose (the row-major case). */
struct matrix {
    const ft_tensor *t;
    ft_cuda_scratch staged = {NULL, 0, 0};
    void *ptr = NULL;
    ft_dtype dtype;
    bool stored_transposed;
    uint64_t rows, cols, ld; /* of the column-major matrix */

    ~matrix() { ft_cuda_scratch_free(&staged); }

    /* copy: the values are read; dtype: the dtype the product needs */
    ft_status init(const ft_tensor *tensor, ft_dtype want, bool copy) {
        t = tensor;
        dtype = want;
        int64_t R = t->shape[0], C = t->shape[1], s0 = t->strides[0], s1 = t->strides[1];
        if (t->dtype == want && (s1 == 1 || C == 1) && (R == 1 || s0 >= C) && s0 > 0) {
            set(ft_tensor_data(t), true, R == 1 ? C : s0);
        } else if (t->dtype == want && (s0 == 1 || R == 1) && (C == 1 || s1 >= R) && s1 > 0) {
            set(ft_tensor_data(t), false, C == 1 ? R : s1);
        } else {
            FT_TRY(ft_cuda_stage(&staged, t, want, copy));
            set(staged.ptr, true, C);
        }
        return FT_OK;
    }

    void set(void *p, bool transposed, int64_t lead) {
        ptr = p;
        stored_transposed = transposed;
        rows = (uint64_t)(transposed ? t->shape[1] : t->shape[0]);
        cols = (uint64_t)(transposed ? t->shape[0] : t->shape[1]);
        ld = (uint64_t)(lead > (int64_t)rows ? lead : (int64_t)rows);
    }

    /* The operation that makes the stored matrix the tensor (`want_transpose`
     * false) or its transpose (true). */
    cublasOperation_t op(bool want_transpose) const {
        return want_transpose == stored_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;
    }

    ft_status finish() { return staged.ptr ? ft_cuda_copy_back(t, staged.ptr, dtype) : FT_OK; }
};

/* The largest power of two (up to 256) dividing the address: what the
 * heuristic must know to skip kernels that need more. */
static uint32_t alignment(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

/* Owns the descriptors of one matmul. */
struct lt_descs {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, d = NULL;
    cublasLtMatmulPreference_t pref = NULL;

    ~lt_descs() {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        if (d)
            cublasLtMatrixLayoutDestroy(d);
        if (b)
            cublasLtMatrixLayoutDestroy(b);
        if (a)
            cublasLtMatrixLayoutDestroy(a);
        if (op)
            cublasLtMatmulDescDestroy(op);
    }
};

static ft_status layout(cublasLtMatrixLayout_t *l, const matrix &m) {
    return lt_check(cublasLtMatrixLayoutCreate(l, lt_dtype(m.dtype), m.rows, m.cols, m.ld),
                    "cublasLtMatrixLayoutCreate");
}

/* D (column-major) = op(A) op(B), with the epilogue and its float32 vector:
 * the bias it adds, or the bias gradient it writes. With `supported` not
 * NULL, a product cuBLASLt has no algorithm for (an epilogue it lacks for
 * these types) sets *supported false and runs nothing. */
static ft_status matmul(const matrix &A, cublasOperation_t opa, const matrix &B, cublasOperation_t opb,
                        const matrix &D, cublasLtEpilogue_t epilogue, const float *bias, bool *supported) {
    int device = ft_tensor_device(D.t).index;
    cublasLtHandle_t h;
    FT_TRY(handle_of(&h, device));
    bool tf32 = A.dtype == FT_FLOAT32 && ft_cuda_allow_tf32();
    lt_descs ds;
    FT_TRY(lt_check(cublasLtMatmulDescCreate(&ds.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                             CUDA_R_32F),
                    "cublasLtMatmulDescCreate"));
    FT_TRY(lt_check(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
                    "cublasLtMatmulDescSetAttribute(TRANSA)"));
    FT_TRY(lt_check(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
                    "cublasLtMatmulDescSetAttribute(TRANSB)"));
    FT_TRY(lt_check(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
                    "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
    if (bias)
        FT_TRY(lt_check(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                        "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
    FT_TRY(layout(&ds.a, A));
    FT_TRY(layout(&ds.b, B));
    FT_TRY(layout(&ds.d, D));
    FT_TRY(lt_check(cublasLtMatmulPreferenceCreate(&ds.pref), "cublasLtMatmulPreferenceCreate"));
    uint64_t ws_size = WORKSPACE;
    FT_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size,
                                                         sizeof ws_size),
                    "cublasLtMatmulPreferenceSetAttribute"));
    const cublasLtMatmulPreferenceAttributes_t align_attr[3] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const void *ptrs[3] = {A.ptr, B.ptr, D.ptr};
    for (int i = 0; i < 3; i++) {
        uint32_t a = alignment(ptrs[i]);
        FT_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(ds.pref, align_attr[i], &a, sizeof a),
                        "cublasLtMatmulPreferenceSetAttribute"));
    }
    /* C is D (beta = 0 reads nothing), so it shares D's alignment */
    uint32_t ad = alignment(D.ptr);
    FT_TRY(lt_check(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad,
                                                         sizeof ad),
                    "cublasLtMatmulPreferenceSetAttribute"));
    /* The heuristic's list depends only on the descriptors, the alignments
     * and the workspace size, so taking its first candidate that runs picks
     * the same algorithm every time. cuBLASLt may list a candidate that its
     * matmul then refuses (NOT_SUPPORTED, before it writes anything): the
     * next one is tried. */
    enum { CANDIDATES = 8 };
    cublasLtMatmulHeuristicResult_t results[CANDIDATES];
    int found = 0;
    cublasStatus_t last =
        cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, CANDIDATES, results, &found);
    if (last != CUBLAS_STATUS_NOT_SUPPORTED)
        FT_TRY(lt_check(last, "cublasLtMatmulAlgoGetHeuristic"));
    const float one = 1.0f, zero = 0.0f;
    last = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < found && last == CUBLAS_STATUS_NOT_SUPPORTED; i++) {
        ft_cuda_scratch ws;
        FT_TRY(ft_cuda_scratch_alloc(&ws, results[i].workspaceSize, device));
        last = cublasLtMatmul(h, ds.op, &one, A.ptr, ds.a, B.ptr, ds.b, &zero, D.ptr, ds.d, D.ptr, ds.d,
                              &results[i].algo, ws.ptr, results[i].workspaceSize, FT_CUDA_STREAM);
        ft_cuda_scratch_free(&ws);
    }
    if (supported)
        *supported = last != CUBLAS_STATUS_NOT_SUPPORTED;
    if (supported && !*supported)
        return FT_OK;
    if (last == CUBLAS_STATUS_NOT_SUPPORTED)
        return ft_cuda_fail(FT_ERR_CUDA, "linear: cuBLASLt has no algorithm for a %llux%llu by %llux%llu product",
                            (unsigned long long)A.rows, (unsigned long long)A.cols, (unsigned long long)B.rows,
                            (unsigned long long)B.cols);
    return lt_check(last, "cublasLtMatmul");
}

/* float32 products write float32 (cuBLASLt has no float32 -> 16-bit path):
 * another output dtype is staged. */
static ft_dtype out_dtype(ft_dtype inputs, const ft_tensor *out) {
    return inputs == FT_FLOAT32 ? FT_FLOAT32 : out->dtype;
}

static ft_status linear_forward(const ft_tensor *out, const ft_tensor *x, const ft_tensor *w, const ft_tensor *b,
                                ft_act act) {
    FT_TRY(ft_cuda_use_device(x));
    ft_dtype dt = x->dtype;
    matrix X, W, D;
    FT_TRY(X.init(x, dt, true));
    FT_TRY(W.init(w, dt, true));
    /* D must be out^T column-major, i.e. out row-major */
    FT_TRY(D.init(out, out_dtype(dt, out), false));
    if (!D.stored_transposed) {
        ft_cuda_scratch_free(&D.staged);
        FT_TRY(ft_cuda_stage(&D.staged, out, D.dtype, false));
        D.set(D.staged.ptr, true, out->shape[1]);
    }
    /* The epilogue takes a float32 bias into a float32 D, and the tanh GELU
     * (cuBLASLt's GELU); anything else gets its own pass, ReLU too: an
     * epilogue's max(x, 0) would turn NaN into 0 (PyTorch's ReLU keeps it). */
    const float *bias = b ? (const float *)ft_tensor_data(b) : NULL;
    bool fuse = D.dtype == FT_FLOAT32 && (!bias || alignment(bias) >= 16) &&
                (act.kind == FT_ACT_NONE || act.kind == FT_ACT_GELU_TANH);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (fuse) {
        if (act.kind == FT_ACT_GELU_TANH)
            epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
        else if (bias)
            epi = CUBLASLT_EPILOGUE_BIAS;
    }
    /* out^T (O x N) = w (O x I) x^T (I x N); an epilogue cuBLASLt cannot
     * run for these shapes leaves the bias and activation to their pass */
    bool fused = false;
    if (fuse)
        FT_TRY(matmul(W, W.op(false), X, X.op(true), D, epi, bias, &fused));
    if (!fused)
        FT_TRY(matmul(W, W.op(false), X, X.op(true), D, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL));
    FT_TRY(D.finish());
    return fused ? FT_OK : ft_cuda_bias_act(out, b, 1, act);
}

/* db (float32, given only with dw) comes out of dw's product as cuBLASLt's
 * bias-gradient epilogue where it has one for these types, else from the
 * bias_grad op. */
static ft_status linear_backward(const ft_tensor *dx, const ft_tensor *dw, const ft_tensor *db,
                                 const ft_tensor *dout, const ft_tensor *x, const ft_tensor *w) {
    FT_TRY(ft_cuda_use_device(dout));
    ft_dtype dt = x->dtype;
    matrix G;
    FT_TRY(G.init(dout, dt, true));
    if (dx) {
        matrix W, DX;
        FT_TRY(W.init(w, dt, true));
        FT_TRY(DX.init(dx, out_dtype(dt, dx), false));
        if (DX.stored_transposed) { /* dx^T (I x N) = w^T (I x O) dout^T (O x N) */
            FT_TRY(matmul(W, W.op(true), G, G.op(true), DX, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL));
        } else { /* dx (N x I) = dout (N x O) w (O x I) */
            FT_TRY(matmul(G, G.op(false), W, W.op(false), DX, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL));
        }
        FT_TRY(DX.finish());
    }
    if (!dw)
        return FT_OK;
    matrix X, DW;
    FT_TRY(X.init(x, dt, true));
    FT_TRY(DW.init(dw, FT_FLOAT32, false)); /* a 16-bit dw (a matmul's gradient of an activation) is staged */
    /* db[o] sums dout over the batch, the product's inner dimension: dout is
     * the second factor of dw^T = x^T dout (BGRADB), the first of
     * dw = dout^T x (BGRADA) */
    bool dense = db && (db->strides[0] == 1 || db->shape[0] == 1) && alignment(ft_tensor_data(db)) >= 16;
    float *grad = dense ? (float *)ft_tensor_data(db) : NULL;
    bool fused = false;
    if (DW.stored_transposed) { /* dw^T (I x O) = x^T (I x N) dout (N x O) */
        if (grad)
            FT_TRY(matmul(X, X.op(true), G, G.op(false), DW, CUBLASLT_EPILOGUE_BGRADB, grad, &fused));
        if (!fused)
            FT_TRY(matmul(X, X.op(true), G, G.op(false), DW, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL));
    } else { /* dw (O x I) = dout^T (O x N) x (N x I) */
        if (grad)
            FT_TRY(matmul(G, G.op(true), X, X.op(false), DW, CUBLASLT_EPILOGUE_BGRADA, grad, &fused));
        if (!fused)
            FT_TRY(matmul(G, G.op(true), X, X.op(false), DW, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL));
    }
    FT_TRY(DW.finish());
    return db && !fused ? ft_cuda_table()->bias_grad(db, dout) : FT_OK;
}

void ft_cuda_register_linear(ft_cuda_ops *ops) {
    ops->linear_forward = linear_forward;
    ops->linear_backward = linear_backward;
}
