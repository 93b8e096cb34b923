/* Strided copy with dtype cast, the CUDA side of the core's copy/cast.
 *
 * Each element is loaded as a "wide" value and stored converted to the
 * destination dtype by the cast rules of kernels/cast.h, one switch per
 * side instead of a kernel per (src, dst) pair.
 * A same-dtype copy moves the bytes unchanged, which is also the only copy
 * complex dtypes allow. */
#include "backend.h"
#include "kernels/cast.h"

/* ---- the kernel -------------------------------------------------------- */

#define FT_COPY_THREADS 256
/* Blocks per SM in the grid: 2048 threads / 256, the most an SM of sm_80 or
 * sm_90 holds at once. One such wave keeps every SM busy, and the
 * grid-stride loop covers the rest of numel with no further blocks. */
#define FT_COPY_BLOCKS_PER_SM 8

/* How one element moves. word == 0: cast through ft_wide. word > 0: a
 * same-dtype copy of `words` machine words of `word` bytes each; complex
 * elements go as two words of their component size because their buffers
 * are only guaranteed the component's alignment. */
typedef struct {
    int dst_size, src_size; /* itemsizes in bytes */
    int word, words;
} ft_copy_plan;

/* Moves element i of the row-major iteration over d->shape: it is read at
 * src + dot(idx, src_strides) and written at dst + dot(idx, dst_strides),
 * strides in elements. FT_HD so that host tests can run it element by
 * element. */
static inline FT_HD void ft_copy_element(const ft_copy_desc *d, ft_copy_plan plan, int64_t i) {
    /* Unravel i over shape, innermost dimension first; the outermost index
     * is what remains, so it needs no division. */
    int64_t rem = i, doff = 0, soff = 0;
    for (int k = d->ndim - 1; k > 0; k--) {
        int64_t q = rem / d->shape[k], idx = rem - q * d->shape[k];
        doff += idx * d->dst_strides[k];
        soff += idx * d->src_strides[k];
        rem = q;
    }
    if (d->ndim > 0) {
        doff += rem * d->dst_strides[0];
        soff += rem * d->src_strides[0];
    }
    char *dst = (char *)d->dst + doff * plan.dst_size;
    const char *src = (const char *)d->src + soff * plan.src_size;
    if (plan.word == 0) {
        ft_store_wide(dst, d->dst_dtype, ft_load_wide(src, d->src_dtype));
        return;
    }
    for (int w = 0; w < plan.words; w++) {
        switch (plan.word) {
        case 1: ((uint8_t *)dst)[w] = ((const uint8_t *)src)[w]; break;
        case 2: ((uint16_t *)dst)[w] = ((const uint16_t *)src)[w]; break;
        case 4: ((uint32_t *)dst)[w] = ((const uint32_t *)src)[w]; break;
        default: ((uint64_t *)dst)[w] = ((const uint64_t *)src)[w]; break;
        }
    }
}

/* The descriptor travels by value in the kernel's parameter space (about
 * 420 bytes of the 4 KiB allowed), so a launch needs no device copy of it. */
__global__ void __launch_bounds__(FT_COPY_THREADS)
    ft_copy_kernel(ft_copy_desc d, int64_t numel, ft_copy_plan plan) {
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += step)
        ft_copy_element(&d, plan, i);
}

/* ---- the host entry ---------------------------------------------------- */

static const char *const dtype_names[] = {
#define FT_DTYPE_NAME(id, name, code, bits) #name,
    FT_FOR_EACH_DTYPE(FT_DTYPE_NAME)
#undef FT_DTYPE_NAME
};

static const int dtype_sizes[] = {
#define FT_DTYPE_SIZE(id, name, code, bits) (bits) / 8,
    FT_FOR_EACH_DTYPE(FT_DTYPE_SIZE)
#undef FT_DTYPE_SIZE
};

size_t ft_cuda_itemsize(ft_dtype dt) { return (size_t)dtype_sizes[dt]; }

static bool is_complex(ft_dtype dt) { return dt == FT_COMPLEX64 || dt == FT_COMPLEX128; }

/* Drops size-1 dimensions and merges each dimension into its outer
 * neighbour where, on both sides, the outer stride steps exactly over the
 * whole inner dimension. Fewer dimensions mean fewer 64-bit divisions per
 * element, which dominate the kernel; a contiguous copy becomes 1-d. */
static void coalesce(ft_copy_desc *out, const ft_copy_desc *in) {
    int n = 0;
    for (int k = 0; k < in->ndim; k++) {
        int64_t size = in->shape[k], ds = in->dst_strides[k], ss = in->src_strides[k];
        if (size == 1)
            continue;
        int64_t dspan, sspan;
        if (n > 0 && !__builtin_mul_overflow(size, ds, &dspan) && !__builtin_mul_overflow(size, ss, &sspan) &&
            out->dst_strides[n - 1] == dspan && out->src_strides[n - 1] == sspan) {
            out->shape[n - 1] *= size;
        } else {
            out->shape[n] = size;
            n++;
        }
        out->dst_strides[n - 1] = ds;
        out->src_strides[n - 1] = ss;
    }
    out->ndim = n;
}

ft_status ft_cuda_copy_strided(const ft_copy_desc *desc, int device, void *stream) {
    if (desc->ndim < 0 || desc->ndim > FT_MAX_DIMS)
        return ft_cuda_fail(FT_ERR_SHAPE, "copy of %d dimensions: at most %d are supported", desc->ndim,
                            FT_MAX_DIMS);
    if ((unsigned)desc->src_dtype >= FT_NUM_DTYPES || (unsigned)desc->dst_dtype >= FT_NUM_DTYPES)
        return ft_cuda_fail(FT_ERR_DTYPE, "copy between invalid dtype codes %d and %d", (int)desc->src_dtype,
                            (int)desc->dst_dtype);
    bool same = desc->src_dtype == desc->dst_dtype;
    if (!same && (is_complex(desc->src_dtype) || is_complex(desc->dst_dtype)))
        return ft_cuda_fail(FT_ERR_DTYPE, "cannot cast %s to %s: complex dtypes cannot be cast",
                            dtype_names[desc->src_dtype], dtype_names[desc->dst_dtype]);

    int64_t numel = 1;
    bool empty = false;
    for (int k = 0; k < desc->ndim; k++) {
        if (desc->shape[k] < 0)
            return ft_cuda_fail(FT_ERR_SHAPE, "copy with negative size %lld in dimension %d",
                                (long long)desc->shape[k], k);
        empty = empty || desc->shape[k] == 0;
    }
    if (empty)
        return FT_OK;
    for (int k = 0; k < desc->ndim; k++)
        if (__builtin_mul_overflow(numel, desc->shape[k], &numel))
            return ft_cuda_fail(FT_ERR_OVERFLOW, "copy of more than 2^63 elements");

    ft_copy_desc d = *desc;
    coalesce(&d, desc);

    ft_copy_plan plan;
    plan.dst_size = dtype_sizes[d.dst_dtype];
    plan.src_size = dtype_sizes[d.src_dtype];
    plan.word = same ? plan.src_size : 0;
    plan.words = 1;
    if (same && is_complex(d.src_dtype)) {
        plan.word = plan.src_size / 2;
        plan.words = 2;
    }

    FT_TRY(ft_cuda_check(cudaSetDevice(device), "cudaSetDevice"));
    /* One contiguous run of one dtype between disjoint buffers: the copy
     * engine moves it at the memory's bandwidth, where the element loop
     * below reached about a third of it (H200: 1.5 of 4.2 TB/s). */
    if (same && d.ndim == 1 && d.dst_strides[0] == 1 && d.src_strides[0] == 1) {
        size_t bytes = (size_t)numel * (size_t)plan.src_size;
        const char *from = (const char *)d.src;
        char *to = (char *)d.dst;
        if (to + bytes <= from || from + bytes <= to)
            return ft_cuda_check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                                 "cudaMemcpyAsync");
    }
    int sms;
    FT_TRY(ft_cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                         "cudaDeviceGetAttribute"));
    int64_t blocks = (numel + FT_COPY_THREADS - 1) / FT_COPY_THREADS;
    if (blocks > (int64_t)sms * FT_COPY_BLOCKS_PER_SM)
        blocks = (int64_t)sms * FT_COPY_BLOCKS_PER_SM;

    /* The thread's last-error slot can still hold an error some earlier
     * call returned (and we reported); clear it so that the check below
     * sees only this launch. Sticky errors survive this and resurface. */
    (void)cudaGetLastError();
    ft_copy_kernel<<<(unsigned)blocks, FT_COPY_THREADS, 0, (cudaStream_t)stream>>>(d, numel, plan);
    return ft_cuda_check(cudaGetLastError(), "copy_strided kernel launch");
}
