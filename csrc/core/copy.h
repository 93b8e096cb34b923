/* Strided copies with dtype conversion, the one loop behind copy_, fill_,
 * contiguous(), to() and the bridge. */
#ifndef FT_CORE_COPY_H
#define FT_CORE_COPY_H

#include <stdint.h>

#include "core/device.h"
#include "core/dtype.h"
#include "core/status.h"

/* A strided copy with dtype cast between two buffers on one device.
 * Strides are in elements; the shape is the same on both sides. */
typedef struct {
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    void *dst;
    const void *src;
    int64_t dst_strides[FT_MAX_DIMS];
    int64_t src_strides[FT_MAX_DIMS];
    ft_dtype dst_dtype, src_dtype;
} ft_copy_desc;

/* A scalar as the user gave it, before conversion to a tensor's dtype. */
typedef struct {
    enum { FT_SCALAR_INT, FT_SCALAR_UINT, FT_SCALAR_FLOAT } kind;
    union {
        int64_t i;
        uint64_t u;
        double f;
    };
} ft_scalar;

/* FT_ERR_DTYPE when the conversion src -> dst is not defined (complex types
 * are storage-only: they copy only to themselves). */
ft_status ft_copy_check_dtypes(ft_dtype dst, ft_dtype src);

/* Orders the dimensions as dst lies in memory, merges those contiguous on
 * both sides and drops size-1 ones. */
void ft_copy_coalesce(ft_copy_desc *d);

/* *dst (of dtype dt) = v, with the conversion rules of the copies. */
void ft_store_scalar(void *dst, ft_dtype dt, ft_scalar v);

/* Runs d on the CPU, split over the thread pool for large copies. */
void ft_copy_cpu(const ft_copy_desc *d);

/* Runs d on the CPU in the calling thread only (the data loader's workers
 * run beside the compute pool and must not start OpenMP teams). */
void ft_copy_cpu_serial(const ft_copy_desc *d);

#endif
