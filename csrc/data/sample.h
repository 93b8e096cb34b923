/* One sample as a source hands it to the pipeline: encoded JPEG or PNG
 * bytes or a raw uint8 image, and its label. */
#ifndef FT_DATA_SAMPLE_H
#define FT_DATA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum {
    FT_SAMPLE_JPEG = 1, /* a JPEG file's bytes */
    FT_SAMPLE_RAW = 2,  /* uint8 pixels (H, W, C), rows of W*C bytes, C = 1 or 3 */
    FT_SAMPLE_PNG = 3,  /* a PNG file's bytes (not stored in record files) */
} ft_sample_kind;

/* Bytes readable past the end of a decoded image's last row: the resampler's
 * hpass4 reads whole 16-byte groups, so every buffer it reads keeps this
 * slack (augment.c's scratch buffers, the decoded-image cache). */
#define FT_IMAGE_SLACK 64

typedef struct {
    ft_sample_kind kind;
    const uint8_t *data; /* valid until the next fetch into the same buffer */
    size_t size;         /* bytes */
    int64_t label;
    int height, width, channels; /* FT_SAMPLE_RAW only */
} ft_sample;

/* Per-thread scratch for the bytes of samples that are read or copied
 * (files read with pread, strided arrays). Zero-initialise; free with
 * ft_fetch_buf_free. */
typedef struct {
    uint8_t *data;
    size_t cap;
} ft_fetch_buf;

void ft_fetch_buf_free(ft_fetch_buf *b);
/* Makes b hold at least n bytes. */
ft_status ft_fetch_buf_reserve(ft_fetch_buf *b, size_t n);

/* Reads exactly n bytes at `offset` of the file open as fd (named `path` in
 * messages). Files are read, never mapped: a file cut short while open
 * gives FT_ERR_IO ("PATH was truncated after it was opened") where a
 * mapping would give SIGBUS. */
ft_status ft_read_at(int fd, uint64_t offset, void *dst, size_t n, const char *path);

#endif
