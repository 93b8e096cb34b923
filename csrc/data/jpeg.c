#include "data/jpeg.h"

#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

struct ft_jpeg_decoder {
    tjhandle handle;
    uint8_t *cmyk; /* (H, W, 4) staging for CMYK files, grown on demand */
    size_t cmyk_cap;
};

ft_status ft_jpeg_read_info(const uint8_t *data, size_t size, ft_jpeg_info *out) {
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8)
        return ft_fail(FT_ERR_FORMAT, "not a JPEG file (no SOI marker)");
    size_t i = 2;
    while (i + 4 <= size) {
        if (data[i] != 0xFF) {
            /* Garbage between segments: libjpeg skips it with a warning; look for the next marker. */
            i++;
            continue;
        }
        uint8_t m = data[i + 1];
        if (m == 0xFF) { /* fill byte */
            i++;
            continue;
        }
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) { /* markers without a length */
            i += 2;
            continue;
        }
        if (m == 0xD9 || m == 0xDA)
            break; /* EOI or scan data before any frame header */
        size_t len = (size_t)data[i + 2] << 8 | data[i + 3];
        if (len < 2 || i + 2 + len > size)
            break;
        bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
        if (sof) {
            if (len < 8)
                return ft_fail(FT_ERR_FORMAT, "corrupt JPEG frame header");
            const uint8_t *p = data + i + 4;
            out->height = p[1] << 8 | p[2];
            out->width = p[3] << 8 | p[4];
            out->components = p[5];
            out->progressive = m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE;
            if (p[0] != 8)
                return ft_fail(FT_ERR_FORMAT, "%d-bit JPEG samples are not supported (only 8-bit)", p[0]);
            if (m == 0xC3 || m == 0xC7 || m == 0xCB || m == 0xCF)
                return ft_fail(FT_ERR_FORMAT, "lossless JPEG is not supported");
            if (out->width == 0 || out->height == 0)
                return ft_fail(FT_ERR_FORMAT, "JPEG with a zero size (or a DNL marker) is not supported");
            if (out->components != 1 && out->components != 3 && out->components != 4)
                return ft_fail(FT_ERR_FORMAT, "JPEG with %d components is not supported", out->components);
            if ((int64_t)out->width * out->height > FT_JPEG_MAX_PIXELS) /* a header alone could ask for 16 GB */
                return ft_fail(FT_ERR_FORMAT, "JPEG of %dx%d pixels is larger than the %lld pixels decoded",
                               out->width, out->height, (long long)FT_JPEG_MAX_PIXELS);
            return FT_OK;
        }
        i += 2 + len;
    }
    return ft_fail(FT_ERR_FORMAT, "truncated or corrupt JPEG: no frame header found");
}

int ft_jpeg_pick_scale(double region_w, double region_h, int out_w, int out_h) {
    static const int nums[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        int num = nums[k];
        if (region_w * num / 8 >= out_w && region_h * num / 8 >= out_h)
            return num;
    }
    return 8;
}

ft_status ft_jpeg_decoder_new(ft_jpeg_decoder **out) {
    ft_jpeg_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return ft_fail(FT_ERR_NOMEM, "out of memory creating a JPEG decoder");
    d->handle = tjInitDecompress();
    if (!d->handle) {
        free(d);
        return ft_fail(FT_ERR_RUNTIME, "TurboJPEG: %s", tjGetErrorStr2(NULL));
    }
    *out = d;
    return FT_OK;
}

void ft_jpeg_decoder_free(ft_jpeg_decoder *d) {
    if (!d)
        return;
    tjDestroy(d->handle);
    free(d->cmyk);
    free(d);
}

static ft_status tj_failed(ft_jpeg_decoder *d) {
    const char *msg = tjGetErrorStr2(d->handle);
    if (tjGetErrorCode(d->handle) == TJERR_WARNING)
        return ft_fail(FT_ERR_FORMAT, "corrupt or truncated JPEG: %s", msg);
    return ft_fail(FT_ERR_FORMAT, "cannot decode JPEG: %s", msg);
}

ft_status ft_jpeg_decode(ft_jpeg_decoder *d, const uint8_t *data, size_t size, const ft_jpeg_info *info, int num,
                         int bpp, uint8_t *out, size_t stride) {
    if (num < 1 || num > 16 || !(bpp == 1 || bpp == 3 || bpp == 4))
        return ft_fail(FT_ERR_VALUE, "bad JPEG decode request (scale %d/8, %d bytes per pixel)", num, bpp);
    int w = ft_jpeg_scaled(info->width, num), h = ft_jpeg_scaled(info->height, num);
    /* TJFLAG_STOPONWARNING: a truncated file fails at once rather than
     * after decoding gray filler rows. */
    int flags = TJFLAG_STOPONWARNING;
    if (info->components == 4) {
        size_t need = (size_t)w * h * 4;
        if (need > d->cmyk_cap) {
            uint8_t *grown = realloc(d->cmyk, need);
            if (!grown)
                return ft_fail(FT_ERR_NOMEM, "out of memory decoding a %d x %d CMYK JPEG", w, h);
            d->cmyk = grown;
            d->cmyk_cap = need;
        }
        if (tjDecompress2(d->handle, data, (unsigned long)size, d->cmyk, w, w * 4, h, TJPF_CMYK, flags) != 0)
            return tj_failed(d);
        for (int y = 0; y < h; y++) {
            const uint8_t *s = d->cmyk + (size_t)y * w * 4;
            uint8_t *o = out + (size_t)y * stride;
            for (int x = 0; x < w; x++, s += 4) {
                uint8_t r = (uint8_t)((double)s[0] * s[3] / 255.0 + 0.5);
                uint8_t g = (uint8_t)((double)s[1] * s[3] / 255.0 + 0.5);
                uint8_t b = (uint8_t)((double)s[2] * s[3] / 255.0 + 0.5);
                if (bpp == 1) {
                    o[x] = (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
                } else {
                    o[x * bpp] = r, o[x * bpp + 1] = g, o[x * bpp + 2] = b;
                    if (bpp == 4)
                        o[x * 4 + 3] = 255;
                }
            }
        }
        return FT_OK;
    }
    int pf = bpp == 1 ? TJPF_GRAY : bpp == 3 ? TJPF_RGB : TJPF_RGBX;
    if (tjDecompress2(d->handle, data, (unsigned long)size, out, w, (int)stride, h, pf, flags) != 0)
        return tj_failed(d);
    return FT_OK;
}

ft_status ft_jpeg_encode(const uint8_t *pixels, int height, int width, int channels, int quality,
                         const char *subsampling, bool progressive, uint8_t **out, size_t *out_size) {
    int samp = TJSAMP_420;
    if (channels == 1) {
        samp = TJSAMP_GRAY;
    } else if (channels != 3) {
        return ft_fail(FT_ERR_VALUE, "JPEG encoding takes 1 or 3 channels, got %d", channels);
    } else if (subsampling) {
        static const struct { const char *name; int samp; } table[] = {
            {"444", TJSAMP_444}, {"422", TJSAMP_422}, {"420", TJSAMP_420}, {"440", TJSAMP_440}, {"411", TJSAMP_411}};
        samp = -1;
        for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
            if (strcmp(subsampling, table[i].name) == 0)
                samp = table[i].samp;
        if (samp < 0)
            return ft_fail(FT_ERR_VALUE, "unknown chroma subsampling '%s' (444, 422, 420, 440 or 411)", subsampling);
    }
    if (quality < 1 || quality > 100 || height < 1 || width < 1)
        return ft_fail(FT_ERR_VALUE, "bad JPEG encode request (%d x %d, quality %d)", height, width, quality);
    tjhandle h = tjInitCompress();
    if (!h)
        return ft_fail(FT_ERR_RUNTIME, "TurboJPEG: %s", tjGetErrorStr2(NULL));
    unsigned char *buf = NULL;
    unsigned long len = 0;
    int r = tjCompress2(h, pixels, width, width * channels, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &len,
                        samp, quality, progressive ? TJFLAG_PROGRESSIVE : 0);
    ft_status s = FT_OK;
    if (r != 0) {
        s = ft_fail(FT_ERR_RUNTIME, "JPEG encoding failed: %s", tjGetErrorStr2(h));
    } else if (!(*out = malloc(len))) {
        s = ft_fail(FT_ERR_NOMEM, "out of memory encoding a JPEG");
    } else {
        memcpy(*out, buf, len);
        *out_size = len;
    }
    tjFree(buf);
    tjDestroy(h);
    return s;
}
