#include "data/sampler.h"

#include "kernels/philox.h"

ft_status ft_sampler_check(const ft_sampler *s) {
    if (s->num_samples < 0 || s->num_samples >= ((int64_t)1 << 40))
        return ft_fail(FT_ERR_VALUE, "a source of %lld samples is not supported", (long long)s->num_samples);
    if (s->batch_size < 1)
        return ft_fail(FT_ERR_VALUE, "batch_size must be at least 1, got %lld", (long long)s->batch_size);
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return ft_fail(FT_ERR_VALUE, "rank %d is not in [0, world_size=%d)", s->rank, s->world_size);
    return FT_OK;
}

int64_t ft_sampler_rank_samples(const ft_sampler *s) {
    int64_t n = s->num_samples, w = s->world_size;
    if (w == 1)
        return n;
    return s->drop_last ? n / w : (n + w - 1) / w;
}

int64_t ft_sampler_rank_unique(const ft_sampler *s) {
    int64_t n = s->num_samples, w = s->world_size, mine = ft_sampler_rank_samples(s);
    int64_t below = n > s->rank ? (n - s->rank + w - 1) / w : 0;
    return below < mine ? below : mine;
}

int64_t ft_sampler_num_batches(const ft_sampler *s) {
    int64_t n = ft_sampler_rank_samples(s), b = s->batch_size;
    return s->drop_last ? n / b : (n + b - 1) / b;
}

static void shuffle(int64_t *p, int64_t n, uint64_t seed, uint64_t epoch) {
    for (int64_t k = 0; k + 1 < n; k++) {
        int64_t i = n - 1 - k;
        ft_philox_block b = ft_philox(seed, FT_SHUFFLE_STREAM, epoch << 32 | (uint64_t)k);
        uint64_t r = (uint64_t)b.v[0] | (uint64_t)b.v[1] << 32;
        int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

ft_status ft_sampler_epoch_order(const ft_sampler *s, uint64_t epoch, int64_t *order, int64_t *scratch) {
    FT_TRY(ft_sampler_check(s));
    if (epoch >= ((uint64_t)1 << 32))
        return ft_fail(FT_ERR_VALUE, "epoch %llu is out of range (at most 2**32 - 1)", (unsigned long long)epoch);
    int64_t n = s->num_samples, w = s->world_size, per_rank = ft_sampler_rank_samples(s);
    int64_t *all = (w == 1 && !s->shuffle) ? order : (w == 1 ? order : scratch);
    for (int64_t i = 0; i < n; i++)
        all[i] = i;
    if (s->shuffle)
        shuffle(all, n, s->seed, epoch);
    if (w > 1)
        for (int64_t k = 0; k < per_rank; k++)
            order[k] = all[(s->rank + k * w) % n]; /* positions past n wrap to the head: the padding */
    return FT_OK;
}
