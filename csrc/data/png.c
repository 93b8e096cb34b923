#include "data/png.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jpeg.h" /* FT_JPEG_MAX_PIXELS: one size limit for every decoded image */

static const uint8_t signature[8] = {137, 'P', 'N', 'G', '\r', '\n', 26, '\n'};

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | p[2] << 8 | p[3]; }

bool ft_png_is_png(const uint8_t *data, size_t size) { return size >= 8 && memcmp(data, signature, 8) == 0; }

ft_status ft_png_read_info(const uint8_t *data, size_t size, ft_png_info *out) {
    if (!ft_png_is_png(data, size))
        return ft_fail(FT_ERR_FORMAT, "not a PNG file (no PNG signature)");
    if (size < 8 + 8 + 13 || be32(data + 8) != 13 || memcmp(data + 12, "IHDR", 4) != 0)
        return ft_fail(FT_ERR_FORMAT, "truncated or corrupt PNG: no IHDR chunk after the signature");
    const uint8_t *h = data + 16;
    uint32_t w = be32(h), ht = be32(h + 4);
    int depth = h[8], type = h[9];
    bool ok;
    switch (type) {
    case 0: ok = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16; break;
    case 3: ok = depth == 1 || depth == 2 || depth == 4 || depth == 8; break;
    case 2: case 4: case 6: ok = depth == 8 || depth == 16; break;
    default: return ft_fail(FT_ERR_FORMAT, "PNG color type %d is not valid", type);
    }
    if (!ok)
        return ft_fail(FT_ERR_FORMAT, "PNG color type %d with %d-bit samples is not valid", type, depth);
    if (h[10] != 0 || h[11] != 0 || h[12] > 1)
        return ft_fail(FT_ERR_FORMAT, "PNG with an unknown compression, filter or interlace method");
    if (w == 0 || ht == 0)
        return ft_fail(FT_ERR_FORMAT, "PNG with a zero size");
    if (w > FT_PNG_MAX_SIDE || ht > FT_PNG_MAX_SIDE)
        return ft_fail(FT_ERR_FORMAT, "PNG of %ux%u pixels: sides over %d pixels are not decoded", w, ht,
                       FT_PNG_MAX_SIDE);
    if ((int64_t)w * ht > FT_JPEG_MAX_PIXELS) /* a header alone could ask for terabytes */
        return ft_fail(FT_ERR_FORMAT, "PNG of %ux%u pixels is larger than the %lld pixels decoded", w, ht,
                       (long long)FT_JPEG_MAX_PIXELS);
    *out = (ft_png_info){.width = (int)w, .height = (int)ht, .color_type = type, .bit_depth = depth,
                         .interlaced = h[12] == 1};
    return FT_OK;
}

/* libpng's I/O and error state for one decode: its callbacks find it
 * through the pointers registered with the read struct. */
typedef struct {
    const uint8_t *data;
    size_t size, pos;
    char message[256];
} png_source;

/* libpng's error handlers must not return: keep the message and unwind to
 * the setjmp in ft_png_decode. */
static void on_error(png_structp png, png_const_charp msg) {
    png_source *src = png_get_error_ptr(png);
    snprintf(src->message, sizeof src->message, "%s", msg);
    png_longjmp(png, 1);
}

/* Warnings do not fail a decode (see png.h). */
static void on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

static void read_bytes(png_structp png, png_bytep out, size_t n) {
    png_source *src = png_get_io_ptr(png);
    if (n > src->size - src->pos)
        png_error(png, "truncated file (it ends inside a chunk)");
    memcpy(out, src->data + src->pos, n);
    src->pos += n;
}

/* Pillow's convert("L"), as augment.c converts raw RGB samples. */
static void luma_row(const uint8_t *rgb, uint8_t *gray, int width) {
    for (int x = 0; x < width; x++, rgb += 3)
        gray[x] = (uint8_t)((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

ft_status ft_png_decode(const uint8_t *data, size_t size, const ft_png_info *info, int channels, uint8_t *out,
                        size_t stride) {
    if (!(channels == 1 || channels == 3))
        return ft_fail(FT_ERR_VALUE, "PNG decodes to 1 or 3 channels, not %d", channels);
    bool color = (info->color_type & PNG_COLOR_MASK_COLOR) != 0;
    bool to_luma = channels == 1 && color;
    /* Gray from a color file goes through RGB rows: one row at a time, or
     * the whole image when interlaced, since each pass adds pixels to rows
     * read before. Allocated before the setjmp so that nothing it unwinds
     * to has changed since. */
    size_t rgb_stride = (size_t)info->width * 3;
    uint8_t *rgb = NULL;
    if (to_luma && !(rgb = malloc(rgb_stride * (info->interlaced ? (size_t)info->height : 1))))
        return ft_fail(FT_ERR_NOMEM, "out of memory decoding a %d x %d PNG", info->width, info->height);
    png_source src = {.data = data, .size = size};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, on_error, on_warning);
    png_infop pi = png ? png_create_info_struct(png) : NULL;
    if (!pi) {
        png_destroy_read_struct(&png, NULL, NULL);
        free(rgb);
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a PNG decoder");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &pi, NULL);
        free(rgb);
        return ft_fail(FT_ERR_FORMAT, "cannot decode PNG: %s", src.message);
    }
    png_set_read_fn(png, &src, read_bytes);
    png_set_user_limits(png, FT_PNG_MAX_SIDE, FT_PNG_MAX_SIDE);
    /* A CRC mismatch in an ancillary chunk is a damaged file too (Pillow
     * refuses it), not only one in a critical chunk. */
    png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
    png_read_info(png, pi);
    png_uint_32 w, h;
    int depth, type, interlace;
    png_get_IHDR(png, pi, &w, &h, &depth, &type, &interlace, NULL, NULL);
    /* `out` was sized from info: the header libpng reads must be that one. */
    if (w != (png_uint_32)info->width || h != (png_uint_32)info->height || depth != info->bit_depth ||
        type != info->color_type || (interlace != PNG_INTERLACE_NONE) != info->interlaced)
        png_error(png, "the header differs from the one read before decoding");
    if (type == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    else if (depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16)
        png_set_strip_16(png);
    png_set_strip_alpha(png); /* also the alpha that palette expansion makes of tRNS */
    if (channels == 3 && !color)
        png_set_gray_to_rgb(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, pi);
    int row_channels = to_luma ? 3 : channels;
    if (png_get_bit_depth(png, pi) != 8 || png_get_channels(png, pi) != row_channels)
        png_error(png, "the transforms did not make 8-bit rows of the requested channels");
    for (int pass = 0; pass < passes; pass++) {
        for (int y = 0; y < info->height; y++) {
            uint8_t *row = !to_luma ? out + (size_t)y * stride : rgb + (info->interlaced ? (size_t)y * rgb_stride : 0);
            png_read_row(png, row, NULL);
            if (to_luma && !info->interlaced)
                luma_row(rgb, out + (size_t)y * stride, info->width);
        }
    }
    if (to_luma && info->interlaced)
        for (int y = 0; y < info->height; y++)
            luma_row(rgb + (size_t)y * rgb_stride, out + (size_t)y * stride, info->width);
    png_destroy_read_struct(&png, &pi, NULL);
    free(rgb);
    return FT_OK;
}
