#include "nn/reducer.h"

#include <omp.h>
#include <stdlib.h>

#include "core/dist.h"

struct ft_reducer {
    ft_program *prog;
    float *grads;
    int64_t n, per;   /* elements of the buffer, and of a bucket (the first from the end) */
    int nbuckets;
    int *waiting;     /* (nbuckets) the slots that overlap each bucket */
    int *left;        /* (nbuckets) of them, those not final yet this step */
    int *first, *last; /* (slots) the buckets a slot overlaps: first..last */
    int next;         /* the next bucket to start */
    int idle;         /* buckets no slot overlaps: started before the backward */
    int early;        /* buckets the last step started within its backward */
    double wait;      /* seconds the last step spent in ft_reducer_finish */
    ft_status error;  /* the first failure to start a sum this step */
};

/* Bucket b holds the elements [n - (b + 1) per, n - b per), clipped at 0. */
static int bucket_of(const ft_reducer *r, int64_t i) { return (int)((r->n - 1 - i) / r->per); }

static void start(ft_reducer *r, int b) {
    int64_t hi = r->n - (int64_t)b * r->per, lo = hi - r->per > 0 ? hi - r->per : 0;
    if (r->error == FT_OK)
        r->error = ft_dist_iallreduce_sum_f32(r->grads + lo, hi - lo);
}

static void start_ready(ft_reducer *r) {
    while (r->next < r->nbuckets && r->left[r->next] == 0)
        start(r, r->next++);
}

/* The program's hook: slot s of the step's last backward is final. */
static void slot_final(void *ctx, int s) {
    ft_reducer *r = ctx;
    for (int b = r->first[s]; b <= r->last[s]; b++)
        r->left[b]--;
    start_ready(r);
    if (r->next > 0 && r->error == FT_OK)
        r->error = ft_dist_progress();
}

ft_status ft_reducer_create(ft_reducer **out, ft_program *p, const ft_tensor *grads, int64_t bucket_bytes) {
    *out = NULL;
    int64_t n = grads->shape[0], per = bucket_bytes / (int64_t)sizeof(float);
    if (per < 1)
        return ft_fail(FT_ERR_VALUE, "the gradient bucket must hold at least one float, got %lld bytes",
                       (long long)bucket_bytes);
    int nslots = ft_program_num_slots(p);
    ft_reducer *r = calloc(1, sizeof *r);
    int nb = n > 0 ? (int)((n + per - 1) / per) : 0;
    if (r) {
        r->waiting = calloc((size_t)nb + 1, sizeof *r->waiting);
        r->left = calloc((size_t)nb + 1, sizeof *r->left);
        r->first = calloc((size_t)nslots + 1, sizeof *r->first);
        r->last = calloc((size_t)nslots + 1, sizeof *r->last);
    }
    if (!r || !r->waiting || !r->left || !r->first || !r->last) {
        ft_reducer_destroy(r);
        return ft_fail(FT_ERR_NOMEM, "out of memory for the gradient buckets");
    }
    r->prog = p, r->grads = (float *)ft_tensor_data(grads), r->n = n, r->per = per, r->nbuckets = nb;
    for (int s = 0; s < nslots; s++) {
        const ft_tensor *t = ft_program_slot(p, s);
        int64_t lo = (float *)ft_tensor_data(t) - r->grads, len = ft_tensor_numel(t);
        r->first[s] = 1, r->last[s] = 0; /* an empty slot overlaps nothing */
        if (len == 0)
            continue;
        r->first[s] = bucket_of(r, lo + len - 1), r->last[s] = bucket_of(r, lo);
        for (int b = r->first[s]; b <= r->last[s]; b++)
            r->waiting[b]++;
    }
    *out = r;
    return FT_OK;
}

void ft_reducer_destroy(ft_reducer *r) {
    if (!r)
        return;
    free(r->waiting), free(r->left), free(r->first), free(r->last);
    free(r);
}

void ft_reducer_begin(ft_reducer *r) {
    for (int b = 0; b < r->nbuckets; b++)
        r->left[b] = r->waiting[b];
    r->next = 0, r->error = FT_OK;
    start_ready(r); /* buckets that no slot overlaps */
    r->idle = r->next;
    ft_program_on_slot_final(r->prog, slot_final, r);
}

ft_status ft_reducer_finish(ft_reducer *r) {
    double t0 = omp_get_wtime();
    ft_program_on_slot_final(r->prog, NULL, NULL);
    r->early = r->next - r->idle;
    while (r->next < r->nbuckets)
        start(r, r->next++);
    ft_status waited = ft_dist_wait_all(); /* even after a failed start: leave nothing pending */
    r->wait = omp_get_wtime() - t0;
    return r->error != FT_OK ? r->error : waited;
}

int ft_reducer_num_buckets(const ft_reducer *r) { return r->nbuckets; }
int ft_reducer_started_early(const ft_reducer *r) { return r->early; }
double ft_reducer_wait_seconds(const ft_reducer *r) { return r->wait; }
