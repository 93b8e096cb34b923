/* Scaled dot-product attention on the CPU, blocked over queries and keys.
 *
 * Legend: as ops/attention.h; BQ query rows and BK key rows per block; Dp
 * the head size rounded up to whole vectors (VL floats), the extra columns
 * zero. A block is copied into per-thread buffers that stay in L1/L2 (at
 * D = 64: 16 KiB per (64, Dp) buffer): rows past the end of the sequence are
 * zero, so every product below runs on full (BQ or BK, Dp) tiles, and masked
 * or missing scores get probability 0 explicitly.
 *
 * Forward: one unit of work per (n, h, query block); the key blocks run in
 * order through an online softmax (running max m, running sum l, the output
 * rescaled when m grows). Backward, with Delta = rowsum(dout * out):
 *   S = (q * scale) k^T, P = exp(S - lse), dP = dout v^T, dS = P (dP - Delta),
 *   dv = P^T dout, dk = dS^T (q * scale), dq = scale * dS k.
 * dk and dv come from units (n, h, key block) that loop over the query blocks
 * in order; dq either from a second pass of units (n, h, query block) that
 * loop over the key blocks in order, or, when there are enough heads to keep
 * every thread busy, within the first pass, one unit per (n, h) holding its
 * dq in a per-thread buffer (two products fewer). Both ways add every
 * element's terms in the same order from the same operands, so they give the
 * same bits, and no unit's result depends on which thread runs it.
 *
 * Every product is c += a b over tiles, each element of c one chain of fmaf
 * over the inner index in order: the AVX-512 kernel and the plain loop give
 * the same bits, and a score computed as a row of q k^T or a column of k q^T
 * is the same float. */
#include "ops/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/convert.h"
#include "kernels/activation.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"
#include "ops/softmax.h"

#define BQ 64
#define BK 64
#define VL 16 /* floats per vector: widths are padded to multiples of it */
#define RB 8  /* rows of c per step of the product kernels */

static const ft_mem_pool HOST = {FT_MEM_HOST, 0};

/* ---- geometry ---- */

typedef struct {
    int64_t N, H, Tq, Tk, D, Dp, nqb, nkb;
    float scale;
    bool causal;
} geom;

/* A (N, H, T, D) float32 or bfloat16 tensor: its data and its strides (in
 * elements) over N, H and T. The blocks compute in float32 whatever the
 * tensors hold: bfloat16 rows are converted as they are loaded and stored. */
typedef struct {
    char *p;
    int64_t sn, sh, st;
    bool bf16;
} view4;

static view4 view_of(const ft_tensor *t) {
    view4 v = {NULL, 0, 0, 0, false};
    if (t) {
        v.p = ft_tensor_data(t);
        v.sn = t->strides[0], v.sh = t->strides[1], v.st = t->strides[2];
        v.bf16 = t->dtype == FT_BFLOAT16;
    }
    return v;
}

static inline void *row_at(const view4 *v, int64_t n, int64_t h, int64_t t) {
    return v->p + (n * v->sn + h * v->sh + t * v->st) * (v->bf16 ? 2 : 4);
}

static inline float elem(const view4 *v, const void *row, int64_t d) {
    return v->bf16 ? ft_bf16_to_f32(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

static inline void put(const view4 *v, void *row, int64_t d, float x) {
    if (v->bf16)
        ((uint16_t *)row)[d] = ft_f32_to_bf16(x);
    else
        ((float *)row)[d] = x;
}

/* The valid rows of block b of size bs in a sequence of T. */
static inline int rows_in(int64_t b, int bs, int64_t T) {
    int64_t r = T - b * bs;
    return (int)(r < bs ? r : bs);
}

/* Whether any query of block qb sees any key of block kb. */
static inline bool block_active(const geom *g, int64_t qb, int64_t kb) {
    return !g->causal || (qb * BQ + rows_in(qb, BQ, g->Tq) - 1 >= kb * BK);
}

/* ---- tiles ---- */

/* dst (R, Dp) = the first n rows from row t0 of head (n0, h) of v, times
 * mul; zero in the padding. */
static void load_rows(float *dst, int R, const view4 *v, int64_t n0, int64_t h, int64_t t0, int n, const geom *g,
                      float mul) {
    int64_t D = g->D, Dp = g->Dp;
    for (int r = 0; r < R; r++) {
        float *d = dst + r * Dp;
        int64_t c = 0;
        if (r < n) {
            const void *s = row_at(v, n0, h, t0 + r);
            if (v->bf16)
                for (; c < D; c++)
                    d[c] = ft_bf16_to_f32(((const uint16_t *)s)[c]) * mul;
            else
                for (; c < D; c++)
                    d[c] = ((const float *)s)[c] * mul;
        }
        for (; c < Dp; c++)
            d[c] = 0.0f;
    }
}

/* dst (Dp, R) = load_rows's tile transposed. */
static void load_cols(float *dst, int R, const view4 *v, int64_t n0, int64_t h, int64_t t0, int n, const geom *g,
                      float mul) {
    int64_t D = g->D, Dp = g->Dp;
    memset(dst, 0, (size_t)(Dp * R) * sizeof *dst);
    for (int r = 0; r < n; r++) {
        const void *s = row_at(v, n0, h, t0 + r);
        for (int64_t c = 0; c < D; c++)
            dst[c * R + r] = elem(v, s, c) * mul;
    }
}

/* dst (R, C) = src (C, R) transposed. */
static void transpose(float *dst, const float *src, int R, int C) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            dst[r * C + c] = src[c * R + r];
}

/* ---- c (R, W) += a (R, K) b (K, W), R a multiple of RB, W of VL ---- */

FT_VEC_CLONES static void gemm_loop(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb,
                                    int R, int K, int W) {
    for (int i = 0; i < R; i++)
        for (int k = 0; k < K; k++) {
            float aik = a[i * lda + k];
            float *ci = c + i * ldc;
            const float *bk = b + k * ldb;
            FT_SIMD_FOR(j, W)
                ci[j] = fmaf(aik, bk[j], ci[j]);
        }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(FT_NO_CLONES)
#include <immintrin.h>
#define HAVE_AVX512 1

/* RB rows by NV vectors of c in registers for the whole k loop: the loop
 * above reloads c for every k and is bound by those loads and stores. */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define LOAD2(r) __m512 x##r##0 = _mm512_loadu_ps(cr + r * ldc + j), x##r##1 = _mm512_loadu_ps(cr + r * ldc + j + VL);
#define STEP2(r)                                                  \
    {                                                             \
        __m512 s = _mm512_set1_ps(ar[r * lda + k]);               \
        x##r##0 = _mm512_fmadd_ps(s, b0, x##r##0);                \
        x##r##1 = _mm512_fmadd_ps(s, b1, x##r##1);                \
    }
#define STORE2(r) _mm512_storeu_ps(cr + r * ldc + j, x##r##0), _mm512_storeu_ps(cr + r * ldc + j + VL, x##r##1);
#define LOAD1(r) __m512 x##r##0 = _mm512_loadu_ps(cr + r * ldc + j);
#define STEP1(r) x##r##0 = _mm512_fmadd_ps(_mm512_set1_ps(ar[r * lda + k]), b0, x##r##0);
#define STORE1(r) _mm512_storeu_ps(cr + r * ldc + j, x##r##0);

__attribute__((target("avx512f"))) static void gemm_avx512(float *c, int64_t ldc, const float *a, int64_t lda,
                                                           const float *b, int64_t ldb, int R, int K, int W) {
    for (int i = 0; i < R; i += RB) {
        const float *ar = a + i * lda;
        float *cr = c + i * ldc;
        int j = 0;
        for (; j + 2 * VL <= W; j += 2 * VL) {
            ROWS(LOAD2)
            for (int k = 0; k < K; k++) {
                __m512 b0 = _mm512_loadu_ps(b + k * ldb + j), b1 = _mm512_loadu_ps(b + k * ldb + j + VL);
                ROWS(STEP2)
            }
            ROWS(STORE2)
        }
        for (; j < W; j += VL) {
            ROWS(LOAD1)
            for (int k = 0; k < K; k++) {
                __m512 b0 = _mm512_loadu_ps(b + k * ldb + j);
                ROWS(STEP1)
            }
            ROWS(STORE1)
        }
    }
}
#endif

static void gemm(float *c, int64_t ldc, const float *a, int64_t lda, const float *b, int64_t ldb, int R, int K,
                 int W) {
#ifdef HAVE_AVX512
    if (__builtin_cpu_supports("avx512f")) {
        gemm_avx512(c, ldc, a, lda, b, ldb, R, K, W);
        return;
    }
#endif
    gemm_loop(c, ldc, a, lda, b, ldb, R, K, W);
}

/* ---- row math ---- */

static float lanes_sum(float *acc) {
    for (int w = VL / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

/* The max of s[0..n) (n >= 1), over a row of BK. */
FT_VEC_CLONES static float row_max(const float *s, int n) {
    float acc[VL];
    for (int l = 0; l < VL; l++)
        acc[l] = -INFINITY;
    for (int j0 = 0; j0 < BK; j0 += VL)
        for (int l = 0; l < VL; l++) {
            float x = j0 + l < n ? s[j0 + l] : -INFINITY;
            acc[l] = x > acc[l] ? x : acc[l];
        }
    float m = acc[0];
    for (int l = 1; l < VL; l++)
        m = acc[l] > m ? acc[l] : m;
    return m;
}

/* s[j] = exp(s[j] - shift) for j < n, 0 after, over a row of BK; returns the sum. */
FT_VEC_CLONES static float row_exp(float *s, int n, float shift) {
    float acc[VL] = {0};
    for (int j0 = 0; j0 < BK; j0 += VL)
        for (int l = 0; l < VL; l++) {
            float e = j0 + l < n ? ft_expf(s[j0 + l] - shift) : 0.0f;
            s[j0 + l] = e;
            acc[l] += e;
        }
    return lanes_sum(acc);
}

/* Over a tile of R rows by C columns: p = exp(s - lse) where row r sees
 * columns [lo[r], hi[r]), else 0; dp becomes dS = p (dp - delta). lse and
 * delta are per row (by_row) or per column. */
FT_VEC_CLONES static void probs_grad(float *s, float *dp, int R, int C, const int *lo, const int *hi,
                                     const float *lse, const float *delta, bool by_row) {
    for (int r = 0; r < R; r++) {
        float *sr = s + r * C, *dr = dp + r * C;
        int a = lo[r], z = hi[r];
        if (by_row) {
            float ls = lse[r], dl = delta[r];
            for (int c = 0; c < C; c++) {
                float p = c >= a && c < z ? ft_expf(sr[c] - ls) : 0.0f;
                sr[c] = p;
                dr[c] = p * (dr[c] - dl);
            }
        } else {
            for (int c = 0; c < C; c++) {
                float p = c >= a && c < z ? ft_expf(sr[c] - lse[c]) : 0.0f;
                sr[c] = p;
                dr[c] = p * (dr[c] - delta[c]);
            }
        }
    }
}

/* The keys query i sees in key block kb: [0, the returned count). */
static inline int keys_seen(const geom *g, int64_t i, int64_t kb) {
    if (i >= g->Tq)
        return 0;
    int64_t n = rows_in(kb, BK, g->Tk);
    if (g->causal && i - kb * BK + 1 < n)
        n = i - kb * BK + 1;
    return n > 0 ? (int)n : 0;
}

/* ---- forward ---- */

typedef struct {
    float *qs, *kt, *vb, *s, *o, *m, *l; /* (BQ, Dp) (Dp, BK) (BK, Dp) (BQ, BK) (BQ, Dp) (BQ) (BQ) */
} fwd_ws;

/* Carves n floats (whole vectors, so every buffer stays 64-byte aligned) off *p. */
static float *take(float **p, int64_t n) {
    float *r = *p;
    *p += (n + VL - 1) / VL * VL;
    return r;
}

/* The floats fwd_ws_at carves (every size a whole number of vectors). */
static int64_t fwd_ws_floats(const geom *g) { return 2 * BQ * g->Dp + 2 * g->Dp * BK + BQ * BK + 2 * BQ; }

static fwd_ws fwd_ws_at(float *p, const geom *g) {
    fwd_ws w;
    w.qs = take(&p, BQ * g->Dp), w.kt = take(&p, g->Dp * BK), w.vb = take(&p, BK * g->Dp);
    w.s = take(&p, BQ * BK), w.o = take(&p, BQ * g->Dp), w.m = take(&p, BQ), w.l = take(&p, BQ);
    return w;
}

static void forward_block(const fwd_ws *w, const geom *g, const view4 *out, float *lse, const int64_t *lse_st,
                          const view4 *q, const view4 *k, const view4 *v, int64_t n, int64_t h, int64_t qb) {
    int64_t Dp = g->Dp, i0 = qb * BQ;
    int nq = rows_in(qb, BQ, g->Tq);
    load_rows(w->qs, BQ, q, n, h, i0, nq, g, g->scale);
    memset(w->o, 0, (size_t)(BQ * Dp) * sizeof(float));
    for (int r = 0; r < BQ; r++)
        w->m[r] = -INFINITY, w->l[r] = 0.0f;
    for (int64_t kb = 0; kb < g->nkb && block_active(g, qb, kb); kb++) {
        int64_t j0 = kb * BK;
        int nk = rows_in(kb, BK, g->Tk);
        load_cols(w->kt, BK, k, n, h, j0, nk, g, 1.0f);
        load_rows(w->vb, BK, v, n, h, j0, nk, g, 1.0f);
        memset(w->s, 0, sizeof(float) * BQ * BK);
        gemm(w->s, BK, w->qs, Dp, w->kt, BK, BQ, (int)Dp, BK);
        for (int r = 0; r < BQ; r++) {
            float *sr = w->s + r * BK, *o = w->o + r * Dp;
            int seen = keys_seen(g, i0 + r, kb);
            if (seen == 0) { /* nothing to add: a zero row of P */
                memset(sr, 0, sizeof(float) * BK);
                continue;
            }
            float mx = row_max(sr, seen), mn = w->m[r] > mx ? w->m[r] : mx;
            /* m = -inf: nothing summed yet, o and l are 0 */
            float alpha = w->m[r] == -INFINITY ? 0.0f : ft_expf(w->m[r] - mn);
            float sum = row_exp(sr, seen, mn);
            w->l[r] = w->l[r] * alpha + sum;
            w->m[r] = mn;
            if (alpha != 1.0f)
                for (int64_t d = 0; d < Dp; d++)
                    o[d] *= alpha;
        }
        gemm(w->o, Dp, w->s, BK, w->vb, Dp, BQ, BK, (int)Dp);
    }
    for (int r = 0; r < nq; r++) {
        void *dst = row_at(out, n, h, i0 + r);
        float *o = w->o + r * Dp, l = w->l[r];
        for (int64_t d = 0; d < g->D; d++)
            put(out, dst, d, l > 0.0f ? o[d] / l : 0.0f);
        if (lse)
            lse[n * lse_st[0] + h * lse_st[1] + (i0 + r) * lse_st[2]] = l > 0.0f ? w->m[r] + logf(l) : -INFINITY;
    }
}

/* ---- checks ---- */

static ft_status check_qkv(const char *op, const char *arg, const ft_tensor *t, ft_device dev, int64_t N, int64_t H,
                           int64_t T, int64_t D) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, "q", dev.type == FT_DEV_CPU));
    FT_TRY(ft_check_ndim(op, arg, t, 4, "(N, H, T, D)"));
    if (N >= 0) {
        int64_t shape[4] = {N, H, T, D};
        FT_TRY(ft_check_shape(op, arg, t, 4, shape));
    }
    if (t->shape[3] > 1 && t->strides[3] != 1)
        return ft_fail(FT_ERR_SHAPE, "%s: %s must have unit stride along D (its last dimension), got stride %lld", op,
                       arg, (long long)t->strides[3]);
    return FT_OK;
}

/* q (N, H, Tq, D), and k and v (N, H, Tk, D) of q's N, H and D: *N, *H, *Tq, *D from q. */
static ft_status check_heads(const char *op, const ft_tensor *q, const ft_tensor *k, const ft_tensor *v, ft_device dev,
                             int64_t *N, int64_t *H, int64_t *Tq, int64_t *D) {
    FT_TRY(check_qkv(op, "q", q, dev, -1, 0, 0, 0));
    FT_TRY(check_qkv(op, "k", k, dev, -1, 0, 0, 0));
    *N = q->shape[0], *H = q->shape[1], *Tq = q->shape[2], *D = q->shape[3];
    FT_TRY(check_qkv(op, "k", k, dev, *N, *H, k->shape[2], *D));
    return check_qkv(op, "v", v, dev, *N, *H, k->shape[2], *D);
}

/* lse (N, H, Tq) float32 on dev. */
static ft_status check_lse(const char *op, const ft_tensor *lse, ft_device dev, int64_t N, int64_t H, int64_t Tq) {
    int64_t shape[3] = {N, H, Tq};
    FT_TRY(ft_check_float_on(op, "lse", lse, dev, "q", false));
    return ft_check_shape(op, "lse", lse, 3, shape);
}

/* An output: writable, and sharing no memory with any of the tensors in, in place or not. */
static ft_status check_writes(const char *op, const char *arg, const ft_tensor *t, const ft_tensor *const *in,
                              const char *const *names, int n_in) {
    FT_TRY(ft_check_output(op, arg, t));
    for (int i = 0; i < n_in; i++) {
        if (!in[i] || ft_tensor_numel(t) == 0 || ft_tensor_numel(in[i]) == 0)
            continue;
        if (ft_same_view(t, in[i]))
            return ft_fail(FT_ERR_VALUE, "%s: %s cannot be %s itself; pass separate memory", op, arg, names[i]);
        FT_TRY(ft_check_alias(op, arg, t, names[i], in[i]));
    }
    return FT_OK;
}

static ft_status make_geom(geom *g, const ft_tensor *q, const ft_tensor *k, const ft_sdpa_params *p) {
    g->N = q->shape[0], g->H = q->shape[1], g->Tq = q->shape[2], g->Tk = k->shape[2], g->D = q->shape[3];
    g->Dp = (g->D + VL - 1) / VL * VL;
    g->nqb = (g->Tq + BQ - 1) / BQ, g->nkb = (g->Tk + BK - 1) / BK;
    g->scale = p->scale > 0 ? (float)p->scale : g->D > 0 ? (float)(1.0 / sqrt((double)g->D)) : 1.0f;
    g->causal = p->causal;
    if (!isfinite(g->scale))
        return ft_fail(FT_ERR_VALUE, "sdpa: scale must be finite, got %g", p->scale);
    return FT_OK;
}

/* One workspace of `per` floats per thread. */
static ft_status ws_alloc(float **ws, size_t *granted, int64_t per, int threads, const char *op) {
    if (ft_alloc((void **)ws, granted, (size_t)per * (size_t)threads * sizeof(float), HOST) != FT_OK)
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory for the block buffers", op);
    return FT_OK;
}

ft_status ft_sdpa_forward(const ft_tensor *out, const ft_tensor *lse, const ft_tensor *q, const ft_tensor *k,
                          const ft_tensor *v, const ft_sdpa_params *p) {
    const char *op = "sdpa";
    ft_device dev = ft_op_device(q);
    int64_t N, H, Tq, D;
    FT_TRY(check_heads(op, q, k, v, dev, &N, &H, &Tq, &D));
    FT_TRY(check_qkv(op, "out", out, dev, N, H, Tq, D));
    const ft_tensor *in[] = {q, k, v};
    const char *names[] = {"q", "k", "v"};
    FT_TRY(check_writes(op, "out", out, in, names, 3));
    if (lse) {
        FT_TRY(check_lse(op, lse, dev, N, H, Tq));
        FT_TRY(check_writes(op, "lse", lse, in, names, 3));
        FT_TRY(ft_check_alias(op, "lse", lse, "out", out));
    }
    geom g;
    FT_TRY(make_geom(&g, q, k, p));
    if (dev.type == FT_DEV_CUDA)
        FT_CUDA_DISPATCH(op, sdpa_forward, out, lse, q, k, v, p);
    int64_t units = N * H * g.nqb;
    if (units == 0)
        return FT_OK;
    int threads = omp_get_max_threads();
    int64_t per = fwd_ws_floats(&g);
    float *ws;
    size_t granted;
    FT_TRY(ws_alloc(&ws, &granted, per, threads, op));
    view4 vo = view_of(out), vq = view_of(q), vk = view_of(k), vv = view_of(v);
    float *lp = lse ? (float *)ft_tensor_data(lse) : NULL;
    const int64_t *lst = lse ? lse->strides : NULL;
#pragma omp parallel num_threads(threads) if (units > 1)
    {
        fwd_ws w = fwd_ws_at(ws + per * omp_get_thread_num(), &g);
        /* round robin: under a causal mask later query blocks cost more */
#pragma omp for schedule(static, 1)
        for (int64_t u = 0; u < units; u++) {
            int64_t nh = u / g.nqb;
            forward_block(&w, &g, &vo, lp, lst, &vq, &vk, &vv, nh / H, nh % H, u % g.nqb);
        }
    }
    ft_free(ws, granted, HOST);
    return FT_OK;
}

/* ---- backward ---- */

typedef struct {
    float *qs, *dob;    /* (BQ, Dp): q * scale, dout */
    float *qt, *dot;    /* (Dp, BQ): the same transposed */
    float *kj, *vj;     /* (BK, Dp) */
    float *kt, *vt;     /* (Dp, BK) */
    float *s, *dp, *ds; /* (BQ, BK) or (BK, BQ) */
    float *dk, *dv;     /* (BK, Dp) */
    float *dq;          /* (BQ, Dp), or (nqb * BQ, Dp) for the whole sequence */
    float *lse, *delta; /* (BQ) */
    int *lo, *hi;       /* (max(BQ, BK)) */
} bwd_ws;

/* The floats bwd_ws_at carves. */
static int64_t bwd_ws_floats(const geom *g, bool whole_dq) {
    int64_t Dp = g->Dp, dq = whole_dq ? g->nqb * BQ * Dp : BQ * Dp;
    return 2 * BQ * Dp + 2 * Dp * BQ + 2 * BK * Dp + 2 * Dp * BK + 3 * BQ * BK + 2 * BK * Dp + dq + 2 * BQ +
           2 * (BQ > BK ? BQ : BK);
}

static bwd_ws bwd_ws_at(float *p, const geom *g, bool whole_dq) {
    int64_t Dp = g->Dp;
    bwd_ws w;
    w.qs = take(&p, BQ * Dp), w.dob = take(&p, BQ * Dp), w.qt = take(&p, Dp * BQ), w.dot = take(&p, Dp * BQ);
    w.kj = take(&p, BK * Dp), w.vj = take(&p, BK * Dp), w.kt = take(&p, Dp * BK), w.vt = take(&p, Dp * BK);
    w.s = take(&p, BQ * BK), w.dp = take(&p, BQ * BK), w.ds = take(&p, BQ * BK);
    w.dk = take(&p, BK * Dp), w.dv = take(&p, BK * Dp);
    w.dq = take(&p, whole_dq ? g->nqb * BQ * Dp : BQ * Dp);
    w.lse = take(&p, BQ), w.delta = take(&p, BQ);
    int nb = BQ > BK ? BQ : BK;
    w.lo = (int *)take(&p, nb), w.hi = (int *)take(&p, nb);
    return w;
}

typedef struct {
    view4 dq, dk, dv, dout, q, k, v;
    const float *lse; /* (N, H, Tq) with strides lse_st */
    int64_t lse_st[3];
    const float *delta; /* (N * H, Tq) */
    ft_sdpa_acc acc;
} bwd_args;

/* w->lse and w->delta (BQ) = those of query block qb, 0 past the end. */
static void load_row_stats(const bwd_ws *w, const bwd_args *a, const geom *g, int64_t n, int64_t h, int64_t qb) {
    int nq = rows_in(qb, BQ, g->Tq);
    for (int r = 0; r < BQ; r++) {
        int64_t i = qb * BQ + r;
        w->lse[r] = r < nq ? a->lse[n * a->lse_st[0] + h * a->lse_st[1] + i * a->lse_st[2]] : 0.0f;
        w->delta[r] = r < nq ? a->delta[(n * g->H + h) * g->Tq + i] : 0.0f;
    }
}

/* Row t of head (n, h) of v (D) = src * mul, or += with accumulate. */
static void store_row(const view4 *v, int64_t n, int64_t h, int64_t t, const float *src, int64_t D, float mul,
                      bool accumulate) {
    void *dst = row_at(v, n, h, t);
    for (int64_t d = 0; d < D; d++)
        put(v, dst, d, accumulate ? elem(v, dst, d) + src[d] * mul : src[d] * mul);
}

/* The dot product of row t of head (n, h) of a and of b. */
static float rows_dot(const view4 *a, const view4 *b, int64_t n, int64_t h, int64_t t, int64_t D) {
    const void *x = row_at(a, n, h, t), *y = row_at(b, n, h, t);
    if (!a->bf16 && !b->bf16)
        return ft_row_dot(x, y, D);
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++)
        s += elem(a, x, d) * elem(b, y, d);
    return s;
}

/* dk and dv of key block kb over every query block; with dq (the whole
 * sequence's, (nqb * BQ, Dp)) also the key block's terms of dq. */
static void backward_kv(const bwd_ws *w, const bwd_args *a, const geom *g, int64_t n, int64_t h, int64_t kb,
                        float *dq) {
    int64_t Dp = g->Dp, j0 = kb * BK;
    int nk = rows_in(kb, BK, g->Tk);
    load_rows(w->kj, BK, &a->k, n, h, j0, nk, g, 1.0f);
    load_rows(w->vj, BK, &a->v, n, h, j0, nk, g, 1.0f);
    memset(w->dk, 0, sizeof(float) * BK * Dp);
    memset(w->dv, 0, sizeof(float) * BK * Dp);
    for (int64_t qb = 0; qb < g->nqb; qb++) {
        if (!block_active(g, qb, kb))
            continue;
        int64_t i0 = qb * BQ;
        int nq = rows_in(qb, BQ, g->Tq);
        load_rows(w->qs, BQ, &a->q, n, h, i0, nq, g, g->scale);
        load_cols(w->qt, BQ, &a->q, n, h, i0, nq, g, g->scale);
        load_rows(w->dob, BQ, &a->dout, n, h, i0, nq, g, 1.0f);
        load_cols(w->dot, BQ, &a->dout, n, h, i0, nq, g, 1.0f);
        load_row_stats(w, a, g, n, h, qb);
        /* key j sees the queries i >= j (causal) of the block's valid ones */
        for (int r = 0; r < BK; r++) {
            int64_t lo = g->causal ? j0 + r - i0 : 0;
            w->lo[r] = lo < 0 ? 0 : lo > BQ ? BQ : (int)lo;
            w->hi[r] = r < nk ? nq : 0;
        }
        memset(w->s, 0, sizeof(float) * BK * BQ);
        memset(w->dp, 0, sizeof(float) * BK * BQ);
        gemm(w->s, BQ, w->kj, Dp, w->qt, BQ, BK, (int)Dp, BQ);   /* S^T */
        gemm(w->dp, BQ, w->vj, Dp, w->dot, BQ, BK, (int)Dp, BQ); /* dP^T */
        probs_grad(w->s, w->dp, BK, BQ, w->lo, w->hi, w->lse, w->delta, false);
        gemm(w->dv, Dp, w->s, BQ, w->dob, Dp, BK, BQ, (int)Dp);
        gemm(w->dk, Dp, w->dp, BQ, w->qs, Dp, BK, BQ, (int)Dp);
        if (dq) {
            transpose(w->ds, w->dp, BQ, BK);
            gemm(dq + i0 * Dp, Dp, w->ds, BK, w->kj, Dp, BQ, BK, (int)Dp);
        }
    }
    for (int r = 0; r < nk; r++) {
        if (a->dk.p)
            store_row(&a->dk, n, h, j0 + r, w->dk + r * Dp, g->D, 1.0f, a->acc.k);
        if (a->dv.p)
            store_row(&a->dv, n, h, j0 + r, w->dv + r * Dp, g->D, 1.0f, a->acc.v);
    }
}

/* dq of query block qb over every key block. */
static void backward_q(const bwd_ws *w, const bwd_args *a, const geom *g, int64_t n, int64_t h, int64_t qb) {
    int64_t Dp = g->Dp, i0 = qb * BQ;
    int nq = rows_in(qb, BQ, g->Tq);
    load_rows(w->qs, BQ, &a->q, n, h, i0, nq, g, g->scale);
    load_rows(w->dob, BQ, &a->dout, n, h, i0, nq, g, 1.0f);
    load_row_stats(w, a, g, n, h, qb);
    memset(w->dq, 0, sizeof(float) * BQ * Dp);
    for (int64_t kb = 0; kb < g->nkb && block_active(g, qb, kb); kb++) {
        int64_t j0 = kb * BK;
        int nk = rows_in(kb, BK, g->Tk);
        load_cols(w->kt, BK, &a->k, n, h, j0, nk, g, 1.0f);
        load_rows(w->kj, BK, &a->k, n, h, j0, nk, g, 1.0f);
        load_cols(w->vt, BK, &a->v, n, h, j0, nk, g, 1.0f);
        for (int r = 0; r < BQ; r++)
            w->lo[r] = 0, w->hi[r] = keys_seen(g, i0 + r, kb);
        memset(w->s, 0, sizeof(float) * BQ * BK);
        memset(w->dp, 0, sizeof(float) * BQ * BK);
        gemm(w->s, BK, w->qs, Dp, w->kt, BK, BQ, (int)Dp, BK);
        gemm(w->dp, BK, w->dob, Dp, w->vt, BK, BQ, (int)Dp, BK);
        probs_grad(w->s, w->dp, BQ, BK, w->lo, w->hi, w->lse, w->delta, true);
        gemm(w->dq, Dp, w->dp, BK, w->kj, Dp, BQ, BK, (int)Dp);
    }
    for (int r = 0; r < nq; r++)
        store_row(&a->dq, n, h, i0 + r, w->dq + r * Dp, g->D, g->scale, a->acc.q);
}

ft_status ft_sdpa_backward(const ft_tensor *dq, const ft_tensor *dk, const ft_tensor *dv, const ft_tensor *dout,
                           const ft_tensor *q, const ft_tensor *k, const ft_tensor *v, const ft_tensor *out,
                           const ft_tensor *lse, const ft_sdpa_params *p, ft_sdpa_acc acc) {
    const char *op = "sdpa_backward";
    ft_device dev = ft_op_device(q);
    int64_t N, H, Tq, D;
    FT_TRY(check_heads(op, q, k, v, dev, &N, &H, &Tq, &D));
    if (!dout || !out || !lse)
        return ft_fail(FT_ERR_VALUE, "%s: dout, out and lse (the forward's) are required", op);
    FT_TRY(check_qkv(op, "dout", dout, dev, N, H, Tq, D));
    FT_TRY(check_qkv(op, "out", out, dev, N, H, Tq, D));
    FT_TRY(check_lse(op, lse, dev, N, H, Tq));
    const ft_tensor *in[] = {dout, q, k, v, out, lse, dq, dk, dv};
    const char *names[] = {"dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv"};
    const ft_tensor *grads[] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        if (!grads[i])
            continue;
        const ft_tensor *ref = i == 0 ? q : k;
        FT_TRY(check_qkv(op, names[6 + i], grads[i], dev, N, H, ref->shape[2], D));
        FT_TRY(check_writes(op, names[6 + i], grads[i], in, names, 6 + i));
    }
    geom g;
    FT_TRY(make_geom(&g, q, k, p));
    if (dev.type == FT_DEV_CUDA) { /* the backend writes: accumulation is staged */
        ft_grad_out gq = {0}, gk = {0}, gv = {0};
        const ft_tensor *q_to, *k_to, *v_to;
        ft_status s = ft_grad_out_begin(&gq, dq, acc.q, &q_to);
        if (s == FT_OK)
            s = ft_grad_out_begin(&gk, dk, acc.k, &k_to);
        if (s == FT_OK)
            s = ft_grad_out_begin(&gv, dv, acc.v, &v_to);
        if (s == FT_OK)
            s = FT_CUDA_CALL(op, sdpa_backward, q_to, k_to, v_to, dout, q, k, v, out, lse, p);
        return ft_grad_out_end(&gv, ft_grad_out_end(&gk, ft_grad_out_end(&gq, s)));
    }
    if (N * H == 0 || (!dq && !dk && !dv))
        return FT_OK;
    int threads = omp_get_max_threads();
    /* dq within the (n, h) units of the key pass when they keep every thread busy */
    bool fused = dq && (dk || dv) && N * H >= 2 * threads;
    int64_t per = bwd_ws_floats(&g, fused);
    float *ws;
    size_t granted;
    size_t dbytes = (size_t)(N * H * Tq) * sizeof(float);
    float *delta;
    size_t dgranted;
    if (ft_alloc((void **)&delta, &dgranted, dbytes, HOST) != FT_OK)
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory", op);
    ft_status s = ws_alloc(&ws, &granted, per, threads, op);
    if (s != FT_OK) {
        ft_free(delta, dgranted, HOST);
        return s;
    }
    bwd_args a = {view_of(dq), view_of(dk), view_of(dv), view_of(dout), view_of(q), view_of(k), view_of(v),
                  (const float *)ft_tensor_data(lse), {lse->strides[0], lse->strides[1], lse->strides[2]},
                  delta, acc};
    view4 vo = view_of(out);
    int64_t rows = N * H * Tq;
#pragma omp parallel num_threads(threads) if (N * H * (g.nqb > g.nkb ? g.nqb : g.nkb) > 1)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows; i++) {
            int64_t nh = i / (Tq ? Tq : 1);
            delta[i] = rows_dot(&a.dout, &vo, nh / H, nh % H, i % Tq, D);
        }
        bwd_ws w = bwd_ws_at(ws + per * omp_get_thread_num(), &g, fused);
        if (fused) {
#pragma omp for schedule(static)
            for (int64_t nh = 0; nh < N * H; nh++) {
                memset(w.dq, 0, sizeof(float) * g.nqb * BQ * g.Dp);
                for (int64_t kb = 0; kb < g.nkb; kb++)
                    backward_kv(&w, &a, &g, nh / H, nh % H, kb, w.dq);
                for (int64_t i = 0; i < Tq; i++)
                    store_row(&a.dq, nh / H, nh % H, i, w.dq + i * g.Dp, D, g.scale, acc.q);
            }
        } else {
            if (dk || dv) {
                int64_t units = N * H * g.nkb;
#pragma omp for schedule(static, 1)
                for (int64_t u = 0; u < units; u++)
                    backward_kv(&w, &a, &g, u / g.nkb / H, u / g.nkb % H, u % g.nkb, NULL);
            }
            if (dq) {
                int64_t units = N * H * g.nqb;
#pragma omp for schedule(static, 1)
                for (int64_t u = 0; u < units; u++)
                    backward_q(&w, &a, &g, u / g.nqb / H, u / g.nqb % H, u % g.nqb);
            }
        }
    }
    ft_free(ws, granted, HOST);
    ft_free(delta, dgranted, HOST);
    return FT_OK;
}
