#include "core/alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/cuda.h"

#define ALIGN 64
#define LARGE (1u << 20)
#define HUGE_PAGE (2u << 20)

typedef struct {
    void *ptr;
    size_t size;
} cached_block;

typedef struct {
    ft_mem_stats stats;
    cached_block *cache;
    size_t ncache, capcache;
} pool_state;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pool_state host_pool, pinned_pool, cuda_pools[FT_MAX_CUDA_DEVICES];

/* Zero-byte tensors still get a distinct, aligned, non-NULL address. */
static _Alignas(ALIGN) char zero_sized[ALIGN];

static pool_state *state_of(ft_mem_pool pool) {
    switch (pool.kind) {
    case FT_MEM_PINNED: return &pinned_pool;
    case FT_MEM_CUDA: return &cuda_pools[pool.device];
    default: return &host_pool;
    }
}

static bool is_cached_size(ft_mem_pool pool, size_t size) { return pool.kind != FT_MEM_HOST || size >= LARGE; }

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static size_t granted_size(ft_mem_pool pool, size_t nbytes) {
    if (nbytes >= LARGE)
        return round_up(nbytes, HUGE_PAGE);
    return round_up(nbytes, pool.kind == FT_MEM_CUDA ? 512 : ALIGN);
}

/* A 2 MiB-aligned anonymous mapping, so that transparent huge pages can back it. */
static void *map_huge(size_t size) {
    size_t span = size + HUGE_PAGE;
    char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *aligned = (char *)round_up((uintptr_t)p, HUGE_PAGE);
    if (aligned > p)
        munmap(p, (size_t)(aligned - p));
    size_t tail = (size_t)(p + span - (aligned + size));
    if (tail)
        munmap(aligned + size, tail);
    madvise(aligned, size, MADV_HUGEPAGE);
    return aligned;
}

static ft_status system_alloc(void **ptr, size_t size, ft_mem_pool pool) {
    switch (pool.kind) {
    case FT_MEM_HOST:
        *ptr = size >= LARGE ? map_huge(size) : aligned_alloc(ALIGN, size);
        return *ptr ? FT_OK : ft_fail(FT_ERR_NOMEM, "out of host memory allocating %zu bytes", size);
    case FT_MEM_PINNED:
        if (ft_cuda())
            return ft_cuda()->host_alloc(ptr, size);
        /* Without CUDA, page-locked memory is memory the kernel will not page out. */
        *ptr = map_huge(size);
        if (!*ptr)
            return ft_fail(FT_ERR_NOMEM, "out of host memory allocating %zu pinned bytes", size);
        if (mlock(*ptr, size) != 0) {
            int err = errno;
            munmap(*ptr, size);
            return ft_fail(FT_ERR_NOMEM, "cannot page-lock %zu bytes: %s (raise RLIMIT_MEMLOCK, ulimit -l)", size,
                           strerror(err));
        }
        return FT_OK;
    case FT_MEM_CUDA:
        return ft_cuda()->malloc(ptr, size, pool.device);
    }
    return ft_fail(FT_ERR_RUNTIME, "unknown memory kind %d", (int)pool.kind);
}

static void system_free(void *ptr, size_t size, ft_mem_pool pool) {
    switch (pool.kind) {
    case FT_MEM_HOST:
        if (size >= LARGE)
            munmap(ptr, size);
        else
            free(ptr);
        break;
    case FT_MEM_PINNED:
        if (ft_cuda())
            ft_cuda()->host_free(ptr);
        else
            munmap(ptr, size); /* also unlocks */
        break;
    case FT_MEM_CUDA:
        ft_cuda()->free(ptr, pool.device);
        break;
    }
}

/* Takes the smallest cached block that fits and is not more than 25% larger. */
static bool take_cached(pool_state *st, size_t size, void **ptr, size_t *granted) {
    size_t best = st->ncache;
    for (size_t i = 0; i < st->ncache; i++) {
        size_t s = st->cache[i].size;
        if (s >= size && size >= s - s / 5 && (best == st->ncache || s < st->cache[best].size))
            best = i;
    }
    if (best == st->ncache)
        return false;
    *ptr = st->cache[best].ptr;
    *granted = st->cache[best].size;
    st->cache[best] = st->cache[--st->ncache];
    return true;
}

static void drain(pool_state *st, ft_mem_pool pool) {
    for (size_t i = 0; i < st->ncache; i++) {
        system_free(st->cache[i].ptr, st->cache[i].size, pool);
        st->stats.reserved -= (int64_t)st->cache[i].size;
    }
    st->ncache = 0;
}

ft_status ft_alloc(void **ptr, size_t *granted, size_t nbytes, ft_mem_pool pool) {
    if (pool.kind == FT_MEM_CUDA)
        FT_TRY(ft_cuda_check_device(pool.device));
    if (nbytes == 0) {
        *ptr = zero_sized;
        *granted = 0;
        return FT_OK;
    }
    if (nbytes > (size_t)INT64_MAX / 2)
        return ft_fail(FT_ERR_NOMEM, "cannot allocate %zu bytes", nbytes);
    size_t size = granted_size(pool, nbytes);
    pthread_mutex_lock(&lock);
    pool_state *st = state_of(pool);
    ft_status s = FT_OK;
    if (!(is_cached_size(pool, size) && take_cached(st, size, ptr, granted))) {
        s = system_alloc(ptr, size, pool);
        if (s != FT_OK && st->ncache) {
            /* Memory held in the cache may be what is missing: give it back and retry. */
            drain(st, pool);
            s = system_alloc(ptr, size, pool);
        }
        if (s == FT_OK) {
            *granted = size;
            st->stats.reserved += (int64_t)size;
        }
    }
    if (s == FT_OK) {
        st->stats.allocated += (int64_t)*granted;
        st->stats.num_allocs++;
        if (st->stats.allocated > st->stats.peak)
            st->stats.peak = st->stats.allocated;
    }
    pthread_mutex_unlock(&lock);
    return s;
}

void ft_free(void *ptr, size_t granted, ft_mem_pool pool) {
    if (ptr == zero_sized)
        return;
    pthread_mutex_lock(&lock);
    pool_state *st = state_of(pool);
    st->stats.allocated -= (int64_t)granted;
    bool keep = is_cached_size(pool, granted);
    if (keep && st->ncache == st->capcache) {
        size_t cap = st->capcache ? st->capcache * 2 : 16;
        cached_block *grown = realloc(st->cache, cap * sizeof *grown);
        if (grown) {
            st->cache = grown;
            st->capcache = cap;
        } else {
            keep = false;
        }
    }
    if (keep) {
        st->cache[st->ncache++] = (cached_block){ptr, granted};
    } else {
        system_free(ptr, granted, pool);
        st->stats.reserved -= (int64_t)granted;
    }
    pthread_mutex_unlock(&lock);
}

ft_mem_stats ft_memory_stats(ft_mem_pool pool) {
    pthread_mutex_lock(&lock);
    ft_mem_stats s = state_of(pool)->stats;
    pthread_mutex_unlock(&lock);
    return s;
}

void ft_reset_peak_memory_stats(ft_mem_pool pool) {
    pthread_mutex_lock(&lock);
    pool_state *st = state_of(pool);
    st->stats.peak = st->stats.allocated;
    pthread_mutex_unlock(&lock);
}

void ft_empty_cache(void) {
    pthread_mutex_lock(&lock);
    drain(&host_pool, (ft_mem_pool){FT_MEM_HOST, 0});
    drain(&pinned_pool, (ft_mem_pool){FT_MEM_PINNED, 0});
    for (int d = 0; d < FT_MAX_CUDA_DEVICES; d++)
        drain(&cuda_pools[d], (ft_mem_pool){FT_MEM_CUDA, d});
    pthread_mutex_unlock(&lock);
}
