/* The autotuner behind ft.backends.benchmark (PyTorch's cudnn.benchmark on
 * the CPU): for a key that identifies an op's shapes and settings completely,
 * time each candidate implementation once, keep the fastest, and reuse the
 * choice. With FASTTRAIN_CACHE_DIR set, choices persist across runs in
 * <dir>/fasttrain-autotune.txt (keyed also by the thread count, which changes
 * what is fastest). */
#ifndef FT_OPS_AUTOTUNE_H
#define FT_OPS_AUTOTUNE_H

#include <stddef.h>

#include "core/status.h"

/* Runs candidate `c` once on the op's real arguments. */
typedef ft_status (*ft_tune_run_fn)(int c, void *ctx);

/* *choice = the remembered choice for key, else the fastest of the
 * `ncandidates` (candidates that fail are skipped; if all fail, the first's
 * error is returned). */
ft_status ft_tune_pick(int *choice, const void *key, size_t key_len, int ncandidates, ft_tune_run_fn run, void *ctx);

#endif
