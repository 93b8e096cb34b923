/* PNG through libpng, decoded from memory to 8-bit gray or RGB.
 *
 * Every color type and bit depth is read, interlaced (Adam7) files too. The
 * conversions are those of Pillow's convert("RGB") / convert("L"), so that a
 * folder of PNG files loads as torchvision's PIL loader would load it:
 *   palette             expanded to RGB
 *   gray of 1, 2, 4 bit expanded to 8 bit (0..255 spread evenly)
 *   16-bit samples      the high byte (libpng's png_set_strip_16, which is
 *                       what Pillow's "RGB;16B" raw mode reads; not the
 *                       rounded png_set_scale_16); 16-bit gray too, which
 *                       Pillow opens as an "I;16" image and clips at 255
 *                       when converting it
 *   alpha, tRNS         dropped, not composited onto a background
 *   gray -> RGB         the value in all three channels
 *   color -> gray       ITU-R 601-2 luma in Pillow's 16-bit fixed point,
 *                       (R 19595 + G 38470 + B 7471 + 0x8000) >> 16, as the
 *                       loader converts raw RGB samples (libpng's own
 *                       rgb_to_gray truncates instead of rounding)
 * gAMA, cHRM, iCCP and sBIT are ignored, as Pillow ignores them.
 *
 * Errors: any error libpng reports (bad signature or header, a CRC mismatch
 * in any chunk, a bad zlib stream, data cut short) fails with FT_ERR_FORMAT
 * and libpng's message. Its warnings (a known-bad sRGB profile, extra image
 * data) do not fail, as Pillow loads those files. Decoding stops after the
 * last image row: what follows the image data is not read.
 *
 * No state is kept between calls: any thread may decode at any time. */
#ifndef FT_DATA_PNG_H
#define FT_DATA_PNG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct {
    int width, height;
    int color_type; /* 0 gray, 2 RGB, 3 palette, 4 gray + alpha, 6 RGBA (PNG's numbering) */
    int bit_depth;  /* 1, 2, 4, 8 or 16 */
    bool interlaced;
} ft_png_info;

/* libpng's default limit on either side, applied by both functions below. */
#define FT_PNG_MAX_SIDE 1000000

/* True when the bytes start with the PNG signature. */
bool ft_png_is_png(const uint8_t *data, size_t size);

/* Reads the signature and the IHDR chunk (which PNG puts first) without
 * libpng, checks its fields as libpng would (the decode checks its CRC) and
 * refuses images over FT_JPEG_MAX_PIXELS pixels, so that no buffer is sized
 * from a hostile header. */
ft_status ft_png_read_info(const uint8_t *data, size_t size, ft_png_info *out);

/* Decodes the whole image into out: (height, width, channels) uint8 with rows
 * of `stride` bytes; channels 1 gives gray, 3 RGB. `info` is the file's
 * ft_png_read_info. */
ft_status ft_png_decode(const uint8_t *data, size_t size, const ft_png_info *info, int channels, uint8_t *out,
                        size_t stride);

#endif
