/* What the translation units of libfasttrain_cuda.so share with each other.
 *
 * The library exports ft_cuda_open and nothing else: the core reaches every
 * other function through the table it returns. Functions that one .cu file
 * defines and another calls therefore cannot be static, and are hidden
 * instead so that they stay out of the dynamic symbol table. */
#ifndef FT_CUDA_BACKEND_H
#define FT_CUDA_BACKEND_H

#include <cuda_runtime.h>

#include "core/cuda.h"

#define FT_CUDA_HIDDEN __attribute__((visibility("hidden")))

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

#endif
