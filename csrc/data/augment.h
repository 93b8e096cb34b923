/* The per-sample pipeline: decode, geometric transforms, conversion to the
 * batch's dtype and layout, tensor transforms. Names and semantics are
 * torchvision's (transforms v1 on PIL images); the random parameters come
 * from Philox instead of torch's generator.
 *
 * Randomness rule: every random number used for sample `index` in `epoch`
 * is a pure function of (seed, epoch, index), so a batch is identical
 * whatever worker made it. Draw n of a sample (n = 0, 1, ... in the order
 * the transforms consume them) is Philox block (epoch << 32 | n) of stream
 * `index`, read as the double u = ft_uniform_f64(v0, v1) in [0, 1):
 *
 *   RandomResizedCrop  per attempt (at most 10): u -> area, u -> log ratio;
 *                      when the crop fits: u -> top, u -> left
 *   RandomCrop         u -> top, u -> left (none when the crop is the whole
 *                      padded image)
 *   RandomHorizontalFlip / RandomVerticalFlip   u; flips when u < p
 *   RandomErasing      u; when u < p, attempts as RandomResizedCrop
 *   Cutout             u; when u < p, per hole u -> y, u -> x
 *
 * A uniform on [a, b) is a + (b - a) * u; an integer in [lo, hi) is
 * lo + floor(u * (hi - lo)). RandomErasing(value="random") noise element k
 * (row-major over (C, h, w)) is Box-Muller on Philox block
 * (epoch << 32 | 1 << 31 | op << 24 | k / 2) of stream `index`:
 * u1 = ft_uniform_f64(v0, v1), u2 = ft_uniform_f64(v2, v3),
 * r = sqrt(-2 log(1 - u1)), even k -> r cos(2 pi u2), odd k -> r sin(2 pi u2).
 *
 * Resize and RandomResizedCrop resample exactly as Pillow does (see
 * kernels/resize.h). With `dct_scale`, a JPEG whose first transform is a
 * Resize or RandomResizedCrop to at most half the (cropped) source size is
 * decoded at 1/2, 1/4 or 1/8 scale instead and resampled from there (the
 * crop is chosen on the full-size geometry; the pixels then differ slightly
 * from a full-size decode). */
#ifndef FT_DATA_AUGMENT_H
#define FT_DATA_AUGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "data/sample.h"

typedef enum {
    FT_XF_RANDOM_RESIZED_CROP = 1,
    FT_XF_RESIZE,
    FT_XF_CENTER_CROP,
    FT_XF_RANDOM_CROP,
    FT_XF_RANDOM_HORIZONTAL_FLIP,
    FT_XF_RANDOM_VERTICAL_FLIP,
    FT_XF_NORMALIZE,
    FT_XF_RANDOM_ERASING,
    FT_XF_CUTOUT,
} ft_transform_kind;

typedef enum { FT_PAD_CONSTANT, FT_PAD_EDGE, FT_PAD_REFLECT, FT_PAD_SYMMETRIC } ft_pad_mode;

#define FT_MAX_TRANSFORMS 32

typedef struct {
    ft_transform_kind kind;
    int height, width;     /* output size; Resize with width 0 matches the shorter edge to height */
    int max_size;          /* Resize: cap on the longer edge (0: none) */
    double scale[2];       /* RandomResizedCrop, RandomErasing: area fraction range */
    double ratio[2];       /* RandomResizedCrop, RandomErasing: aspect ratio range */
    double p;              /* flips, RandomErasing, Cutout: probability */
    int padding[4];        /* RandomCrop: left, top, right, bottom */
    bool pad_if_needed;    /* RandomCrop */
    ft_pad_mode padding_mode;
    double fill[3];        /* RandomCrop: pad value; RandomErasing, Cutout: erase value, per channel */
    int nfill;             /* 1 (one value for all channels) or the channel count */
    bool random_fill;      /* RandomErasing(value="random") */
    float mean[3], std[3]; /* Normalize, per channel (one value repeated for gray) */
    int length, holes;     /* Cutout: square side and count */
} ft_transform;

typedef struct {
    ft_dtype dtype;     /* FT_FLOAT32, FT_BFLOAT16, FT_FLOAT16 (values / 255, then Normalize) or FT_UINT8 */
    bool channels_last; /* NHWC instead of NCHW */
    int channels;       /* 1 or 3; 0 takes the first sample's */
    int height, width;  /* 0: what the transforms make of the first sample */
    bool dct_scale;     /* allow reduced-size JPEG decoding (see above) */
} ft_output;

/* A compiled pipeline: immutable, shared by all workers. */
typedef struct ft_plan ft_plan;

/* Checks the transforms and fixes the output shape, using the first
 * sample's size where the transforms leave it open. */
ft_status ft_plan_new(ft_plan **out, const ft_transform *ops, int nops, const ft_output *output,
                      const ft_sample *first);
void ft_plan_free(ft_plan *p);

/* The shape of one output sample, (C, H, W) whatever the layout. */
void ft_plan_shape(const ft_plan *p, int *channels, int *height, int *width);
const ft_output *ft_plan_output(const ft_plan *p);

/* A decoded image: rows of `stride` bytes, bpp bytes per pixel (1 gray,
 * 3 RGB, 4 RGBX). */
typedef struct {
    const uint8_t *data;
    size_t stride;
    int height, width, bpp;
} ft_image;

/* Per-thread state: the TurboJPEG handle and scratch buffers. */
typedef struct ft_augment_ctx ft_augment_ctx;

ft_status ft_augment_ctx_new(ft_augment_ctx **out);
void ft_augment_ctx_free(ft_augment_ctx *ctx);

/* Runs the pipeline on one sample into `out` (C x H x W elements of the
 * output dtype, the sample's place in the batch). `decoded`, when not NULL, is the
 * sample's full-size decode from a cache and replaces decoding; with
 * `full_decode` a JPEG is decoded at full size whatever dct_scale says
 * (to fill such a cache), and ft_augment_decoded then returns the JPEG's or
 * PNG's decode. */
ft_status ft_augment_sample(const ft_plan *p, ft_augment_ctx *ctx, const ft_sample *s, const ft_image *decoded,
                            bool full_decode, uint64_t seed, uint64_t epoch, int64_t index, void *out);

/* The full-size decode made by the last ft_augment_sample call with
 * full_decode, or NULL. Valid until the next call. */
const ft_image *ft_augment_decoded(const ft_augment_ctx *ctx);

#endif
