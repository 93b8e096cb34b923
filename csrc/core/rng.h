/* Random tensors from Philox, as pure functions of (seed, offset).
 *
 * Element i of a draw comes from Philox block `offset + i / E` (E elements
 * per 128-bit block: 4 for uniform/normal of 32-bit or narrower floats, 2 for
 * float64 and for integers), so a value depends on its index only, never on
 * the thread count. Each function reports how many blocks it used: the
 * caller's generator advances its offset by that much. */
#ifndef FT_CORE_RNG_H
#define FT_CORE_RNG_H

#include "core/tensor.h"

typedef struct {
    uint64_t seed;
    uint64_t offset; /* Philox blocks consumed so far */
} ft_rng_state;

/* out ~ U[low, high); out is a float tensor. */
ft_status ft_rng_uniform(const ft_tensor *out, ft_rng_state *rng, double low, double high);

/* out ~ N(mean, std^2) by the Box-Muller transform; out is a float tensor. */
ft_status ft_rng_normal(const ft_tensor *out, ft_rng_state *rng, double mean, double std);

/* out ~ uniform integers in [low, high); any real dtype. */
ft_status ft_rng_randint(const ft_tensor *out, ft_rng_state *rng, int64_t low, int64_t high);

/* out (int64, 1-d) = a uniform random permutation of 0..n-1 (Fisher-Yates). */
ft_status ft_rng_randperm(const ft_tensor *out, ft_rng_state *rng);

#endif
