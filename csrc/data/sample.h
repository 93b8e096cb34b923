/* One sample as a source hands it to the pipeline: encoded JPEG or PNG
 * bytes or a raw uint8 image, and its label. */
#ifndef FT_DATA_SAMPLE_H
#define FT_DATA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

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

#endif
