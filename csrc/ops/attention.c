/* Scaled dot-product attention on the CPU, blocked over queries and keys.
 *
 * Legend: as ops/attention.h; BQ query rows and BK key rows per block; Dp
 * the head size rounded up to whole vectors (VL floats), the extra columns
 * zero. A block is read in place when its rows need no padding (float32
 * rows of whole vectors, or bfloat16 rows of whole, aligned pairs, and a
 * whole number of RB rows), else copied into per-thread buffers that stay in
 * L1/L2 (at D = 64: 16 KiB per (64, Dp) buffer), zero past the end of the
 * sequence; masked or missing scores get probability 0 explicitly.
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
 * Every product is c (+)= a b over tiles, a read as stored or transposed,
 * each element of c one chain of fmaf over the inner index in order: the
 * AVX-512 kernel and the plain loop give the same bits, and a score computed
 * as a row of q k^T or a column of k q^T is the same float. A loop with a
 * fixed block takes the other's scores transposed (the forward and the dq
 * pass S^T, the key pass S), so only the fixed block is ever transposed. */
#include "ops/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/alloc.h"
#include "core/settings.h"
#include "kernels/convert.h"
#include "kernels/activation.h"
#include "ops/check.h"
#include "ops/cuda_ops.h"
#include "ops/dropout.h"
#include "ops/pointwise.h"
#include "ops/softmax.h"

#define BQ 64
#define BK 64
#define VL 16 /* floats per vector: widths are padded to multiples of it */
#define RB 8  /* rows of c per step of the product kernels */

static const ft_mem_pool HOST = {FT_MEM_HOST, 0};

/* ---- geometry ---- */

typedef struct {
    int64_t N, H, Tq, Tk, D, Dp, Dh, nqb, nkb; /* Dh: pairs of D, (D + 1) / 2 */
    float scale;
    bool causal;
    bool pairs; /* the products in bfloat16 pairs (see "bfloat16 products") */
    bool dropout;         /* the probabilities through a dropout mask, drop */
    ft_dropout_params drop;
    const uint8_t *km; /* the key mask (NULL: none), its strides over N and T */
    int64_t km_n, km_t;
    const void *bias; /* the additive bias (NULL: none), its strides over N, H, Tq and Tk */
    int64_t b_n, b_h, b_q, b_k;
    bool b_bf16;
} geom;

/* A (N, H, T, D) float32 or bfloat16 tensor: its data and its strides (in
 * elements) over N, H and T. Blocks compute in float32 (bfloat16 rows
 * converted as they are loaded and stored) unless every operand is bfloat16
 * and the CPU has AVX512-BF16 (see "bfloat16 products"). */
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
    return ft_float_at(row, v->bf16, d);
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

static inline int round_rows(int n) { return (n + RB - 1) / RB * RB; }

/* The n rows from row t0 of head (n0, h) of v as an (R, Dp) tile, with its
 * row length in *ld: the tensor itself where its float32 rows need no
 * padding and n is a whole number of RB rows (so the products, which read
 * round_rows(n) rows, read no row past n), else buf (R, Dp) filled by
 * load_rows. */
static const float *rows_tile(float *buf, int R, int64_t *ld, const view4 *v, int64_t n0, int64_t h, int64_t t0,
                              int n, const geom *g) {
    if (!v->bf16 && g->D == g->Dp && n % RB == 0) {
        *ld = v->st;
        return row_at(v, n0, h, t0);
    }
    load_rows(buf, R, v, n0, h, t0, n, g, 1.0f);
    *ld = g->Dp;
    return buf;
}

/* ---- c (R, W) (+)= a (R, K) b (K, W) ----
 *
 * a's element (i, k) is a[i * ai + k * ak]: a tile as stored (ai its row
 * length, ak = 1) or transposed (ai = 1), so no product needs a transposed
 * copy of the tile the softmax wrote. R is a multiple of RB, W of VL; with
 * add the products are added to c, else they replace it. */

FT_VEC_CLONES static void gemm_loop(float *c, int64_t ldc, const float *a, int64_t ai, int64_t ak, const float *b,
                                    int64_t ldb, int R, int K, int W, bool add) {
    for (int i = 0; i < R; i++) {
        float *ci = c + i * ldc;
        if (!add)
            memset(ci, 0, sizeof(float) * (size_t)W);
        for (int k = 0; k < K; k++) {
            float aik = a[i * ai + k * ak];
            const float *bk = b + k * ldb;
            FT_SIMD_FOR(j, W)
                ci[j] = fmaf(aik, bk[j], ci[j]);
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(FT_NO_CLONES)
#include <immintrin.h>
#define HAVE_AVX512 1

/* RB rows by NV vectors of c in registers for the whole k loop: the loop
 * above reloads c for every k and is bound by those loads and stores. */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define C0(r, j) (add ? _mm512_loadu_ps(cr + r * ldc + (j)) : _mm512_setzero_ps())
#define LOAD2(r) __m512 x##r##0 = C0(r, j), x##r##1 = C0(r, j + VL);
#define STEP2(r)                                                  \
    {                                                             \
        __m512 s = _mm512_set1_ps(ak_[r * ai]);                   \
        x##r##0 = _mm512_fmadd_ps(s, b0, x##r##0);                \
        x##r##1 = _mm512_fmadd_ps(s, b1, x##r##1);                \
    }
#define STORE2(r) _mm512_storeu_ps(cr + r * ldc + j, x##r##0), _mm512_storeu_ps(cr + r * ldc + j + VL, x##r##1);
#define LOAD1(r) __m512 x##r##0 = C0(r, j);
#define STEP1(r) x##r##0 = _mm512_fmadd_ps(_mm512_set1_ps(ak_[r * ai]), b0, x##r##0);
#define STORE1(r) _mm512_storeu_ps(cr + r * ldc + j, x##r##0);

/* Inlined into one kernel per layout of a, so that its unit stride is a constant. */
__attribute__((target("avx512f"), always_inline)) static inline void gemm_tiles(float *c, int64_t ldc, const float *a,
                                                                               int64_t ai, int64_t ak, const float *b,
                                                                               int64_t ldb, int R, int K, int W,
                                                                               bool add) {
    for (int i = 0; i < R; i += RB) {
        const float *ar = a + i * ai;
        float *cr = c + i * ldc;
        int j = 0;
        for (; j + 2 * VL <= W; j += 2 * VL) {
            ROWS(LOAD2)
            for (int k = 0; k < K; k++) {
                const float *ak_ = ar + k * ak;
                __m512 b0 = _mm512_loadu_ps(b + k * ldb + j), b1 = _mm512_loadu_ps(b + k * ldb + j + VL);
                ROWS(STEP2)
            }
            ROWS(STORE2)
        }
        for (; j < W; j += VL) {
            ROWS(LOAD1)
            for (int k = 0; k < K; k++) {
                const float *ak_ = ar + k * ak;
                __m512 b0 = _mm512_loadu_ps(b + k * ldb + j);
                ROWS(STEP1)
            }
            ROWS(STORE1)
        }
    }
}

__attribute__((target("avx512f"))) static void gemm_rows_avx512(float *c, int64_t ldc, const float *a, int64_t lda,
                                                                const float *b, int64_t ldb, int R, int K, int W,
                                                                bool add) {
    gemm_tiles(c, ldc, a, lda, 1, b, ldb, R, K, W, add);
}

__attribute__((target("avx512f"))) static void gemm_cols_avx512(float *c, int64_t ldc, const float *a, int64_t lda,
                                                                const float *b, int64_t ldb, int R, int K, int W,
                                                                bool add) {
    gemm_tiles(c, ldc, a, 1, lda, b, ldb, R, K, W, add);
}
#endif

static void gemm(float *c, int64_t ldc, const float *a, int64_t ai, int64_t ak, const float *b, int64_t ldb, int R,
                 int K, int W, bool add) {
#ifdef HAVE_AVX512
    if (__builtin_cpu_supports("avx512f")) {
        if (ak == 1)
            gemm_rows_avx512(c, ldc, a, ai, b, ldb, R, K, W, add);
        else
            gemm_cols_avx512(c, ldc, a, ak, b, ldb, R, K, W, add);
        return;
    }
#endif
    gemm_loop(c, ldc, a, ai, ak, b, ldb, R, K, W, add);
}

/* Row t of head (n, h) of v (D) = src * mul, or += with accumulate. */
static void store_row(const view4 *v, int64_t n, int64_t h, int64_t t, const float *src, int64_t D, float mul,
                      bool accumulate) {
    void *dst = row_at(v, n, h, t);
    for (int64_t d = 0; d < D; d++)
        put(v, dst, d, accumulate ? elem(v, dst, d) + src[d] * mul : src[d] * mul);
}

/* ---- bfloat16 products ----
 *
 * With bfloat16 q, k, v (and dout) on a CPU with AVX512-BF16, every product
 * runs in vdpbf16ps, twice the float32 FMA rate: pairs of bfloat16 products
 * (exact in float32) added to float32 sums. Operands are tiles of pairs (two
 * bfloat16 in a uint32): on the a side, pair (i, kp) is a's elements
 * (i, 2kp) and (i, 2kp + 1), at a[i * ai + kp * ak]; the b side is packed
 * (KP, W), pair (kp, j) = b's elements (2kp, j) and (2kp + 1, j). The scores
 * come out in float32 unscaled (the scale is applied as the softmax reads
 * them) and the softmax stays float32; P and dS are rounded to bfloat16 for
 * the products that read them, as PyTorch's bfloat16 attention does. Each
 * element of c is one chain over kp in order, so results are as
 * deterministic as the float32 path's (though not the same bits). */

static inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return lo | (uint32_t)hi << 16; }

/* dst (ceil(n / 2), W): pair (kp, j) = rows 2kp and 2kp + 1 of the float32
 * tile src (rows of ld) at column j, zero past row n. */
FT_VEC_CLONES static void pack_tile(uint32_t *dst, const float *src, int64_t ld, int n, int W) {
    for (int kp = 0; kp < (n + 1) / 2; kp++) {
        const float *r0 = src + 2 * kp * ld, *r1 = r0 + ld;
        uint32_t *d = dst + kp * W;
        if (2 * kp + 1 < n)
            FT_SIMD_FOR(j, W)
                d[j] = pair_of(ft_f32_to_bf16(r0[j]), ft_f32_to_bf16(r1[j]));
        else
            FT_SIMD_FOR(j, W)
                d[j] = ft_f32_to_bf16(r0[j]);
    }
}

/* dst (R, C / 2): pair (r, cp) = columns 2cp and 2cp + 1 of row r of the
 * float32 tile src (R, C). */
FT_VEC_CLONES static void pair_tile(uint32_t *dst, const float *src, int R, int C) {
    for (int r = 0; r < R; r++) {
        const float *s = src + r * C;
        FT_SIMD_FOR(cp, C / 2)
            dst[r * (C / 2) + cp] = pair_of(ft_f32_to_bf16(s[2 * cp]), ft_f32_to_bf16(s[2 * cp + 1]));
    }
}

/* dst (ceil(n / 2), Dp) packed from the n rows from row t0 of head (n0, h)
 * of bfloat16 v (pair (kp, d) = rows 2kp and 2kp + 1 at column d), zero past
 * row n and column D. */
static void pack_rows(uint32_t *dst, const view4 *v, int64_t n0, int64_t h, int64_t t0, int n, const geom *g) {
    int64_t D = g->D, Dp = g->Dp;
    for (int kp = 0; kp < (n + 1) / 2; kp++) {
        const uint16_t *r0 = row_at(v, n0, h, t0 + 2 * kp);
        const uint16_t *r1 = 2 * kp + 1 < n ? row_at(v, n0, h, t0 + 2 * kp + 1) : NULL;
        uint32_t *d = dst + kp * Dp;
        for (int64_t c = 0; c < D; c++)
            d[c] = pair_of(r0[c], r1 ? r1[c] : 0);
        for (int64_t c = D; c < Dp; c++)
            d[c] = 0;
    }
}

/* dst (Dh, W): pair (dp, j) = row j's elements 2dp and 2dp + 1, for the n
 * rows from row t0 of head (n0, h) of bfloat16 v; zero past row n and D. */
static void pack_cols(uint32_t *dst, int W, const view4 *v, int64_t n0, int64_t h, int64_t t0, int n,
                      const geom *g) {
    int64_t D = g->D;
    memset(dst, 0, (size_t)(g->Dh * W) * sizeof *dst);
    for (int j = 0; j < n; j++) {
        const uint16_t *r = row_at(v, n0, h, t0 + j);
        for (int64_t dp = 0; dp < D / 2; dp++)
            dst[dp * W + j] = pair_of(r[2 * dp], r[2 * dp + 1]);
        if (D % 2)
            dst[(D / 2) * W + j] = r[D - 1];
    }
}

/* The n rows from row t0 of head (n0, h) of bfloat16 v as an a-side tile of
 * pairs along D, with its row length in pairs in *ld: the tensor itself
 * where its rows are whole, aligned pairs and n a whole number of RB rows
 * (as rows_tile), else buf (R, Dh) with zero past row n and D. */
static const uint32_t *pair_rows(uint32_t *buf, int R, int64_t *ld, const view4 *v, int64_t n0, int64_t h,
                                 int64_t t0, int n, const geom *g) {
    const uint16_t *first = row_at(v, n0, h, t0);
    if (g->D % 2 == 0 && v->st % 2 == 0 && (uintptr_t)first % sizeof(uint32_t) == 0 && n % RB == 0) {
        *ld = v->st / 2;
        return (const uint32_t *)first;
    }
    int64_t D = g->D, Dh = g->Dh;
    for (int r = 0; r < R; r++) {
        uint32_t *d = buf + r * Dh;
        const uint16_t *s = r < n ? row_at(v, n0, h, t0 + r) : NULL;
        for (int64_t dp = 0; dp < Dh; dp++)
            d[dp] = s ? pair_of(s[2 * dp], 2 * dp + 1 < D ? s[2 * dp + 1] : 0) : 0;
    }
    *ld = Dh;
    return buf;
}

#ifdef HAVE_AVX512
#define STEP2P(r)                                                                         \
    {                                                                                     \
        __m512bh s = (__m512bh)_mm512_set1_epi32((int)ak_[r * ai]);                       \
        x##r##0 = _mm512_dpbf16_ps(x##r##0, s, b0), x##r##1 = _mm512_dpbf16_ps(x##r##1, s, b1); \
    }
#define STEP1P(r) x##r##0 = _mm512_dpbf16_ps(x##r##0, (__m512bh)_mm512_set1_epi32((int)ak_[r * ai]), b0);

/* c (R, W) (+)= a b over KP pairs, as gemm_tiles. */
__attribute__((target("avx512f,avx512bf16"), always_inline)) static inline void
gemm_pairs_tiles(float *c, int64_t ldc, const uint32_t *a, int64_t ai, int64_t ak, const uint32_t *b, int64_t ldb,
                 int R, int KP, int W, bool add) {
    for (int i = 0; i < R; i += RB) {
        const uint32_t *ar = a + i * ai;
        float *cr = c + i * ldc;
        int j = 0;
        for (; j + 2 * VL <= W; j += 2 * VL) {
            ROWS(LOAD2)
            for (int k = 0; k < KP; k++) {
                const uint32_t *ak_ = ar + k * ak;
                __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + k * ldb + j);
                __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + k * ldb + j + VL);
                ROWS(STEP2P)
            }
            ROWS(STORE2)
        }
        for (; j < W; j += VL) {
            ROWS(LOAD1)
            for (int k = 0; k < KP; k++) {
                const uint32_t *ak_ = ar + k * ak;
                __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + k * ldb + j);
                ROWS(STEP1P)
            }
            ROWS(STORE1)
        }
    }
}

__attribute__((target("avx512f,avx512bf16"))) static void gemm_pairs_rows(float *c, int64_t ldc, const uint32_t *a,
                                                                         int64_t lda, const uint32_t *b, int64_t ldb,
                                                                         int R, int KP, int W, bool add) {
    gemm_pairs_tiles(c, ldc, a, lda, 1, b, ldb, R, KP, W, add);
}

__attribute__((target("avx512f,avx512bf16"))) static void gemm_pairs_cols(float *c, int64_t ldc, const uint32_t *a,
                                                                         int64_t lda, const uint32_t *b, int64_t ldb,
                                                                         int R, int KP, int W, bool add) {
    gemm_pairs_tiles(c, ldc, a, 1, lda, b, ldb, R, KP, W, add);
}

/* Whether this CPU runs gemm_pairs. */
static bool have_pairs(void) { return ft_cpu_bf16(); }

/* c (R, W) (+)= a (R, 2 KP) b (2 KP, W) from tiles of pairs. */
static void gemm_pairs(float *c, int64_t ldc, const uint32_t *a, int64_t ai, int64_t ak, const uint32_t *b,
                       int64_t ldb, int R, int KP, int W, bool add) {
    if (ak == 1)
        gemm_pairs_rows(c, ldc, a, ai, b, ldb, R, KP, W, add);
    else
        gemm_pairs_cols(c, ldc, a, ak, b, ldb, R, KP, W, add);
}
#else
static bool have_pairs(void) { return false; }

/* Never called: have_pairs() is false. */
static void gemm_pairs(float *c, int64_t ldc, const uint32_t *a, int64_t ai, int64_t ak, const uint32_t *b,
                       int64_t ldb, int R, int KP, int W, bool add) {
    (void)c, (void)ldc, (void)a, (void)ai, (void)ak, (void)b, (void)ldb, (void)R, (void)KP, (void)W, (void)add;
    __builtin_unreachable();
}
#endif

/* ---- softmax ---- */

/* The keys query i sees in key block kb: [0, the returned count). */
static inline int keys_seen(const geom *g, int64_t i, int64_t kb) {
    if (i >= g->Tq)
        return 0;
    int64_t n = rows_in(kb, BK, g->Tk);
    if (g->causal && i - kb * BK + 1 < n)
        n = i - kb * BK + 1;
    return n > 0 ? (int)n : 0;
}

/* kept[j] (BK) = whether key j0 + j of sample n takes part: in the sequence
 * and not masked out. */
static void keys_kept(const geom *g, int64_t n, int64_t j0, int nk, uint8_t *kept) {
    for (int j = 0; j < BK; j++)
        kept[j] = j < nk && !(g->km && g->km[n * g->km_n + (j0 + j) * g->km_t]);
}

/* Folds a key block's scores s * scale (s (nk, BQ), key j in row j and
 * query i in column i) into each query's running max m and sum l: s becomes
 * exp(s * scale - m) (0 where query i sees only keys j < seen[i], or key j is
 * not kept), and alpha[i] the factor that rescales what query i summed
 * before. Returns whether some alpha is not 1. */
FT_VEC_CLONES static bool online_softmax(float *s, int nk, const int *seen, const uint8_t *kept, float scale,
                                         float *m, float *l, float *alpha, float *acc) {
    for (int i = 0; i < BQ; i++)
        acc[i] = -INFINITY;
    for (int j = 0; j < nk; j++) {
        const float *sj = s + j * BQ;
        if (kept[j])
            for (int i = 0; i < BQ; i++)
                acc[i] = j < seen[i] && sj[i] * scale > acc[i] ? sj[i] * scale : acc[i];
    }
    bool rescale = false;
    for (int i = 0; i < BQ; i++) {
        float mn = m[i] > acc[i] ? m[i] : acc[i];
        /* m = -inf: nothing summed yet */
        alpha[i] = m[i] == -INFINITY ? 0.0f : ft_expf(m[i] - mn);
        rescale |= alpha[i] != 1.0f;
        m[i] = mn;
        acc[i] = 0.0f;
    }
    for (int j = 0; j < nk; j++) {
        float *sj = s + j * BQ;
        int k = kept[j];
        for (int i = 0; i < BQ; i++) {
            float p = k && j < seen[i] ? ft_expf(sj[i] * scale - m[i]) : 0.0f;
            sj[i] = p;
            acc[i] += p;
        }
    }
    for (int i = 0; i < BQ; i++)
        l[i] = l[i] * alpha[i] + acc[i];
    return rescale;
}

/* Over a tile of R rows by C columns: p = exp(s * scale - lse) where row r
 * sees columns [lo[r], hi[r]), else 0; dp becomes dS = p (dp - delta). lse
 * and delta are per row (by_row) or per column. */
FT_VEC_CLONES static void probs_grad(float *s, float *dp, int R, int C, const int *lo, const int *hi, float scale,
                                     const float *lse, const float *delta, bool by_row) {
    for (int r = 0; r < R; r++) {
        float *sr = s + r * C, *dr = dp + r * C;
        int a = lo[r], z = hi[r];
        if (by_row) {
            float ls = lse[r], dl = delta[r];
            for (int c = 0; c < C; c++) {
                float p = c >= a && c < z ? ft_expf(sr[c] * scale - ls) : 0.0f;
                sr[c] = p;
                dr[c] = p * (dr[c] - dl);
            }
        } else {
            for (int c = 0; c < C; c++) {
                float p = c >= a && c < z ? ft_expf(sr[c] * scale - lse[c]) : 0.0f;
                sr[c] = p;
                dr[c] = p * (dr[c] - delta[c]);
            }
        }
    }
}

/* ---- bias ---- */

/* s = s * scale + the bias, over the tile of queries [i0, i0 + nq) and keys
 * [j0, j0 + nk) of head (n, h): query r's score for key c at s[r * rs + c * cs]. */
static void add_bias(float *s, int64_t rs, int64_t cs, const geom *g, int64_t n, int64_t h, int64_t i0, int nq,
                     int64_t j0, int nk, float scale) {
    const char *b = (const char *)g->bias + (n * g->b_n + h * g->b_h + i0 * g->b_q + j0 * g->b_k) * (g->b_bf16 ? 2 : 4);
    for (int r = 0; r < nq; r++)
        for (int c = 0; c < nk; c++) {
            float *x = s + r * rs + c * cs;
            *x = *x * scale + ft_float_at(b, g->b_bf16, r * g->b_q + c * g->b_k);
        }
}

/* ---- dropout ----
 *
 * With dropout, out = (P o Z) v for the mask's factors Z (0 or 1 / (1 - p));
 * l and lse sum P itself. In the backward dv = (P o Z)^T dout and the
 * gradient of P is (dout v^T) o Z; delta = rowsum(dout * out) is still
 * rowsum(P o that gradient), so dS = P (dP o Z - delta) as without. */

/* z = the dropout factors of queries [i0, i0 + nq) for keys [j0, j0 + nk)
 * of head (n, h): query i0 + r's for key j0 + c at z[r * rs + c * cs], for
 * r < BQ and c < BK; 0 outside the sequence. */
static void mask_tile(float *z, int64_t rs, int64_t cs, const geom *g, int64_t n, int64_t h, int64_t i0, int nq,
                      int64_t j0, int nk) {
    float row[BK];
    for (int r = 0; r < BQ; r++) {
        int m = r < nq ? nk : 0;
        if (m)
            ft_dropout_factors(row, &g->drop, ((n * g->H + h) * g->Tq + i0 + r) * g->Tk + j0, m);
        for (int c = 0; c < BK; c++)
            z[r * rs + c * cs] = c < m ? row[c] : 0.0f;
    }
}

/* x (n) *= z (n). */
FT_VEC_CLONES static void times(float *x, const float *z, int64_t n) {
    FT_SIMD_FOR(e, n)
        x[e] *= z[e];
}

/* ---- forward ---- */

typedef struct {
    float *qt, *kj, *vj, *s, *o; /* (Dp, BQ) (BK, Dp) (BK, Dp) (BK, BQ) (BQ, Dp) */
    float *z;                    /* (BK, BQ) dropout factors */
    float *m, *l, *alpha, *acc;  /* (BQ) */
    int *seen;                   /* (BQ) */
    uint32_t *qp, *kp, *pp, *vp; /* pairs: (Dh, BQ) (BK, Dh) (BK / 2, BQ) (BK / 2, Dp) */
} fwd_ws;

/* Carves n floats (whole vectors, so every buffer stays 64-byte aligned) off *p. */
static float *take(float **p, int64_t n) {
    float *r = *p;
    *p += (n + VL - 1) / VL * VL;
    return r;
}

/* The floats fwd_ws_at carves (every size a whole number of vectors). */
static int64_t fwd_ws_floats(const geom *g) {
    return 2 * g->Dp * BQ + 2 * BK * g->Dp + 2 * BK * BQ + 5 * BQ + g->Dh * (BQ + BK) + BK / 2 * (BQ + g->Dp);
}

static fwd_ws fwd_ws_at(float *p, const geom *g) {
    fwd_ws w;
    w.qt = take(&p, g->Dp * BQ), w.kj = take(&p, BK * g->Dp), w.vj = take(&p, BK * g->Dp);
    w.s = take(&p, BK * BQ), w.o = take(&p, BQ * g->Dp), w.z = take(&p, BK * BQ);
    w.m = take(&p, BQ), w.l = take(&p, BQ), w.alpha = take(&p, BQ), w.acc = take(&p, BQ);
    w.seen = (int *)take(&p, BQ);
    w.qp = (uint32_t *)take(&p, g->Dh * BQ), w.kp = (uint32_t *)take(&p, BK * g->Dh);
    w.pp = (uint32_t *)take(&p, BK / 2 * BQ), w.vp = (uint32_t *)take(&p, BK / 2 * g->Dp);
    return w;
}

/* One query block. The scores are computed transposed, S^T = k (q * scale)^T,
 * so that the only transposed copy is the query block's, once, and the
 * softmax runs down columns, a query per lane; O += P v reads P^T as P. */
static void forward_block(const fwd_ws *w, const geom *g, const view4 *out, float *lse, const int64_t *lse_st,
                          const view4 *q, const view4 *k, const view4 *v, int64_t n, int64_t h, int64_t qb) {
    int64_t Dp = g->Dp, i0 = qb * BQ;
    int nq = rows_in(qb, BQ, g->Tq);
    float scale = g->pairs ? g->scale : 1.0f; /* what the softmax applies */
    if (g->pairs)
        pack_cols(w->qp, BQ, q, n, h, i0, nq, g);
    else
        load_cols(w->qt, BQ, q, n, h, i0, nq, g, g->scale);
    memset(w->o, 0, (size_t)(BQ * Dp) * sizeof(float));
    for (int i = 0; i < BQ; i++)
        w->m[i] = -INFINITY, w->l[i] = 0.0f;
    for (int64_t kb = 0; kb < g->nkb && block_active(g, qb, kb); kb++) {
        int64_t j0 = kb * BK, ldk;
        int nk = rows_in(kb, BK, g->Tk);
        if (g->pairs) {
            const uint32_t *kp = pair_rows(w->kp, BK, &ldk, k, n, h, j0, nk, g);
            gemm_pairs(w->s, BQ, kp, ldk, 1, w->qp, BQ, round_rows(nk), (int)g->Dh, BQ, false);
        } else {
            const float *kj = rows_tile(w->kj, BK, &ldk, k, n, h, j0, nk, g);
            gemm(w->s, BQ, kj, ldk, 1, w->qt, BQ, round_rows(nk), (int)g->D, BQ, false);
        }
        for (int i = 0; i < BQ; i++)
            w->seen[i] = keys_seen(g, i0 + i, kb);
        uint8_t kept[BK];
        keys_kept(g, n, j0, nk, kept);
        if (g->bias)
            add_bias(w->s, 1, BQ, g, n, h, i0, nq, j0, nk, scale);
        if (online_softmax(w->s, nk, w->seen, kept, g->bias ? 1.0f : scale, w->m, w->l, w->alpha, w->acc))
            for (int i = 0; i < BQ; i++) {
                float *oi = w->o + i * Dp, alpha = w->alpha[i];
                FT_SIMD_FOR(d, Dp)
                    oi[d] *= alpha;
            }
        if (g->dropout) {
            mask_tile(w->z, 1, BQ, g, n, h, i0, nq, j0, nk);
            times(w->s, w->z, nk * BQ);
        }
        if (g->pairs) {
            pack_tile(w->pp, w->s, BQ, nk, BQ);
            pack_rows(w->vp, v, n, h, j0, nk, g);
            gemm_pairs(w->o, Dp, w->pp, 1, BQ, w->vp, Dp, BQ, (nk + 1) / 2, (int)Dp, true);
        } else {
            int64_t ldv;
            const float *vj = rows_tile(w->vj, BK, &ldv, v, n, h, j0, nk, g);
            gemm(w->o, Dp, w->s, 1, BQ, vj, ldv, BQ, nk, (int)Dp, true);
        }
    }
    for (int i = 0; i < nq; i++) {
        float l = w->l[i];
        store_row(out, n, h, i0 + i, w->o + i * Dp, g->D, l > 0.0f ? 1.0f / l : 0.0f, false);
        if (lse)
            lse[n * lse_st[0] + h * lse_st[1] + (i0 + i) * lse_st[2]] = l > 0.0f ? w->m[i] + logf(l) : -INFINITY;
    }
}

/* ---- checks ---- */

static ft_status check_qkv(const char *op, const char *arg, const ft_tensor *t, ft_device dev, int64_t N, int64_t H,
                           int64_t T, int64_t D) {
    FT_TRY(ft_check_float_on(op, arg, t, dev, "q", true));
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

/* The key mask, if any: (N, Tk) bool on dev. */
static ft_status check_key_mask(const char *op, const ft_sdpa_params *p, ft_device dev, int64_t N, int64_t Tk) {
    const ft_tensor *m = p->key_mask;
    if (!m)
        return FT_OK;
    if (m->dtype != FT_BOOL)
        return ft_fail(FT_ERR_DTYPE, "%s: key_mask must be bool, got %s", op, ft_dtype_get(m->dtype)->name);
    FT_TRY(ft_check_on(op, "key_mask", m, dev, "q"));
    int64_t shape[2] = {N, Tk};
    return ft_check_shape(op, "key_mask", m, 2, shape);
}

/* The bias, if any: (N, H, Tq, Tk) float32 or bfloat16 on the CPU. */
static ft_status check_bias(const char *op, const ft_sdpa_params *p, ft_device dev, int64_t N, int64_t H, int64_t Tq,
                            int64_t Tk) {
    const ft_tensor *b = p->bias;
    if (!b)
        return FT_OK;
    if (dev.type == FT_DEV_CUDA)
        return ft_fail(FT_ERR_VALUE, "%s: an additive bias runs on the CPU (on CUDA, add it to the scores written "
                                     "out)", op);
    FT_TRY(ft_check_float_on(op, "bias", b, dev, "q", true));
    int64_t shape[4] = {N, H, Tq, Tk};
    return ft_check_shape(op, "bias", b, 4, shape);
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

/* Whether the products run in bfloat16 pairs: every one of the n operands is
 * bfloat16 and the CPU has the instructions. */
static bool in_pairs(const ft_tensor *const *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i]->dtype != FT_BFLOAT16)
            return false;
    return have_pairs();
}

static ft_status make_geom(geom *g, const ft_tensor *q, const ft_tensor *k, const ft_sdpa_params *p, bool pairs) {
    g->N = q->shape[0], g->H = q->shape[1], g->Tq = q->shape[2], g->Tk = k->shape[2], g->D = q->shape[3];
    g->Dp = (g->D + VL - 1) / VL * VL, g->Dh = (g->D + 1) / 2;
    g->nqb = (g->Tq + BQ - 1) / BQ, g->nkb = (g->Tk + BK - 1) / BK;
    g->scale = p->scale > 0 ? (float)p->scale : g->D > 0 ? (float)(1.0 / sqrt((double)g->D)) : 1.0f;
    g->causal = p->causal, g->pairs = pairs;
    g->dropout = p->dropout_p > 0.0;
    g->drop = (ft_dropout_params){p->dropout_p, p->seed, p->offset, 1};
    g->km = p->key_mask ? (const uint8_t *)ft_tensor_data(p->key_mask) : NULL;
    g->km_n = p->key_mask ? p->key_mask->strides[0] : 0, g->km_t = p->key_mask ? p->key_mask->strides[1] : 0;
    const ft_tensor *b = p->bias;
    g->bias = b ? ft_tensor_data(b) : NULL, g->b_bf16 = b && b->dtype == FT_BFLOAT16;
    g->b_n = b ? b->strides[0] : 0, g->b_h = b ? b->strides[1] : 0, g->b_q = b ? b->strides[2] : 0;
    g->b_k = b ? b->strides[3] : 0;
    if (!isfinite(g->scale))
        return ft_fail(FT_ERR_VALUE, "sdpa: scale must be finite, got %g", p->scale);
    if (!(p->dropout_p >= 0.0 && p->dropout_p <= 1.0))
        return ft_fail(FT_ERR_VALUE, "sdpa: dropout_p must be in [0, 1], got %g", p->dropout_p);
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
    FT_TRY(check_key_mask(op, p, dev, N, k->shape[2]));
    FT_TRY(check_bias(op, p, dev, N, H, Tq, k->shape[2]));
    geom g;
    FT_TRY(make_geom(&g, q, k, p, in_pairs(in, 3)));
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
    float *qs, *qt;     /* (BQ, Dp) q * scale, (Dp, BQ) the same transposed */
    float *dob, *dot;   /* (BQ, Dp) dout, (Dp, BQ) the same transposed */
    float *kj, *vj;     /* (BK, Dp) */
    float *kt, *vt;     /* (Dp, BK) */
    float *s, *dp, *z;  /* (BQ, BK) or (BK, BQ); z the dropout factors */
    float *dk, *dv;     /* (BK, Dp) */
    float *dq;          /* (BQ, Dp), or (nqb * BQ, Dp) for the whole sequence */
    float *lse, *delta; /* (BQ) */
    int *lo, *hi;       /* (max(BQ, BK)) */
    /* pairs (bfloat16 products): a-side rows, b-side tiles packed from
     * rows (by key or query) or from columns (by D), P and dS packed */
    uint32_t *qrow, *drow, *krow, *vrow; /* (BQ or BK, Dh) */
    uint32_t *qcol, *dcol, *kcol, *vcol; /* (Dh, BQ or BK) */
    uint32_t *qpk, *dpk, *kpk;           /* (BQ / 2 or BK / 2, Dp) */
    uint32_t *ppk, *dspk;                /* (BQ / 2, BK) or (BK / 2, BQ) */
    uint32_t *dsrow;                     /* (BQ, BK / 2) */
} bwd_ws;

/* The floats bwd_ws_at carves. */
static int64_t bwd_ws_floats(const geom *g, bool whole_dq) {
    int64_t Dp = g->Dp, dq = whole_dq ? g->nqb * BQ * Dp : BQ * Dp;
    return 4 * BQ * Dp + 4 * BK * Dp + 3 * BQ * BK + 2 * BK * Dp + dq + 2 * BQ + 2 * (BQ > BK ? BQ : BK) +
           4 * g->Dh * (BQ + BK) + (BQ + BK / 2) * Dp + 3 * BQ * BK / 2;
}

static bwd_ws bwd_ws_at(float *p, const geom *g, bool whole_dq) {
    int64_t Dp = g->Dp;
    bwd_ws w;
    w.qs = take(&p, BQ * Dp), w.qt = take(&p, Dp * BQ), w.dob = take(&p, BQ * Dp), w.dot = take(&p, Dp * BQ);
    w.kj = take(&p, BK * Dp), w.vj = take(&p, BK * Dp), w.kt = take(&p, Dp * BK), w.vt = take(&p, Dp * BK);
    w.s = take(&p, BQ * BK), w.dp = take(&p, BQ * BK), w.z = take(&p, BQ * BK);
    w.dk = take(&p, BK * Dp), w.dv = take(&p, BK * Dp);
    w.dq = take(&p, whole_dq ? g->nqb * BQ * Dp : BQ * Dp);
    w.lse = take(&p, BQ), w.delta = take(&p, BQ);
    int nb = BQ > BK ? BQ : BK;
    w.lo = (int *)take(&p, nb), w.hi = (int *)take(&p, nb);
    int64_t Dh = g->Dh;
    w.qrow = (uint32_t *)take(&p, BQ * Dh), w.drow = (uint32_t *)take(&p, BQ * Dh);
    w.krow = (uint32_t *)take(&p, BK * Dh), w.vrow = (uint32_t *)take(&p, BK * Dh);
    w.qcol = (uint32_t *)take(&p, Dh * BQ), w.dcol = (uint32_t *)take(&p, Dh * BQ);
    w.kcol = (uint32_t *)take(&p, Dh * BK), w.vcol = (uint32_t *)take(&p, Dh * BK);
    w.qpk = (uint32_t *)take(&p, BQ / 2 * Dp), w.dpk = (uint32_t *)take(&p, BQ / 2 * Dp);
    w.kpk = (uint32_t *)take(&p, BK / 2 * Dp);
    w.ppk = (uint32_t *)take(&p, BQ * BK / 2), w.dspk = (uint32_t *)take(&p, BQ * BK / 2);
    w.dsrow = (uint32_t *)take(&p, BQ * BK / 2);
    return w;
}

typedef struct {
    view4 dq, dk, dv, dout, q, k, v;
    char *dbias; /* (N, H, Tq, Tk) with strides db_st, or NULL */
    int64_t db_st[4];
    bool dbias_bf16;
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

/* probs_grad over the key pass's tiles (a query per row): P o Z in s, for
 * dv, and dS in dp, which is the bias's gradient. */
static void probs_grad_kv(const bwd_ws *w, const bwd_args *a, const geom *g, int64_t n, int64_t h, int64_t i0,
                          int nq, int64_t j0, int nk, float scale) {
    int rq = round_rows(nq);
    if (g->bias) {
        add_bias(w->s, BK, 1, g, n, h, i0, nq, j0, nk, scale);
        scale = 1.0f;
    }
    if (g->dropout) {
        mask_tile(w->z, BK, 1, g, n, h, i0, nq, j0, nk);
        times(w->dp, w->z, rq * BK);
    }
    probs_grad(w->s, w->dp, rq, BK, w->lo, w->hi, scale, w->lse, w->delta, true);
    if (g->dropout)
        times(w->s, w->z, rq * BK);
    if (g->km) { /* the masked keys' columns: no probability, no gradient */
        uint8_t kept[BK];
        keys_kept(g, n, j0, nk, kept);
        for (int r = 0; r < rq; r++)
            for (int c = 0; c < nk; c++)
                if (!kept[c])
                    w->s[r * BK + c] = w->dp[r * BK + c] = 0.0f;
    }
    if (a->dbias)
        for (int r = 0; r < nq; r++)
            for (int c = 0; c < nk; c++) {
                float ds = w->dp[r * BK + c];
                int64_t at = n * a->db_st[0] + h * a->db_st[1] + (i0 + r) * a->db_st[2] + (j0 + c) * a->db_st[3];
                if (a->dbias_bf16) {
                    uint16_t *d = (uint16_t *)a->dbias + at;
                    *d = ft_f32_to_bf16(a->acc.bias ? ft_bf16_to_f32(*d) + ds : ds);
                } else {
                    float *d = (float *)a->dbias + at;
                    *d = a->acc.bias ? *d + ds : ds;
                }
            }
}

/* probs_grad over the dq pass's tiles (a key per row): dS in dp. */
static void probs_grad_q(const bwd_ws *w, const geom *g, int64_t n, int64_t h, int64_t i0, int nq, int64_t j0,
                         int nk, float scale) {
    int rk = round_rows(nk);
    if (g->bias) {
        add_bias(w->s, 1, BQ, g, n, h, i0, nq, j0, nk, scale);
        scale = 1.0f;
    }
    if (g->dropout) {
        mask_tile(w->z, 1, BQ, g, n, h, i0, nq, j0, nk);
        times(w->dp, w->z, rk * BQ);
    }
    probs_grad(w->s, w->dp, rk, BQ, w->lo, w->hi, scale, w->lse, w->delta, false);
}

/* dk and dv of key block kb over every query block; with dq (the whole
 * sequence's, (nqb * BQ, Dp)) also the key block's terms of dq. The key
 * block is fixed, so the scores are S = (q * scale) k^T, a query per row:
 * only the key block is transposed, once. */
static void backward_kv(const bwd_ws *w, const bwd_args *a, const geom *g, int64_t n, int64_t h, int64_t kb,
                        float *dq) {
    int64_t Dp = g->Dp, j0 = kb * BK, ldk = 0;
    int nk = rows_in(kb, BK, g->Tk), Dh = (int)g->Dh;
    float scale = g->pairs ? g->scale : 1.0f; /* what probs_grad and the store of dk apply */
    const float *kj = NULL;
    if (g->pairs) {
        pack_cols(w->kcol, BK, &a->k, n, h, j0, nk, g);
        pack_cols(w->vcol, BK, &a->v, n, h, j0, nk, g);
        if (dq)
            pack_rows(w->kpk, &a->k, n, h, j0, nk, g);
    } else {
        kj = rows_tile(w->kj, BK, &ldk, &a->k, n, h, j0, nk, g);
        load_cols(w->kt, BK, &a->k, n, h, j0, nk, g, 1.0f);
        load_cols(w->vt, BK, &a->v, n, h, j0, nk, g, 1.0f);
    }
    memset(w->dk, 0, sizeof(float) * BK * Dp);
    memset(w->dv, 0, sizeof(float) * BK * Dp);
    for (int64_t qb = 0; qb < g->nqb; qb++) {
        if (!block_active(g, qb, kb))
            continue;
        int64_t i0 = qb * BQ, lda, ldd;
        int nq = rows_in(qb, BQ, g->Tq), rq = round_rows(nq);
        load_row_stats(w, a, g, n, h, qb);
        for (int r = 0; r < rq; r++)
            w->lo[r] = 0, w->hi[r] = keys_seen(g, i0 + r, kb);
        if (g->pairs) {
            const uint32_t *qa = pair_rows(w->qrow, BQ, &lda, &a->q, n, h, i0, nq, g);
            const uint32_t *da = pair_rows(w->drow, BQ, &ldd, &a->dout, n, h, i0, nq, g);
            gemm_pairs(w->s, BK, qa, lda, 1, w->kcol, BK, rq, Dh, BK, false);
            gemm_pairs(w->dp, BK, da, ldd, 1, w->vcol, BK, rq, Dh, BK, false);
            probs_grad_kv(w, a, g, n, h, i0, nq, j0, nk, scale);
            int qh = (nq + 1) / 2;
            pack_tile(w->ppk, w->s, BK, nq, BK);
            pack_tile(w->dspk, w->dp, BK, nq, BK);
            pack_rows(w->dpk, &a->dout, n, h, i0, nq, g);
            pack_rows(w->qpk, &a->q, n, h, i0, nq, g);
            gemm_pairs(w->dv, Dp, w->ppk, 1, BK, w->dpk, Dp, BK, qh, (int)Dp, true);
            gemm_pairs(w->dk, Dp, w->dspk, 1, BK, w->qpk, Dp, BK, qh, (int)Dp, true);
            if (dq) {
                pair_tile(w->dsrow, w->dp, rq, BK);
                gemm_pairs(dq + i0 * Dp, Dp, w->dsrow, BK / 2, 1, w->kpk, Dp, rq, (nk + 1) / 2, (int)Dp, true);
            }
            continue;
        }
        load_rows(w->qs, BQ, &a->q, n, h, i0, nq, g, g->scale);
        const float *dob = rows_tile(w->dob, BQ, &ldd, &a->dout, n, h, i0, nq, g);
        gemm(w->s, BK, w->qs, Dp, 1, w->kt, BK, rq, (int)g->D, BK, false);
        gemm(w->dp, BK, dob, ldd, 1, w->vt, BK, rq, (int)g->D, BK, false);
        probs_grad_kv(w, a, g, n, h, i0, nq, j0, nk, scale);
        gemm(w->dv, Dp, w->s, 1, BK, dob, ldd, BK, nq, (int)Dp, true);
        gemm(w->dk, Dp, w->dp, 1, BK, w->qs, Dp, BK, nq, (int)Dp, true);
        if (dq)
            gemm(dq + i0 * Dp, Dp, w->dp, BK, 1, kj, ldk, rq, nk, (int)Dp, true);
    }
    for (int r = 0; r < nk; r++) {
        if (a->dk.p)
            store_row(&a->dk, n, h, j0 + r, w->dk + r * Dp, g->D, scale, a->acc.k);
        if (a->dv.p)
            store_row(&a->dv, n, h, j0 + r, w->dv + r * Dp, g->D, 1.0f, a->acc.v);
    }
}

/* dq of query block qb over every key block, in the forward's transposed
 * layout: S^T = k (q * scale)^T, so only the query block is transposed, once. */
static void backward_q(const bwd_ws *w, const bwd_args *a, const geom *g, int64_t n, int64_t h, int64_t qb) {
    int64_t Dp = g->Dp, i0 = qb * BQ;
    int nq = rows_in(qb, BQ, g->Tq), Dh = (int)g->Dh;
    float scale = g->pairs ? g->scale : 1.0f;
    if (g->pairs) {
        pack_cols(w->qcol, BQ, &a->q, n, h, i0, nq, g);
        pack_cols(w->dcol, BQ, &a->dout, n, h, i0, nq, g);
    } else {
        load_cols(w->qt, BQ, &a->q, n, h, i0, nq, g, g->scale);
        load_cols(w->dot, BQ, &a->dout, n, h, i0, nq, g, 1.0f);
    }
    load_row_stats(w, a, g, n, h, qb);
    memset(w->dq, 0, sizeof(float) * BQ * Dp);
    for (int64_t kb = 0; kb < g->nkb && block_active(g, qb, kb); kb++) {
        int64_t j0 = kb * BK, ldk, ldv;
        int nk = rows_in(kb, BK, g->Tk), rk = round_rows(nk);
        /* key j sees the queries i >= j (causal) of the block's valid ones, none when masked out */
        uint8_t kept[BK];
        keys_kept(g, n, j0, nk, kept);
        for (int r = 0; r < rk; r++) {
            int64_t lo = g->causal ? j0 + r - i0 : 0;
            w->lo[r] = lo < 0 ? 0 : lo > BQ ? BQ : (int)lo;
            w->hi[r] = kept[r] ? nq : 0;
        }
        if (g->pairs) {
            const uint32_t *ka = pair_rows(w->krow, BK, &ldk, &a->k, n, h, j0, nk, g);
            const uint32_t *va = pair_rows(w->vrow, BK, &ldv, &a->v, n, h, j0, nk, g);
            gemm_pairs(w->s, BQ, ka, ldk, 1, w->qcol, BQ, rk, Dh, BQ, false);
            gemm_pairs(w->dp, BQ, va, ldv, 1, w->dcol, BQ, rk, Dh, BQ, false);
            probs_grad_q(w, g, n, h, i0, nq, j0, nk, scale);
            pack_tile(w->dspk, w->dp, BQ, nk, BQ);
            pack_rows(w->kpk, &a->k, n, h, j0, nk, g);
            gemm_pairs(w->dq, Dp, w->dspk, 1, BQ, w->kpk, Dp, BQ, (nk + 1) / 2, (int)Dp, true);
            continue;
        }
        const float *kj = rows_tile(w->kj, BK, &ldk, &a->k, n, h, j0, nk, g);
        const float *vj = rows_tile(w->vj, BK, &ldv, &a->v, n, h, j0, nk, g);
        gemm(w->s, BQ, kj, ldk, 1, w->qt, BQ, rk, (int)g->D, BQ, false);
        gemm(w->dp, BQ, vj, ldv, 1, w->dot, BQ, rk, (int)g->D, BQ, false);
        probs_grad_q(w, g, n, h, i0, nq, j0, nk, scale);
        gemm(w->dq, Dp, w->dp, 1, BQ, kj, ldk, BQ, nk, (int)Dp, true);
    }
    for (int r = 0; r < nq; r++)
        store_row(&a->dq, n, h, i0 + r, w->dq + r * Dp, g->D, g->scale, a->acc.q);
}

ft_status ft_sdpa_backward(const ft_tensor *dq, const ft_tensor *dk, const ft_tensor *dv, const ft_tensor *dbias,
                           const ft_tensor *dout, const ft_tensor *q, const ft_tensor *k, const ft_tensor *v,
                           const ft_tensor *out, const ft_tensor *lse, const ft_sdpa_params *p, ft_sdpa_acc acc) {
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
    FT_TRY(check_key_mask(op, p, dev, N, k->shape[2]));
    FT_TRY(check_bias(op, p, dev, N, H, Tq, k->shape[2]));
    if (dbias) {
        if (!p->bias)
            return ft_fail(FT_ERR_VALUE, "%s: dbias is the gradient of a bias, and none was given", op);
        int64_t shape[4] = {N, H, Tq, k->shape[2]};
        FT_TRY(ft_check_float_on(op, "dbias", dbias, dev, "q", true));
        FT_TRY(ft_check_shape(op, "dbias", dbias, 4, shape));
        const ft_tensor *bias_in[] = {p->bias};
        const char *bias_name[] = {"bias"};
        FT_TRY(check_writes(op, "dbias", dbias, in, names, 9));
        FT_TRY(check_writes(op, "dbias", dbias, bias_in, bias_name, 1));
    }
    geom g;
    FT_TRY(make_geom(&g, q, k, p, in_pairs(in, 4))); /* dout, q, k and v */
    if (dev.type == FT_DEV_CUDA) { /* the backend writes: accumulation is staged */
        ft_grad_out gq = {0}, gk = {0}, gv = {0};
        const ft_tensor *q_to, *k_to, *v_to;
        ft_status s = ft_grad_out_begin_float(&gq, dq, acc.q, &q_to);
        if (s == FT_OK)
            s = ft_grad_out_begin_float(&gk, dk, acc.k, &k_to);
        if (s == FT_OK)
            s = ft_grad_out_begin_float(&gv, dv, acc.v, &v_to);
        if (s == FT_OK)
            s = FT_CUDA_CALL(op, sdpa_backward, q_to, k_to, v_to, dout, q, k, v, out, lse, p);
        return ft_grad_out_end(&gv, ft_grad_out_end(&gk, ft_grad_out_end(&gq, s)));
    }
    if (N * H == 0 || (!dq && !dk && !dv && !dbias))
        return FT_OK;
    bool key_pass = dk || dv || dbias;
    if (dbias && !acc.bias) /* the keys no query sees (causal blocks skipped) get 0 */
        FT_TRY(ft_tensor_fill(dbias, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0.0f}));
    int threads = omp_get_max_threads();
    /* dq within the (n, h) units of the key pass when they keep every thread busy */
    bool fused = dq && key_pass && N * H >= 2 * threads;
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
                  dbias ? ft_tensor_data(dbias) : NULL,
                  {dbias ? dbias->strides[0] : 0, dbias ? dbias->strides[1] : 0, dbias ? dbias->strides[2] : 0,
                   dbias ? dbias->strides[3] : 0},
                  dbias && dbias->dtype == FT_BFLOAT16,
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
            if (key_pass) {
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
