/* What the translation units of libfasttrain_cuda.so share with each other.
 *
 * The library exports ft_cuda_open and nothing else: the core reaches every
 * other function through the table it returns. Functions that one .cu file
 * defines and another calls therefore cannot be static, and are hidden
 * instead so that they stay out of the dynamic symbol table.
 *
 * Ops run on the device of their tensors, on its legacy default stream (the
 * core's compute stream), and return once their kernels are queued. */
#ifndef FT_CUDA_BACKEND_H
#define FT_CUDA_BACKEND_H

#include <cuda_runtime.h>

#include "core/cuda.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/convert.h"

#define FT_CUDA_HIDDEN __attribute__((visibility("hidden")))

/* The stream every op queues its work on. */
#define FT_CUDA_STREAM ((cudaStream_t)0)

/* FT_OK when `err` is cudaSuccess; otherwise reports "<what> failed: <CUDA's
 * message>" through the core's fail() and returns FT_ERR_NOMEM for an
 * allocation failure, FT_ERR_CUDA for anything else. */
FT_CUDA_HIDDEN ft_status ft_cuda_check(cudaError_t err, const char *what);

/* Reports a failure through the core's fail() and returns `status`. The
 * host's function pointer carries no format attribute; this wrapper gives
 * every message of the backend printf checking. */
FT_CUDA_HIDDEN ft_status ft_cuda_fail(ft_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The copy_strided entry of the table (cuda/copy.cu). */
FT_CUDA_HIDDEN ft_status ft_cuda_copy_strided(const ft_copy_desc *desc, int device, void *stream);

/* The NCCL entries of the table (cuda/nccl.cu). */
FT_CUDA_HIDDEN ft_status ft_cuda_nccl_unique_id(void *id);
FT_CUDA_HIDDEN ft_status ft_cuda_nccl_init(void **comm, const void *id, int rank, int size, int device);
FT_CUDA_HIDDEN ft_status ft_cuda_nccl_allreduce_sum_f32(void *comm, float *buf, int64_t n, int device);
FT_CUDA_HIDDEN ft_status ft_cuda_nccl_destroy(void *comm);

/* Bytes per element of dt (the backend cannot call the core's ft_dtype_get). */
FT_CUDA_HIDDEN size_t ft_cuda_itemsize(ft_dtype dt);

/* Makes t's device the calling thread's current one, as kernel launches and
 * library handles need. */
FT_CUDA_HIDDEN ft_status ft_cuda_use_device(const ft_tensor *t);

/* The status of the kernel launched last on this thread ("<kernel> launch failed: ..."). */
static inline ft_status ft_cuda_launched(const char *kernel) {
    return ft_cuda_check(cudaGetLastError(), kernel);
}

/* Device memory from the core's caching allocator, for workspaces and
 * partial results. A block freed after queuing the kernels that use it is
 * safe: the allocator hands it only to work queued later on the same stream
 * (or, for the copy stream, ordered after it by an event). */
typedef struct {
    void *ptr;
    size_t granted;
    int device;
} ft_cuda_scratch;
FT_CUDA_HIDDEN ft_status ft_cuda_scratch_alloc(ft_cuda_scratch *s, size_t nbytes, int device);
FT_CUDA_HIDDEN void ft_cuda_scratch_free(ft_cuda_scratch *s);

/* Blocks of `threads` for a grid-stride loop over n items: enough to fill
 * any device, few enough that each thread does several items of big arrays. */
static inline unsigned ft_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* float16 elements: a type of their own beside bfloat16's uint16_t. */
struct ft_cuda_half {
    uint16_t bits;
};

/* Loads and stores of float32, bfloat16 (uint16_t) or float16 elements as
 * float, rounding to nearest even as the CPU's conversions. */
template <typename T> struct ft_cuda_io;
template <> struct ft_cuda_io<float> {
    static __device__ float load(const float *p) { return *p; }
    static __device__ void store(float *p, float v) { *p = v; }
};
template <> struct ft_cuda_io<uint16_t> {
    static __device__ float load(const uint16_t *p) { return ft_bf16_to_f32(*p); }
    static __device__ void store(uint16_t *p, float v) { *p = ft_f32_to_bf16(v); }
};
template <> struct ft_cuda_io<ft_cuda_half> {
    static __device__ float load(const ft_cuda_half *p) { return ft_f16_to_f32(p->bits); }
    static __device__ void store(ft_cuda_half *p, float v) { p->bits = ft_f32_to_f16(v); }
};

/* How kernels that learn a float tensor's dtype at run time store it. */
enum { FT_CUDA_F32, FT_CUDA_BF16, FT_CUDA_F16 };

static inline int8_t ft_cuda_kind(ft_dtype dt) {
    return dt == FT_BFLOAT16 ? FT_CUDA_BF16 : dt == FT_FLOAT16 ? FT_CUDA_F16 : FT_CUDA_F32;
}

/* Element i of base as float, its storage (ft_cuda_kind) known only at run
 * time (operands of one op may mix float32 and a 16-bit float). */
static inline FT_HD float ft_cuda_load_f(const char *base, int64_t i, int8_t kind) {
    if (kind == FT_CUDA_F32)
        return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    return kind == FT_CUDA_BF16 ? ft_bf16_to_f32(h) : ft_f16_to_f32(h);
}

static inline FT_HD void ft_cuda_store_f(char *base, int64_t i, int8_t kind, float v) {
    if (kind == FT_CUDA_F32)
        ((float *)base)[i] = v;
    else
        ((uint16_t *)base)[i] = kind == FT_CUDA_BF16 ? ft_f32_to_bf16(v) : ft_f32_to_f16(v);
}

/* A tensor's dims and strides in a form kernels take by value, with
 * ft_cuda_offset giving the element offset of the i-th element in C order. */
typedef struct {
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    int64_t strides[FT_MAX_DIMS];
} ft_cuda_layout;

static inline ft_cuda_layout ft_cuda_layout_of(const ft_tensor *t) {
    ft_cuda_layout l;
    l.ndim = t->ndim;
    for (int k = 0; k < t->ndim; k++) {
        l.shape[k] = t->shape[k];
        l.strides[k] = t->strides[k];
    }
    return l;
}

static inline __device__ int64_t ft_cuda_offset(const ft_cuda_layout &l, int64_t i) {
    int64_t off = 0;
    for (int k = l.ndim - 1; k > 0; k--) {
        int64_t idx = i % l.shape[k];
        i /= l.shape[k];
        off += idx * l.strides[k];
    }
    return l.ndim ? off + i * l.strides[0] : 0;
}

/* The core's settings (core/settings.h), as ops must read them at each call. */
FT_CUDA_HIDDEN bool ft_cuda_deterministic(void);
FT_CUDA_HIDDEN bool ft_cuda_benchmark(void);
FT_CUDA_HIDDEN bool ft_cuda_allow_tf32(void);

/* ---- operands in the layouts cuDNN and cuBLASLt take (cuda/layout.cu) ---- */

/* A C-contiguous copy of t converted to `dtype` in scratch memory (s->ptr);
 * with copy false only the memory, for an output written later by
 * ft_cuda_copy_back. */
FT_CUDA_HIDDEN ft_status ft_cuda_stage(ft_cuda_scratch *s, const ft_tensor *t, ft_dtype dtype, bool copy);

/* dst (any strides and dtype) = the C-contiguous array src of dtype src_dtype
 * and dst's shape. */
FT_CUDA_HIDDEN ft_status ft_cuda_copy_back(const ft_tensor *dst, const void *src, ft_dtype src_dtype);

/* out = act(out + b) in place, b (out.shape[dim]) float32 broadcast along
 * dimension `dim` (NULL: act only): the epilogue of convolution and linear
 * where the libraries' own fusions do not apply. */
FT_CUDA_HIDDEN ft_status ft_cuda_bias_act(const ft_tensor *out, const ft_tensor *b, int dim, ft_act act);

/* The op table, for an op that runs another (e.g. linear's bias gradient). */
FT_CUDA_HIDDEN const struct ft_cuda_ops *ft_cuda_table(void);

/* Each .cu file of ops fills its entries of the table; runtime.cu calls them all. */
FT_CUDA_HIDDEN void ft_cuda_register_attention(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_layout(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_math(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_conv(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_linear(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_norm(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_groupnorm(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_embedding(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_upsample(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_optim(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_pool(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_pointwise(struct ft_cuda_ops *ops);
FT_CUDA_HIDDEN void ft_cuda_register_softmax(struct ft_cuda_ops *ops);

#endif
