/* Scheduling, in one paragraph: batches of the current epoch are claimed in
 * order; a claimed batch gets a free ring buffer and its samples are handed
 * out in chunks, lowest batch first, so all workers finish batch k before
 * helping with k + 1. At most `prefetch` batches past the consumer are
 * claimed. Each sample's output has a fixed place in its buffer, so no step
 * depends on which worker ran it or when. A generation counter retires the
 * work of an epoch that set_epoch/seek abandoned; workers still busy on such
 * a buffer hand it back when they finish their chunk. */
#include "data/loader.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/cuda.h"
#include "data/sampler.h"

#define CHUNK_MAX 64

typedef enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_OUT, SLOT_COPYING, SLOT_ABANDONED } slot_state;

typedef struct ring ring;

typedef struct {
    ring *ring;
    void *mem; /* images (B, sample bytes) then, 64-aligned, labels (B, label bytes) */
    size_t granted;
    uint8_t *images;
    uint8_t *labels;
    uint8_t *ok; /* (B) sample produced; false for a failed one */
    slot_state state;
    uint64_t gen;
    int64_t batch, n, claimed, done;
    int busy; /* chunks being processed outside the lock */
    int64_t err_pos; /* first failed position in the batch, or -1 */
    int64_t failed;  /* samples of the batch that failed */
    ft_status err_status;
    char err[512];
    void *event; /* CUDA: the copy of this buffer to the device has completed */
} slot;

/* The buffers outlive the loader while the consumer holds batches: the ring
 * is shared by the loader and every batch storage handed out. */
struct ring {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* workers: there may be work */
    pthread_cond_t ready_cv; /* consumer: a batch completed, or a failure */
    long refs;
    bool loader_alive;
    pid_t threads_pid; /* the process whose worker threads use the lock; 0: none do */
    slot **slots;
    int nslots, cap;
    size_t slot_bytes, labels_offset;
    ft_mem_pool pool;
};

struct ft_loader {
    ft_source *source;
    ft_plan *plan;
    ft_cache *cache;
    ft_loader_config cfg;
    ft_sampler sampler;
    ring *ring;
    pthread_t *threads;
    int nthreads;
    pid_t pid; /* the process that started the threads: a fork copies the loader, not them */
    bool stop;
    /* the batch: (B, *sample.shape) of out.dtype, and labels (B, *label.shape) */
    ft_output out; /* images: as the plan made it */
    ft_sample_layout sample, label;
    size_t sample_bytes, label_bytes;
    bool tensors; /* a source of feature arrays: rows are copied, no plan */
    int64_t rows; /* the most samples a batch holds: the batch size, or this rank's samples when fewer */
    int64_t chunk;
    /* production (under ring->mu) */
    uint64_t gen;
    int64_t epoch, nbatches, nsamples;
    int64_t *order;   /* (nsamples) this rank's sample indices for `epoch` */
    int64_t *scratch; /* (N) */
    int64_t deliver, claim;
    bool pending_done;
    int64_t cons_epoch, cons_batch;
    ft_status fatal;
    char fatal_msg[512];
    /* statistics (under ring->mu) */
    int64_t st_samples, st_skipped, st_errors, st_batches;
    double wait_seconds;
    char last_error[512];
    /* num_workers == 0: the consumer's own pipeline state */
    ft_augment_ctx *inline_ctx;
    ft_fetch_buf inline_buf;
    /* device == CUDA */
    void *stream;
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void ft_loader_config_default(ft_loader_config *c) {
    *c = (ft_loader_config){.batch_size = 1, .num_workers = 2, .prefetch = 2, .pin_memory = true,
                            .device = {FT_DEV_CPU, 0}, .world_size = 1, .verify = true};
}

/* ---- ring buffers ---- */

static void slot_destroy(slot *s, ft_mem_pool pool) {
    if (!s)
        return;
    if (s->event && ft_cuda()) {
        ft_cuda()->event_synchronize(s->event);
        ft_cuda()->event_destroy(s->event);
    }
    if (s->mem)
        ft_free(s->mem, s->granted, pool);
    free(s->ok);
    free(s);
}

static void ring_unref_locked_then_unlock(ring *r) {
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->work_cv);
        pthread_cond_destroy(&r->ready_cv);
        free(r->slots);
        free(r);
    }
}

/* The release of a batch storage: from any thread, maybe after the loader. */
static void slot_released(void *owner) {
    slot *s = owner;
    ring *r = s->ring;
    if (r->threads_pid && getpid() != r->threads_pid)
        return; /* a batch dropped in a forked process: the lock may be held by a worker of the parent's */
    pthread_mutex_lock(&r->mu);
    if (r->loader_alive) {
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&r->work_cv);
    } else {
        slot_destroy(s, r->pool);
    }
    ring_unref_locked_then_unlock(r);
}

static ft_status slot_new(ft_loader *l, slot **out) {
    ring *r = l->ring;
    slot *s = calloc(1, sizeof *s);
    if (!s || !(s->ok = calloc((size_t)l->rows, 1))) {
        free(s);
        return ft_fail(FT_ERR_NOMEM, "out of memory for a batch buffer");
    }
    s->ring = r;
    ft_status st = ft_alloc(&s->mem, &s->granted, r->slot_bytes, r->pool);
    if (st == FT_OK && l->cfg.device.type == FT_DEV_CUDA)
        st = ft_cuda()->event_create(&s->event, l->cfg.device.index);
    if (st != FT_OK) {
        slot_destroy(s, r->pool);
        return st;
    }
    s->images = s->mem;
    s->labels = (uint8_t *)s->mem + r->labels_offset;
    *out = s;
    return FT_OK;
}

/* Adds a buffer to the ring (under the lock). */
static ft_status ring_grow(ft_loader *l, slot **out) {
    ring *r = l->ring;
    if (r->nslots == r->cap) {
        int cap = r->cap ? r->cap * 2 : 8;
        slot **grown = realloc(r->slots, (size_t)cap * sizeof *grown);
        if (!grown)
            return ft_fail(FT_ERR_NOMEM, "out of memory growing the batch ring");
        r->slots = grown;
        r->cap = cap;
    }
    slot *s = NULL;
    FT_TRY(slot_new(l, &s));
    r->slots[r->nslots++] = s;
    *out = s;
    return FT_OK;
}

/* A buffer for the next batch, or NULL when the worker must wait for one. */
static slot *take_slot(ft_loader *l) {
    ring *r = l->ring;
    for (int i = 0; i < r->nslots; i++)
        if (r->slots[i]->state == SLOT_FREE)
            return r->slots[i];
    for (int i = 0; i < r->nslots; i++) {
        slot *s = r->slots[i];
        bool copied = false;
        if (s->state == SLOT_COPYING && ft_cuda()->event_query(s->event, &copied) == FT_OK && copied) {
            s->state = SLOT_FREE;
            return s;
        }
    }
    if (l->claim != l->deliver)
        return NULL; /* buffers will come back: the consumer is not starved */
    /* The batch the consumer waits for has no buffer: every buffer is held
     * by the consumer (or copying to the device). Growing is the only way on. */
    for (int i = 0; i < r->nslots; i++) {
        slot *s = r->slots[i];
        if (s->state == SLOT_COPYING && ft_cuda()->event_synchronize(s->event) == FT_OK) {
            s->state = SLOT_FREE;
            return s;
        }
    }
    slot *s = NULL;
    ft_status st = ring_grow(l, &s);
    if (st != FT_OK) {
        l->fatal = st;
        snprintf(l->fatal_msg, sizeof l->fatal_msg, "%s", ft_last_error());
        pthread_cond_broadcast(&r->ready_cv);
        return NULL;
    }
    return s;
}

/* ---- epochs ---- */

static ft_status start_epoch(ft_loader *l, int64_t epoch, int64_t batch) {
    if (epoch < 0)
        return ft_fail(FT_ERR_VALUE, "epoch must be non-negative, got %lld", (long long)epoch);
    FT_TRY(ft_sampler_epoch_order(&l->sampler, (uint64_t)epoch, l->order, l->scratch));
    l->gen++;
    ring *r = l->ring;
    for (int i = 0; i < r->nslots; i++) {
        slot *s = r->slots[i];
        if (s->state == SLOT_FILLING || s->state == SLOT_READY)
            s->state = s->busy ? SLOT_ABANDONED : SLOT_FREE;
    }
    l->epoch = epoch;
    l->deliver = l->claim = batch;
    l->pending_done = false;
    pthread_cond_broadcast(&r->work_cv);
    return FT_OK;
}

/* ---- workers ---- */

static ft_status process_sample(ft_loader *l, ft_augment_ctx *ctx, ft_fetch_buf *buf, int64_t i, uint64_t epoch,
                                uint8_t *out, void *label) {
    if (l->tensors)
        return ft_source_read_tensors(l->source, i, out, l->out.dtype, label);
    ft_sample smp = {0};
    ft_image img;
    const ft_image *decoded = NULL;
    bool fill_decoded = false;
    ft_cache_entry ce;
    ft_cache_mode mode = l->cache ? l->cfg.cache : FT_CACHE_NONE;
    if (mode == FT_CACHE_DECODED && ft_cache_get(l->cache, i, &ce)) {
        img = (ft_image){ce.data, (size_t)ce.width * ce.channels, ce.height, ce.width, ce.channels};
        decoded = &img;
        smp = (ft_sample){.kind = FT_SAMPLE_JPEG, .label = ce.label};
    } else if (mode == FT_CACHE_ENCODED && ft_cache_get(l->cache, i, &ce)) {
        smp = (ft_sample){ce.kind, ce.data, ce.size, ce.label, ce.height, ce.width, ce.channels};
    } else {
        FT_TRY(ft_source_get(l->source, i, l->cfg.verify, buf, &smp));
        if (mode == FT_CACHE_ENCODED)
            ft_cache_put(l->cache, i, &(ft_cache_entry){smp.kind, smp.data, smp.size, smp.label, smp.height,
                                                        smp.width, smp.channels});
        fill_decoded = mode == FT_CACHE_DECODED && (smp.kind == FT_SAMPLE_JPEG || smp.kind == FT_SAMPLE_PNG);
    }
    FT_TRY(ft_augment_sample(l->plan, ctx, &smp, decoded, fill_decoded, l->cfg.seed, epoch, i, out));
    const ft_image *d = fill_decoded ? ft_augment_decoded(ctx) : NULL;
    if (d)
        ft_cache_put(l->cache, i, &(ft_cache_entry){FT_SAMPLE_RAW, d->data, d->stride * (size_t)d->height,
                                                    smp.label, d->height, d->width, d->bpp});
    memcpy(label, &smp.label, sizeof smp.label);
    return FT_OK;
}

/* The last error, naming sample i once: sources that read files name them
 * already ("cannot open PATH: ..."), and a record file's "PATH: record 5 ..."
 * becomes "PATH#5: record 5 ...". */
static void sample_error(const ft_loader *l, int64_t i, char *msg, size_t n) {
    char name[256];
    ft_source_describe(l->source, i, name, sizeof name);
    const char *err = ft_last_error(), *colon = strstr(err, ": ");
    if (strstr(err, name))
        snprintf(msg, n, "%s", err);
    else if (colon && colon > err && strncmp(name, err, (size_t)(colon - err)) == 0)
        snprintf(msg, n, "%s: %s", name, colon + 2);
    else
        snprintf(msg, n, "%s: %s", name, err);
}

/* Claims and runs one chunk of samples; called and returning with the lock
 * held. False when there is nothing to do now. */
static bool work_once(ft_loader *l, ft_augment_ctx *ctx, ft_fetch_buf *buf) {
    ring *r = l->ring;
    slot *s = NULL;
    for (int i = 0; i < r->nslots; i++) {
        slot *c = r->slots[i];
        if (c->state == SLOT_FILLING && c->gen == l->gen && c->claimed < c->n && (!s || c->batch < s->batch))
            s = c;
    }
    /* cfg, not nthreads: the consumer counts nthreads up while the first
     * workers already run here */
    int64_t window = l->cfg.num_workers ? l->cfg.prefetch : 1;
    if (!s && l->fatal == FT_OK && l->claim < l->nbatches && l->claim < l->deliver + window) {
        s = take_slot(l);
        if (s) {
            int64_t b = l->claim++, start = b * l->cfg.batch_size;
            s->state = SLOT_FILLING;
            s->gen = l->gen;
            s->batch = b;
            s->n = l->nsamples - start < l->cfg.batch_size ? l->nsamples - start : l->cfg.batch_size;
            s->claimed = s->done = s->failed = 0;
            s->err_pos = -1;
        }
    }
    if (!s)
        return false;
    int64_t first = s->claimed, k = s->n - first < l->chunk ? s->n - first : l->chunk;
    int64_t idx[CHUNK_MAX];
    for (int64_t j = 0; j < k; j++)
        idx[j] = l->order[s->batch * l->cfg.batch_size + first + j];
    s->claimed += k;
    s->busy++;
    uint64_t epoch = (uint64_t)l->epoch;
    pthread_mutex_unlock(&r->mu);

    int64_t failed_pos = -1, nfailed = 0;
    ft_status failed_status = FT_OK;
    char msg[512] = "";
    for (int64_t j = 0; j < k; j++) {
        int64_t pos = first + j;
        ft_status st = process_sample(l, ctx, buf, idx[j], epoch, s->images + (size_t)pos * l->sample_bytes,
                                      s->labels + (size_t)pos * l->label_bytes);
        s->ok[pos] = st == FT_OK;
        if (st != FT_OK) {
            nfailed++;
            if (failed_pos < 0) {
                sample_error(l, idx[j], msg, sizeof msg);
                failed_pos = pos;
                failed_status = st;
            }
        }
    }

    pthread_mutex_lock(&r->mu);
    s->busy--;
    if (s->state == SLOT_ABANDONED) {
        if (s->busy == 0) {
            s->state = SLOT_FREE;
            pthread_cond_broadcast(&r->work_cv);
        }
        return true;
    }
    if (failed_pos >= 0 && (s->err_pos < 0 || failed_pos < s->err_pos)) {
        s->err_pos = failed_pos;
        s->err_status = failed_status;
        snprintf(s->err, sizeof s->err, "%s", msg);
    }
    s->failed += nfailed;
    s->done += k;
    if (s->done == s->n) {
        s->state = SLOT_READY;
        pthread_cond_broadcast(&r->ready_cv);
    }
    return true;
}

static void *worker_main(void *arg) {
    ft_loader *l = arg;
    ring *r = l->ring;
    ft_augment_ctx *ctx = NULL;
    ft_fetch_buf buf = {0};
    ft_status st = ft_augment_ctx_new(&ctx); /* the thread's own TurboJPEG handle */
    pthread_mutex_lock(&r->mu);
    if (st != FT_OK && l->fatal == FT_OK) {
        l->fatal = st;
        snprintf(l->fatal_msg, sizeof l->fatal_msg, "%s", ft_last_error());
        pthread_cond_broadcast(&r->ready_cv);
    }
    while (st == FT_OK && !l->stop)
        if (!work_once(l, ctx, &buf))
            pthread_cond_wait(&r->work_cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    ft_augment_ctx_free(ctx);
    ft_fetch_buf_free(&buf);
    return NULL;
}

/* ---- create / destroy ---- */

/* A loader copied into a forked process has no workers there, and its lock may be held by one that was working
 * at the fork: it is refused, its lock is left alone (its position and counters read as they were), and freeing it
 * leaks it. */
static bool forked(const ft_loader *l) { return l->nthreads > 0 && getpid() != l->pid; }

static ft_status refuse_forked(const ft_loader *l) {
    return ft_fail(FT_ERR_RUNTIME,
                   "this Loader was made in process %ld and runs worker threads, which a forked process (%ld) does "
                   "not have: make the Loader in the process that iterates it (or use num_workers=0)",
                   (long)l->pid, (long)getpid());
}

static void stop_workers(ft_loader *l) {
    ring *r = l->ring;
    pthread_mutex_lock(&r->mu);
    l->stop = true;
    pthread_cond_broadcast(&r->work_cv);
    pthread_cond_broadcast(&r->ready_cv);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    l->nthreads = 0;
}

void ft_loader_free(ft_loader *l) {
    if (!l || forked(l))
        return;
    if (l->ring) {
        stop_workers(l);
        ring *r = l->ring;
        pthread_mutex_lock(&r->mu);
        r->loader_alive = false;
        for (int i = 0; i < r->nslots; i++) {
            slot *s = r->slots[i];
            if (s->state != SLOT_OUT)
                slot_destroy(s, r->pool); /* a held one goes when its batch is released */
            r->slots[i] = NULL;
        }
        r->nslots = 0;
        ring_unref_locked_then_unlock(r);
    }
    if (l->stream)
        ft_cuda()->stream_destroy(l->stream);
    free(l->threads);
    ft_plan_free(l->plan);
    ft_cache_free(l->cache);
    free(l->order);
    free(l->scratch);
    ft_augment_ctx_free(l->inline_ctx);
    ft_fetch_buf_free(&l->inline_buf);
    ft_source_release(l->source);
    free(l);
}

static ft_status check_config(const ft_loader_config *c, int64_t count) {
    if (c->num_workers < 0 || c->num_workers > 256)
        return ft_fail(FT_ERR_VALUE, "num_workers must be in [0, 256], got %d", c->num_workers);
    if (c->prefetch < 1 || c->prefetch > 1024)
        return ft_fail(FT_ERR_VALUE, "prefetch must be in [1, 1024], got %d", c->prefetch);
    if (c->batch_size < 1 || c->batch_size > (1 << 24))
        return ft_fail(FT_ERR_VALUE, "batch_size must be in [1, 2**24], got %lld", (long long)c->batch_size);
    if (c->on_error != FT_ON_ERROR_RAISE && c->on_error != FT_ON_ERROR_SKIP)
        return ft_fail(FT_ERR_VALUE, "on_error must be raise or skip");
    if (c->cache != FT_CACHE_NONE && c->cache != FT_CACHE_ENCODED && c->cache != FT_CACHE_DECODED)
        return ft_fail(FT_ERR_VALUE, "unknown cache mode %d", (int)c->cache);
    if (c->device.type != FT_DEV_CPU && c->device.type != FT_DEV_CUDA)
        return ft_fail(FT_ERR_DEVICE, "the loader delivers batches to the CPU or a CUDA device");
    if (count == 0)
        return ft_fail(FT_ERR_VALUE, "the source holds no samples");
    return FT_OK;
}

/* The batch of a tensors source (whose rows are laid out as f and t): its
 * rows as they are, floating features in the output's float dtype, integer
 * ones (token ids) as int64. */
static ft_status tensor_batches(ft_loader *l, const ft_sample_layout *f, const ft_sample_layout *t, int nops,
                                const ft_output *output) {
    if (nops)
        return ft_fail(FT_ERR_VALUE, "transforms apply to images: a source of feature arrays takes none (got %d); "
                                     "transform the arrays beforehand", nops);
    if (output->channels || output->height || output->width || output->channels_last)
        return ft_fail(FT_ERR_VALUE, "channels, image_size and channels_last apply to images, not to feature arrays");
    ft_dtype dt = output->dtype;
    if (dt != FT_FLOAT32 && dt != FT_BFLOAT16 && dt != FT_FLOAT16)
        return ft_fail(FT_ERR_DTYPE, "batches of features are float32, bfloat16 or float16 (integer ones int64), "
                                     "not %s",
                       ft_dtype_get(dt)->name);
    if (f->dtype == FT_INT64) /* token ids stay integers */
        dt = FT_INT64;
    l->tensors = true;
    l->out = *output;
    l->sample = *f;
    l->sample.dtype = dt;
    l->label = *t;
    return FT_OK;
}

/* The batch's layout: a tensors source's, or the plan's, which the first
 * readable sample fixes. */
static ft_status make_plan(ft_loader *l, const ft_transform *ops, int nops, const ft_output *output) {
    ft_sample_layout f, t;
    if (ft_source_tensor_layout(l->source, &f, &t))
        return tensor_batches(l, &f, &t, nops, output);
    ft_status st = FT_ERR_VALUE;
    int64_t count = ft_source_count(l->source), tries = count < 64 ? count : 64;
    char first_error[512] = "";
    for (int64_t i = 0; i < tries; i++) {
        ft_sample smp;
        st = ft_source_get(l->source, i, l->cfg.verify, &l->inline_buf, &smp);
        if (st == FT_OK)
            st = ft_plan_new(&l->plan, ops, nops, output, &smp);
        if (st == FT_OK) {
            int C, H, W;
            ft_plan_shape(l->plan, &C, &H, &W);
            l->out = *ft_plan_output(l->plan);
            l->sample = (ft_sample_layout){.ndim = 3, .shape = {C, H, W}, .dtype = l->out.dtype};
            l->label = (ft_sample_layout){.ndim = 0, .dtype = FT_INT64};
            return st;
        }
        if (!first_error[0])
            sample_error(l, i, first_error, sizeof first_error);
        if (l->cfg.on_error == FT_ON_ERROR_RAISE)
            return ft_fail(st, "%s", first_error);
    }
    return ft_fail(st, "no readable sample among the first %lld to fix the batch shape: %s", (long long)tries,
                   first_error);
}

static size_t layout_bytes(const ft_sample_layout *s) {
    size_t n = ft_dtype_get(s->dtype)->itemsize;
    for (int d = 0; d < s->ndim; d++)
        n *= (size_t)s->shape[d];
    return n;
}

ft_status ft_loader_new(ft_loader **out, ft_source *source, const ft_transform *ops, int nops,
                        const ft_output *output, const ft_loader_config *config) {
    int64_t count = ft_source_count(source);
    FT_TRY(check_config(config, count));
    if (config->device.type == FT_DEV_CUDA) {
        ft_status st = ft_cuda_check_device(config->device.index);
        if (st != FT_OK)
            return ft_fail(st, "device='cuda:%d' needs a usable CUDA device: %s", config->device.index,
                           ft_last_error());
    }
    ft_loader *l = calloc(1, sizeof *l);
    if (!l)
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a loader");
    ft_source_retain(source);
    l->source = source;
    l->pid = getpid();
    l->cfg = *config;
    l->sampler = (ft_sampler){count, config->batch_size, config->shuffle, config->drop_last, config->seed,
                              config->rank, config->world_size};
    ft_status st = ft_sampler_check(&l->sampler);
    if (st == FT_OK)
        st = make_plan(l, ops, nops, output);
    if (st != FT_OK) {
        ft_loader_free(l);
        return st;
    }
    l->sample_bytes = layout_bytes(&l->sample);
    l->label_bytes = layout_bytes(&l->label);
    l->nsamples = ft_sampler_rank_samples(&l->sampler);
    l->nbatches = ft_sampler_num_batches(&l->sampler);
    l->rows = config->batch_size < l->nsamples ? config->batch_size : l->nsamples > 0 ? l->nsamples : 1;
    l->order = malloc((size_t)(l->nsamples > 0 ? l->nsamples : 1) * sizeof *l->order);
    l->scratch = malloc((size_t)count * sizeof *l->scratch);
    ring *r = calloc(1, sizeof *r);
    if (!l->order || !l->scratch || !r) {
        free(r);
        ft_loader_free(l);
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a loader");
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work_cv, &ca);
    pthread_cond_init(&r->ready_cv, &ca);
    pthread_condattr_destroy(&ca);
    r->refs = 1;
    r->loader_alive = true;
    r->threads_pid = config->num_workers > 0 ? l->pid : 0;
    size_t images_bytes = (size_t)l->rows * l->sample_bytes;
    r->labels_offset = (images_bytes + 63) / 64 * 64;
    r->slot_bytes = r->labels_offset + (size_t)l->rows * l->label_bytes;
    /* in this order: a CPU loader that asks for no pinning loads no CUDA library */
    bool pinned = (config->pin_memory || config->device.type == FT_DEV_CUDA) && ft_cuda();
    r->pool = (ft_mem_pool){pinned ? FT_MEM_PINNED : FT_MEM_HOST, 0};
    l->ring = r;

    int64_t chunk = l->rows / (4 * (config->num_workers > 0 ? config->num_workers : 1));
    l->chunk = chunk < 1 ? 1 : chunk > CHUNK_MAX ? CHUNK_MAX : chunk;
    if (config->cache != FT_CACHE_NONE && config->cache_bytes > 0 && !l->tensors &&
        !(config->cache == FT_CACHE_ENCODED && ft_source_in_memory(source)))
        st = ft_cache_new(&l->cache, count, config->cache_bytes);
    if (st == FT_OK && config->device.type == FT_DEV_CUDA)
        st = ft_cuda()->stream_create(&l->stream, config->device.index);
    /* The ring starts with one buffer for the batch the consumer holds and
     * one per batch in preparation. */
    int initial = (config->num_workers ? config->prefetch : 1) + 1;
    for (int i = 0; st == FT_OK && i < initial; i++) {
        slot *s;
        st = ring_grow(l, &s);
    }
    if (st == FT_OK && config->num_workers == 0)
        st = ft_augment_ctx_new(&l->inline_ctx);
    if (st == FT_OK) {
        pthread_mutex_lock(&r->mu);
        st = start_epoch(l, 0, 0);
        pthread_mutex_unlock(&r->mu);
    }
    if (st == FT_OK && config->num_workers > 0) {
        l->threads = calloc((size_t)config->num_workers, sizeof *l->threads);
        if (!l->threads)
            st = ft_fail(FT_ERR_NOMEM, "out of memory creating a loader");
        /* Workers take no signals: Ctrl-C belongs to the consumer's thread. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (int i = 0; st == FT_OK && i < config->num_workers; i++) {
            int err = pthread_create(&l->threads[i], NULL, worker_main, l);
            if (err) {
                st = ft_fail(FT_ERR_RUNTIME, "cannot start a loader thread: %s", strerror(err));
                break;
            }
            l->nthreads++;
            char name[32];
            snprintf(name, sizeof name, "ft-data-%d", i);
            name[15] = 0; /* the kernel's limit */
            pthread_setname_np(l->threads[i], name);
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (st != FT_OK) {
        ft_loader_free(l);
        return st;
    }
    *out = l;
    return FT_OK;
}

/* ---- consumer ---- */

int64_t ft_loader_num_batches(const ft_loader *l) { return l->nbatches; }
int64_t ft_loader_num_samples(const ft_loader *l) { return l->nsamples; }
int64_t ft_loader_unique_samples(const ft_loader *l) { return ft_sampler_rank_unique(&l->sampler); }
const ft_output *ft_loader_output(const ft_loader *l) { return &l->out; }

int ft_loader_batch_shape(const ft_loader *l, int64_t shape[FT_MAX_DIMS]) {
    shape[0] = l->cfg.batch_size;
    memcpy(shape + 1, l->sample.shape, (size_t)l->sample.ndim * sizeof *shape);
    return l->sample.ndim + 1;
}

/* n rows of layout s: contiguous (n, *s.shape). */
static void rows_layout(const ft_sample_layout *s, ft_tensor *t, int64_t n) {
    t->ndim = s->ndim + 1;
    t->shape[0] = n;
    memcpy(t->shape + 1, s->shape, (size_t)s->ndim * sizeof *t->shape);
    ft_contiguous_strides(t->strides, t->ndim, t->shape);
    t->dtype = s->dtype;
}

/* The images of n samples in the batch buffers' layout: NCHW, or NHWC
 * memory under the (N, C, H, W) shape; features as they are. */
static void image_layout(const ft_loader *l, ft_tensor *t, int64_t n) {
    rows_layout(&l->sample, t, n);
    if (l->out.channels_last) {
        int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3], s[4] = {H * W * C, 1, W * C, C};
        memcpy(t->strides, s, sizeof s);
    }
}

ft_status ft_loader_set_epoch(ft_loader *l, int64_t epoch) {
    if (forked(l))
        return refuse_forked(l);
    ring *r = l->ring;
    pthread_mutex_lock(&r->mu);
    ft_status st = FT_OK;
    /* Nothing of the epoch handed out yet (it may be prefetched): keep it. */
    if (!(l->epoch == epoch && l->deliver == 0))
        st = start_epoch(l, epoch, 0);
    if (st == FT_OK) {
        l->pending_done = false;
        l->cons_epoch = epoch;
        l->cons_batch = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

ft_status ft_loader_seek(ft_loader *l, int64_t epoch, int64_t batch) {
    if (forked(l))
        return refuse_forked(l);
    if (batch < 0 || batch > l->nbatches)
        return ft_fail(FT_ERR_VALUE, "batch %lld is out of range: an epoch has %lld batches", (long long)batch,
                       (long long)l->nbatches);
    ring *r = l->ring;
    pthread_mutex_lock(&r->mu);
    ft_status st = start_epoch(l, epoch, batch);
    if (st == FT_OK) {
        l->cons_epoch = epoch;
        l->cons_batch = batch;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

void ft_loader_position(const ft_loader *l, int64_t *epoch, int64_t *batch) {
    ring *r = l->ring;
    bool lock = !forked(l);
    if (lock)
        pthread_mutex_lock(&r->mu);
    *epoch = l->cons_epoch;
    *batch = l->cons_batch;
    if (lock)
        pthread_mutex_unlock(&r->mu);
}

static slot *ready_slot(ft_loader *l) {
    ring *r = l->ring;
    for (int i = 0; i < r->nslots; i++) {
        slot *s = r->slots[i];
        if (s->state == SLOT_READY && s->gen == l->gen && s->batch == l->deliver)
            return s;
    }
    return NULL;
}

/* Moves the produced samples of a batch with skipped ones to the front. */
static int64_t compact(ft_loader *l, slot *s) {
    int64_t n = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (!s->ok[i])
            continue;
        if (n != i) {
            memmove(s->images + (size_t)n * l->sample_bytes, s->images + (size_t)i * l->sample_bytes,
                    l->sample_bytes);
            memmove(s->labels + (size_t)n * l->label_bytes, s->labels + (size_t)i * l->label_bytes, l->label_bytes);
        }
        n++;
    }
    return n;
}

/* Hands the buffer over as CPU tensors, or copies it to the device. */
static ft_status deliver(ft_loader *l, slot *s, int64_t n, ft_batch *out) {
    ring *r = l->ring;
    if (l->cfg.device.type == FT_DEV_CUDA) {
        ft_tensor images = {0}, labels = {0};
        image_layout(l, &images, n);
        rows_layout(&l->label, &labels, n);
        ft_status st = ft_tensor_empty(&out->images, images.ndim, images.shape, images.dtype, l->cfg.device, false);
        if (st == FT_OK) /* the same bytes, copied as they are */
            memcpy(out->images.strides, images.strides, sizeof images.strides);
        if (st == FT_OK &&
            (st = ft_tensor_empty(&out->labels, labels.ndim, labels.shape, labels.dtype, l->cfg.device, false)) !=
                FT_OK)
            ft_tensor_release(&out->images);
        const ft_cuda_api *cu = ft_cuda();
        int dev = l->cfg.device.index;
        if (st == FT_OK) {
            /* Asynchronous copies on the loader's stream, after the work
             * queued on the compute stream so far (the new tensors may be
             * memory that work has just given back); the compute stream waits
             * for them, and the buffer is reused once they are done. A wait
             * takes the event as recorded at the call, so it is recorded
             * again for the copies. */
            st = cu->event_record(s->event, NULL, dev);
            if (st == FT_OK)
                st = cu->stream_wait_event(l->stream, s->event);
            if (st == FT_OK)
                st = cu->memcpy(ft_tensor_data(&out->images), s->images, (size_t)n * l->sample_bytes, dev,
                                l->stream);
            if (st == FT_OK)
                st = cu->memcpy(ft_tensor_data(&out->labels), s->labels, (size_t)n * l->label_bytes, dev,
                                l->stream);
            if (st == FT_OK)
                st = cu->event_record(s->event, l->stream, dev);
            if (st == FT_OK)
                st = cu->stream_wait_event(NULL, s->event);
            if (st != FT_OK) {
                cu->stream_synchronize(l->stream);
                ft_tensor_release(&out->images);
                ft_tensor_release(&out->labels);
            }
        }
        pthread_mutex_lock(&r->mu);
        s->state = st == FT_OK ? SLOT_COPYING : SLOT_FREE;
        pthread_cond_broadcast(&r->work_cv);
        pthread_mutex_unlock(&r->mu);
        return st;
    }
    ft_storage *st;
    ft_status status = ft_storage_borrow(&st, s->mem, r->slot_bytes, FT_CPU, false, slot_released, s);
    pthread_mutex_lock(&r->mu);
    if (status != FT_OK) {
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&r->work_cv);
    } else {
        r->refs++; /* the storage's: dropped by slot_released */
    }
    pthread_mutex_unlock(&r->mu);
    if (status != FT_OK)
        return status;
    st->pinned = r->pool.kind == FT_MEM_PINNED;
    out->images = (ft_tensor){.storage = st};
    image_layout(l, &out->images, n);
    ft_storage_retain(st);
    out->labels = (ft_tensor){.storage = st, .offset = (int64_t)r->labels_offset};
    rows_layout(&l->label, &out->labels, n);
    return FT_OK;
}

ft_status ft_loader_next_wait(ft_loader *l, ft_batch *out, bool *done, int timeout_ms, bool *timed_out) {
    ring *r = l->ring;
    *done = false;
    *timed_out = false;
    if (forked(l))
        return refuse_forked(l);
    double start = now_seconds();
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms >= 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L)
            deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    }
next:
    pthread_mutex_lock(&r->mu);
    ft_status st = FT_OK;
    if (l->pending_done || l->deliver >= l->nbatches) {
        /* End of the epoch; with pending_done the next one is being prepared already. */
        if (!l->pending_done)
            st = start_epoch(l, l->epoch + 1, 0);
        l->pending_done = false;
        l->cons_epoch = l->epoch;
        l->cons_batch = 0;
        pthread_mutex_unlock(&r->mu);
        *done = st == FT_OK;
        return st;
    }
    slot *s;
    while (!(s = ready_slot(l))) {
        if (l->fatal != FT_OK) {
            ft_status f = l->fatal;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", l->fatal_msg);
            pthread_mutex_unlock(&r->mu);
            return ft_fail(f, "%s", msg);
        }
        if (l->nthreads == 0) {
            if (!work_once(l, l->inline_ctx, &l->inline_buf)) {
                pthread_mutex_unlock(&r->mu);
                return ft_fail(FT_ERR_RUNTIME, "internal: the loader has no work to do for batch %lld",
                               (long long)l->deliver);
            }
            continue;
        }
        int err = timeout_ms >= 0 ? pthread_cond_timedwait(&r->ready_cv, &r->mu, &deadline)
                                  : pthread_cond_wait(&r->ready_cv, &r->mu);
        if (err == ETIMEDOUT && !ready_slot(l) && l->fatal == FT_OK) {
            l->wait_seconds += now_seconds() - start;
            pthread_mutex_unlock(&r->mu);
            *timed_out = true;
            return FT_OK;
        }
    }
    s->state = SLOT_OUT;
    int64_t index = l->deliver++;
    int64_t epoch = l->epoch;
    l->cons_epoch = epoch;
    l->cons_batch = l->deliver;
    if (l->deliver == l->nbatches) {
        /* Workers start on the next epoch now; the consumer sees its end first. */
        st = start_epoch(l, l->epoch + 1, 0);
        l->pending_done = st == FT_OK;
    }
    pthread_cond_broadcast(&r->work_cv);
    l->wait_seconds += now_seconds() - start;
    /* Counted as delivered, so that batches prepared ahead do not count. */
    l->st_samples += s->n - s->failed;
    l->st_errors += s->failed;
    if (l->cfg.on_error == FT_ON_ERROR_SKIP)
        l->st_skipped += s->failed;
    if (s->err_pos >= 0)
        snprintf(l->last_error, sizeof l->last_error, "%s", s->err);
    bool raise = s->err_pos >= 0 && l->cfg.on_error == FT_ON_ERROR_RAISE;
    if (raise) {
        ft_status f = s->err_status;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", s->err);
        s->state = SLOT_FREE;
        pthread_mutex_unlock(&r->mu);
        return ft_fail(f, "%s", msg);
    }
    l->st_batches++;
    pthread_mutex_unlock(&r->mu);
    if (st != FT_OK)
        return st;
    int64_t n = s->err_pos >= 0 ? compact(l, s) : s->n;
    if (n == 0) { /* every sample skipped: no empty batch is handed out, the next one is */
        pthread_mutex_lock(&r->mu);
        s->state = SLOT_FREE;
        l->st_batches--;
        pthread_cond_broadcast(&r->work_cv);
        pthread_mutex_unlock(&r->mu);
        start = now_seconds(); /* the wait so far is counted */
        goto next;
    }
    st = deliver(l, s, n, out);
    if (st != FT_OK)
        return st;
    out->epoch = epoch;
    out->index = index;
    out->size = n;
    return FT_OK;
}

ft_status ft_loader_next(ft_loader *l, ft_batch *out, bool *done) {
    bool timed_out;
    return ft_loader_next_wait(l, out, done, -1, &timed_out);
}

void ft_loader_release(ft_loader *l, ft_batch *b) {
    (void)l;
    if (b->images.storage)
        ft_tensor_release(&b->images);
    if (b->labels.storage)
        ft_tensor_release(&b->labels);
}

void ft_loader_get_stats(ft_loader *l, ft_loader_stats *out) {
    ring *r = l->ring;
    bool lock = !forked(l);
    if (lock)
        pthread_mutex_lock(&r->mu);
    *out = (ft_loader_stats){.samples = l->st_samples, .skipped = l->st_skipped, .errors = l->st_errors,
                             .batches = l->st_batches, .ring_buffers = r->nslots, .ring_bytes = r->slot_bytes,
                             .wait_seconds = l->wait_seconds};
    snprintf(out->last_error, sizeof out->last_error, "%s", l->last_error);
    if (lock)
        pthread_mutex_unlock(&r->mu);
    if (l->cache && lock)
        out->cache = ft_cache_get_stats(l->cache);
}
