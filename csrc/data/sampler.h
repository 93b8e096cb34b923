/* Which samples an epoch visits, in which order, and how they are cut into
 * batches: PyTorch's RandomSampler / DistributedSampler / BatchSampler rules
 * with fasttrain's counter-based shuffle.
 *
 *   order     0..N-1, or with shuffle a permutation that is a pure function
 *             of (seed, epoch): Fisher-Yates where step k (k = 0..N-2,
 *             swapping position i = N-1-k) draws Philox block
 *             (epoch << 32 | k) of stream FT_SHUFFLE_STREAM, takes the
 *             64-bit word r = v0 | v1 << 32 and swaps with j = (r * (i+1)) >> 64
 *   ranks     with world_size W > 1 the order is first cut to a multiple of
 *             W (drop_last) or padded to one by repeating its head, and rank
 *             r takes positions r, r+W, r+2W, ...: every rank gets the same
 *             number of samples, hence of batches
 *   batches   consecutive runs of batch_size; the last, shorter one is
 *             dropped with drop_last */
#ifndef FT_DATA_SAMPLER_H
#define FT_DATA_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

/* The Philox stream (counter words 2-3) of the shuffle; sample streams are
 * the sample indices, which stay below it. */
#define FT_SHUFFLE_STREAM UINT64_MAX

typedef struct {
    int64_t num_samples; /* N, the source's count */
    int64_t batch_size;
    bool shuffle, drop_last;
    uint64_t seed;
    int rank, world_size;
} ft_sampler;

ft_status ft_sampler_check(const ft_sampler *s);

/* Samples this rank visits per epoch. */
int64_t ft_sampler_rank_samples(const ft_sampler *s);

/* Of those, the ones that are not padding: the first ones of the rank's
 * order (the padding repeats the head at the end of the whole order), as
 * many as the positions r, r+W, ... below N. Evaluation counts only them. */
int64_t ft_sampler_rank_unique(const ft_sampler *s);

/* Batches per epoch for this rank. */
int64_t ft_sampler_num_batches(const ft_sampler *s);

/* order (ft_sampler_rank_samples) = this rank's sample indices for epoch,
 * in visiting order. `scratch` (N) is needed when world_size > 1 or shuffle. */
ft_status ft_sampler_epoch_order(const ft_sampler *s, uint64_t epoch, int64_t *order, int64_t *scratch);

#endif
