#include "ops/pointwise.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/convert.h"

/* Elements per thread below which a loop stays on fewer threads. */
#define GRAIN (1 << 14)
/* Floats per operand in a gathered tile. */
#define TILE 256

bool ft_pw_plan_make(ft_pw_plan *pl, const ft_pw_loop *l) {
    const ft_tensor *t0 = l->t[0];
    int nrows = l->nops + (l->need_index ? 1 : 0);
    int64_t cstride[FT_MAX_DIMS];
    ft_contiguous_strides(cstride, t0->ndim, t0->shape);
    for (int k = 0; k < l->nops; k++) {
        pl->base[k] = ft_tensor_data(l->t[k]);
        pl->dtype[k] = l->t[k]->dtype;
    }
    /* keep dimensions of size > 1 */
    int nd = 0, order[FT_MAX_DIMS];
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 0)
            return false;
        if (t0->shape[d] > 1)
            order[nd++] = d;
    }
    /* outermost first: by decreasing |stride| of operand 0, stable; kernels
     * that need the C-order index walk in C order instead, so that their runs
     * are consecutive elements (dropout draws 4 per Philox block) */
    if (!l->need_index)
        ft_sort_dims_by_stride(order, nd, t0->shape, t0->strides);
    pl->ndim = 0;
    for (int i = 0; i < nd; i++) {
        int d = order[i];
        int64_t cur[FT_PW_MAX_OPS + 1];
        for (int k = 0; k < l->nops; k++)
            cur[k] = l->t[k]->strides[d] * (int64_t)ft_dtype_get(l->t[k]->dtype)->itemsize;
        if (l->need_index)
            cur[l->nops] = cstride[d];
        int m = pl->ndim - 1;
        bool merge = m >= 0;
        for (int k = 0; merge && k < nrows; k++)
            merge = pl->st[k][m] == cur[k] * t0->shape[d];
        if (merge) {
            pl->shape[m] *= t0->shape[d];
            for (int k = 0; k < nrows; k++)
                pl->st[k][m] = cur[k];
        } else {
            pl->shape[pl->ndim] = t0->shape[d];
            for (int k = 0; k < nrows; k++)
                pl->st[k][pl->ndim] = cur[k];
            pl->ndim++;
        }
    }
    if (pl->ndim == 0) { /* one element */
        pl->ndim = 1;
        pl->shape[0] = 1;
        for (int k = 0; k < l->nops; k++)
            pl->st[k][0] = (int64_t)ft_dtype_get(l->t[k]->dtype)->itemsize;
        if (l->need_index)
            pl->st[l->nops][0] = 1;
    }
    int in = pl->ndim - 1;
    pl->direct = !l->need_index || pl->st[l->nops][in] == 1;
    for (int k = 0; k < l->nops; k++)
        pl->direct = pl->direct && pl->dtype[k] == FT_FLOAT32 && pl->st[k][in] == 4;
    return true;
}

/* A tile of n elements of dtype dt (float32, bfloat16, or bool as 0 and 1) at a byte step into floats and back;
 * dense runs (the usual case) take vectorised loops. */
FT_VEC_CLONES void ft_pw_gather(float *dst, const char *src, int64_t step, ft_dtype dt, int64_t n) {
    if (dt == FT_BOOL) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = src[i * step] != 0;
    } else if (step == (int64_t)ft_dtype_get(dt)->itemsize) {
        if (dt == FT_BFLOAT16)
            ft_floats_in(src, true, 0, n, dst);
        else
            memcpy(dst, src, (size_t)n * sizeof *dst);
    } else if (dt == FT_BFLOAT16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = ft_bf16_to_f32(*(const uint16_t *)(src + i * step));
    } else {
        for (int64_t i = 0; i < n; i++)
            dst[i] = *(const float *)(src + i * step);
    }
}

FT_VEC_CLONES void ft_pw_scatter(char *dst, int64_t step, ft_dtype dt, const float *src, int64_t n) {
    if (dt == FT_BOOL) {
        for (int64_t i = 0; i < n; i++)
            dst[i * step] = src[i] != 0;
    } else if (step == (int64_t)ft_dtype_get(dt)->itemsize) {
        if (dt == FT_BFLOAT16)
            ft_floats_out(dst, true, 0, n, src);
        else
            memcpy(dst, src, (size_t)n * sizeof *src);
    } else if (dt == FT_BFLOAT16) {
        for (int64_t i = 0; i < n; i++)
            *(uint16_t *)(dst + i * step) = ft_f32_to_bf16(src[i]);
    } else {
        for (int64_t i = 0; i < n; i++)
            *(float *)(dst + i * step) = src[i];
    }
}

/* One run of n elements along the inner dimension, starting at ptr[]. */
static void run(const ft_pw_loop *l, const ft_pw_plan *pl, char *const *ptr, int64_t n, int64_t idx0) {
    int in = pl->ndim - 1;
    if (pl->direct) {
        float *p[FT_PW_MAX_OPS];
        for (int k = 0; k < l->nops; k++)
            p[k] = (float *)ptr[k];
        l->fn(p, n, NULL, idx0, l->ctx);
        return;
    }
    _Alignas(64) float tiles[FT_PW_MAX_OPS][TILE];
    int64_t idx[TILE];
    float *p[FT_PW_MAX_OPS];
    for (int k = 0; k < l->nops; k++)
        p[k] = tiles[k];
    int64_t istep = l->need_index ? pl->st[l->nops][in] : 1;
    for (int64_t off = 0; off < n; off += TILE) {
        int64_t m = n - off < TILE ? n - off : TILE;
        for (int k = l->read_outputs ? 0 : l->nout; k < l->nops; k++)
            ft_pw_gather(tiles[k], ptr[k] + off * pl->st[k][in], pl->st[k][in], pl->dtype[k], m);
        if (l->need_index && istep != 1)
            for (int64_t i = 0; i < m; i++)
                idx[i] = idx0 + (off + i) * istep;
        l->fn(p, m, l->need_index && istep != 1 ? idx : NULL, idx0 + off * istep, l->ctx);
        for (int k = 0; k < l->nout; k++)
            ft_pw_scatter(ptr[k] + off * pl->st[k][in], pl->st[k][in], pl->dtype[k], tiles[k], m);
    }
}

/* Elements [begin, end) in the plan's order. */
void ft_pw_walk(const ft_pw_loop *l, const ft_pw_plan *pl, int64_t begin, int64_t end) {
    int nd = pl->ndim, nrows = l->nops + (l->need_index ? 1 : 0);
    int64_t pos[FT_MAX_DIMS], rem = begin;
    for (int d = nd - 1; d >= 0; d--) {
        pos[d] = rem % pl->shape[d];
        rem /= pl->shape[d];
    }
    char *ptr[FT_PW_MAX_OPS];
    int64_t idx = 0;
    for (int k = 0; k < l->nops; k++) {
        ptr[k] = pl->base[k];
        for (int d = 0; d < nd; d++)
            ptr[k] += pos[d] * pl->st[k][d];
    }
    if (l->need_index)
        for (int d = 0; d < nd; d++)
            idx += pos[d] * pl->st[l->nops][d];
    int in = nd - 1;
    while (begin < end) {
        int64_t n = pl->shape[in] - pos[in];
        if (n > end - begin)
            n = end - begin;
        run(l, pl, ptr, n, idx);
        begin += n;
        /* advance the odometer by n along the inner dimension */
        pos[in] += n;
        for (int k = 0; k < l->nops; k++)
            ptr[k] += n * pl->st[k][in];
        if (l->need_index)
            idx += n * pl->st[l->nops][in];
        for (int d = in; d > 0 && pos[d] == pl->shape[d]; d--) {
            pos[d] = 0;
            pos[d - 1]++;
            for (int k = 0; k < nrows; k++) {
                int64_t delta = pl->st[k][d - 1] - pl->shape[d] * pl->st[k][d];
                if (k < l->nops)
                    ptr[k] += delta;
                else
                    idx += delta;
            }
        }
    }
}

int64_t ft_pw_plan_numel(const ft_pw_plan *pl) {
    int64_t total = 1;
    for (int d = 0; d < pl->ndim; d++)
        total *= pl->shape[d];
    return total;
}

void ft_pw_run(const ft_pw_loop *l) {
    ft_pw_plan pl;
    if (!ft_pw_plan_make(&pl, l))
        return;
    int64_t total = ft_pw_plan_numel(&pl);
    int64_t want = total / GRAIN;
    int nt = omp_get_max_threads();
    if (want < nt)
        nt = want < 1 ? 1 : (int)want;
    if (nt == 1) {
        ft_pw_walk(l, &pl, 0, total);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
        ft_pw_walk(l, &pl, total / T * t + (t < total % T ? t : total % T),
             total / T * (t + 1) + (t + 1 < total % T ? t + 1 : total % T));
    }
}
