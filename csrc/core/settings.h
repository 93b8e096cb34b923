/* Process-wide settings: the one thread pool (OpenMP, the runtime oneDNN
 * uses too) and the determinism switch later ops consult. */
#ifndef FT_CORE_SETTINGS_H
#define FT_CORE_SETTINGS_H

#include <stdbool.h>

#include "core/status.h"

ft_status ft_set_num_threads(int n);
int ft_get_num_threads(void);

void ft_set_deterministic(bool on);
bool ft_deterministic(void);

/* ft.backends.benchmark: time candidate implementations per shape (see ops/autotune.h). */
void ft_set_benchmark(bool on);
bool ft_benchmark(void);

/* ft.backends.allow_tf32: float32 convolutions and matmuls on CUDA may use
 * TF32 tensor cores (10-bit mantissa products). Off by default. */
void ft_set_allow_tf32(bool on);
bool ft_allow_tf32(void);

/* Whether fasttrain's own kernels may multiply bfloat16 with AVX512-BF16:
 * the CPU has it, and ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA), oneDNN's cap
 * on the instruction sets it uses, does not exclude it; one variable
 * caps the whole process. Read once. */
bool ft_cpu_bf16(void);

#endif
