/* 2-d upsampling on CUDA, nearest and bilinear: the CUDA side of
 * ops/upsample.c, with its results bit for bit.
 *
 * Legend: N batch, C channels, H W input size, P Q the output size (P = H sh,
 * Q = W sw for nearest).
 *
 * The backwards are gathers: one thread per input element adds what it
 * passed to dout (nearest: its sh x sw block; bilinear: the outputs that
 * read it, weighted, through kernels/interp.h) in the CPU's order from 0: no
 * atomics, and the CPU's bits. Threads are numbered channels innermost when the
 * tensor they walk is channels-last, so that neighbouring threads touch
 * neighbouring memory. Tensors have any strides, and each may be float32 or
 * a 16-bit float (ft_cuda_kind): values are loaded as float, the backward's
 * sums run in float, and every result is rounded once, so a 16-bit result
 * is the float32 kernel's on the same values, rounded. */
#include "backend.h"
#include "kernels/interp.h"
#include "ops/cuda_ops.h"

namespace {

constexpr int THREADS = 256;

typedef struct {
    int64_t N, C, H, W, sh, sw;
    int64_t xs[4], ys[4]; /* strides of the small (inp, dinp) and the big (out, dout) tensor */
    bool cl;              /* threads numbered channels innermost */
    int8_t kx, ky;        /* storage of the small and the big tensor */

    /* (n, c, h, w) of thread index i over a tensor of rows x cols pixels */
    __device__ void coords(int64_t i, int64_t rows, int64_t cols, int64_t *n, int64_t *c, int64_t *h,
                           int64_t *w) const {
        if (cl) {
            *c = i % C, i /= C;
            *w = i % cols, i /= cols;
            *h = i % rows, *n = i / rows;
        } else {
            *w = i % cols, i /= cols;
            *h = i % rows, i /= rows;
            *c = i % C, *n = i / C;
        }
    }
} up_geom;

static up_geom geom_of(const ft_tensor *small, const ft_tensor *big, const ft_tensor *walked, int64_t sh,
                       int64_t sw) {
    up_geom g = {};
    g.N = small->shape[0], g.C = small->shape[1], g.H = small->shape[2], g.W = small->shape[3];
    g.sh = sh, g.sw = sw;
    for (int d = 0; d < 4; d++)
        g.xs[d] = small->strides[d], g.ys[d] = big->strides[d];
    g.kx = ft_cuda_kind(small->dtype), g.ky = ft_cuda_kind(big->dtype);
    g.cl = walked->shape[1] > 1 && walked->strides[1] == 1;
    return g;
}

__global__ void __launch_bounds__(THREADS) up_forward(up_geom g, const char *x, char *y) {
    int64_t P = g.H * g.sh, Q = g.W * g.sw, total = g.N * g.C * P * Q, n, c, i, j;
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < total; k += (int64_t)gridDim.x * THREADS) {
        g.coords(k, P, Q, &n, &c, &i, &j);
        float v = ft_cuda_load_f(x, n * g.xs[0] + c * g.xs[1] + (i / g.sh) * g.xs[2] + (j / g.sw) * g.xs[3], g.kx);
        ft_cuda_store_f(y, n * g.ys[0] + c * g.ys[1] + i * g.ys[2] + j * g.ys[3], g.ky, v);
    }
}

__global__ void __launch_bounds__(THREADS) up_backward(up_geom g, const char *dy, char *dx, bool acc) {
    int64_t total = g.N * g.C * g.H * g.W, n, c, h, w;
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < total; k += (int64_t)gridDim.x * THREADS) {
        g.coords(k, g.H, g.W, &n, &c, &h, &w);
        int64_t b = n * g.ys[0] + c * g.ys[1] + h * g.sh * g.ys[2] + w * g.sw * g.ys[3];
        float s = 0.0f;
        for (int64_t a = 0; a < g.sh; a++)
            for (int64_t e = 0; e < g.sw; e++)
                s += ft_cuda_load_f(dy, b + a * g.ys[2] + e * g.ys[3], g.ky);
        int64_t o = n * g.xs[0] + c * g.xs[1] + h * g.xs[2] + w * g.xs[3];
        ft_cuda_store_f(dx, o, g.kx, acc ? ft_cuda_load_f(dx, o, g.kx) + s : s);
    }
}

static ft_status upsample_forward(const ft_tensor *out, const ft_tensor *inp, int64_t sh, int64_t sw) {
    FT_TRY(ft_cuda_use_device(inp));
    up_geom g = geom_of(inp, out, out, sh, sw);
    int64_t total = g.N * g.C * g.H * sh * g.W * sw;
    up_forward<<<ft_cuda_blocks(total, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(g, (const char *)ft_tensor_data(inp),
                                                                              (char *)ft_tensor_data(out));
    return ft_cuda_launched("up_forward");
}

static ft_status upsample_backward(const ft_tensor *dinp, const ft_tensor *dout, int64_t sh, int64_t sw,
                                   bool accumulate) {
    FT_TRY(ft_cuda_use_device(dout));
    up_geom g = geom_of(dinp, dout, dinp, sh, sw);
    up_backward<<<ft_cuda_blocks(g.N * g.C * g.H * g.W, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
        g, (const char *)ft_tensor_data(dout), (char *)ft_tensor_data(dinp), accumulate);
    return ft_cuda_launched("up_backward");
}

/* Bilinear: the geometry's sh and sw hold the output size (P, Q); each
 * axis's coordinate scale comes with it. */
typedef struct {
    float scale_h, scale_w;
    bool ac;
} lerp_scales;

static lerp_scales scales_of(const ft_tensor *small, const ft_tensor *big, const ft_bilinear2d_params *p) {
    return {ft_lerp_scale(small->shape[2], big->shape[2], p->scale_h, p->align_corners),
            ft_lerp_scale(small->shape[3], big->shape[3], p->scale_w, p->align_corners), p->align_corners};
}

__global__ void __launch_bounds__(THREADS) lerp_forward(up_geom g, lerp_scales s, const char *x, char *y) {
    int64_t P = g.sh, Q = g.sw, total = g.N * g.C * P * Q, n, c, i, j;
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < total; k += (int64_t)gridDim.x * THREADS) {
        g.coords(k, P, Q, &n, &c, &i, &j);
        ft_lerp_tap th = ft_lerp_at(i, g.H, s.scale_h, s.ac), tw = ft_lerp_at(j, g.W, s.scale_w, s.ac);
        int64_t b = n * g.xs[0] + c * g.xs[1], r0 = b + th.i0 * g.xs[2], r1 = b + th.i1 * g.xs[2];
        float top = tw.l0 * ft_cuda_load_f(x, r0 + tw.i0 * g.xs[3], g.kx) +
                    tw.l1 * ft_cuda_load_f(x, r0 + tw.i1 * g.xs[3], g.kx);
        float bottom = tw.l0 * ft_cuda_load_f(x, r1 + tw.i0 * g.xs[3], g.kx) +
                       tw.l1 * ft_cuda_load_f(x, r1 + tw.i1 * g.xs[3], g.kx);
        ft_cuda_store_f(y, n * g.ys[0] + c * g.ys[1] + i * g.ys[2] + j * g.ys[3], g.ky, th.l0 * top + th.l1 * bottom);
    }
}

__global__ void __launch_bounds__(THREADS) lerp_backward(up_geom g, lerp_scales s, const char *dy, char *dx,
                                                         bool acc) {
    int64_t P = g.sh, Q = g.sw, total = g.N * g.C * g.H * g.W, n, c, h, w, plo, phi, qlo, qhi;
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < total; k += (int64_t)gridDim.x * THREADS) {
        g.coords(k, g.H, g.W, &n, &c, &h, &w);
        ft_lerp_readers(h, g.H, P, s.scale_h, s.ac, &plo, &phi);
        ft_lerp_readers(w, g.W, Q, s.scale_w, s.ac, &qlo, &qhi);
        int64_t b = n * g.ys[0] + c * g.ys[1];
        float sum = 0.0f;
        for (int64_t i = plo; i < phi; i++) {
            float row = 0.0f;
            for (int64_t q = qlo; q < qhi; q++)
                row += ft_lerp_weight(ft_lerp_at(q, g.W, s.scale_w, s.ac), w) *
                       ft_cuda_load_f(dy, b + i * g.ys[2] + q * g.ys[3], g.ky);
            sum += ft_lerp_weight(ft_lerp_at(i, g.H, s.scale_h, s.ac), h) * row;
        }
        int64_t o = n * g.xs[0] + c * g.xs[1] + h * g.xs[2] + w * g.xs[3];
        ft_cuda_store_f(dx, o, g.kx, acc ? ft_cuda_load_f(dx, o, g.kx) + sum : sum);
    }
}

static ft_status bilinear_forward(const ft_tensor *out, const ft_tensor *inp, const ft_bilinear2d_params *p) {
    FT_TRY(ft_cuda_use_device(inp));
    up_geom g = geom_of(inp, out, out, out->shape[2], out->shape[3]);
    lerp_forward<<<ft_cuda_blocks(g.N * g.C * g.sh * g.sw, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
        g, scales_of(inp, out, p), (const char *)ft_tensor_data(inp), (char *)ft_tensor_data(out));
    return ft_cuda_launched("lerp_forward");
}

static ft_status bilinear_backward(const ft_tensor *dinp, const ft_tensor *dout, const ft_bilinear2d_params *p,
                                   bool accumulate) {
    FT_TRY(ft_cuda_use_device(dout));
    up_geom g = geom_of(dinp, dout, dinp, dout->shape[2], dout->shape[3]);
    lerp_backward<<<ft_cuda_blocks(g.N * g.C * g.H * g.W, THREADS), THREADS, 0, FT_CUDA_STREAM>>>(
        g, scales_of(dinp, dout, p), (const char *)ft_tensor_data(dout), (char *)ft_tensor_data(dinp), accumulate);
    return ft_cuda_launched("lerp_backward");
}

} // namespace

void ft_cuda_register_upsample(struct ft_cuda_ops *ops) {
    ops->upsample_nearest2d_forward = upsample_forward;
    ops->upsample_nearest2d_backward = upsample_backward;
    ops->upsample_bilinear2d_forward = bilinear_forward;
    ops->upsample_bilinear2d_backward = bilinear_backward;
}
