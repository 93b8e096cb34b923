#include "core/settings.h"

#include <omp.h>
#include <stdatomic.h>

static atomic_bool deterministic, benchmark, allow_tf32;

ft_status ft_set_num_threads(int n) {
    if (n < 1)
        return ft_fail(FT_ERR_VALUE, "the number of threads must be at least 1, got %d", n);
    omp_set_num_threads(n);
    return FT_OK;
}

int ft_get_num_threads(void) { return omp_get_max_threads(); }

void ft_set_deterministic(bool on) { atomic_store(&deterministic, on); }

bool ft_deterministic(void) { return atomic_load(&deterministic); }

void ft_set_benchmark(bool on) { atomic_store(&benchmark, on); }

bool ft_benchmark(void) { return atomic_load(&benchmark); }

void ft_set_allow_tf32(bool on) { atomic_store(&allow_tf32, on); }

bool ft_allow_tf32(void) { return atomic_load(&allow_tf32); }
