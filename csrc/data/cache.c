#include "data/cache.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { EMPTY, WRITING, READY };

typedef struct {
    atomic_int state;
    ft_cache_entry e;
} slot;

struct ft_cache {
    slot *slots; /* (count) */
    int64_t count;
    size_t budget;
    atomic_size_t bytes;
    atomic_llong entries, hits, misses;
};

ft_status ft_cache_new(ft_cache **out, int64_t count, size_t budget) {
    ft_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->slots = calloc((size_t)(count > 0 ? count : 1), sizeof *c->slots))) {
        free(c);
        return ft_fail(FT_ERR_NOMEM, "out of memory for a cache of %lld samples", (long long)count);
    }
    c->count = count;
    c->budget = budget;
    *out = c;
    return FT_OK;
}

void ft_cache_free(ft_cache *c) {
    if (!c)
        return;
    for (int64_t i = 0; i < c->count; i++)
        if (atomic_load_explicit(&c->slots[i].state, memory_order_relaxed) == READY)
            free((void *)c->slots[i].e.data);
    free(c->slots);
    free(c);
}

bool ft_cache_get(ft_cache *c, int64_t i, ft_cache_entry *out) {
    if (i < 0 || i >= c->count || atomic_load_explicit(&c->slots[i].state, memory_order_acquire) != READY) {
        atomic_fetch_add_explicit(&c->misses, 1, memory_order_relaxed);
        return false;
    }
    *out = c->slots[i].e;
    atomic_fetch_add_explicit(&c->hits, 1, memory_order_relaxed);
    return true;
}

void ft_cache_put(ft_cache *c, int64_t i, const ft_cache_entry *e) {
    if (i < 0 || i >= c->count)
        return;
    slot *s = &c->slots[i];
    int expected = EMPTY;
    if (!atomic_compare_exchange_strong_explicit(&s->state, &expected, WRITING, memory_order_acquire,
                                                 memory_order_relaxed))
        return;
    size_t before = atomic_fetch_add_explicit(&c->bytes, e->size, memory_order_relaxed);
    /* Decoded images are resampled straight from here: they need the slack
     * of every image buffer (the budget counts only the image). */
    uint8_t *copy = before + e->size <= c->budget ? malloc(e->size + FT_IMAGE_SLACK) : NULL;
    if (!copy) {
        atomic_fetch_sub_explicit(&c->bytes, e->size, memory_order_relaxed);
        atomic_store_explicit(&s->state, EMPTY, memory_order_release);
        return;
    }
    memcpy(copy, e->data, e->size);
    s->e = *e;
    s->e.data = copy;
    atomic_fetch_add_explicit(&c->entries, 1, memory_order_relaxed);
    atomic_store_explicit(&s->state, READY, memory_order_release);
}

ft_cache_stats ft_cache_get_stats(const ft_cache *c) {
    ft_cache *m = (ft_cache *)c;
    return (ft_cache_stats){atomic_load(&m->entries), atomic_load(&m->hits), atomic_load(&m->misses),
                            atomic_load(&m->bytes), c->budget};
}
