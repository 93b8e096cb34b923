/* Sources: where samples come from. Each gives a count, and for an index in
 * [0, count) one sample: encoded bytes or raw pixels, and a label.
 *
 *   record file   ft_source_open_record: one file read with pread (data/record.h)
 *   ImageFolder   ft_source_open_image_folder: root/CLASS/[SUBDIRS/]NAME.jpg, classes
 *                 sorted by name and numbered from 0, files in the order of
 *                 torchvision's ImageFolder (sorted directories, then sorted
 *                 names); only regular .jpg and .jpeg files (any case) are
 *                 samples (named pipes and other special files are left out)
 *   tar shards    ft_source_open_tar: the WebDataset layout, members grouped
 *                 by key (the path up to the first dot of its last component);
 *                 a sample is a key with a .jpg or .jpeg member and a .cls
 *                 member holding its label as decimal text
 *   arrays        ft_source_from_arrays: uint8 images (N, H, W) or
 *                 (N, H, W, C) with C = 1 or 3 and integer labels (N,), any
 *                 strides, shared without a copy (the source holds a
 *                 reference to both storages)
 *   tensors       ft_source_from_tensors: features (N, ...) of a floating
 *                 or integer dtype (token ids) and targets (N, ...) of any
 *                 real dtype, any strides,
 *                 shared without a copy; a loader copies their rows into its
 *                 batches (ft_source_read_tensors), without images' decoding
 *                 or transforms
 *
 * Sources are immutable once opened and may be read from any number of
 * threads at once; they are reference counted so that loaders can share one. */
#ifndef FT_DATA_SOURCE_H
#define FT_DATA_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"
#include "data/sample.h"

typedef struct ft_source ft_source;

ft_status ft_source_open_record(ft_source **out, const char *path, bool recover);
ft_status ft_source_open_image_folder(ft_source **out, const char *root);
ft_status ft_source_open_tar(ft_source **out, const char *const *paths, int npaths);
ft_status ft_source_from_arrays(ft_source **out, const ft_tensor *images, const ft_tensor *labels);
ft_status ft_source_from_tensors(ft_source **out, const ft_tensor *features, const ft_tensor *targets);

void ft_source_retain(ft_source *s);
void ft_source_release(ft_source *s);

int64_t ft_source_count(const ft_source *s);

/* "record", "image_folder", "tar", "arrays" or "tensors". */
const char *ft_source_kind(const ft_source *s);

/* Whether samples are already in memory (arrays) or in the kernel's page
 * cache behind one open file (record files, tar shards): a cache of encoded
 * bytes would only duplicate them. */
bool ft_source_in_memory(const ft_source *s);

/* Sample i. Its bytes point into the source or into buf; with `verify`,
 * record checksums are checked. Safe from many threads with distinct bufs. */
ft_status ft_source_get(const ft_source *s, int64_t i, bool verify, ft_fetch_buf *buf, ft_sample *out);

/* The per-sample shape and dtype of a batch's rows. */
typedef struct {
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    ft_dtype dtype;
} ft_sample_layout;

/* For a tensors source: the features' per-sample shape and dtype (int64 for
 * integer ones, which batches take as they are), and the targets'
 * per-sample shape with the dtype they take in batches (int64 for integer
 * or bool targets, float32 for floating ones); false for any other source
 * (whose samples ft_source_get gives). */
bool ft_source_tensor_layout(const ft_source *s, ft_sample_layout *features, ft_sample_layout *targets);

/* Sample i of a tensors source: its features into `features` as `dtype`
 * (integer ones as int64 whatever dtype says) and its targets into `targets` as their batch dtype, both C-contiguous.
 * Runs on the calling thread; safe from many threads at once. */
ft_status ft_source_read_tensors(const ft_source *s, int64_t i, void *features, ft_dtype dtype, void *targets);

/* A name for sample i in messages: a path, "file.rec#12", "shard.tar:key". */
void ft_source_describe(const ft_source *s, int64_t i, char *buf, size_t n);

/* Class names of an ImageFolder (label = position); 0 for other sources. */
int ft_source_num_classes(const ft_source *s);
/* An ImageFolder's image files in a format it does not decode (PNG, BMP, ...):
 * skipped, not samples. */
int64_t ft_source_skipped_images(const ft_source *s);
const char *ft_source_class_name(const ft_source *s, int c);
/* The number of an ImageFolder's samples of class c. */
int64_t ft_source_class_count(const ft_source *s, int c);

/* The record file's meta bytes (NULL elsewhere). */
const char *ft_source_meta(const ft_source *s, size_t *len);

#endif
