/* JPEG through libjpeg-turbo's TurboJPEG API.
 *
 * A decoder holds one TurboJPEG handle and must be used by one thread at a
 * time: each loader worker owns one. Baseline and progressive files, every
 * chroma subsampling (including 4:1:0 and 4:4:0, whose headers TurboJPEG 2.1
 * cannot classify: fasttrain reads the frame header itself), grayscale, RGB,
 * and CMYK/YCCK (converted to RGB as djpeg does: R = C * K / 255, rounded,
 * which is right for the inverted CMYK that Adobe applications write).
 *
 * Decoding is strict: a file that libjpeg warns about (truncated data,
 * corrupt entropy-coded segments) fails with FT_ERR_FORMAT. */
#ifndef FT_DATA_JPEG_H
#define FT_DATA_JPEG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct {
    int width, height;
    int components; /* 1 gray, 3 YCbCr or RGB, 4 CMYK or YCCK */
    bool progressive;
} ft_jpeg_info;

/* The largest frame decoded (16384 x 16384): larger headers are refused
 * before any buffer is sized from them. */
#define FT_JPEG_MAX_PIXELS ((int64_t)1 << 28)

/* Reads the frame header (SOFn) of a JPEG file. */
ft_status ft_jpeg_read_info(const uint8_t *data, size_t size, ft_jpeg_info *out);

/* The size of a dimension decoded at scale num/8 (TurboJPEG's TJSCALED). */
static inline int ft_jpeg_scaled(int dim, int num) { return (dim * num + 7) / 8; }

/* The DCT scale num/8 to decode at when a region of the source of
 * (region_w, region_h) pixels will become (out_w, out_h): the smallest of
 * 1/8, 1/4 and 1/2 (the scales with SIMD inverse DCTs) that still leaves at
 * least the output size, used only when the output is at most half the
 * region; 8 (full size) otherwise. */
int ft_jpeg_pick_scale(double region_w, double region_h, int out_w, int out_h);

typedef struct ft_jpeg_decoder ft_jpeg_decoder;

ft_status ft_jpeg_decoder_new(ft_jpeg_decoder **out);
void ft_jpeg_decoder_free(ft_jpeg_decoder *d);

/* Decodes at scale num/8 (num in 1..16) into out: (H', W', bpp) uint8 with
 * rows of `stride` bytes, H' = ft_jpeg_scaled(height, num), likewise W'.
 * bpp 1 gives luma (the Y channel as libjpeg computes it), 3 RGB, 4 RGBX
 * (the fourth byte is padding). `info` is the file's ft_jpeg_read_info. */
ft_status ft_jpeg_decode(ft_jpeg_decoder *d, const uint8_t *data, size_t size, const ft_jpeg_info *info, int num,
                         int bpp, uint8_t *out, size_t stride);

/* Encodes (H, W, C) uint8 pixels (C = 1 or 3, rows of W*C bytes) at
 * `quality` with chroma subsampling "444", "422", "420", "440" or "411"
 * (ignored for gray); *out is malloc'ed and *out_size set. */
ft_status ft_jpeg_encode(const uint8_t *pixels, int height, int width, int channels, int quality,
                         const char *subsampling, bool progressive, uint8_t **out, size_t *out_size);

#endif
