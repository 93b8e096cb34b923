/* Legend for buffer shapes: H, W = rows and columns of an image, B = bytes
 * per pixel (1 gray, 3 RGB, 4 RGBX), C = output channels, K = resampling
 * taps per output pixel. */
#include "data/augment.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/jpeg.h"
#include "data/png.h"
#include "kernels/convert.h"
#include "kernels/philox.h"
#include "kernels/resize.h"

/* ---- plan ---- */

struct ft_plan {
    ft_transform ops[FT_MAX_TRANSFORMS];
    int nops, ngeo; /* ops[0, ngeo) are geometric, the rest act on the output tensor */
    ft_output out;
    int C, H, W;
    size_t esize;
    float lut_f32[3][256];  /* pixel value -> float32 after /255 and every Normalize */
    uint16_t lut_u16[3][256]; /* the same rounded to bfloat16 or float16 */
    uint8_t lut_u8[3][256];   /* identity, for uint8 output */
    float erase_value[FT_MAX_TRANSFORMS][3]; /* erase value of a tensor op after the Normalizes that follow it */
};

static bool is_geometric(ft_transform_kind k) {
    return k == FT_XF_RANDOM_RESIZED_CROP || k == FT_XF_RESIZE || k == FT_XF_CENTER_CROP || k == FT_XF_RANDOM_CROP ||
           k == FT_XF_RANDOM_HORIZONTAL_FLIP || k == FT_XF_RANDOM_VERTICAL_FLIP;
}

static const char *kind_name(ft_transform_kind k) {
    switch (k) {
    case FT_XF_RANDOM_RESIZED_CROP: return "RandomResizedCrop";
    case FT_XF_RESIZE: return "Resize";
    case FT_XF_CENTER_CROP: return "CenterCrop";
    case FT_XF_RANDOM_CROP: return "RandomCrop";
    case FT_XF_RANDOM_HORIZONTAL_FLIP: return "RandomHorizontalFlip";
    case FT_XF_RANDOM_VERTICAL_FLIP: return "RandomVerticalFlip";
    case FT_XF_NORMALIZE: return "Normalize";
    case FT_XF_RANDOM_ERASING: return "RandomErasing";
    case FT_XF_CUTOUT: return "Cutout";
    }
    return "?";
}

/* torchvision's _compute_resized_output_size. */
static ft_status resized_size(const ft_transform *t, int h, int w, int *oh, int *ow) {
    if (t->width > 0) {
        *oh = t->height;
        *ow = t->width;
        return FT_OK;
    }
    int shrt = w <= h ? w : h, lng = w <= h ? h : w;
    int new_short = t->height, new_long = (int)((double)((int64_t)t->height * lng) / (double)shrt);
    if (t->max_size > 0 && new_long > t->max_size) {
        new_short = (int)((double)((int64_t)t->max_size * new_short) / (double)new_long);
        new_long = t->max_size;
    }
    if (new_short < 1 || new_long < 1)
        return ft_fail(FT_ERR_VALUE, "Resize makes a %d x %d image empty", h, w);
    *ow = w <= h ? new_short : new_long;
    *oh = w <= h ? new_long : new_short;
    return FT_OK;
}

/* The size after the geometric transforms, which is fixed by each of them
 * but Resize(int), whose output follows the input's aspect ratio. */
static ft_status geometric_size(const ft_plan *p, int h, int w, int *oh, int *ow) {
    for (int i = 0; i < p->ngeo; i++) {
        const ft_transform *t = &p->ops[i];
        switch (t->kind) {
        case FT_XF_RESIZE: FT_TRY(resized_size(t, h, w, &h, &w)); break;
        case FT_XF_RANDOM_RESIZED_CROP:
        case FT_XF_CENTER_CROP:
        case FT_XF_RANDOM_CROP: h = t->height, w = t->width; break;
        default: break;
        }
    }
    *oh = h;
    *ow = w;
    return FT_OK;
}

static ft_status check_op(const ft_transform *t, const ft_output *o) {
    const char *name = kind_name(t->kind);
    switch (t->kind) {
    case FT_XF_RANDOM_RESIZED_CROP:
        if (!(t->scale[0] > 0 && t->scale[0] <= t->scale[1] && t->scale[1] <= 1e6))
            return ft_fail(FT_ERR_VALUE, "%s: scale must satisfy 0 < min <= max, got (%g, %g)", name, t->scale[0],
                           t->scale[1]);
        /* fall through */
    case FT_XF_RANDOM_ERASING:
        if (!(t->ratio[0] > 0 && t->ratio[0] <= t->ratio[1]))
            return ft_fail(FT_ERR_VALUE, "%s: ratio must satisfy 0 < min <= max, got (%g, %g)", name, t->ratio[0],
                           t->ratio[1]);
        if (t->kind == FT_XF_RANDOM_ERASING &&
            !(t->scale[0] >= 0 && t->scale[0] <= t->scale[1] && t->scale[1] <= 1))
            return ft_fail(FT_ERR_VALUE, "%s: scale must lie in [0, 1] with min <= max", name);
        break;
    case FT_XF_NORMALIZE:
        for (int c = 0; c < 3; c++)
            if (t->std[c] == 0 || !isfinite(t->std[c]) || !isfinite(t->mean[c]))
                return ft_fail(FT_ERR_VALUE, "Normalize: std must be non-zero and values finite");
        if (o->dtype == FT_UINT8)
            return ft_fail(FT_ERR_VALUE, "Normalize needs a floating-point output dtype, not uint8");
        break;
    case FT_XF_CUTOUT:
        if (t->length < 1 || t->holes < 1)
            return ft_fail(FT_ERR_VALUE, "Cutout: size and holes must be positive");
        break;
    default: break;
    }
    if (t->kind == FT_XF_RANDOM_ERASING && t->random_fill && o->dtype == FT_UINT8)
        return ft_fail(FT_ERR_VALUE, "RandomErasing(value='random') needs a floating-point output dtype");
    bool sized = t->kind == FT_XF_RANDOM_RESIZED_CROP || t->kind == FT_XF_RESIZE || t->kind == FT_XF_CENTER_CROP ||
                 t->kind == FT_XF_RANDOM_CROP;
    if (sized && (t->height < 1 || t->width < 0 || (t->width == 0 && t->kind != FT_XF_RESIZE) ||
                  t->height > (1 << 16) || t->width > (1 << 16)))
        return ft_fail(FT_ERR_VALUE, "%s: bad size (%d, %d)", name, t->height, t->width);
    if (t->kind == FT_XF_RESIZE && t->width == 0 && t->max_size > 0 && t->max_size <= t->height)
        return ft_fail(FT_ERR_VALUE, "Resize: max_size (%d) must be larger than size (%d)", t->max_size, t->height);
    if (t->kind == FT_XF_RANDOM_CROP)
        for (int i = 0; i < 4; i++)
            if (t->padding[i] < 0 || t->padding[i] > (1 << 16))
                return ft_fail(FT_ERR_VALUE, "RandomCrop: padding must be non-negative");
    if ((t->kind == FT_XF_RANDOM_HORIZONTAL_FLIP || t->kind == FT_XF_RANDOM_VERTICAL_FLIP ||
         t->kind == FT_XF_RANDOM_ERASING || t->kind == FT_XF_CUTOUT) &&
        !(t->p >= 0 && t->p <= 1))
        return ft_fail(FT_ERR_VALUE, "%s: p must lie in [0, 1], got %g", name, t->p);
    if ((t->kind == FT_XF_RANDOM_CROP || t->kind == FT_XF_RANDOM_ERASING || t->kind == FT_XF_CUTOUT) &&
        !(t->nfill == 1 || t->nfill == 3) && !t->random_fill)
        return ft_fail(FT_ERR_VALUE, "%s: give one fill value or one per channel", name);
    return FT_OK;
}

static float apply_normalizes(const ft_plan *p, int from, int c, float v) {
    for (int i = from; i < p->nops; i++)
        if (p->ops[i].kind == FT_XF_NORMALIZE)
            v = (v - p->ops[i].mean[c]) / p->ops[i].std[c];
    return v;
}

static double fill_of(const ft_transform *t, int c) { return t->nfill == 1 ? t->fill[0] : t->fill[c]; }

ft_status ft_plan_new(ft_plan **out, const ft_transform *ops, int nops, const ft_output *output,
                      const ft_sample *first) {
    if (nops < 0 || nops > FT_MAX_TRANSFORMS)
        return ft_fail(FT_ERR_VALUE, "at most %d transforms, got %d", FT_MAX_TRANSFORMS, nops);
    ft_dtype dt = output->dtype;
    if (dt != FT_FLOAT32 && dt != FT_BFLOAT16 && dt != FT_FLOAT16 && dt != FT_UINT8)
        return ft_fail(FT_ERR_DTYPE, "the batch dtype must be float32, bfloat16, float16 or uint8, not %s",
                       ft_dtype_get(dt)->name);
    if (output->channels != 0 && output->channels != 1 && output->channels != 3)
        return ft_fail(FT_ERR_VALUE, "channels must be 1 or 3, got %d", output->channels);
    ft_plan *p = calloc(1, sizeof *p);
    if (!p)
        return ft_fail(FT_ERR_NOMEM, "out of memory compiling transforms");
    if (nops)
        memcpy(p->ops, ops, (size_t)nops * sizeof *ops);
    p->nops = nops;
    p->out = *output;
    ft_status s = FT_OK;
    bool seen_tensor_op = false;
    for (int i = 0; i < nops && s == FT_OK; i++) {
        s = check_op(&ops[i], output);
        if (is_geometric(ops[i].kind)) {
            if (seen_tensor_op)
                s = ft_fail(FT_ERR_VALUE, "%s comes after a tensor transform: put crops, resizes and flips before "
                                          "Normalize, RandomErasing and Cutout", kind_name(ops[i].kind));
            p->ngeo = i + 1;
        } else {
            seen_tensor_op = true;
        }
    }
    int first_h = 0, first_w = 0, first_c = 3;
    if (s == FT_OK) {
        if (first->kind == FT_SAMPLE_RAW) {
            first_h = first->height, first_w = first->width, first_c = first->channels;
        } else if (first->kind == FT_SAMPLE_PNG) {
            ft_png_info info;
            s = ft_png_read_info(first->data, first->size, &info);
            first_h = info.height, first_w = info.width;
        } else {
            ft_jpeg_info info;
            s = ft_jpeg_read_info(first->data, first->size, &info);
            first_h = info.height, first_w = info.width;
        }
    }
    if (s == FT_OK) {
        p->C = output->channels ? output->channels : first_c;
        if (output->height > 0 && output->width > 0)
            p->H = output->height, p->W = output->width;
        else
            s = geometric_size(p, first_h, first_w, &p->H, &p->W);
    }
    if (s != FT_OK) {
        free(p);
        return s;
    }
    p->esize = ft_dtype_get(dt)->itemsize;
    for (int c = 0; c < 3; c++) {
        for (int v = 0; v < 256; v++) {
            float f = apply_normalizes(p, 0, c, (float)v / 255.0f);
            p->lut_f32[c][v] = f;
            p->lut_u16[c][v] = dt == FT_FLOAT16 ? ft_f32_to_f16(f) : ft_f32_to_bf16(f);
            p->lut_u8[c][v] = (uint8_t)v;
        }
        for (int i = p->ngeo; i < nops; i++)
            if (ops[i].kind == FT_XF_RANDOM_ERASING || ops[i].kind == FT_XF_CUTOUT)
                p->erase_value[i][c] = apply_normalizes(p, i + 1, c, (float)fill_of(&ops[i], c));
    }
    *out = p;
    return FT_OK;
}

void ft_plan_free(ft_plan *p) { free(p); }

void ft_plan_shape(const ft_plan *p, int *channels, int *height, int *width) {
    *channels = p->C;
    *height = p->H;
    *width = p->W;
}

const ft_output *ft_plan_output(const ft_plan *p) { return &p->out; }

/* ---- per-thread context ---- */

/* Every image buffer keeps FT_IMAGE_SLACK bytes past `n`. */
static ft_status reserve(ft_fetch_buf *b, size_t n) {
    /* Sizes can come from a damaged file: refused well before a size wraps. */
    if (n > SIZE_MAX / 4)
        return ft_fail(FT_ERR_NOMEM, "an image buffer of %zu bytes is too large", n);
    return ft_fetch_buf_reserve(b, n + FT_IMAGE_SLACK);
}

/* Pillow's convert("L") of n pixels of bpp bytes (RGB first): ITU-R 601-2 luma in 16-bit fixed point. dst may
 * be src: pixel i is written after pixels 0..i are read. */
static void to_luma(const uint8_t *src, int bpp, uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint8_t *px = src + (size_t)bpp * i;
        dst[i] = (uint8_t)((px[0] * 19595 + px[1] * 38470 + px[2] * 7471 + 0x8000) >> 16);
    }
}

struct ft_augment_ctx {
    ft_jpeg_decoder *jpeg;
    ft_fetch_buf decode; /* (H, W, B) the decoded image */
    ft_fetch_buf img[2]; /* (H, W, B) ping-pong for materialised and resampled images */
    ft_fetch_buf tmp;    /* (rows, W_out, B) between the two resampling passes */
    ft_fetch_buf coef;   /* bounds and fixed-point weights of both passes */
    ft_fetch_buf acc;    /* (W_out * B) int32 row sums of the vertical pass */
    ft_fetch_buf colmap; /* (W_out) int32 source column per output column */
    ft_image decoded;   /* the full-size decode, for a decoded-sample cache */
    bool have_decoded;
};

ft_status ft_augment_ctx_new(ft_augment_ctx **out) {
    ft_augment_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return ft_fail(FT_ERR_NOMEM, "out of memory");
    ft_status s = ft_jpeg_decoder_new(&c->jpeg);
    if (s != FT_OK) {
        free(c);
        return s;
    }
    *out = c;
    return FT_OK;
}

void ft_augment_ctx_free(ft_augment_ctx *c) {
    if (!c)
        return;
    ft_jpeg_decoder_free(c->jpeg);
    ft_fetch_buf_free(&c->decode);
    ft_fetch_buf_free(&c->img[0]);
    ft_fetch_buf_free(&c->img[1]);
    ft_fetch_buf_free(&c->tmp);
    ft_fetch_buf_free(&c->coef);
    ft_fetch_buf_free(&c->acc);
    ft_fetch_buf_free(&c->colmap);
    free(c);
}

const ft_image *ft_augment_decoded(const ft_augment_ctx *ctx) { return ctx->have_decoded ? &ctx->decoded : NULL; }

/* ---- random parameters ---- */

typedef struct {
    uint64_t seed, epoch;
    int64_t index;
    uint32_t n; /* draws so far */
} draws;

static double next_u(draws *d) {
    ft_philox_block b = ft_philox(d->seed, (uint64_t)d->index, d->epoch << 32 | d->n++);
    return ft_uniform_f64(b.v[0], b.v[1]);
}

static int64_t next_int(draws *d, int64_t lo, int64_t hi) { return lo + (int64_t)floor(next_u(d) * (double)(hi - lo)); }

/* RandomResizedCrop.get_params and the area/ratio loop of
 * RandomErasing.get_params: (top, left, h, w), or false after 10 misses.
 * `erasing` swaps the roles of h and w and wants h < H, w < W. */
static bool area_crop(draws *d, int H, int W, const ft_transform *t, bool erasing, int *top, int *left, int *h,
                      int *w) {
    double area = (double)H * W, lr0 = log(t->ratio[0]), lr1 = log(t->ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (t->scale[0] + (t->scale[1] - t->scale[0]) * next_u(d));
        double aspect = exp(lr0 + (lr1 - lr0) * next_u(d));
        int a = (int)rint(sqrt(target * aspect)), b = (int)rint(sqrt(target / aspect));
        int cw = erasing ? b : a, ch = erasing ? a : b;
        bool fits = erasing ? (ch < H && cw < W) : (0 < cw && cw <= W && 0 < ch && ch <= H);
        if (!fits)
            continue;
        *top = (int)next_int(d, 0, H - ch + 1);
        *left = (int)next_int(d, 0, W - cw + 1);
        *h = ch;
        *w = cw;
        return true;
    }
    return false;
}

/* ---- geometry as steps ---- */

typedef enum { ST_PAD, ST_CROP, ST_RESAMPLE, ST_FLIP_X, ST_FLIP_Y } step_kind;

typedef struct {
    step_kind kind;
    int x, y, w, h;  /* CROP window (left, top, width, height); RESAMPLE output (w, h) */
    int pad[4];      /* left, top, right, bottom */
    ft_pad_mode mode;
    uint8_t fill[4];
} step;

#define MAX_STEPS (4 * FT_MAX_TRANSFORMS)

static void pad_step(step *st, int *n, int *H, int *W, int l, int t, int r, int b, ft_pad_mode mode,
                     const ft_transform *tr) {
    step s = {.kind = ST_PAD, .pad = {l, t, r, b}, .mode = mode};
    for (int c = 0; c < 3; c++) {
        double f = tr ? fill_of(tr, c) : 0;
        s.fill[c] = (uint8_t)(f < 0 ? 0 : f > 255 ? 255 : f);
    }
    s.fill[3] = 255;
    st[(*n)++] = s;
    *W += l + r;
    *H += t + b;
}

/* Draws the random parameters of every geometric transform for an H x W
 * input, in transform order, and lists what to do. */
static ft_status plan_steps(const ft_plan *p, draws *d, int H, int W, step *st, int *nsteps, int *oh, int *ow) {
    int n = 0;
    for (int i = 0; i < p->ngeo; i++) {
        const ft_transform *t = &p->ops[i];
        switch (t->kind) {
        case FT_XF_RANDOM_RESIZED_CROP: {
            int top, left, h, w;
            if (!area_crop(d, H, W, t, false, &top, &left, &h, &w)) {
                double in_ratio = (double)W / H, rmin = fmin(t->ratio[0], t->ratio[1]),
                       rmax = fmax(t->ratio[0], t->ratio[1]);
                if (in_ratio < rmin)
                    w = W, h = (int)rint(w / rmin);
                else if (in_ratio > rmax)
                    h = H, w = (int)rint(h * rmax);
                else
                    w = W, h = H;
                top = (H - h) / 2;
                left = (W - w) / 2;
            }
            st[n++] = (step){.kind = ST_CROP, .x = left, .y = top, .w = w, .h = h};
            st[n++] = (step){.kind = ST_RESAMPLE, .w = t->width, .h = t->height};
            H = t->height, W = t->width;
            break;
        }
        case FT_XF_RESIZE: {
            int h, w;
            FT_TRY(resized_size(t, H, W, &h, &w));
            st[n++] = (step){.kind = ST_RESAMPLE, .w = w, .h = h};
            H = h, W = w;
            break;
        }
        case FT_XF_CENTER_CROP: {
            int ch = t->height, cw = t->width;
            if (cw > W || ch > H)
                pad_step(st, &n, &H, &W, cw > W ? (cw - W) / 2 : 0, ch > H ? (ch - H) / 2 : 0,
                         cw > W ? (cw - W + 1) / 2 : 0, ch > H ? (ch - H + 1) / 2 : 0, FT_PAD_CONSTANT, NULL);
            int top = (int)rint((H - ch) / 2.0), left = (int)rint((W - cw) / 2.0);
            st[n++] = (step){.kind = ST_CROP, .x = left, .y = top, .w = cw, .h = ch};
            H = ch, W = cw;
            break;
        }
        case FT_XF_RANDOM_CROP: {
            const int *pd = t->padding;
            if (pd[0] || pd[1] || pd[2] || pd[3])
                pad_step(st, &n, &H, &W, pd[0], pd[1], pd[2], pd[3], t->padding_mode, t);
            if (t->pad_if_needed && W < t->width)
                pad_step(st, &n, &H, &W, t->width - W, 0, t->width - W, 0, t->padding_mode, t);
            if (t->pad_if_needed && H < t->height)
                pad_step(st, &n, &H, &W, 0, t->height - H, 0, t->height - H, t->padding_mode, t);
            if (H < t->height || W < t->width)
                return ft_fail(FT_ERR_VALUE, "RandomCrop: required crop size (%d, %d) is larger than the input "
                                             "image size (%d, %d)", t->height, t->width, H, W);
            int top = 0, left = 0;
            if (!(H == t->height && W == t->width)) {
                top = (int)next_int(d, 0, H - t->height + 1);
                left = (int)next_int(d, 0, W - t->width + 1);
            }
            st[n++] = (step){.kind = ST_CROP, .x = left, .y = top, .w = t->width, .h = t->height};
            H = t->height, W = t->width;
            break;
        }
        case FT_XF_RANDOM_HORIZONTAL_FLIP:
        case FT_XF_RANDOM_VERTICAL_FLIP:
            if (next_u(d) < t->p)
                st[n++] = (step){.kind = t->kind == FT_XF_RANDOM_HORIZONTAL_FLIP ? ST_FLIP_X : ST_FLIP_Y};
            break;
        default: break;
        }
    }
    *nsteps = n;
    *oh = H;
    *ow = W;
    return FT_OK;
}

/* ---- the lazy view: crops, flips and padding move a window over the base
 * image; pixels are only copied by a resample, or when a pad must apply to
 * an image that is already a window. ---- */

typedef struct {
    const uint8_t *base; /* (bh, bw, bpp), rows of `stride` bytes */
    size_t stride;
    int bw, bh, bpp;
    int ox, oy, w, h; /* window in (padded) base coordinates */
    bool fx, fy;      /* logical x runs right-to-left over the window */
    bool padded;
    ft_pad_mode mode;
    uint8_t fill[4];
    int num; /* base decoded at num/8 of the logical size; 8 once resampled */
} view;

static int map_coord(int v, int n, ft_pad_mode mode) {
    if (v >= 0 && v < n)
        return v;
    switch (mode) {
    case FT_PAD_CONSTANT: return -1;
    case FT_PAD_EDGE: return v < 0 ? 0 : n - 1;
    case FT_PAD_REFLECT: {
        if (n == 1)
            return 0;
        int period = 2 * (n - 1), m = ((v % period) + period) % period;
        return m < n ? m : period - m;
    }
    case FT_PAD_SYMMETRIC: {
        int period = 2 * n, m = ((v % period) + period) % period;
        return m < n ? m : period - 1 - m;
    }
    }
    return -1;
}

static int view_col(const view *v, int x) { return map_coord(v->ox + (v->fx ? v->w - 1 - x : x), v->bw, v->mode); }
static int view_row(const view *v, int y) { return map_coord(v->oy + (v->fy ? v->h - 1 - y : y), v->bh, v->mode); }

static bool view_inside(const view *v) {
    return v->ox >= 0 && v->oy >= 0 && v->ox + v->w <= v->bw && v->oy + v->h <= v->bh;
}

static void view_set_image(view *v, const uint8_t *data, size_t stride, int h, int w, int bpp) {
    *v = (view){.base = data, .stride = stride, .bw = w, .bh = h, .bpp = bpp, .w = w, .h = h, .num = 8};
}

static ft_status materialize(view *v, ft_augment_ctx *ctx) {
    ft_fetch_buf *dst = v->base == ctx->img[0].data ? &ctx->img[1] : &ctx->img[0];
    int bpp = v->bpp;
    FT_TRY(reserve(dst, (size_t)v->w * v->h * bpp));
    for (int y = 0; y < v->h; y++) {
        uint8_t *o = dst->data + (size_t)y * v->w * bpp;
        int row = view_row(v, y);
        for (int x = 0; x < v->w; x++) {
            int col = row < 0 ? -1 : view_col(v, x);
            const uint8_t *px = col < 0 ? v->fill : v->base + (size_t)row * v->stride + (size_t)col * bpp;
            memcpy(o + (size_t)x * bpp, px, (size_t)bpp);
        }
    }
    view_set_image(v, dst->data, (size_t)v->w * bpp, v->h, v->w, bpp);
    return FT_OK;
}

/* Horizontal pass: dst (rows, out_w, B) from src rows. */
#define HPASS_BODY(B)                                                                                    \
    for (int r = 0; r < rows; r++) {                                                                     \
        const uint8_t *s = src + (size_t)r * sstride;                                                    \
        uint8_t *o = dst + (size_t)r * dstride;                                                          \
        for (int x = 0; x < out_w; x++) {                                                                \
            const int32_t *k = kk + (size_t)x * ksize;                                                   \
            const uint8_t *px = s + (size_t)bounds[2 * x] * B;                                           \
            int n = bounds[2 * x + 1];                                                                   \
            int32_t acc[B];                                                                              \
            for (int c = 0; c < B; c++)                                                                  \
                acc[c] = FT_RESIZE_ROUND_INIT;                                                           \
            for (int t = 0; t < n; t++)                                                                  \
                for (int c = 0; c < B; c++)                                                              \
                    acc[c] += px[t * B + c] * k[t];                                                      \
            for (int c = 0; c < B; c++)                                                                  \
                o[x * B + c] = ft_resize_clip8(acc[c]);                                                  \
        }                                                                                                \
    }

#define HPASS_ARGS                                                                                       \
    const uint8_t *src, size_t sstride, int rows, uint8_t *dst, size_t dstride, int out_w, const int *bounds, \
        const int32_t *kk, int ksize

/* AVX2 code chosen at run time. -DFT_NO_CLONES builds the plain version, as
 * in ops/pointwise.h: ThreadSanitizer instruments the resolvers, which run
 * before its runtime does. */
#if !defined(FT_NO_CLONES)
#define AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define AVX2_CLONES
#endif

AVX2_CLONES static void hpass1(HPASS_ARGS) { HPASS_BODY(1) }
AVX2_CLONES static void hpass3(HPASS_ARGS) { HPASS_BODY(3) }

/* RGBX: the taps of one output pixel are adjacent input pixels, so one
 * 16-byte load covers four taps of all four channels; each weight is
 * repeated over its pixel's four lanes (kk4, built by expand_weights), and
 * the four tap groups are summed at the end. Integer sums in any order give
 * Pillow's exact result. Reads up to 15 bytes past the last tap: the image
 * buffers keep that much slack. */
#define HPASS4_ARGS                                                                                      \
    const uint8_t *src, size_t sstride, int rows, uint8_t *dst, size_t dstride, int out_w, const int *bounds, \
        const int32_t *kk4 /* (out_w, groups, 16) */, int groups

/* Four summed int32 lanes (R, G, B, X) to four bytes, clipped as Pillow does. */
__attribute__((target("sse4.1"))) static inline uint32_t pack_rgbx(__m128i s) {
    s = _mm_add_epi32(s, _mm_set1_epi32(FT_RESIZE_ROUND_INIT));
    s = _mm_srai_epi32(_mm_max_epi32(s, _mm_setzero_si128()), FT_RESIZE_PRECISION_BITS);
    s = _mm_min_epi32(s, _mm_set1_epi32(255));
    s = _mm_packus_epi32(s, s);
    return (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(s, s));
}

__attribute__((target("avx512f,avx2,sse4.1"))) static void hpass4_avx512(HPASS4_ARGS) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = src + (size_t)r * sstride;
        uint8_t *o = dst + (size_t)r * dstride;
        for (int x = 0; x < out_w; x++) {
            const uint8_t *px = s + (size_t)bounds[2 * x] * 4;
            const int32_t *k = kk4 + (size_t)x * groups * 16;
            int g = (bounds[2 * x + 1] + 3) / 4;
            __m512i acc = _mm512_setzero_si512();
            for (int i = 0; i < g; i++) {
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(px + 16 * i)));
                acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(v, _mm512_loadu_si512(k + 16 * i)));
            }
            __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
            __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            uint32_t v = pack_rgbx(q);
            memcpy(o + 4 * x, &v, 4);
        }
    }
}

__attribute__((target("avx2,sse4.1"))) static void hpass4_avx2(HPASS4_ARGS) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = src + (size_t)r * sstride;
        uint8_t *o = dst + (size_t)r * dstride;
        for (int x = 0; x < out_w; x++) {
            const uint8_t *px = s + (size_t)bounds[2 * x] * 4;
            const int32_t *k = kk4 + (size_t)x * groups * 16;
            int halves = (bounds[2 * x + 1] + 1) / 2;
            __m256i acc = _mm256_setzero_si256();
            for (int i = 0; i < halves; i++) {
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(px + 8 * i)));
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(v, _mm256_loadu_si256((const __m256i *)(k + 8 * i))));
            }
            __m128i q = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
            uint32_t v = pack_rgbx(q);
            memcpy(o + 4 * x, &v, 4);
        }
    }
}

static void hpass4_plain(HPASS4_ARGS) {
    for (int r = 0; r < rows; r++) {
        const uint8_t *s = src + (size_t)r * sstride;
        uint8_t *o = dst + (size_t)r * dstride;
        for (int x = 0; x < out_w; x++) {
            const uint8_t *px = s + (size_t)bounds[2 * x] * 4;
            const int32_t *k = kk4 + (size_t)x * groups * 16;
            for (int c = 0; c < 4; c++) {
                int32_t acc = FT_RESIZE_ROUND_INIT;
                for (int t = 0; t < bounds[2 * x + 1]; t++)
                    acc += px[4 * t + c] * k[4 * t + c];
                o[4 * x + c] = ft_resize_clip8(acc);
            }
        }
    }
}

/* Chosen once for the process: the loader's worker threads all resize, and
 * pthread_once both orders their first calls and publishes the choice. */
static pthread_once_t hpass4_once = PTHREAD_ONCE_INIT;
static void (*hpass4_best)(HPASS4_ARGS);

static void hpass4_choose(void) {
    __builtin_cpu_init();
    hpass4_best = __builtin_cpu_supports("avx512f") ? hpass4_avx512
                  : __builtin_cpu_supports("avx2") ? hpass4_avx2
                                                   : hpass4_plain;
}

static void hpass4(HPASS4_ARGS) {
    pthread_once(&hpass4_once, hpass4_choose);
    hpass4_best(src, sstride, rows, dst, dstride, out_w, bounds, kk4, groups);
}

/* kk4 (out_w, groups, 16): kk's weights each repeated 4 times, zero past the taps. */
static void expand_weights(int32_t *kk4, const int32_t *kk, int out_w, int ksize, int groups) {
    for (int x = 0; x < out_w; x++)
        for (int t = 0; t < groups * 4; t++)
            for (int c = 0; c < 4; c++)
                kk4[((size_t)x * groups * 4 + t) * 4 + c] = t < ksize ? kk[(size_t)x * ksize + t] : 0;
}

/* Vertical pass: dst (out_h, n) from src rows; n = row bytes. */
AVX2_CLONES static void vpass(const uint8_t *src, size_t sstride, uint8_t *dst, size_t dstride, int out_h, int n,
                              const int *bounds, const int32_t *kk, int ksize, int32_t *acc /* (n) */) {
    for (int y = 0; y < out_h; y++) {
        const int32_t *k = kk + (size_t)y * ksize;
        int ymin = bounds[2 * y], taps = bounds[2 * y + 1];
        for (int e = 0; e < n; e++)
            acc[e] = FT_RESIZE_ROUND_INIT;
        for (int t = 0; t < taps; t++) {
            const uint8_t *s = src + (size_t)(ymin + t) * sstride;
            int32_t w = k[t];
            for (int e = 0; e < n; e++)
                acc[e] += s[e] * w;
        }
        uint8_t *o = dst + (size_t)y * dstride;
        for (int e = 0; e < n; e++) {
            int32_t a = acc[e];
            a = a < 0 ? 0 : a;
            a >>= FT_RESIZE_PRECISION_BITS;
            o[e] = (uint8_t)(a > 255 ? 255 : a);
        }
    }
}

static void hpass_any(HPASS_ARGS, const int32_t *kk4, int groups, int bpp) {
    if (bpp == 4)
        hpass4(src, sstride, rows, dst, dstride, out_w, bounds, kk4, groups);
    else if (bpp == 3)
        hpass3(src, sstride, rows, dst, dstride, out_w, bounds, kk, ksize);
    else
        hpass1(src, sstride, rows, dst, dstride, out_w, bounds, kk, ksize);
}

/* Pillow's ImagingResampleInner for the box [x0, x1) x [y0, y1) of an
 * in_h x in_w image: dst (out_h, out_w, B), contiguous. */
static ft_status resample(ft_augment_ctx *ctx, const uint8_t *src, size_t sstride, int in_h, int in_w, int bpp,
                          double x0, double x1, double y0, double y1, ft_fetch_buf *dst, int out_h, int out_w) {
    size_t out_row = (size_t)out_w * bpp;
    FT_TRY(reserve(dst, out_row * out_h));
    bool need_h = !(out_w == in_w && x0 == 0 && x1 == in_w);
    bool need_v = !(out_h == in_h && y0 == 0 && y1 == in_h);
    if (!need_h && !need_v) {
        for (int y = 0; y < out_h; y++)
            memcpy(dst->data + y * out_row, src + (size_t)y * sstride, out_row);
        return FT_OK;
    }
    int kh = ft_resize_ksize(x0, x1, out_w), kv = ft_resize_ksize(y0, y1, out_h), groups = (kh + 3) / 4;
    size_t nh = (size_t)out_w * (2 + kh), nv = (size_t)out_h * (2 + kv), n4 = bpp == 4 ? (size_t)out_w * groups * 16 : 0;
    FT_TRY(reserve(&ctx->coef, (nh + nv + n4) * sizeof(int32_t) + 64));
    int32_t *bh = (int32_t *)ctx->coef.data, *kkh = bh + 2 * out_w, *bv = kkh + (size_t)out_w * kh,
            *kkv = bv + 2 * out_h, *kk4 = kkv + (size_t)out_h * kv;
    for (int x = 0; need_h && x < out_w; x++)
        ft_resize_coeffs_at(in_w, x0, x1, out_w, kh, x, bh + 2 * x, kkh + (size_t)x * kh);
    for (int y = 0; need_v && y < out_h; y++)
        ft_resize_coeffs_at(in_h, y0, y1, out_h, kv, y, bv + 2 * y, kkv + (size_t)y * kv);
    if (bpp == 4 && need_h)
        expand_weights(kk4, kkh, out_w, kh, groups);
    if (!need_v) {
        hpass_any(src, sstride, in_h, dst->data, out_row, out_w, bh, kkh, kh, kk4, groups, bpp);
        return FT_OK;
    }
    FT_TRY(reserve(&ctx->acc, out_row * sizeof(int32_t)));
    if (!need_h) {
        vpass(src, sstride, dst->data, out_row, out_h, (int)out_row, bv, kkv, kv, (int32_t *)ctx->acc.data);
        return FT_OK;
    }
    int first = bv[0], last = bv[2 * (out_h - 1)] + bv[2 * (out_h - 1) + 1];
    for (int y = 0; y < out_h; y++)
        bv[2 * y] -= first;
    FT_TRY(reserve(&ctx->tmp, out_row * (size_t)(last - first)));
    hpass_any(src + (size_t)first * sstride, sstride, last - first, ctx->tmp.data, out_row, out_w, bh, kkh, kh, kk4,
              groups, bpp);
    vpass(ctx->tmp.data, out_row, dst->data, out_row, out_h, (int)out_row, bv, kkv, kv, (int32_t *)ctx->acc.data);
    return FT_OK;
}

static ft_status run_steps(ft_augment_ctx *ctx, view *v, const step *st, int nsteps) {
    for (int i = 0; i < nsteps; i++) {
        const step *s = &st[i];
        switch (s->kind) {
        case ST_CROP:
            v->ox += v->fx ? v->w - s->x - s->w : s->x;
            v->oy += v->fy ? v->h - s->y - s->h : s->y;
            v->w = s->w;
            v->h = s->h;
            break;
        case ST_FLIP_X: v->fx = !v->fx; break;
        case ST_FLIP_Y: v->fy = !v->fy; break;
        case ST_PAD:
            /* Padding a window (or padding twice) must see the window's own
             * edges: copy it out first. */
            if (v->padded || v->ox || v->oy || v->w != v->bw || v->h != v->bh)
                FT_TRY(materialize(v, ctx));
            v->ox = -(v->fx ? s->pad[2] : s->pad[0]);
            v->oy = -(v->fy ? s->pad[3] : s->pad[1]);
            v->w += s->pad[0] + s->pad[2];
            v->h += s->pad[1] + s->pad[3];
            v->padded = true;
            v->mode = s->mode;
            memcpy(v->fill, s->fill, 4);
            break;
        case ST_RESAMPLE: {
            ft_fetch_buf *dst = v->base == ctx->img[0].data ? &ctx->img[1] : &ctx->img[0];
            if (v->num != 8) {
                /* Decoded at num/8: the window, in full-size coordinates,
                 * becomes a fractional box of the smaller image. */
                double f = v->num / 8.0;
                FT_TRY(resample(ctx, v->base, v->stride, v->bh, v->bw, v->bpp, v->ox * f, (v->ox + v->w) * f,
                                v->oy * f, (v->oy + v->h) * f, dst, s->h, s->w));
            } else {
                if (v->fx || v->fy || !view_inside(v)) {
                    FT_TRY(materialize(v, ctx));
                    dst = v->base == ctx->img[0].data ? &ctx->img[1] : &ctx->img[0];
                }
                const uint8_t *src = v->base + (size_t)v->oy * v->stride + (size_t)v->ox * v->bpp;
                FT_TRY(resample(ctx, src, v->stride, v->h, v->w, v->bpp, 0, v->w, 0, v->h, dst, s->h, s->w));
            }
            view_set_image(v, dst->data, (size_t)s->w * v->bpp, s->h, s->w, v->bpp);
            break;
        }
        }
    }
    return FT_OK;
}

/* ---- output ---- */

/* One output row per channel through the lookup table. NCHW: `plane`
 * elements between channels and xs = 1; NHWC: plane = 1 and xs = C. */
#define WRITE_ROWS(T, LUT)                                                                                  \
    do {                                                                                                    \
        T *o = (T *)out;                                                                                    \
        for (int y = 0; y < H; y++) {                                                                       \
            int row = view_row(v, y);                                                                       \
            const uint8_t *srow = row < 0 ? NULL : v->base + (size_t)row * v->stride;                       \
            for (int c = 0; c < C; c++) {                                                                   \
                const T *lut = LUT[c];                                                                      \
                T *d = o + (size_t)c * plane + (size_t)y * ys;                                              \
                int off = v->bpp == 1 ? 0 : c;                                                              \
                if (!srow) {                                                                                \
                    T f = lut[v->fill[c]];                                                                  \
                    for (int x = 0; x < W; x++)                                                             \
                        d[x * xs] = f;                                                                      \
                } else if (fast) {                                                                          \
                    const uint8_t *s = srow + (ptrdiff_t)first * v->bpp + off;                              \
                    for (int x = 0; x < W; x++)                                                             \
                        d[x * xs] = lut[s[x * step]];                                                       \
                } else {                                                                                    \
                    for (int x = 0; x < W; x++) {                                                           \
                        int col = colmap[x];                                                                \
                        d[x * xs] = lut[col < 0 ? v->fill[c] : srow[(size_t)col * v->bpp + off]];          \
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
    } while (0)

static ft_status write_output(const ft_plan *p, ft_augment_ctx *ctx, const view *v, void *out) {
    int C = p->C, H = p->H, W = p->W;
    bool nhwc = p->out.channels_last;
    size_t plane = nhwc ? 1 : (size_t)H * W, ys = nhwc ? (size_t)W * C : (size_t)W;
    ptrdiff_t xs = nhwc ? C : 1;
    bool fast = v->ox >= 0 && v->ox + v->w <= v->bw;
    int first = fast ? v->ox + (v->fx ? v->w - 1 : 0) : 0;
    ptrdiff_t step = v->fx ? -v->bpp : v->bpp;
    FT_TRY(reserve(&ctx->colmap, (size_t)W * sizeof(int32_t)));
    int32_t *colmap = (int32_t *)ctx->colmap.data;
    for (int x = 0; !fast && x < W; x++)
        colmap[x] = view_col(v, x);
    switch (p->out.dtype) {
    case FT_FLOAT32: WRITE_ROWS(float, p->lut_f32); break;
    case FT_UINT8: WRITE_ROWS(uint8_t, p->lut_u8); break;
    default: WRITE_ROWS(uint16_t, p->lut_u16); break;
    }
    return FT_OK;
}

static void store(const ft_plan *p, void *out, size_t at, float v) {
    switch (p->out.dtype) {
    case FT_FLOAT32: ((float *)out)[at] = v; break;
    case FT_BFLOAT16: ((uint16_t *)out)[at] = ft_f32_to_bf16(v); break;
    case FT_FLOAT16: ((uint16_t *)out)[at] = ft_f32_to_f16(v); break;
    default: ((uint8_t *)out)[at] = (uint8_t)(v <= 0 ? 0 : v >= 255 ? 255 : (int)v); break;
    }
}

static size_t elem_at(const ft_plan *p, int c, int y, int x) {
    return p->out.channels_last ? ((size_t)y * p->W + x) * p->C + c : ((size_t)c * p->H + y) * p->W + x;
}

static void fill_rect(const ft_plan *p, int op, void *out, int top, int left, int h, int w) {
    for (int c = 0; c < p->C; c++)
        for (int y = top; y < top + h; y++)
            for (int x = left; x < left + w; x++)
                store(p, out, elem_at(p, c, y, x), p->erase_value[op][c]);
}

static ft_status noise_rect(const ft_plan *p, int op, const draws *d, void *out, int top, int left, int h, int w) {
    uint64_t count = (uint64_t)p->C * h * w;
    if (count / 2 >= (1u << 24))
        return ft_fail(FT_ERR_VALUE, "RandomErasing(value='random'): an erased area of %llu values is too large",
                       (unsigned long long)count);
    double z[2] = {0, 0};
    for (uint64_t k = 0; k < count; k++) {
        if (k % 2 == 0) {
            ft_philox_block b = ft_philox(d->seed, (uint64_t)d->index,
                                          d->epoch << 32 | 1ull << 31 | (uint64_t)op << 24 | k / 2);
            double u1 = ft_uniform_f64(b.v[0], b.v[1]), u2 = ft_uniform_f64(b.v[2], b.v[3]);
            double r = sqrt(-2.0 * log(1.0 - u1));
            z[0] = r * cos(2.0 * M_PI * u2);
            z[1] = r * sin(2.0 * M_PI * u2);
        }
        int c = (int)(k / ((uint64_t)h * w)), rest = (int)(k % ((uint64_t)h * w));
        int y = top + rest / w, x = left + rest % w;
        store(p, out, elem_at(p, c, y, x), apply_normalizes(p, op + 1, c, (float)z[k % 2]));
    }
    return FT_OK;
}

static ft_status tensor_ops(const ft_plan *p, draws *d, void *out) {
    int H = p->H, W = p->W;
    for (int i = p->ngeo; i < p->nops; i++) {
        const ft_transform *t = &p->ops[i];
        if (t->kind == FT_XF_RANDOM_ERASING) {
            if (!(next_u(d) < t->p))
                continue;
            int top, left, h, w;
            if (!area_crop(d, H, W, t, true, &top, &left, &h, &w))
                continue;
            if (t->random_fill)
                FT_TRY(noise_rect(p, i, d, out, top, left, h, w));
            else
                fill_rect(p, i, out, top, left, h, w);
        } else if (t->kind == FT_XF_CUTOUT) {
            if (!(next_u(d) < t->p))
                continue;
            for (int hole = 0; hole < t->holes; hole++) {
                int cy = (int)next_int(d, 0, H), cx = (int)next_int(d, 0, W), half = t->length / 2;
                int y1 = cy - half < 0 ? 0 : cy - half, y2 = cy + half > H ? H : cy + half;
                int x1 = cx - half < 0 ? 0 : cx - half, x2 = cx + half > W ? W : cx + half;
                fill_rect(p, i, out, y1, x1, y2 - y1, x2 - x1);
            }
        }
    }
    return FT_OK;
}

/* ---- one sample ---- */

ft_status ft_augment_sample(const ft_plan *p, ft_augment_ctx *ctx, const ft_sample *s, const ft_image *decoded,
                            bool full_decode, uint64_t seed, uint64_t epoch, int64_t index, void *out) {
    ctx->have_decoded = false;
    draws d = {seed, epoch, index, 0};
    int H, W;
    ft_jpeg_info info = {0};
    ft_png_info png = {0};
    if (decoded) {
        H = decoded->height, W = decoded->width;
    } else if (s->kind == FT_SAMPLE_RAW) {
        H = s->height, W = s->width;
        if (H < 1 || W < 1 || H > (1 << 24) || W > (1 << 24) || !(s->channels == 1 || s->channels == 3) ||
            (uint64_t)H * (uint64_t)W * (uint64_t)s->channels != (uint64_t)s->size)
            return ft_fail(FT_ERR_FORMAT, "a raw sample of %d x %d x %d pixels cannot hold %zu bytes", H, W,
                           s->channels, s->size);
    } else if (s->kind == FT_SAMPLE_JPEG) {
        FT_TRY(ft_jpeg_read_info(s->data, s->size, &info));
        H = info.height, W = info.width;
    } else if (s->kind == FT_SAMPLE_PNG) {
        FT_TRY(ft_png_read_info(s->data, s->size, &png));
        H = png.height, W = png.width;
    } else {
        return ft_fail(FT_ERR_FORMAT, "unknown sample kind %d", (int)s->kind);
    }
    step st[MAX_STEPS];
    int nsteps = 0, oh = 0, ow = 0;
    FT_TRY(plan_steps(p, &d, H, W, st, &nsteps, &oh, &ow));
    if (oh != p->H || ow != p->W)
        return ft_fail(FT_ERR_SHAPE, "the transforms make a %d x %d image of this %d x %d sample, but the batch "
                                     "holds %d x %d images (end the transforms with a fixed-size crop or resize)",
                       oh, ow, H, W, p->H, p->W);
    view v;
    if (decoded) {
        view_set_image(&v, decoded->data, decoded->stride, H, W, decoded->bpp);
    } else if (s->kind == FT_SAMPLE_RAW) {
        if (s->channels == 3 && p->C == 1) {
            FT_TRY(reserve(&ctx->decode, (size_t)H * W));
            to_luma(s->data, 3, ctx->decode.data, (size_t)H * W);
            view_set_image(&v, ctx->decode.data, (size_t)W, H, W, 1);
        } else {
            view_set_image(&v, s->data, (size_t)W * s->channels, H, W, s->channels);
        }
    } else if (s->kind == FT_SAMPLE_PNG) {
        /* PNG has no reduced-size decode: the full image, then the steps as
         * for a raw one. */
        int bpp = p->C;
        FT_TRY(reserve(&ctx->decode, (size_t)H * W * bpp));
        FT_TRY(ft_png_decode(s->data, s->size, &png, bpp, ctx->decode.data, (size_t)W * bpp));
        view_set_image(&v, ctx->decode.data, (size_t)W * bpp, H, W, bpp);
        ctx->decoded = (ft_image){ctx->decode.data, (size_t)W * bpp, H, W, bpp};
        ctx->have_decoded = full_decode;
    } else {
        int num = 8;
        ft_transform_kind k0 = p->ngeo ? p->ops[0].kind : 0;
        if (p->out.dct_scale && !full_decode && nsteps > 0 &&
            (k0 == FT_XF_RESIZE || k0 == FT_XF_RANDOM_RESIZED_CROP)) {
            const step *rs = st[0].kind == ST_CROP ? &st[1] : &st[0];
            double rw = st[0].kind == ST_CROP ? st[0].w : W, rh = st[0].kind == ST_CROP ? st[0].h : H;
            num = ft_jpeg_pick_scale(rw, rh, rs->w, rs->h);
        }
        /* one channel of a colour file: its RGB made luma as Pillow's convert("L") makes it (libjpeg's own Y
         * differs by the chroma's rounding and upsampling), as for raw and PNG images */
        bool luma = p->C == 1 && info.components != 1;
        int bpp = p->C == 1 && !luma ? 1 : 4;
        int sh = ft_jpeg_scaled(H, num), sw = ft_jpeg_scaled(W, num);
        FT_TRY(reserve(&ctx->decode, (size_t)sh * sw * bpp));
        FT_TRY(ft_jpeg_decode(ctx->jpeg, s->data, s->size, &info, num, bpp, ctx->decode.data, (size_t)sw * bpp));
        if (luma) {
            to_luma(ctx->decode.data, 4, ctx->decode.data, (size_t)sh * sw);
            bpp = 1;
        }
        view_set_image(&v, ctx->decode.data, (size_t)sw * bpp, sh, sw, bpp);
        v.num = num;
        if (num == 8) {
            ctx->decoded = (ft_image){ctx->decode.data, (size_t)sw * bpp, sh, sw, bpp};
            ctx->have_decoded = full_decode;
        }
    }
    if (v.num != 8) {
        /* The window stays in full-size coordinates until the resample. */
        v.w = W, v.h = H;
    }
    FT_TRY(run_steps(ctx, &v, st, nsteps));
    if (v.w != p->W || v.h != p->H || v.num != 8)
        return ft_fail(FT_ERR_RUNTIME, "internal: the pipeline produced %d x %d, expected %d x %d", v.h, v.w, p->H,
                       p->W);
    FT_TRY(write_output(p, ctx, &v, out));
    return tensor_ops(p, &d, out);
}
