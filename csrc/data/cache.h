/* A RAM cache of samples with a byte budget: the encoded bytes of samples
 * read from files, or full-size decoded images. Filled as workers meet
 * samples (so from the second epoch on, cached samples skip the file read or
 * the decode); once the budget is spent, further samples are not cached.
 *
 * Lock-free for readers: each entry is written once by the worker that
 * caches it and published with a release store. */
#ifndef FT_DATA_CACHE_H
#define FT_DATA_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "data/sample.h"

typedef enum { FT_CACHE_NONE, FT_CACHE_ENCODED, FT_CACHE_DECODED } ft_cache_mode;

typedef struct {
    ft_sample_kind kind; /* FT_SAMPLE_JPEG or _PNG (encoded), or FT_SAMPLE_RAW for a decoded image */
    const uint8_t *data;
    size_t size;
    int64_t label;
    int height, width, channels; /* raw/decoded: channels = bytes per pixel (1, 3 or 4) */
} ft_cache_entry;

typedef struct ft_cache ft_cache;

ft_status ft_cache_new(ft_cache **out, int64_t count, size_t budget);
void ft_cache_free(ft_cache *c);

/* Entry i when cached. */
bool ft_cache_get(ft_cache *c, int64_t i, ft_cache_entry *out);

/* Copies e in as entry i unless it is cached already or the budget would
 * be exceeded; a failure to allocate only means the entry is not cached. */
void ft_cache_put(ft_cache *c, int64_t i, const ft_cache_entry *e);

typedef struct {
    int64_t entries, hits, misses;
    size_t bytes, budget;
} ft_cache_stats;

ft_cache_stats ft_cache_get_stats(const ft_cache *c);

#endif
