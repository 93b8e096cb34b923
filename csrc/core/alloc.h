/* Memory for tensors: one caching allocator per memory kind.
 *
 * Host blocks are 64-byte aligned. Blocks of 1 MiB and more are mapped on
 * 2 MiB boundaries with huge-page advice and, once freed, kept for reuse:
 * first touch of fresh pages costs about 3 GB/s here, so a training step
 * that frees and reallocates its buffers must not give them back to the OS.
 * Page-locked host memory and CUDA device memory are always cached, since
 * their allocation calls synchronise and are slow. */
#ifndef FT_CORE_ALLOC_H
#define FT_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/status.h"

typedef enum { FT_MEM_HOST, FT_MEM_PINNED, FT_MEM_CUDA } ft_mem_kind;

typedef struct {
    ft_mem_kind kind;
    int device; /* CUDA device index for FT_MEM_CUDA, else 0 */
} ft_mem_pool;

typedef struct {
    int64_t allocated; /* bytes held by live blocks */
    int64_t peak;      /* highest `allocated` since start or the last reset */
    int64_t reserved;  /* bytes obtained from the system: live plus cached */
    int64_t num_allocs;
} ft_mem_stats;

/* *ptr receives a block of at least nbytes (rounded up; *granted tells how
 * many, to be passed back to ft_free). nbytes == 0 gives a valid pointer. */
ft_status ft_alloc(void **ptr, size_t *granted, size_t nbytes, ft_mem_pool pool);
void ft_free(void *ptr, size_t granted, ft_mem_pool pool);

ft_mem_stats ft_memory_stats(ft_mem_pool pool);
void ft_reset_peak_memory_stats(ft_mem_pool pool);

/* Returns every cached block of every pool to the system. */
void ft_empty_cache(void);

#endif
