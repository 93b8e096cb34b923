/* The oneDNN side of the CPU ops: one engine, a stream per thread, memory
 * descriptors made from fasttrain tensors, and a cache of ready primitives.
 *
 * Creating a oneDNN primitive descriptor costs tens of microseconds, more than
 * a small convolution, so each distinct (op, shapes, strides, dtypes, params)
 * is created once and kept: the cudnn.benchmark idea applied to plain
 * creation, and the place the autotuner stores its choice. */
#ifndef FT_OPS_ONEDNN_H
#define FT_OPS_ONEDNN_H

#include <dnnl.h>

#include "core/tensor.h"
#include "kernels/activation.h"

/* FT_OK, or the oneDNN status as an ft_status naming `what`. */
ft_status ft_dnnl_check(dnnl_status_t s, const char *what);

/* The process's CPU engine. */
ft_status ft_dnnl_engine(dnnl_engine_t *engine);

/* A memory descriptor with explicit dims and strides (which must be
 * non-negative; e.g. a grouped weight view). */
ft_status ft_dnnl_md_strided(dnnl_memory_desc_t *md, ft_dtype dtype, int ndim, const int64_t *dims,
                             const int64_t *strides);

/* A descriptor that lets the primitive choose the layout ("any"); ft_dnnl_run
 * reorders between it and the caller's layout. */
ft_status ft_dnnl_md_any(dnnl_memory_desc_t *md, ft_dtype dtype, int ndim, const int64_t *dims);

/* A cached primitive. */
typedef struct {
    dnnl_primitive_t prim;
} ft_dnnl_prim;

/* Builds the primitive descriptor for a cache miss; `arg` is the caller's. */
typedef ft_status (*ft_dnnl_build_fn)(dnnl_primitive_desc_t *pd, const void *arg);

/* The primitive for `key` (any bytes that identify it completely) and the
 * current thread count, built by `build` on first use. Entries live as long
 * as the process: callers keep using a primitive after the lookup, without
 * the cache's lock. */
ft_status ft_dnnl_get(const ft_dnnl_prim **out, const void *key, size_t key_len, ft_dnnl_build_fn build,
                      const void *arg);

/* Runs a primitive on the calling thread's stream with `n` (arg, memory) pairs,
 * each memory made from a raw pointer and its descriptor, then waits. An
 * argument whose descriptor differs from the one the primitive chose is
 * reordered into a temporary first (inputs) or out of it afterwards (outputs). */
typedef struct {
    int arg;
    const dnnl_memory_desc_t *md;
    void *data;
} ft_dnnl_arg;
ft_status ft_dnnl_run(const ft_dnnl_prim *p, int n, const ft_dnnl_arg *args);

/* Primitive attributes with a user-provided scratchpad (ft_dnnl_run supplies
 * it from the caching allocator). The caller destroys them. */
ft_status ft_dnnl_attr(dnnl_primitive_attr_t *attr);

/* Whether a primitive may run act as its post-op: not a ReLU of slope 0,
 * which oneDNN computes as max(x, 0), turning NaN into 0 where PyTorch's
 * ReLU keeps it; the op runs that one on its output afterwards. */
bool ft_dnnl_fuses(ft_act act);

/* Appends act as an eltwise post-op (nothing for FT_ACT_NONE). */
ft_status ft_dnnl_append_act(dnnl_post_ops_t po, ft_act act);

#endif
