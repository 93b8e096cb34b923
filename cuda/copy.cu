/* Strided copy with dtype cast, the CUDA side of the core's copy/cast.
 *
 * Each element is loaded as a "wide" value (double, int64 or uint64 by the
 * source's kind), then stored converted to the destination dtype. Going
 * through one wide type per kind keeps the kernel to two switches instead of
 * a kernel per (src, dst) pair, and fixes the cast rules in one place; they
 * must give the CPU's results bit for bit:
 *   - bool, float16, bfloat16, float32, float64 load as double; int8..int64
 *     and uint8..uint32 as int64; uint64 as uint64.
 *   - to bool: value != 0, so NaN is true.
 *   - to an integer from int64/uint64: C conversion, which wraps.
 *   - to an integer from double: NaN is 0; saturate to int64 (to [0,
 *     UINT64_MAX] for uint64), then C conversion to the narrower type.
 *   - to float16: ft_f64_to_f16; to bfloat16: ft_f32_to_bf16((float)v);
 *     integers reach float16 and float64 through double, float32 and
 *     bfloat16 by one C conversion to float (through double, an int64 above
 *     2^53 would be rounded twice).
 * A same-dtype copy moves the bytes unchanged, which is also the only copy
 * complex dtypes allow.
 *
 * The ft_wide helpers use only C and FT_HD so that they can move to a header
 * under csrc/kernels/ shared with the CPU loops. */
#include "backend.h"
#include "kernels/convert.h"

/* ---- the cast rules ---------------------------------------------------- */

typedef enum { FT_WIDE_F64, FT_WIDE_I64, FT_WIDE_U64 } ft_wide_kind;

typedef struct {
    ft_wide_kind kind;
    union {
        double f;
        int64_t i;
        uint64_t u;
    } v;
} ft_wide;

static inline FT_HD ft_wide ft_wide_f64(double f) {
    ft_wide w;
    w.kind = FT_WIDE_F64;
    w.v.f = f;
    return w;
}

static inline FT_HD ft_wide ft_wide_i64(int64_t i) {
    ft_wide w;
    w.kind = FT_WIDE_I64;
    w.v.i = i;
    return w;
}

static inline FT_HD ft_wide ft_wide_u64(uint64_t u) {
    ft_wide w;
    w.kind = FT_WIDE_U64;
    w.v.u = u;
    return w;
}

/* `p` points at one element of dtype `dt`, which is neither complex type. */
static inline FT_HD ft_wide ft_load_wide(const void *p, ft_dtype dt) {
    switch (dt) {
    case FT_BOOL:
        /* Read as a byte: a bool holding anything but 0 or 1 is undefined. */
        return ft_wide_f64(*(const uint8_t *)p != 0 ? 1.0 : 0.0);
    case FT_UINT8: return ft_wide_i64(*(const uint8_t *)p);
    case FT_INT8: return ft_wide_i64(*(const int8_t *)p);
    case FT_INT16: return ft_wide_i64(*(const int16_t *)p);
    case FT_INT32: return ft_wide_i64(*(const int32_t *)p);
    case FT_INT64: return ft_wide_i64(*(const int64_t *)p);
    case FT_UINT16: return ft_wide_i64(*(const uint16_t *)p);
    case FT_UINT32: return ft_wide_i64(*(const uint32_t *)p);
    case FT_UINT64: return ft_wide_u64(*(const uint64_t *)p);
    case FT_FLOAT16: return ft_wide_f64(ft_f16_to_f32(*(const uint16_t *)p));
    case FT_BFLOAT16: return ft_wide_f64(ft_bf16_to_f32(*(const uint16_t *)p));
    case FT_FLOAT32: return ft_wide_f64(*(const float *)p);
    case FT_FLOAT64: return ft_wide_f64(*(const double *)p);
    default: return ft_wide_i64(0); /* complex: the caller never gets here */
    }
}

static inline FT_HD double ft_wide_as_f64(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return (double)w.v.i;
    case FT_WIDE_U64: return (double)w.v.u;
    default: return w.v.f;
    }
}

static inline FT_HD float ft_wide_as_f32(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return (float)w.v.i;
    case FT_WIDE_U64: return (float)w.v.u;
    default: return (float)w.v.f;
    }
}

/* Saturating first keeps the double -> integer conversion defined (C leaves
 * out-of-range values undefined); the narrowing that follows then wraps. */
static inline FT_HD int64_t ft_wide_as_i64(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return w.v.i;
    case FT_WIDE_U64: return (int64_t)w.v.u;
    default:
        if (w.v.f != w.v.f) /* NaN */
            return 0;
        /* 2^63 is exact in double, INT64_MAX is not */
        if (w.v.f >= 9223372036854775808.0)
            return INT64_MAX;
        if (w.v.f <= -9223372036854775808.0)
            return INT64_MIN;
        return (int64_t)w.v.f;
    }
}

static inline FT_HD uint64_t ft_wide_as_u64(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return (uint64_t)w.v.i;
    case FT_WIDE_U64: return w.v.u;
    default:
        /* NaN and everything down from (-1, 0] give 0 */
        if (!(w.v.f > 0))
            return 0;
        if (w.v.f >= 18446744073709551616.0) /* 2^64 */
            return UINT64_MAX;
        return (uint64_t)w.v.f;
    }
}

static inline FT_HD bool ft_wide_nonzero(ft_wide w) {
    switch (w.kind) {
    case FT_WIDE_I64: return w.v.i != 0;
    case FT_WIDE_U64: return w.v.u != 0;
    default: return w.v.f != 0; /* true for NaN */
    }
}

/* `p` points at one element of dtype `dt`, which is neither complex type. */
static inline FT_HD void ft_store_wide(void *p, ft_dtype dt, ft_wide w) {
    switch (dt) {
    case FT_BOOL: *(uint8_t *)p = ft_wide_nonzero(w) ? 1 : 0; break;
    case FT_UINT8: *(uint8_t *)p = (uint8_t)ft_wide_as_i64(w); break;
    case FT_INT8: *(int8_t *)p = (int8_t)ft_wide_as_i64(w); break;
    case FT_INT16: *(int16_t *)p = (int16_t)ft_wide_as_i64(w); break;
    case FT_INT32: *(int32_t *)p = (int32_t)ft_wide_as_i64(w); break;
    case FT_INT64: *(int64_t *)p = ft_wide_as_i64(w); break;
    case FT_UINT16: *(uint16_t *)p = (uint16_t)ft_wide_as_i64(w); break;
    case FT_UINT32: *(uint32_t *)p = (uint32_t)ft_wide_as_i64(w); break;
    case FT_UINT64: *(uint64_t *)p = ft_wide_as_u64(w); break;
    case FT_FLOAT16: *(uint16_t *)p = ft_f64_to_f16(ft_wide_as_f64(w)); break;
    case FT_BFLOAT16: *(uint16_t *)p = ft_f32_to_bf16(ft_wide_as_f32(w)); break;
    case FT_FLOAT32: *(float *)p = ft_wide_as_f32(w); break;
    case FT_FLOAT64: *(double *)p = ft_wide_as_f64(w); break;
    default: break; /* complex: the caller never gets here */
    }
}

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
