/* The CUDA backend seen from the core.
 *
 * cuda/ builds into its own shared library (libfasttrain_cuda.so) that the
 * core loads with dlopen the first time anything asks about CUDA: every
 * function below except ft_cuda_set_library. So a process that never touches
 * CUDA never maps cudart, cuBLAS or cuDNN (their load costs more than the
 * rest of the import together); a machine without a driver (libcuda.so.1)
 * does not map them either, since the driver's absence is the answer; and a
 * machine without the CUDA libraries or a device runs fasttrain on the CPU.
 * Why CUDA is unusable (dlerror's text naming the library that failed to
 * load, or the runtime's message) is kept for ft.cuda.unavailable_reason()
 * and for the error of any CUDA request.
 *
 * Whether CUDA is usable is decided once per process: page-locked memory
 * comes from the CUDA runtime exactly when the backend loaded, and its free
 * must take the same path as its allocation. */
#ifndef FT_CORE_CUDA_H
#define FT_CORE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/copy.h"
#include "core/device.h"
#include "core/status.h"

#define FT_CUDA_ABI 8

/* The op table (ops/cuda_ops.h): an op layer type the core only carries. */
struct ft_cuda_ops;

/* What the core lends the backend: its error recording, device memory from
 * the caching allocator (for workspaces and scratch of the ops), and the
 * settings the ops consult (core/settings.h). */
typedef struct {
    ft_status (*fail)(ft_status status, const char *fmt, ...);
    ft_status (*alloc)(void **ptr, size_t *granted, size_t nbytes, int device);
    void (*free)(void *ptr, size_t granted, int device);
    bool (*deterministic)(void);
    bool (*benchmark)(void);
    bool (*allow_tf32)(void);
} ft_cuda_host;

/* Every function returns FT_OK or a status whose message is the CUDA
 * runtime's own error string. Streams and events are opaque handles; a NULL
 * stream is the device's default compute stream. */
typedef struct {
    int abi;
    ft_status (*device_count)(int *count);
    /* the device's name and compute capability (major.minor) */
    ft_status (*device_props)(int device, char *name, size_t len, int *major, int *minor);
    ft_status (*malloc)(void **ptr, size_t nbytes, int device);
    ft_status (*free)(void *ptr, int device);
    ft_status (*host_alloc)(void **ptr, size_t nbytes);
    ft_status (*host_free)(void *ptr);
    /* Copies nbytes between any two of host, pinned host and device memory;
     * asynchronous on `stream` when it is not NULL. */
    ft_status (*memcpy)(void *dst, const void *src, size_t nbytes, int device, void *stream);
    ft_status (*copy_strided)(const ft_copy_desc *desc, int device, void *stream);
    ft_status (*stream_create)(void **stream, int device);
    ft_status (*stream_destroy)(void *stream);
    ft_status (*stream_synchronize)(void *stream);
    ft_status (*event_create)(void **event, int device);
    ft_status (*event_destroy)(void *event);
    /* on `device`'s stream (its default compute stream for NULL): the device is made current first, as an
     * event and the stream it records on must share one */
    ft_status (*event_record)(void *event, void *stream, int device);
    ft_status (*event_query)(void *event, bool *done);
    ft_status (*event_synchronize)(void *event);
    ft_status (*stream_wait_event)(void *stream, void *event);
    ft_status (*device_synchronize)(int device);
    /* NCCL, for data parallelism between GPUs (bootstrapped through MPI,
     * core/dist.h): rank 0 makes the id (FT_NCCL_ID_BYTES), every rank
     * passes it to nccl_init with its rank, the world size and its device;
     * the all-reduce sums in place on the device's compute stream. */
    ft_status (*nccl_unique_id)(void *id);
    ft_status (*nccl_init)(void **comm, const void *id, int rank, int size, int device);
    ft_status (*nccl_allreduce_sum_f32)(void *comm, float *buf, int64_t n, int device);
    ft_status (*nccl_destroy)(void *comm);
    const struct ft_cuda_ops *ops;
} ft_cuda_api;

#define FT_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* The entry point libfasttrain_cuda.so exports. */
typedef const ft_cuda_api *(*ft_cuda_open_fn)(const ft_cuda_host *host);
#define FT_CUDA_OPEN_SYMBOL "ft_cuda_open"

/* Names the backend library the first CUDA question loads; without a name
 * (a build without the backend) CUDA is unavailable. Only the first call
 * counts, and only before that question. */
void ft_cuda_set_library(const char *path);

/* The backend when it loaded and sees at least one device, else NULL. */
const ft_cuda_api *ft_cuda(void);

/* Why ft_cuda() is NULL ("" when it is not). */
const char *ft_cuda_unavailable_reason(void);

/* The backend's op table, or NULL when CUDA is unavailable. */
const struct ft_cuda_ops *ft_cuda_op_table(void);

/* Number of usable devices (0 without the backend). */
int ft_cuda_device_count(void);

/* Queues a copy of nbytes on the device's copy stream, after the work queued
 * on its compute (default) stream so far (the destination may be memory that
 * work has just given back to the allocator), and makes the compute stream
 * wait for it, so later device work sees the data while the host goes on. */
ft_status ft_cuda_copy_async(void *dst, const void *src, size_t nbytes, int device);

/* FT_OK when `index` names a usable CUDA device, else FT_ERR_DEVICE. */
ft_status ft_cuda_check_device(int index);

#endif
