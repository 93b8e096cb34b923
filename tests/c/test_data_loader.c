/* The loader through its C API alone: order, epochs, determinism across
 * worker counts, sharding, resuming, skipping bad samples, buffers that
 * outlive the loader, batches of feature arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/cuda.h"
#include "data/jpeg.h"
#include "data/loader.h"
#include "data/record.h"
#include "kernels/convert.h"

enum { N = 37, IH = 8, IW = 6, IC = 3 };

static ft_tensor images, labels; /* (N, IH, IW, IC) uint8, (N,) int64 */

static uint8_t pixel(int64_t i, int y, int x, int c) { return (uint8_t)(i * 7 + y * 5 + x * 3 + c); }

static void make_arrays(void) {
    int64_t ishape[4] = {N, IH, IW, IC}, lshape[1] = {N};
    CHECK_OK(ft_tensor_empty(&images, 4, ishape, FT_UINT8, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&labels, 1, lshape, FT_INT64, FT_CPU, false));
    uint8_t *p = (uint8_t *)ft_tensor_data(&images);
    for (int64_t i = 0; i < N; i++) {
        ((int64_t *)ft_tensor_data(&labels))[i] = 100 + i;
        for (int y = 0; y < IH; y++)
            for (int x = 0; x < IW; x++)
                for (int c = 0; c < IC; c++)
                    *p++ = pixel(i, y, x, c);
    }
}

static ft_loader_config config(int64_t batch, int workers) {
    ft_loader_config c;
    ft_loader_config_default(&c);
    c.batch_size = batch;
    c.num_workers = workers;
    return c;
}

static ft_loader *open_arrays(const ft_transform *ops, int nops, ft_output out, ft_loader_config c) {
    ft_source *src;
    ft_loader *l = NULL;
    CHECK_OK(ft_source_from_arrays(&src, &images, &labels));
    CHECK_OK(ft_loader_new(&l, src, ops, nops, &out, &c));
    ft_source_release(src); /* the loader keeps its own reference */
    return l;
}

/* Runs one epoch and returns the labels in delivery order (N + 1 entries max). */
static int run_epoch(ft_loader *l, int64_t *seen, uint64_t *hash) {
    int n = 0;
    uint64_t h = 1469598103934665603ull;
    for (;;) {
        ft_batch b;
        bool done;
        ft_status st = ft_loader_next(l, &b, &done);
        CHECK_OK(st);
        if (st != FT_OK || done)
            break;
        const int64_t *lab = (const int64_t *)ft_tensor_data(&b.labels);
        const uint8_t *px = (const uint8_t *)ft_tensor_data(&b.images);
        size_t bytes = (size_t)ft_tensor_numel(&b.images) * ft_dtype_get(b.images.dtype)->itemsize;
        for (size_t k = 0; k < bytes; k++)
            h = (h ^ px[k]) * 1099511628211ull;
        for (int64_t k = 0; k < b.size && n < 4 * N; k++)
            seen[n++] = lab[k];
        ft_loader_release(l, &b);
    }
    if (hash)
        *hash = h;
    return n;
}

static void test_order_and_values(void) {
    ft_output out = {.dtype = FT_UINT8, .channels_last = true};
    ft_loader *l = open_arrays(NULL, 0, out, config(5, 2));
    CHECK(ft_loader_num_batches(l) == 8);
    int64_t shape[FT_MAX_DIMS];
    CHECK(ft_loader_batch_shape(l, shape) == 4);
    CHECK(shape[0] == 5 && shape[1] == IC && shape[2] == IH && shape[3] == IW); /* (N, C, H, W) over NHWC memory */
    for (int epoch = 0; epoch < 2; epoch++) {
        int64_t want = 0;
        for (int64_t b = 0;; b++) {
            ft_batch batch;
            bool done;
            CHECK_OK(ft_loader_next(l, &batch, &done));
            if (done) {
                CHECK(b == 8);
                break;
            }
            CHECK(batch.index == b && batch.epoch == epoch);
            CHECK(batch.size == (b == 7 ? 2 : 5) && batch.images.shape[0] == batch.size);
            CHECK(batch.images.strides[1] == 1 && batch.images.strides[3] == IC && batch.images.strides[2] == IW * IC);
            CHECK(batch.labels.dtype == FT_INT64 && batch.labels.ndim == 1);
            const uint8_t *px = (const uint8_t *)ft_tensor_data(&batch.images);
            const int64_t *lab = (const int64_t *)ft_tensor_data(&batch.labels);
            for (int64_t k = 0; k < batch.size; k++, want++) {
                CHECK(lab[k] == 100 + want);
                for (int y = 0; y < IH; y++)
                    for (int x = 0; x < IW; x++)
                        for (int c = 0; c < IC; c++)
                            CHECKF(px[((k * IH + y) * IW + x) * IC + c] == pixel(want, y, x, c), "sample %lld",
                                   (long long)want);
            }
            ft_loader_release(l, &batch);
        }
    }
    int64_t e, b;
    ft_loader_position(l, &e, &b);
    CHECK(e == 2 && b == 0);
    ft_loader_free(l);

    /* float32 NCHW: value / 255, channel planes. */
    out = (ft_output){.dtype = FT_FLOAT32};
    l = open_arrays(NULL, 0, out, config(4, 0));
    ft_batch batch;
    bool done;
    CHECK_OK(ft_loader_next(l, &batch, &done));
    CHECK(batch.images.shape[1] == IC && batch.images.shape[2] == IH && batch.images.shape[3] == IW);
    const float *f = (const float *)ft_tensor_data(&batch.images);
    CHECK(f[((1 * IC + 2) * IH + 3) * IW + 4] == (float)pixel(1, 3, 4, 2) / 255.0f);
    ft_loader_release(l, &batch);
    ft_loader_free(l);
}

static void test_determinism(void) {
    ft_transform ops[3] = {
        {.kind = FT_XF_RANDOM_CROP, .height = 6, .width = 6, .padding = {2, 2, 2, 2},
         .padding_mode = FT_PAD_REFLECT, .nfill = 1},
        {.kind = FT_XF_RANDOM_HORIZONTAL_FLIP, .p = 0.5},
        {.kind = FT_XF_NORMALIZE, .mean = {0.5f, 0.4f, 0.3f}, .std = {0.2f, 0.25f, 0.3f}},
    };
    ft_output out = {.dtype = FT_BFLOAT16};
    uint64_t ref_hash = 0;
    int64_t ref[4 * N];
    int workers[] = {0, 1, 2, 4};
    for (int w = 0; w < 4; w++) {
        ft_loader_config c = config(6, workers[w]);
        c.shuffle = true;
        c.seed = 1234;
        ft_loader *l = open_arrays(ops, 3, out, c);
        CHECK_OK(ft_loader_set_epoch(l, 3));
        int64_t seen[4 * N];
        uint64_t hash;
        int n = run_epoch(l, seen, &hash);
        CHECK(n == N);
        if (w == 0) {
            ref_hash = hash;
            memcpy(ref, seen, sizeof ref);
            int count[N] = {0};
            for (int k = 0; k < n; k++)
                count[seen[k] - 100]++;
            for (int k = 0; k < N; k++)
                CHECKF(count[k] == 1, "sample %d seen %d times", k, count[k]);
        } else {
            CHECKF(hash == ref_hash && memcmp(seen, ref, (size_t)n * sizeof *seen) == 0, "%d workers", workers[w]);
        }
        /* Another epoch, another order. */
        CHECK_OK(ft_loader_set_epoch(l, 4));
        n = run_epoch(l, seen, NULL);
        CHECK(n == N && memcmp(seen, ref, (size_t)n * sizeof *seen) != 0);
        ft_loader_free(l);
    }
}

static void test_sharding_and_resume(void) {
    ft_output out = {.dtype = FT_UINT8};
    int64_t all[2][4 * N];
    int counts[2];
    for (int rank = 0; rank < 2; rank++) {
        ft_loader_config c = config(4, 2);
        c.shuffle = true;
        c.rank = rank;
        c.world_size = 2;
        ft_loader *l = open_arrays(NULL, 0, out, c);
        CHECK(ft_loader_num_batches(l) == 5); /* 19 samples per rank */
        counts[rank] = run_epoch(l, all[rank], NULL);
        CHECK(counts[rank] == 19);
        ft_loader_free(l);
    }
    int seen[N] = {0};
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < counts[r]; k++)
            seen[all[r][k] - 100]++;
    int twice = 0;
    for (int k = 0; k < N; k++) {
        CHECK(seen[k] >= 1);
        twice += seen[k] == 2;
    }
    CHECK(twice == 1); /* 37 padded to 38 */

    /* drop_last drops the odd sample and the short batch. */
    ft_loader_config c = config(4, 1);
    c.world_size = 2;
    c.rank = 1;
    c.drop_last = true;
    ft_loader *l = open_arrays(NULL, 0, out, c);
    CHECK(ft_loader_num_batches(l) == 4 && ft_loader_num_samples(l) == 18);
    ft_loader_free(l);

    /* Resume in the middle of epoch 2. */
    c = config(3, 2);
    c.shuffle = true;
    c.seed = 99;
    l = open_arrays(NULL, 0, out, c);
    CHECK_OK(ft_loader_set_epoch(l, 2));
    int64_t full[4 * N];
    CHECK(run_epoch(l, full, NULL) == N);
    CHECK_OK(ft_loader_set_epoch(l, 2));
    for (int k = 0; k < 4; k++) {
        ft_batch b;
        bool done;
        CHECK_OK(ft_loader_next(l, &b, &done));
        ft_loader_release(l, &b);
    }
    int64_t e, pos;
    ft_loader_position(l, &e, &pos);
    CHECK(e == 2 && pos == 4);
    ft_loader_free(l);
    l = open_arrays(NULL, 0, out, c);
    CHECK_OK(ft_loader_seek(l, e, pos));
    int64_t rest[4 * N];
    int n = run_epoch(l, rest, NULL);
    CHECK(n == N - 12 && memcmp(rest, full + 12, (size_t)n * sizeof *rest) == 0);
    ft_loader_free(l);
}

/* The consumer keeps every batch: the ring grows rather than deadlocking,
 * and batches stay valid after the loader is gone. */
static void test_held_batches(void) {
    ft_output out = {.dtype = FT_UINT8, .channels_last = true};
    ft_loader_config c = config(2, 3);
    c.prefetch = 1;
    ft_loader *l = open_arrays(NULL, 0, out, c);
    ft_batch held[32];
    int n = 0;
    for (;;) {
        bool done;
        CHECK_OK(ft_loader_next(l, &held[n], &done));
        if (done)
            break;
        n++;
    }
    CHECK(n == 19);
    ft_loader_stats st;
    ft_loader_get_stats(l, &st);
    CHECK(st.ring_buffers >= 19 && st.batches == 19 && st.samples >= N);
    ft_loader_free(l);
    for (int k = 0; k < n; k++) {
        CHECK(((const int64_t *)ft_tensor_data(&held[k].labels))[0] == 100 + 2 * k);
        CHECK(((const uint8_t *)ft_tensor_data(&held[k].images))[5] == pixel(2 * k, 0, 1, 2));
        ft_loader_release(NULL, &held[k]);
    }
}

/* JPEG records through RandomResizedCrop, with one corrupt record. */
static void test_jpeg_records(const char *path) {
    ft_record_writer *w;
    CHECK_OK(ft_record_writer_open(&w, path));
    uint8_t px[48 * 64 * 3];
    for (int i = 0; i < 12; i++) {
        for (int k = 0; k < 48 * 64 * 3; k++)
            px[k] = (uint8_t)((k / 3 % 64) * 4 + i * 9 + (k % 3) * 40);
        uint8_t *jpg;
        size_t n;
        CHECK_OK(ft_jpeg_encode(px, 48, 64, 3, 90, "420", i % 2 == 1, &jpg, &n));
        if (i == 5)
            n /= 2; /* cut short */
        CHECK_OK(ft_record_writer_add(w, FT_SAMPLE_JPEG, jpg, n, i, 0, 0, 0));
        free(jpg);
    }
    CHECK_OK(ft_record_writer_close(w, NULL, 0));
    ft_transform ops[3] = {
        {.kind = FT_XF_RANDOM_RESIZED_CROP, .height = 16, .width = 16, .scale = {0.08, 1}, .ratio = {0.75, 4.0 / 3}},
        {.kind = FT_XF_RANDOM_HORIZONTAL_FLIP, .p = 0.5},
        {.kind = FT_XF_NORMALIZE, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}},
    };
    ft_output out = {.dtype = FT_FLOAT32, .dct_scale = true};
    uint64_t ref = 0;
    for (int workers = 0; workers <= 2; workers++) {
        ft_source *src;
        CHECK_OK(ft_source_open_record(&src, path, false));
        ft_loader_config c = config(4, workers);
        c.on_error = FT_ON_ERROR_SKIP;
        c.shuffle = true;
        ft_loader *l;
        CHECK_OK(ft_loader_new(&l, src, ops, 3, &out, &c));
        ft_source_release(src);
        int64_t seen[4 * N];
        uint64_t hash;
        int n = run_epoch(l, seen, &hash);
        CHECK(n == 11);
        for (int k = 0; k < n; k++)
            CHECK(seen[k] != 5);
        if (workers == 0)
            ref = hash;
        CHECKF(hash == ref, "%d workers", workers);
        ft_loader_stats st;
        ft_loader_get_stats(l, &st);
        CHECK(st.skipped == 1 && strstr(st.last_error, "#5") != NULL);
        ft_loader_free(l);
    }
    /* raise: the batch holding record 5 fails, naming it; the others come. */
    ft_source *src;
    CHECK_OK(ft_source_open_record(&src, path, false));
    ft_loader_config c = config(4, 2);
    ft_loader *l;
    CHECK_OK(ft_loader_new(&l, src, ops, 3, &out, &c));
    ft_source_release(src);
    int failures = 0, good = 0;
    for (;;) {
        ft_batch b;
        bool done;
        ft_status st = ft_loader_next(l, &b, &done);
        if (st != FT_OK) {
            failures++;
            CHECK(st == FT_ERR_FORMAT && strstr(ft_last_error(), "#5") != NULL);
            continue;
        }
        if (done)
            break;
        good++;
        ft_loader_release(l, &b);
    }
    CHECK(failures == 1 && good == 2);
    ft_loader_free(l);
}

/* From the second epoch on, a decoded cache hands the resampler full-size
 * RGBX images out of its own allocations: the batches must equal the first
 * epoch's, with every read inside those allocations (ASan's build). */
static void test_decoded_cache(const char *path) {
    ft_transform resize = {.kind = FT_XF_RESIZE, .height = 20, .width = 30};
    ft_output out = {.dtype = FT_UINT8};
    ft_source *src;
    CHECK_OK(ft_source_open_record(&src, path, false));
    ft_loader_config c = config(4, 1);
    c.on_error = FT_ON_ERROR_SKIP;
    c.cache = FT_CACHE_DECODED;
    c.cache_bytes = 1 << 24;
    ft_loader *l;
    CHECK_OK(ft_loader_new(&l, src, &resize, 1, &out, &c));
    ft_source_release(src);
    int64_t seen[4 * N];
    uint64_t first, second;
    CHECK(run_epoch(l, seen, &first) == 11);
    CHECK(run_epoch(l, seen, &second) == 11);
    CHECK(first == second);
    ft_loader_stats st;
    ft_loader_get_stats(l, &st);
    CHECKF(st.cache.hits >= 11, "%lld cache hits", (long long)st.cache.hits); /* one per sample of epoch 2 at least */
    ft_loader_free(l);
}

static void test_bad_config(void) {
    ft_source *src;
    CHECK_OK(ft_source_from_arrays(&src, &images, &labels));
    ft_output out = {.dtype = FT_FLOAT32};
    ft_loader *l;
    ft_loader_config c = config(0, 1);
    CHECK_STATUS(ft_loader_new(&l, src, NULL, 0, &out, &c), FT_ERR_VALUE);
    c = config(4, 1);
    c.rank = 2;
    c.world_size = 2;
    CHECK_STATUS(ft_loader_new(&l, src, NULL, 0, &out, &c), FT_ERR_VALUE);
    c = config(4, 1);
    c.device = (ft_device){FT_DEV_CUDA, 0};
    if (!ft_cuda()) {
        CHECK_STATUS(ft_loader_new(&l, src, NULL, 0, &out, &c), FT_ERR_DEVICE);
        CHECK(strstr(ft_last_error(), "cuda") != NULL);
    }
    ft_transform norm = {.kind = FT_XF_NORMALIZE, .mean = {0, 0, 0}, .std = {1, 1, 1}};
    out.dtype = FT_UINT8;
    c = config(4, 1);
    CHECK_STATUS(ft_loader_new(&l, src, &norm, 1, &out, &c), FT_ERR_VALUE);
    ft_source_release(src);
}

/* Feature f (of the 2 x 3 of sample i, row-major) and its target. */
static double feature(int64_t i, int f) { return (double)i * 0.25 - (double)f / 7.0; }
static double target(int64_t i) { return 3.0 - (double)i / 3.0; }

/* Sources of feature arrays: features (N, 2, 3) float64 through a
 * transposed view, targets (N,) float32 or int32 through a strided view;
 * every row lands in its batch converted, in the shuffled order, the same
 * for any worker count; transforms and image options are refused. */
static void test_feature_arrays(void) {
    ft_tensor base, feats, tbase, targets, ibase, ints;
    CHECK_OK(ft_tensor_empty(&base, 3, (int64_t[]){N, 3, 2}, FT_FLOAT64, FT_CPU, false));
    double *fb = (double *)ft_tensor_data(&base);
    for (int64_t i = 0; i < N; i++)
        for (int r = 0; r < 2; r++)
            for (int c = 0; c < 3; c++)
                fb[i * 6 + c * 2 + r] = feature(i, r * 3 + c); /* stored (3, 2): the view (2, 3) is transposed */
    CHECK_OK(ft_tensor_view(&feats, &base, 3, (int64_t[]){N, 2, 3}, (int64_t[]){6, 1, 2}, 0));
    CHECK_OK(ft_tensor_empty(&tbase, 2, (int64_t[]){N, 2}, FT_FLOAT32, FT_CPU, false));
    CHECK_OK(ft_tensor_empty(&ibase, 2, (int64_t[]){N, 2}, FT_INT32, FT_CPU, false));
    for (int64_t i = 0; i < N; i++) {
        ((float *)ft_tensor_data(&tbase))[2 * i] = (float)target(i);
        ((int32_t *)ft_tensor_data(&ibase))[2 * i] = (int32_t)(1000 + i);
    }
    CHECK_OK(ft_tensor_view(&targets, &tbase, 1, (int64_t[]){N}, (int64_t[]){2}, 0));
    CHECK_OK(ft_tensor_view(&ints, &ibase, 1, (int64_t[]){N}, (int64_t[]){2}, 0));

    ft_source *src, *isrc;
    CHECK_OK(ft_source_from_tensors(&src, &feats, &targets));
    CHECK_OK(ft_source_from_tensors(&isrc, &feats, &ints));
    CHECK(strcmp(ft_source_kind(src), "tensors") == 0 && ft_source_count(src) == N);
    ft_sample smp;
    ft_fetch_buf fbuf = {0};
    CHECK_STATUS(ft_source_get(src, 0, false, &fbuf, &smp), FT_ERR_VALUE);
    ft_fetch_buf_free(&fbuf);

    ft_dtype dtypes[] = {FT_FLOAT32, FT_BFLOAT16};
    int workers[] = {0, 1, 3};
    for (int d = 0; d < 2; d++) {
        uint64_t ref_hash = 0;
        for (int w = 0; w < 3; w++) {
            ft_loader_config c = config(5, workers[w]);
            c.shuffle = true;
            c.seed = 99;
            ft_output out = {.dtype = dtypes[d]};
            ft_loader *l = NULL;
            CHECK_OK(ft_loader_new(&l, d ? isrc : src, NULL, 0, &out, &c));
            if (!l)
                continue;
            int64_t shape[FT_MAX_DIMS];
            CHECK(ft_loader_batch_shape(l, shape) == 3 && shape[0] == 5 && shape[1] == 2 && shape[2] == 3);
            CHECK_OK(ft_loader_set_epoch(l, 2));
            int seen[N] = {0};
            uint64_t h = 1469598103934665603ull;
            for (;;) {
                ft_batch b;
                bool done;
                CHECK_OK(ft_loader_next(l, &b, &done));
                if (done)
                    break;
                CHECK(b.images.ndim == 3 && b.images.dtype == dtypes[d] && ft_tensor_is_contiguous(&b.images));
                CHECK(b.labels.ndim == 1 && b.labels.shape[0] == b.size);
                CHECK(b.labels.dtype == (d ? FT_INT64 : FT_FLOAT32));
                for (int64_t k = 0; k < b.size; k++) {
                    int64_t i;
                    if (d) {
                        i = ((const int64_t *)ft_tensor_data(&b.labels))[k] - 1000;
                    } else {
                        float t = ((const float *)ft_tensor_data(&b.labels))[k];
                        i = (int64_t)((3.0 - (double)t) * 3.0 + 0.5);
                        CHECKF(t == (float)target(i), "target of sample %lld", (long long)i);
                    }
                    if (i < 0 || i >= N) {
                        CHECK(0);
                        continue;
                    }
                    seen[i]++;
                    h = (h ^ (uint64_t)i) * 1099511628211ull;
                    for (int f = 0; f < 6; f++) {
                        float want = (float)feature(i, f);
                        if (d) {
                            uint16_t got = ((const uint16_t *)ft_tensor_data(&b.images))[k * 6 + f];
                            CHECKF(got == ft_f32_to_bf16(want), "bf16 feature %d of sample %lld", f, (long long)i);
                        } else {
                            float got = ((const float *)ft_tensor_data(&b.images))[k * 6 + f];
                            CHECKF(got == want, "feature %d of sample %lld", f, (long long)i);
                        }
                    }
                }
                ft_loader_release(l, &b);
            }
            for (int i = 0; i < N; i++)
                CHECKF(seen[i] == 1, "sample %d seen %d times", i, seen[i]);
            if (w == 0)
                ref_hash = h;
            CHECKF(h == ref_hash && h != 1469598103934665603ull, "order with %d workers", workers[w]);
            ft_loader_free(l);
        }
    }

    /* Images' options and transforms are refused, and so are non-float batches. */
    ft_loader *l;
    ft_loader_config c = config(4, 1);
    ft_transform flip = {.kind = FT_XF_RANDOM_HORIZONTAL_FLIP, .p = 0.5};
    ft_output out = {.dtype = FT_FLOAT32};
    CHECK_STATUS(ft_loader_new(&l, src, &flip, 1, &out, &c), FT_ERR_VALUE);
    CHECK(strstr(ft_last_error(), "transforms apply to images") != NULL);
    out.channels_last = true;
    CHECK_STATUS(ft_loader_new(&l, src, NULL, 0, &out, &c), FT_ERR_VALUE);
    out = (ft_output){.dtype = FT_UINT8};
    CHECK_STATUS(ft_loader_new(&l, src, NULL, 0, &out, &c), FT_ERR_DTYPE);
    ft_source_release(src);
    ft_source_release(isrc);

    /* Bad arrays: one dimension (of integers, token ids, or floats), targets of another length, complex targets. */
    CHECK_STATUS(ft_source_from_tensors(&src, &ints, &ints), FT_ERR_SHAPE);
    CHECK_STATUS(ft_source_from_tensors(&src, &targets, &targets), FT_ERR_SHAPE);
    CHECK(strstr(ft_last_error(), "(N, 1)") != NULL);
    ft_tensor short_targets, cplx;
    CHECK_OK(ft_tensor_view(&short_targets, &tbase, 1, (int64_t[]){N - 1}, (int64_t[]){2}, 0));
    CHECK_STATUS(ft_source_from_tensors(&src, &feats, &short_targets), FT_ERR_SHAPE);
    CHECK_OK(ft_tensor_empty(&cplx, 1, (int64_t[]){N}, FT_COMPLEX64, FT_CPU, false));
    CHECK_STATUS(ft_source_from_tensors(&src, &feats, &cplx), FT_ERR_DTYPE);
    ft_tensor *all[] = {&base, &feats, &tbase, &targets, &ibase, &ints, &short_targets, &cplx};
    for (int k = 0; k < 8; k++)
        ft_tensor_release(all[k]);
}

int main(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/ft_test_loader_%d.rec", (int)getpid());
    make_arrays();
    test_order_and_values();
    test_determinism();
    test_sharding_and_resume();
    test_held_batches();
    test_jpeg_records(path);
    test_decoded_cache(path);
    test_bad_config();
    test_feature_arrays();
    unlink(path);
    ft_tensor_release(&images);
    ft_tensor_release(&labels);
    return check_main_result("test_data_loader");
}
