/* Scaled dot-product attention on the device (ops/attention.h), without
 * storing any (Tq, Tk) matrix: the forward keeps the online softmax of each
 * query row, the backward recomputes the probabilities from the saved
 * log-sum-exp.
 *
 * One warp per row: lane l holds elements d = l + 32 t (t < DT) of its row's
 * vectors in registers, and a dot product is each lane's fmaf chain over t
 * followed by a fixed xor-shuffle tree, so results are repeatable. The rows
 * the warps of a block share (keys and values for query rows; queries, dout
 * and their statistics for key rows) come through shared memory in tiles of
 * TILE rows. Three kernels make the backward, none with atomics:
 *   delta (N, H, Tq) = rowsum(dout * out), one warp per query row;
 *   dq, one warp per query row, over the keys it sees;
 *   dk and dv, one warp per key row, over the queries that see it.
 * Dropout on the probabilities follows ops/attention.c: P o Z times v, the
 * sums over P; every lane of a warp draws its pair's factor of Z. Operands
 * may be float32, bfloat16 or float16, each its own: elements convert to
 * float32 as they are loaded and round once as results are stored.
 *
 * Legend: as ops/attention.h; MAXD the largest head size the registers take. */
#include <math.h>

#include "backend.h"
#include "kernels/activation.h"
#include "kernels/philox.h"
#include "ops/cuda_ops.h"

#define WARPS 8 /* rows per block */
#define TILE 16 /* shared rows per tile */
#define MAXD 256
#define DT (MAXD / 32)

namespace {

/* A (N, H, T, D) tensor's data, storage (ft_cuda_kind) and strides over N,
 * H and T (D has unit stride): at() is a row's element offset. */
struct rows4 {
    char *p;
    int8_t kind;
    int64_t sn, sh, st;
    __device__ int64_t at(int64_t n, int64_t h, int64_t t) const { return n * sn + h * sh + t * st; }
    __device__ float get(int64_t row, int64_t d) const { return ft_cuda_load_f(p, row + d, kind); }
    __device__ void put(int64_t row, int64_t d, float x) const { ft_cuda_store_f(p, row + d, kind, x); }
};

static rows4 rows_of(const ft_tensor *t) {
    rows4 r = {NULL, FT_CUDA_F32, 0, 0, 0};
    if (t) {
        r.p = (char *)ft_tensor_data(t);
        r.kind = ft_cuda_kind(t->dtype);
        r.sn = t->strides[0], r.sh = t->strides[1], r.st = t->strides[2];
    }
    return r;
}

struct sdpa_args {
    rows4 q, k, v, out, dout, dq, dk, dv;
    float *lse; /* (N, H, Tq) with strides ls, NULL when not stored */
    int64_t ls[3];
    float *delta; /* (N * H, Tq) */
    int64_t N, H, Tq, Tk, D;
    float scale;
    bool causal;
    bool dropout;
    uint64_t seed, offset;
    uint32_t threshold;
    float keep; /* 1 / (1 - p) */
    const unsigned char *km; /* the key mask, NULL when none, with strides kms over N and T */
    int64_t kms[2];
};

static __device__ float warp_sum(float x) {
#pragma unroll
    for (int w = 16; w >= 1; w /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, w);
    return x;
}

/* The dot product of a row in registers with a row in shared memory (zero past D). */
static __device__ float dot_row(const float *reg, const float *sh, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int t = 0; t < DT; t++)
        acc = fmaf(reg[t], sh[lane + 32 * t], acc);
    return warp_sum(acc);
}

/* reg = x's row (n, h, t) times mul, zero past D and when there is no such row. */
static __device__ void load_reg(float *reg, const rows4 &x, bool row, int64_t n, int64_t h, int64_t t_, int64_t D,
                                int lane, float mul) {
    int64_t r = row ? x.at(n, h, t_) : 0;
#pragma unroll
    for (int t = 0; t < DT; t++) {
        int64_t d = lane + 32 * t;
        reg[t] = row && d < D ? x.get(r, d) * mul : 0.0f;
    }
}

/* Rows [r0, r0 + TILE) of x (those below T) times mul into tile (TILE, MAXD), zero elsewhere. */
static __device__ void load_tile(float (*tile)[MAXD], const rows4 &x, int64_t n, int64_t h, int64_t r0, int64_t T,
                                 int64_t D, float mul) {
    for (int e = threadIdx.x; e < TILE * MAXD; e += blockDim.x) {
        int r = e / MAXD, d = e % MAXD;
        tile[r][d] = r0 + r < T && d < D ? x.get(x.at(n, h, r0 + r), d) * mul : 0.0f;
    }
}

/* Whether key j of sample n is masked out. */
static __device__ bool masked(const sdpa_args &a, int64_t n, int64_t j) {
    return a.km && a.km[n * a.kms[0] + j * a.kms[1]];
}

/* Query i's dropout factor for key j of head (n, h): 1 without dropout. */
static __device__ float drop_factor(const sdpa_args &a, int64_t n, int64_t h, int64_t i, int64_t j) {
    if (!a.dropout)
        return 1.0f;
    uint64_t e = (uint64_t)(((n * a.H + h) * a.Tq + i) * a.Tk + j);
    return ft_dropout_factor(a.seed, a.offset, e, a.threshold, a.keep);
}

static __device__ float lse_at(const sdpa_args &a, int64_t n, int64_t h, int64_t i) {
    return a.lse[n * a.ls[0] + h * a.ls[1] + i * a.ls[2]];
}

/* The query blocks of a grid: blockIdx.x = (n * H + h) * blocks_per_head + b. */
struct block_pos {
    int64_t n, h, row0;
};

static __device__ block_pos block_of(const sdpa_args &a, int64_t T) {
    int64_t per = (T + WARPS - 1) / WARPS, nh = blockIdx.x / per;
    return {nh / a.H, nh % a.H, (blockIdx.x % per) * WARPS};
}

__global__ void __launch_bounds__(WARPS * 32) sdpa_forward_kernel(sdpa_args a) {
    __shared__ float ks[TILE][MAXD], vs[TILE][MAXD];
    block_pos b = block_of(a, a.Tq);
    int lane = threadIdx.x % 32;
    int64_t i = b.row0 + threadIdx.x / 32;
    bool row = i < a.Tq;
    float q[DT], o[DT];
    load_reg(q, a.q, row, b.n, b.h, i, a.D, lane, a.scale);
    for (int t = 0; t < DT; t++)
        o[t] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int64_t last = b.row0 + WARPS < a.Tq ? b.row0 + WARPS : a.Tq; /* keys past the block's last query are unseen */
    int64_t kend = a.causal && last < a.Tk ? last : a.Tk;
    for (int64_t j0 = 0; j0 < kend; j0 += TILE) {
        __syncthreads();
        load_tile(ks, a.k, b.n, b.h, j0, a.Tk, a.D, 1.0f);
        load_tile(vs, a.v, b.n, b.h, j0, a.Tk, a.D, 1.0f);
        __syncthreads();
        for (int jj = 0; jj < TILE && row; jj++) {
            int64_t j = j0 + jj;
            if (j >= a.Tk || (a.causal && j > i))
                break;
            if (masked(a, b.n, j))
                continue;
            float s = dot_row(q, ks[jj], lane);
            if (s > m) { /* a new max: rescale what was summed (nothing when m = -inf) */
                float alpha = m == -INFINITY ? 0.0f : ft_expf(m - s);
                l *= alpha;
                for (int t = 0; t < DT; t++)
                    o[t] *= alpha;
                m = s;
            }
            float p = ft_expf(s - m);
            l += p;
            p *= drop_factor(a, b.n, b.h, i, j);
#pragma unroll
            for (int t = 0; t < DT; t++)
                o[t] = fmaf(p, vs[jj][lane + 32 * t], o[t]);
        }
    }
    if (!row)
        return;
    int64_t dst = a.out.at(b.n, b.h, i);
#pragma unroll
    for (int t = 0; t < DT; t++) {
        int64_t d = lane + 32 * t;
        if (d < a.D)
            a.out.put(dst, d, l > 0.0f ? o[t] / l : 0.0f);
    }
    if (a.lse && lane == 0)
        a.lse[b.n * a.ls[0] + b.h * a.ls[1] + i * a.ls[2]] = l > 0.0f ? m + logf(l) : -INFINITY;
}

__global__ void __launch_bounds__(WARPS * 32) sdpa_delta_kernel(sdpa_args a) {
    int64_t row = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= a.N * a.H * a.Tq)
        return;
    int lane = threadIdx.x % 32;
    int64_t nh = row / a.Tq, n = nh / a.H, h = nh % a.H, i = row % a.Tq;
    int64_t x = a.dout.at(n, h, i), y = a.out.at(n, h, i);
    float acc = 0.0f;
    for (int64_t d = lane; d < a.D; d += 32)
        acc = fmaf(a.dout.get(x, d), a.out.get(y, d), acc);
    acc = warp_sum(acc);
    if (lane == 0)
        a.delta[row] = acc;
}

__global__ void __launch_bounds__(WARPS * 32) sdpa_dq_kernel(sdpa_args a) {
    __shared__ float ks[TILE][MAXD], vs[TILE][MAXD];
    block_pos b = block_of(a, a.Tq);
    int lane = threadIdx.x % 32;
    int64_t i = b.row0 + threadIdx.x / 32;
    bool row = i < a.Tq;
    float q[DT], g[DT], dq[DT];
    load_reg(q, a.q, row, b.n, b.h, i, a.D, lane, a.scale);
    load_reg(g, a.dout, row, b.n, b.h, i, a.D, lane, 1.0f);
    for (int t = 0; t < DT; t++)
        dq[t] = 0.0f;
    float ls = row ? lse_at(a, b.n, b.h, i) : 0.0f, dl = row ? a.delta[(b.n * a.H + b.h) * a.Tq + i] : 0.0f;
    int64_t last = b.row0 + WARPS < a.Tq ? b.row0 + WARPS : a.Tq;
    int64_t kend = a.causal && last < a.Tk ? last : a.Tk;
    for (int64_t j0 = 0; j0 < kend; j0 += TILE) {
        __syncthreads();
        load_tile(ks, a.k, b.n, b.h, j0, a.Tk, a.D, 1.0f);
        load_tile(vs, a.v, b.n, b.h, j0, a.Tk, a.D, 1.0f);
        __syncthreads();
        for (int jj = 0; jj < TILE && row; jj++) {
            int64_t j = j0 + jj;
            if (j >= a.Tk || (a.causal && j > i))
                break;
            if (masked(a, b.n, j))
                continue;
            float p = ft_expf(dot_row(q, ks[jj], lane) - ls);
            float ds = p * (dot_row(g, vs[jj], lane) * drop_factor(a, b.n, b.h, i, j) - dl);
#pragma unroll
            for (int t = 0; t < DT; t++)
                dq[t] = fmaf(ds, ks[jj][lane + 32 * t], dq[t]);
        }
    }
    if (!row)
        return;
    int64_t dst = a.dq.at(b.n, b.h, i);
#pragma unroll
    for (int t = 0; t < DT; t++) {
        int64_t d = lane + 32 * t;
        if (d < a.D)
            a.dq.put(dst, d, dq[t] * a.scale);
    }
}

__global__ void __launch_bounds__(WARPS * 32) sdpa_dkdv_kernel(sdpa_args a) {
    __shared__ float qs[TILE][MAXD], gs[TILE][MAXD], lss[TILE], dls[TILE];
    block_pos b = block_of(a, a.Tk);
    int lane = threadIdx.x % 32;
    int64_t j = b.row0 + threadIdx.x / 32;
    bool row = j < a.Tk, seen = row && !masked(a, b.n, j); /* a masked key's gradients are 0 */
    float k[DT], v[DT], dk[DT], dv[DT];
    load_reg(k, a.k, row, b.n, b.h, j, a.D, lane, 1.0f);
    load_reg(v, a.v, row, b.n, b.h, j, a.D, lane, 1.0f);
    for (int t = 0; t < DT; t++)
        dk[t] = dv[t] = 0.0f;
    /* under the mask, queries before the block's first key see none of its keys */
    int64_t start = a.causal ? b.row0 / TILE * TILE : 0;
    for (int64_t i0 = start; i0 < a.Tq; i0 += TILE) {
        __syncthreads();
        load_tile(qs, a.q, b.n, b.h, i0, a.Tq, a.D, a.scale);
        load_tile(gs, a.dout, b.n, b.h, i0, a.Tq, a.D, 1.0f);
        if (threadIdx.x < TILE) {
            int64_t i = i0 + threadIdx.x;
            lss[threadIdx.x] = i < a.Tq ? lse_at(a, b.n, b.h, i) : 0.0f;
            dls[threadIdx.x] = i < a.Tq ? a.delta[(b.n * a.H + b.h) * a.Tq + i] : 0.0f;
        }
        __syncthreads();
        for (int ii = 0; ii < TILE && seen; ii++) {
            int64_t i = i0 + ii;
            if (i >= a.Tq)
                break;
            if (a.causal && j > i)
                continue;
            float p = ft_expf(dot_row(k, qs[ii], lane) - lss[ii]), z = drop_factor(a, b.n, b.h, i, j);
            float ds = p * (dot_row(v, gs[ii], lane) * z - dls[ii]);
#pragma unroll
            for (int t = 0; t < DT; t++) {
                dv[t] = fmaf(p * z, gs[ii][lane + 32 * t], dv[t]);
                dk[t] = fmaf(ds, qs[ii][lane + 32 * t], dk[t]);
            }
        }
    }
    if (!row)
        return;
#pragma unroll
    for (int t = 0; t < DT; t++) {
        int64_t d = lane + 32 * t;
        if (d >= a.D)
            continue;
        if (a.dk.p)
            a.dk.put(a.dk.at(b.n, b.h, j), d, dk[t]);
        if (a.dv.p)
            a.dv.put(a.dv.at(b.n, b.h, j), d, dv[t]);
    }
}

static ft_status make_args(sdpa_args *a, const ft_tensor *q, const ft_tensor *k, const ft_tensor *lse,
                           const ft_sdpa_params *p) {
    memset(a, 0, sizeof *a);
    a->N = q->shape[0], a->H = q->shape[1], a->Tq = q->shape[2], a->Tk = k->shape[2], a->D = q->shape[3];
    if (a->D > MAXD)
        return ft_cuda_fail(FT_ERR_SHAPE, "sdpa: the CUDA kernels take a head size D <= %d, got %lld", MAXD,
                            (long long)a->D);
    a->scale = p->scale > 0 ? (float)p->scale : a->D > 0 ? (float)(1.0 / sqrt((double)a->D)) : 1.0f;
    a->causal = p->causal;
    a->dropout = p->dropout_p > 0.0;
    a->seed = p->seed, a->offset = p->offset;
    a->threshold = ft_dropout_threshold(p->dropout_p), a->keep = ft_dropout_scale(p->dropout_p);
    if (p->key_mask) {
        a->km = (const unsigned char *)ft_tensor_data(p->key_mask);
        a->kms[0] = p->key_mask->strides[0], a->kms[1] = p->key_mask->strides[1];
    }
    a->q = rows_of(q), a->k = rows_of(k);
    if (lse) {
        a->lse = (float *)ft_tensor_data(lse);
        for (int d = 0; d < 3; d++)
            a->ls[d] = lse->strides[d];
    }
    return FT_OK;
}

static unsigned blocks_for(const sdpa_args &a, int64_t T) { return (unsigned)(a.N * a.H * ((T + WARPS - 1) / WARPS)); }

static ft_status sdpa_forward(const ft_tensor *out, const ft_tensor *lse, const ft_tensor *q, const ft_tensor *k,
                              const ft_tensor *v, const ft_sdpa_params *p) {
    sdpa_args a;
    FT_TRY(make_args(&a, q, k, lse, p));
    a.v = rows_of(v), a.out = rows_of(out);
    if (a.N * a.H * a.Tq == 0)
        return FT_OK;
    FT_TRY(ft_cuda_use_device(q));
    sdpa_forward_kernel<<<blocks_for(a, a.Tq), WARPS * 32, 0, FT_CUDA_STREAM>>>(a);
    return ft_cuda_launched("sdpa forward kernel launch");
}

static ft_status sdpa_backward(const ft_tensor *dq, const ft_tensor *dk, const ft_tensor *dv, const ft_tensor *dout,
                               const ft_tensor *q, const ft_tensor *k, const ft_tensor *v, const ft_tensor *out,
                               const ft_tensor *lse, const ft_sdpa_params *p) {
    sdpa_args a;
    FT_TRY(make_args(&a, q, k, lse, p));
    a.v = rows_of(v), a.out = rows_of(out), a.dout = rows_of(dout);
    a.dq = rows_of(dq), a.dk = rows_of(dk), a.dv = rows_of(dv);
    if (a.N * a.H == 0)
        return FT_OK;
    FT_TRY(ft_cuda_use_device(q));
    ft_cuda_scratch delta;
    FT_TRY(ft_cuda_scratch_alloc(&delta, (size_t)(a.N * a.H * a.Tq) * sizeof(float), ft_tensor_device(q).index));
    a.delta = (float *)delta.ptr;
    ft_status s = FT_OK;
    if (a.Tq > 0) {
        sdpa_delta_kernel<<<(unsigned)((a.N * a.H * a.Tq + WARPS - 1) / WARPS), WARPS * 32, 0, FT_CUDA_STREAM>>>(a);
        s = ft_cuda_launched("sdpa delta kernel launch");
    }
    if (s == FT_OK && dq && a.Tq > 0) {
        sdpa_dq_kernel<<<blocks_for(a, a.Tq), WARPS * 32, 0, FT_CUDA_STREAM>>>(a);
        s = ft_cuda_launched("sdpa dq kernel launch");
    }
    if (s == FT_OK && (dk || dv) && a.Tk > 0) {
        sdpa_dkdv_kernel<<<blocks_for(a, a.Tk), WARPS * 32, 0, FT_CUDA_STREAM>>>(a);
        s = ft_cuda_launched("sdpa dk/dv kernel launch");
    }
    ft_cuda_scratch_free(&delta);
    return s;
}

} // namespace

void ft_cuda_register_attention(struct ft_cuda_ops *ops) {
    ops->sdpa_forward = sdpa_forward;
    ops->sdpa_backward = sdpa_backward;
}
