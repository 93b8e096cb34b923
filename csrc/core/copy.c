/* Strided copies with dtype conversion on the CPU.
 *
 * A run of elements is converted through a small buffer of "wide" values
 * (int64, uint64 or double) that stays in L1: the source dtype decides the
 * wide kind, the destination converts from it. 13 loads and 13 stores cover
 * every pair of real dtypes, instead of 169 pairwise loops. The rules are
 * kernels/cast.h's, which cuda/copy.cu converts through element by element;
 * tests compare both with NumPy. */
#include "core/copy.h"

#include <omp.h>
#include <string.h>

#include "core/tensor.h"
#include "kernels/cast.h"
#include "kernels/convert.h"
#include "kernels/simd.h"

/* The wide kinds are ft_scalar's, so that a scalar is a run of one. */
enum { WIDE_I64 = FT_SCALAR_INT, WIDE_U64 = FT_SCALAR_UINT, WIDE_F64 = FT_SCALAR_FLOAT };

typedef union {
    int64_t i;
    uint64_t u;
    double f;
} wide;

#define RUN 256
/* Copies smaller than this run on one thread: a parallel region costs about
 * as much as copying 64 KiB. */
#define PARALLEL_BYTES (1 << 18)

ft_status ft_copy_check_dtypes(ft_dtype dst, ft_dtype src) {
    if (dst != src && (ft_dtype_is_complex(dst) || ft_dtype_is_complex(src)))
        return ft_fail(FT_ERR_DTYPE, "cannot convert %s to %s: complex dtypes are storage-only in fasttrain",
                       ft_dtype_get(src)->name, ft_dtype_get(dst)->name);
    return FT_OK;
}

#define LOAD(T, field, expr)                                   \
    for (int64_t k = 0; k < n; k++) {                          \
        T x;                                                   \
        memcpy(&x, src + k * ss, sizeof x);                    \
        w[k].field = (expr);                                   \
    }

static int load(ft_dtype dt, wide *w, const char *src, int64_t ss, int64_t n) {
    switch (dt) {
    case FT_BOOL: LOAD(uint8_t, f, x != 0) return WIDE_F64;
    case FT_UINT8: LOAD(uint8_t, i, x) return WIDE_I64;
    case FT_INT8: LOAD(int8_t, i, x) return WIDE_I64;
    case FT_INT16: LOAD(int16_t, i, x) return WIDE_I64;
    case FT_INT32: LOAD(int32_t, i, x) return WIDE_I64;
    case FT_INT64: LOAD(int64_t, i, x) return WIDE_I64;
    case FT_UINT16: LOAD(uint16_t, i, x) return WIDE_I64;
    case FT_UINT32: LOAD(uint32_t, i, x) return WIDE_I64;
    case FT_UINT64: LOAD(uint64_t, u, x) return WIDE_U64;
    case FT_FLOAT16: LOAD(uint16_t, f, ft_f16_to_f32(x)) return WIDE_F64;
    case FT_BFLOAT16: LOAD(uint16_t, f, ft_bf16_to_f32(x)) return WIDE_F64;
    case FT_FLOAT32: LOAD(float, f, x) return WIDE_F64;
    default: LOAD(double, f, x) return WIDE_F64;
    }
}

/* Stores T from each wide kind; FROM_I/FROM_U/FROM_F are expressions of v. */
#define STORE(T, FROM_I, FROM_U, FROM_F)                               \
    do {                                                               \
        for (int64_t k = 0; k < n; k++) {                              \
            T y;                                                       \
            if (kind == WIDE_I64) {                                    \
                int64_t v = w[k].i;                                    \
                y = (T)(FROM_I);                                       \
            } else if (kind == WIDE_U64) {                             \
                uint64_t v = w[k].u;                                   \
                y = (T)(FROM_U);                                       \
            } else {                                                   \
                double v = w[k].f;                                     \
                y = (T)(FROM_F);                                       \
            }                                                          \
            memcpy(dst + k * ds, &y, sizeof y);                        \
        }                                                              \
    } while (0)

#define STORE_INT(T, LO, HI) STORE(T, v, v, ft_f64_to_range(v, LO, HI))

static void store(ft_dtype dt, char *dst, int64_t ds, const wide *w, int kind, int64_t n) {
    switch (dt) {
    case FT_BOOL: STORE(uint8_t, v != 0, v != 0, v != 0); break;
    case FT_UINT8: STORE_INT(uint8_t, 0, UINT8_MAX); break;
    case FT_INT8: STORE_INT(int8_t, INT8_MIN, INT8_MAX); break;
    case FT_INT16: STORE_INT(int16_t, INT16_MIN, INT16_MAX); break;
    case FT_INT32: STORE_INT(int32_t, INT32_MIN, INT32_MAX); break;
    case FT_INT64: STORE_INT(int64_t, INT64_MIN, INT64_MAX); break;
    case FT_UINT16: STORE_INT(uint16_t, 0, UINT16_MAX); break;
    case FT_UINT32: STORE_INT(uint32_t, 0, UINT32_MAX); break;
    case FT_UINT64: STORE(uint64_t, v, v, ft_f64_to_u64(v)); break;
    case FT_FLOAT16: STORE(uint16_t, ft_f64_to_f16((double)v), ft_f64_to_f16((double)v), ft_f64_to_f16(v)); break;
    case FT_BFLOAT16:
        STORE(uint16_t, ft_f32_to_bf16((float)v), ft_f32_to_bf16((float)v), ft_f32_to_bf16((float)v));
        break;
    case FT_FLOAT32: STORE(float, v, v, v); break;
    default: STORE(double, v, v, v); break;
    }
}

void ft_store_scalar(void *dst, ft_dtype dt, ft_scalar v) {
    wide w = {.i = v.i};
    store(dt, dst, 0, &w, v.kind, 1);
}

/* Same-dtype runs move whole items; the fixed sizes let the compiler emit
 * plain loads and stores. */
#define MOVE(T)                                                  \
    for (int64_t k = 0; k < n; k++)                              \
        memcpy(dst + k * ds, src + k * ss, sizeof(T));

static void move_items(char *dst, int64_t ds, const char *src, int64_t ss, int64_t n, size_t itemsize) {
    if (ds == ss && ss == (int64_t)itemsize) {
        memcpy(dst, src, (size_t)n * itemsize);
        return;
    }
    typedef struct {
        char b[16];
    } item16;
    switch (itemsize) {
    case 1: MOVE(uint8_t) break;
    case 2: MOVE(uint16_t) break;
    case 4: MOVE(uint32_t) break;
    case 8: MOVE(uint64_t) break;
    default: MOVE(item16) break;
    }
}

/* The conversions of mixed precision (batches, weights, activations), on dense runs. */
FT_VEC_CLONES void ft_bf16_to_f32_run(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = ft_bf16_to_f32(src[i]);
}

FT_VEC_CLONES void ft_f32_to_bf16_run(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = ft_f32_to_bf16(src[i]);
}

static void copy_run(const ft_copy_desc *d, char *dst, int64_t ds, const char *src, int64_t ss, int64_t n) {
    if (d->dst_dtype == d->src_dtype) {
        move_items(dst, ds, src, ss, n, ft_dtype_get(d->src_dtype)->itemsize);
        return;
    }
    bool to_bf16 = d->dst_dtype == FT_BFLOAT16 && d->src_dtype == FT_FLOAT32;
    if ((to_bf16 || (d->dst_dtype == FT_FLOAT32 && d->src_dtype == FT_BFLOAT16)) &&
        ds == (int64_t)ft_dtype_get(d->dst_dtype)->itemsize && ss == (int64_t)ft_dtype_get(d->src_dtype)->itemsize) {
        if (to_bf16)
            ft_f32_to_bf16_run((uint16_t *)dst, (const float *)src, n);
        else
            ft_bf16_to_f32_run((float *)dst, (const uint16_t *)src, n);
        return;
    }
    wide w[RUN];
    for (int64_t k = 0; k < n; k += RUN) {
        int64_t m = n - k < RUN ? n - k : RUN;
        int kind = load(d->src_dtype, w, src + k * ss, ss, m);
        store(d->dst_dtype, dst + k * ds, ds, w, kind, m);
    }
}

void ft_copy_coalesce(ft_copy_desc *d) {
    /* in dst's memory order, so that any dense layout (channels-last too) merges into one run */
    int order[FT_MAX_DIMS];
    ft_copy_desc in = *d;
    for (int i = 0; i < d->ndim; i++)
        order[i] = i;
    ft_sort_dims_by_stride(order, d->ndim, in.shape, in.dst_strides);
    for (int i = 0; i < d->ndim; i++) {
        d->shape[i] = in.shape[order[i]];
        d->dst_strides[i] = in.dst_strides[order[i]];
        d->src_strides[i] = in.src_strides[order[i]];
    }
    int nd = 0;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] == 1)
            continue;
        if (nd > 0 && d->dst_strides[nd - 1] == d->dst_strides[i] * d->shape[i] &&
            d->src_strides[nd - 1] == d->src_strides[i] * d->shape[i]) {
            d->shape[nd - 1] *= d->shape[i];
            d->dst_strides[nd - 1] = d->dst_strides[i];
            d->src_strides[nd - 1] = d->src_strides[i];
            continue;
        }
        d->shape[nd] = d->shape[i];
        d->dst_strides[nd] = d->dst_strides[i];
        d->src_strides[nd] = d->src_strides[i];
        nd++;
    }
    if (nd == 0) { /* a single element */
        d->shape[0] = 1;
        d->dst_strides[0] = d->src_strides[0] = 1;
        nd = 1;
    }
    d->ndim = nd;
}

/* Copies flat elements [begin, end) of the (coalesced) iteration space. */
static void copy_range(const ft_copy_desc *d, int64_t begin, int64_t end) {
    int nd = d->ndim, last = nd - 1;
    int64_t dsz = (int64_t)ft_dtype_get(d->dst_dtype)->itemsize;
    int64_t ssz = (int64_t)ft_dtype_get(d->src_dtype)->itemsize;
    int64_t idx[FT_MAX_DIMS];
    int64_t doff = 0, soff = 0, rest = begin;
    for (int i = last; i >= 0; i--) {
        idx[i] = rest % d->shape[i];
        rest /= d->shape[i];
        doff += idx[i] * d->dst_strides[i];
        soff += idx[i] * d->src_strides[i];
    }
    int64_t pos = begin;
    while (pos < end) {
        int64_t n = d->shape[last] - idx[last];
        if (n > end - pos)
            n = end - pos;
        copy_run(d, (char *)d->dst + doff * dsz, d->dst_strides[last] * dsz, (const char *)d->src + soff * ssz,
                 d->src_strides[last] * ssz, n);
        pos += n;
        idx[last] += n;
        doff += n * d->dst_strides[last];
        soff += n * d->src_strides[last];
        for (int i = last; i > 0 && idx[i] == d->shape[i]; i--) {
            doff += d->dst_strides[i - 1] - d->shape[i] * d->dst_strides[i];
            soff += d->src_strides[i - 1] - d->shape[i] * d->src_strides[i];
            idx[i] = 0;
            idx[i - 1]++;
        }
    }
}

static void copy_cpu(const ft_copy_desc *desc, bool parallel) {
    ft_copy_desc d = *desc;
    ft_copy_coalesce(&d);
    int64_t total = 1;
    for (int i = 0; i < d.ndim; i++)
        total *= d.shape[i];
    if (total == 0)
        return;
    size_t itemsize = ft_dtype_get(d.dst_dtype)->itemsize;
    if (!parallel || (size_t)total * itemsize < PARALLEL_BYTES || omp_get_max_threads() == 1) {
        copy_range(&d, 0, total);
        return;
    }
#pragma omp parallel
    {
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        copy_range(&d, total * t / nt, total * (t + 1) / nt);
    }
}

void ft_copy_cpu(const ft_copy_desc *d) { copy_cpu(d, true); }

void ft_copy_cpu_serial(const ft_copy_desc *d) { copy_cpu(d, false); }
