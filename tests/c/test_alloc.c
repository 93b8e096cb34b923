/* The caching allocator of core/alloc.h: reuse of freed large blocks, the
 * statistics, alignment, zero-byte and impossible sizes, and page-locked
 * memory without CUDA (the mlock path). */
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include "check.h"
#include "core/alloc.h"

static const ft_mem_pool HOST = {FT_MEM_HOST, 0};
static const ft_mem_pool PINNED = {FT_MEM_PINNED, 0};
#define MiB ((size_t)1 << 20)

static int aligned(const void *p, size_t to) { return (uintptr_t)p % to == 0; }

static void test_large_block_reuse(void) {
    ft_empty_cache();
    ft_mem_stats s0 = ft_memory_stats(HOST);
    CHECK(s0.reserved == s0.allocated);

    size_t n = 3 * MiB + 1, g1 = 0, g2 = 0, g3 = 0;
    void *p1 = NULL, *p2 = NULL, *p3 = NULL;
    CHECK_OK(ft_alloc(&p1, &g1, n, HOST));
    CHECK(p1 && g1 >= n && aligned(p1, 64) && aligned(p1, 2 * MiB)); /* mapped on 2 MiB boundaries */
    memset(p1, 0xab, n);
    ft_mem_stats s1 = ft_memory_stats(HOST);
    CHECK(s1.allocated == s0.allocated + (int64_t)g1);
    CHECK(s1.reserved == s0.reserved + (int64_t)g1);
    CHECK(s1.peak >= s1.allocated);
    CHECK(s1.num_allocs == s0.num_allocs + 1);

    ft_free(p1, g1, HOST);
    ft_mem_stats s2 = ft_memory_stats(HOST);
    CHECK(s2.allocated == s0.allocated);
    CHECK(s2.reserved == s0.reserved + (int64_t)g1); /* kept for reuse */

    CHECK_OK(ft_alloc(&p2, &g2, n, HOST));
    CHECK(p2 == p1 && g2 == g1);
    ft_mem_stats s3 = ft_memory_stats(HOST);
    CHECK(s3.allocated == s0.allocated + (int64_t)g1);
    CHECK(s3.reserved == s2.reserved); /* nothing new from the system */
    CHECK(s3.num_allocs == s0.num_allocs + 2);
    memset(p2, 0xcd, n);

    /* With the cached block in use, a second one is new memory. */
    CHECK_OK(ft_alloc(&p3, &g3, n, HOST));
    CHECK(p3 != p2 && g3 >= n);
    ft_mem_stats s4 = ft_memory_stats(HOST);
    CHECK(s4.reserved == s0.reserved + (int64_t)(g1 + g3));
    CHECK(s4.allocated == s0.allocated + (int64_t)(g1 + g3));
    ft_free(p2, g2, HOST);
    ft_free(p3, g3, HOST);
    ft_mem_stats s5 = ft_memory_stats(HOST);
    CHECK(s5.allocated == s0.allocated && s5.reserved == s0.reserved + (int64_t)(g1 + g3));

    ft_empty_cache();
    ft_mem_stats s6 = ft_memory_stats(HOST);
    CHECK(s6.reserved == s6.allocated && s6.allocated == s0.allocated);
}

static void test_empty_cache_keeps_live_blocks(void) {
    ft_empty_cache();
    ft_mem_stats s0 = ft_memory_stats(HOST);
    void *live = NULL, *cached = NULL, *small = NULL;
    size_t gl = 0, gc = 0, gs = 0;
    CHECK_OK(ft_alloc(&live, &gl, 2 * MiB, HOST));
    CHECK_OK(ft_alloc(&cached, &gc, 8 * MiB, HOST));
    CHECK_OK(ft_alloc(&small, &gs, 1000, HOST));
    ft_free(cached, gc, HOST);
    ft_mem_stats s1 = ft_memory_stats(HOST);
    CHECK(s1.reserved == s0.reserved + (int64_t)(gl + gc + gs));
    CHECK(s1.allocated == s0.allocated + (int64_t)(gl + gs));
    ft_empty_cache();
    ft_mem_stats s2 = ft_memory_stats(HOST);
    CHECK(s2.reserved == s2.allocated);
    CHECK(s2.allocated == s0.allocated + (int64_t)(gl + gs));
    memset(live, 1, 2 * MiB); /* still ours */
    memset(small, 1, 1000);

    /* A small block (< 1 MiB) goes straight back to the system. */
    ft_free(small, gs, HOST);
    ft_mem_stats s3 = ft_memory_stats(HOST);
    CHECK(s3.allocated == s0.allocated + (int64_t)gl && s3.reserved == s3.allocated);
    ft_free(live, gl, HOST);
    ft_empty_cache();
    ft_mem_stats s4 = ft_memory_stats(HOST);
    CHECK(s4.allocated == s0.allocated && s4.reserved == s0.reserved);
}

static void test_peak(void) {
    ft_reset_peak_memory_stats(HOST);
    ft_mem_stats s0 = ft_memory_stats(HOST);
    CHECK(s0.peak == s0.allocated);
    void *a = NULL, *b = NULL, *c = NULL;
    size_t ga = 0, gb = 0, gc = 0;
    CHECK_OK(ft_alloc(&a, &ga, 2 * MiB, HOST));
    CHECK_OK(ft_alloc(&b, &gb, 4 * MiB, HOST));
    int64_t high = s0.allocated + (int64_t)(ga + gb);
    CHECK(ft_memory_stats(HOST).peak == high);
    ft_free(b, gb, HOST);
    CHECK_OK(ft_alloc(&c, &gc, 1000, HOST));
    ft_mem_stats s1 = ft_memory_stats(HOST);
    CHECK(s1.peak == high && s1.allocated == s0.allocated + (int64_t)(ga + gc));
    ft_free(a, ga, HOST);
    ft_free(c, gc, HOST);
    ft_mem_stats s2 = ft_memory_stats(HOST);
    CHECK(s2.peak == high && s2.allocated == s0.allocated);
    ft_reset_peak_memory_stats(HOST);
    CHECK(ft_memory_stats(HOST).peak == s0.allocated);
    ft_empty_cache();
}

static void test_alignment_and_sizes(void) {
    const size_t sizes[] = {1, 7, 63, 64, 65, 100, 1000, 4096, 65537, MiB - 1, MiB, MiB + 1, 5 * MiB + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL;
        size_t g = 0;
        ft_mem_stats s0 = ft_memory_stats(HOST);
        CHECK_OK(ft_alloc(&p, &g, sizes[i], HOST));
        CHECKF(p && aligned(p, 64) && g >= sizes[i], "size %zu: %p granted %zu", sizes[i], p, g);
        CHECK(ft_memory_stats(HOST).allocated == s0.allocated + (int64_t)g);
        ((char *)p)[0] = 1;
        ((char *)p)[sizes[i] - 1] = 2;
        ft_free(p, g, HOST);
        CHECK(ft_memory_stats(HOST).allocated == s0.allocated);
    }
    ft_empty_cache();
}

static void test_zero_bytes(void) {
    ft_mem_stats s0 = ft_memory_stats(HOST);
    void *p = NULL, *q = NULL;
    size_t g = 123, h = 123;
    CHECK_OK(ft_alloc(&p, &g, 0, HOST));
    CHECK_OK(ft_alloc(&q, &h, 0, PINNED));
    CHECK(p != NULL && q != NULL && aligned(p, 64));
    CHECK(ft_memory_stats(HOST).allocated == s0.allocated);
    ft_free(p, g, HOST);
    ft_free(q, h, PINNED);
    CHECK(ft_memory_stats(HOST).allocated == s0.allocated);
}

static void test_impossible_sizes(void) {
    const size_t sizes[] = {(size_t)1 << 62, SIZE_MAX, (size_t)INT64_MAX, (size_t)1 << 61, ((size_t)1 << 50) * 3};
    for (int k = 0; k < 2; k++) {
        ft_mem_pool pool = k ? PINNED : HOST;
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            ft_mem_stats s0 = ft_memory_stats(pool);
            void *p = NULL;
            size_t g = 0;
            ft_fail(FT_OK, "%s", "");
            CHECK_STATUS(ft_alloc(&p, &g, sizes[i], pool), FT_ERR_NOMEM);
            CHECKF(ft_last_error()[0] != '\0', "size %zu: no message", sizes[i]);
            ft_mem_stats s1 = ft_memory_stats(pool);
            CHECK(s1.allocated == s0.allocated && s1.num_allocs == s0.num_allocs && s1.reserved >= s1.allocated);
        }
    }
}

/* Without CUDA, pinned memory is mlock()ed: it works, or fails cleanly with
 * FT_ERR_NOMEM when RLIMIT_MEMLOCK forbids it. */
static void try_pinned(size_t n) {
    ft_mem_stats s0 = ft_memory_stats(PINNED);
    void *p = NULL, *q = NULL;
    size_t g = 0, h = 0;
    ft_status st = ft_alloc(&p, &g, n, PINNED);
    CHECKF(st == FT_OK || st == FT_ERR_NOMEM, "pinned %zu bytes: status %d (%s)", n, (int)st, ft_last_error());
    if (st != FT_OK) {
        printf("  pinned %zu bytes refused: %s\n", n, ft_last_error());
        CHECK(ft_last_error()[0] != '\0');
        ft_mem_stats s1 = ft_memory_stats(PINNED);
        CHECK(s1.allocated == s0.allocated && s1.reserved >= s1.allocated);
        return;
    }
    CHECK(p && g >= n && aligned(p, 64));
    memset(p, 0x5a, n);
    ft_mem_stats s1 = ft_memory_stats(PINNED);
    CHECK(s1.allocated == s0.allocated + (int64_t)g && s1.reserved >= s1.allocated);
    ft_free(p, g, PINNED);
    ft_mem_stats s2 = ft_memory_stats(PINNED);
    CHECK(s2.allocated == s0.allocated);
    CHECK(s2.reserved == s1.reserved); /* page-locked memory is always cached */
    CHECK_OK(ft_alloc(&q, &h, n, PINNED));
    CHECK(q == p && h == g);
    ft_free(q, h, PINNED);
}

static void test_pinned_without_cuda(void) {
    try_pinned(4096);
    try_pinned(100);
    try_pinned(16 * MiB);
    ft_empty_cache();
    ft_mem_stats s = ft_memory_stats(PINNED);
    CHECK(s.reserved == s.allocated);

    /* With no page-locking allowed (unless the process may ignore the limit). */
    struct rlimit old;
    if (getrlimit(RLIMIT_MEMLOCK, &old) == 0) {
        struct rlimit none = {0, old.rlim_max};
        if (setrlimit(RLIMIT_MEMLOCK, &none) == 0) {
            try_pinned(64 * 1024);
            ft_empty_cache();
            setrlimit(RLIMIT_MEMLOCK, &old);
        }
    }
}

static void test_cuda_pool_without_cuda(void) {
    void *p = NULL;
    size_t g = 0;
    CHECK_STATUS(ft_alloc(&p, &g, 1024, (ft_mem_pool){FT_MEM_CUDA, 0}), FT_ERR_DEVICE);
    CHECK_STATUS(ft_alloc(&p, &g, 1024, (ft_mem_pool){FT_MEM_CUDA, FT_MAX_CUDA_DEVICES + 3}), FT_ERR_DEVICE);
    CHECK_STATUS(ft_alloc(&p, &g, 1024, (ft_mem_pool){FT_MEM_CUDA, -1}), FT_ERR_DEVICE);
}

/* Allocations from several threads at once keep the statistics exact. */
static void test_threads(void) {
    ft_mem_stats s0 = ft_memory_stats(HOST);
    int failures = 0;
#pragma omp parallel num_threads(2) reduction(+ : failures)
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)(i % 5 == 0 ? 2 * MiB + (size_t)i : 100 + (size_t)i * 37), g = 0;
        void *p = NULL;
        if (ft_alloc(&p, &g, n, HOST) != FT_OK) {
            failures++;
            continue;
        }
        ((volatile char *)p)[n - 1] = 1;
        ft_free(p, g, HOST);
    }
    CHECK(failures == 0);
    ft_mem_stats s1 = ft_memory_stats(HOST);
    CHECK(s1.allocated == s0.allocated && s1.num_allocs == s0.num_allocs + 400);
    ft_empty_cache();
    CHECK(ft_memory_stats(HOST).reserved == s0.allocated);
}

int main(void) {
    test_large_block_reuse();
    test_empty_cache_keeps_live_blocks();
    test_peak();
    test_alignment_and_sizes();
    test_zero_bytes();
    test_impossible_sizes();
    test_pinned_without_cuda();
    test_cuda_pool_without_cuda();
    test_threads();
    return check_main_result("test_alloc");
}
