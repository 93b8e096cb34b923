/* The data loader: worker threads turn a source's samples into batches, in
 * order, into a ring of preallocated batch buffers. This is the C API the
 * training loop consumes with no Python involved:
 *
 *     ft_loader *l;
 *     FT_TRY(ft_loader_new(&l, source, ops, nops, &output, &config));
 *     for (int64_t e = 0; e < epochs; e++) {
 *         FT_TRY(ft_loader_set_epoch(l, e));
 *         ft_batch b;
 *         bool done;
 *         while (ft_loader_next(l, &b, &done) == FT_OK && !done) {
 *             ... use b.images (N, C, H, W), b.labels (N,) int64 ...
 *             ft_loader_release(l, &b);
 *         }
 *     }
 *     ft_loader_free(l);
 *
 * Threading contract
 *   - ft_loader_new starts config.num_workers threads (none with 0: then
 *     ft_loader_next does the work itself). Workers never call Python and
 *     never take a lock the consumer holds while it waits for them.
 *   - Every other function is called by one consumer thread at a time (the
 *     loader is not reentrant): next, release, set_epoch, seek, stats,
 *     position, free. ft_loader_free must not overlap any of them; it stops
 *     and joins the workers and frees every buffer the consumer does not
 *     still hold.
 *   - A batch's tensors are views of one ring buffer. The buffer is reused
 *     only after its last reference is gone: ft_loader_release drops the
 *     references in the ft_batch, and anything that shared the tensors
 *     (ft_tensor_share, a NumPy view) keeps the buffer until it drops its own;
 *     that may happen from any thread, even after ft_loader_free.
 *   - Batches arrive in order (batch 0, 1, ... of the epoch) whatever the
 *     workers finish first, and their contents depend only on (source,
 *     transforms, seed, epoch, rank, world_size, batch size): not on the
 *     worker count or scheduling.
 *   - At most `prefetch` batches are in preparation beyond the ones the
 *     consumer holds; holding more batches than the ring has buffers grows
 *     the ring (one buffer per batch held), it never deadlocks.
 *
 * Epochs: after the last batch of epoch e, the next call reports done and
 * the following one starts epoch e + 1 (whose first batches the workers have
 * prepared meanwhile). ft_loader_set_epoch jumps to batch 0 of any epoch;
 * ft_loader_seek to any batch, which resumes an interrupted epoch exactly. */
#ifndef FT_DATA_LOADER_H
#define FT_DATA_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/device.h"
#include "core/status.h"
#include "core/tensor.h"
#include "data/augment.h"
#include "data/cache.h"
#include "data/source.h"

typedef enum {
    FT_ON_ERROR_RAISE, /* ft_loader_next fails with the first bad sample's status and message */
    FT_ON_ERROR_SKIP,  /* bad samples are left out of their batch and counted */
} ft_on_error;

typedef struct {
    int64_t batch_size;
    bool shuffle, drop_last;
    uint64_t seed;
    int num_workers; /* worker threads; 0 runs the pipeline in the consumer's thread */
    int prefetch;    /* batches prepared ahead of the consumer, >= 1 */
    bool pin_memory; /* page-locked batch buffers when a CUDA device is present */
    ft_device device; /* FT_DEV_CPU, or FT_DEV_CUDA: batches are copied there asynchronously */
    int rank, world_size;
    ft_on_error on_error;
    ft_cache_mode cache;
    size_t cache_bytes;
    bool verify; /* check record checksums on every read */
} ft_loader_config;

/* batch_size 1, no shuffle, seed 0, 2 workers, prefetch 2, pinned, CPU,
 * rank 0 of 1, raise, no cache, verify. */
void ft_loader_config_default(ft_loader_config *c);

typedef struct {
    ft_tensor images; /* (N, C, H, W), or (N, H, W, C) with output.channels_last; a tensors source's (N, ...) features */
    ft_tensor labels; /* (N,) int64; a tensors source's (N, ...) targets, int64 or float32 */
    int64_t epoch;
    int64_t index; /* batch index within the epoch */
    int64_t size;  /* N: batch_size, fewer in a last partial batch or when samples were skipped */
} ft_batch;

typedef struct {
    int64_t samples;  /* samples delivered */
    int64_t skipped;  /* samples left out of delivered batches by on_error skip */
    int64_t errors;   /* failed samples of delivered batches, skipped or raised */
    int64_t batches;  /* batches delivered */
    int64_t ring_buffers;
    size_t ring_bytes; /* bytes of one batch buffer */
    double wait_seconds; /* consumer time spent blocked in ft_loader_next */
    ft_cache_stats cache;
    char last_error[512];
} ft_loader_stats;

typedef struct ft_loader ft_loader;

/* The loader takes its own reference to `source`. ops/output describe the
 * per-sample pipeline (data/augment.h); the batch shape is fixed here, from
 * the first sample where the transforms leave it open. A tensors source
 * takes no transforms and no image options (channels, size, layout): its
 * rows are batched as they are, the features converted to output->dtype
 * (float32, bfloat16 or float16); no cache is kept for it. */
ft_status ft_loader_new(ft_loader **out, ft_source *source, const ft_transform *ops, int nops,
                        const ft_output *output, const ft_loader_config *config);
void ft_loader_free(ft_loader *l);

int64_t ft_loader_num_batches(const ft_loader *l);
int64_t ft_loader_num_samples(const ft_loader *l); /* per epoch, on this rank */
int64_t ft_loader_unique_samples(const ft_loader *l); /* of those, the ones not repeated as padding */
/* The shape of a full batch's images tensor into shape; returns its rank:
 * (N, C, H, W) for images (a channels-last batch has that shape with NHWC
 * strides, as PyTorch's channels_last memory format), (N, ...) for the
 * features of a tensors source. */
int ft_loader_batch_shape(const ft_loader *l, int64_t shape[FT_MAX_DIMS]);
const ft_output *ft_loader_output(const ft_loader *l);

ft_status ft_loader_set_epoch(ft_loader *l, int64_t epoch);
ft_status ft_loader_seek(ft_loader *l, int64_t epoch, int64_t batch);

/* The consumer's position: the epoch and how many of its batches it has
 * received (ft_loader_seek(epoch, batch) resumes right there). */
void ft_loader_position(const ft_loader *l, int64_t *epoch, int64_t *batch);

/* Blocks until the next batch is ready and hands it over (*done false), or
 * reports the end of the epoch (*done true, *out untouched). */
ft_status ft_loader_next(ft_loader *l, ft_batch *out, bool *done);

/* ft_loader_next waiting at most timeout_ms; *timed_out tells that nothing
 * happened (call again). The Python binding uses it to notice Ctrl-C. */
ft_status ft_loader_next_wait(ft_loader *l, ft_batch *out, bool *done, int timeout_ms, bool *timed_out);

/* Drops the batch's references (its buffer is reused once nothing else
 * holds it). */
void ft_loader_release(ft_loader *l, ft_batch *b);

void ft_loader_get_stats(ft_loader *l, ft_loader_stats *out);

#endif
