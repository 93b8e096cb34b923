#include "core/settings.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>

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

static bool cpu_bf16;

static void find_cpu_bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    /* oneDNN's names for the caps below AVX512_CORE_BF16 */
    static const char *const below[] = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                        "AVX512_CORE_VNNI"};
    const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
    if (!cap)
        cap = getenv("DNNL_MAX_CPU_ISA");
    cpu_bf16 = __builtin_cpu_supports("avx512bf16");
    for (size_t i = 0; cap && i < sizeof below / sizeof *below; i++)
        if (strcasecmp(cap, below[i]) == 0)
            cpu_bf16 = false;
#endif
}

bool ft_cpu_bf16(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, find_cpu_bf16);
    return cpu_bf16;
}
