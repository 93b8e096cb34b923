#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda.h"
#include "kernels/convert.h"
#include "kernels/optim.h"
#include "ops/cuda_ops.h"
#include "ops/pointwise.h"
#include "optim/state.h"
#include "optim/trust.h"

/* Below this many elements a pass runs on the calling thread: a parallel
 * region would cost more than it saves. */
#define PARALLEL_MIN 65536

/* Independent double accumulators of the block sums: enough to hide the
 * add latency and to vectorise, and the same on every code path, so the
 * sums do not depend on the instruction set either. */
#define LANES 16

/* ---- blocks: the fixed partition every pass and reduction uses ---- */

typedef struct {
    int seg;
    int64_t start, len; /* elements within the segment */
} block;

typedef struct {
    int nseg;
    int64_t *offset;      /* (nseg + 1): where each segment starts in the flat state */
    int64_t *first_block; /* (nseg + 1): the blocks of segment i are [first_block[i], first_block[i + 1]) */
    block *blocks;
    int64_t nblocks;
} plan;

static void plan_free(plan *pl) {
    free(pl->offset);
    free(pl->first_block);
    free(pl->blocks);
    memset(pl, 0, sizeof *pl);
}

static ft_status plan_build(plan *pl, int nseg, const int64_t *numel, const char *what) {
    memset(pl, 0, sizeof *pl);
    if (nseg < 0)
        return ft_fail(FT_ERR_VALUE, "%s: the number of segments must be >= 0, got %d", what, nseg);
    pl->nseg = nseg;
    pl->offset = malloc(((size_t)nseg + 1) * sizeof *pl->offset);
    pl->first_block = malloc(((size_t)nseg + 1) * sizeof *pl->first_block);
    if (!pl->offset || !pl->first_block) {
        plan_free(pl);
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory for %d segments", what, nseg);
    }
    int64_t total = 0, nblocks = 0;
    for (int i = 0; i < nseg; i++) {
        if (numel[i] < 0 || numel[i] > (INT64_MAX / 8 - total)) {
            plan_free(pl);
            return numel[i] < 0 ? ft_fail(FT_ERR_VALUE, "%s: segment %d has %lld elements", what, i, (long long)numel[i])
                                : ft_fail(FT_ERR_OVERFLOW, "%s: the segments hold too many elements", what);
        }
        pl->offset[i] = total;
        pl->first_block[i] = nblocks;
        total += numel[i];
        nblocks += (numel[i] + FT_OPTIM_BLOCK - 1) / FT_OPTIM_BLOCK;
    }
    pl->offset[nseg] = total;
    pl->first_block[nseg] = nblocks;
    pl->nblocks = nblocks;
    pl->blocks = malloc((size_t)(nblocks ? nblocks : 1) * sizeof *pl->blocks);
    if (!pl->blocks) {
        plan_free(pl);
        return ft_fail(FT_ERR_NOMEM, "%s: out of memory for %lld blocks", what, (long long)nblocks);
    }
    for (int i = 0; i < nseg; i++)
        for (int64_t b = pl->first_block[i], start = 0; b < pl->first_block[i + 1]; b++, start += FT_OPTIM_BLOCK)
            pl->blocks[b] = (block){i, start, numel[i] - start < FT_OPTIM_BLOCK ? numel[i] - start : FT_OPTIM_BLOCK};
    return FT_OK;
}

static int64_t plan_total(const plan *pl) { return pl->offset[pl->nseg]; }

/* A zeroed float32 buffer of the plan's size on `device`; on the CPU zeroed
 * block by block on the pool so that its pages are first touched where the
 * passes will run. */
static ft_status new_zeroed(ft_storage **out, const plan *pl, ft_device device) {
    FT_TRY(ft_storage_new(out, (size_t)plan_total(pl) * sizeof(float), device, false));
    if (device.type == FT_DEV_CUDA) {
        ft_status st = FT_CUDA_CALL("optimizer state", optim_zero, (*out)->data, plan_total(pl), device.index);
        if (st != FT_OK) {
            ft_storage_release(*out);
            *out = NULL;
        }
        return st;
    }
    float *base = (*out)->data;
#pragma omp parallel for schedule(static) if (plan_total(pl) >= PARALLEL_MIN)
    for (int64_t b = 0; b < pl->nblocks; b++) {
        const block *bk = &pl->blocks[b];
        memset(base + pl->offset[bk->seg] + bk->start, 0, (size_t)bk->len * sizeof(float));
    }
    return FT_OK;
}

/* ---- fixed-order sums of squares ---- */

static double sum_lanes(const double *acc) {
    double s = 0;
    for (int j = 0; j < LANES; j++)
        s += acc[j];
    return s;
}

/* sum over i of (x[i] * scale)^2, the product rounded to float as the
 * scaled gradient would be, the square and the sum in double. */
FT_VEC_CLONES
static double sum_squares(const float *x, int64_t n, float scale) {
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            double v = x[i + j] * scale;
            acc[j] += v * v;
        }
    for (int j = 0; i + j < n; j++) {
        double v = x[i + j] * scale;
        acc[j] += v * v;
    }
    return sum_lanes(acc);
}

/* ---- the optimizer ---- */

typedef struct {
    float scale, clip;
} grad_xform;

typedef ft_optim_coef coef;

struct ft_optimizer {
    ft_optim_kind kind;
    ft_device device;
    int ngroups;
    ft_optim_group *groups;
    ft_optim_segment *segs;
    ft_optim_segment_state *seg_state;
    coef *coefs; /* (nseg): this step's coefficients */
    plan plan;
    double *partial; /* CPU: (nblocks, 2) per-block sums of squares */
    ft_storage *state[FT_OPTIM_NUM_STATES];
    int64_t nsteps;
    /* CUDA: the partials, the total and the table of ft_cuda_optim in device
     * memory, and the host side of the table */
    ft_storage *workspace;
    ft_cuda_optim_segment *table; /* (nseg) */
    void **copies;                /* (nseg) or NULL: see ft_optimizer_set_copies */
    ft_dtype copy_dtype;
};

static const char *const kind_names[] = {"SGD",      "AdamW",   "LAMB",   "LARS",  "Adam", "RMSprop",
                                         "Adadelta", "Adagrad", "Adamax", "NAdam", "RAdam"};

static bool finite_ge0(double x) { return isfinite(x) && x >= 0; }

const char *ft_optim_kind_name(ft_optim_kind kind) {
    return (int)kind >= FT_OPTIM_SGD && kind < FT_OPTIM_NKINDS ? kind_names[kind] : "unknown optimizer";
}

/* The device whose memory the params are in, with page-locked host memory
 * counted as the CPU; FT_ERR_DEVICE when the passes cannot run there. */
static ft_status check_device(ft_device *device, const char *what) {
    if (device->type == FT_DEV_CPU || device->type == FT_DEV_CUDA_HOST) {
        *device = FT_CPU;
        return FT_OK;
    }
    if (device->type != FT_DEV_CUDA)
        return ft_fail(FT_ERR_DEVICE, "%s: the params are on an unsupported device (type %d)", what, device->type);
    FT_TRY(ft_cuda_check_device(device->index));
    const struct ft_cuda_ops *ops = ft_cuda_op_table();
    if (!ops->optim_zero || !ops->optim_upload || !ops->optim_grad_sumsq || !ops->optim_update || !ops->ema_update)
        return ft_fail(FT_ERR_DEVICE, "%s: has no CUDA implementation in this build", what);
    return FT_OK;
}

static ft_status check_kind(ft_optim_kind kind) {
    if ((int)kind < FT_OPTIM_SGD || (int)kind >= FT_OPTIM_NKINDS)
        return ft_fail(FT_ERR_VALUE, "unknown optimizer kind %d", (int)kind);
    return FT_OK;
}

ft_status ft_optim_check_group(ft_optim_kind kind, int i, const ft_optim_group *g) {
    FT_TRY(check_kind(kind));
    const char *k = kind_names[kind];
    if (!finite_ge0(g->lr))
        return ft_fail(FT_ERR_VALUE, "%s group %d: lr must be finite and >= 0, got %g", k, i, g->lr);
    if (!finite_ge0(g->weight_decay))
        return ft_fail(FT_ERR_VALUE, "%s group %d: weight_decay must be finite and >= 0, got %g", k, i,
                       g->weight_decay);
    if (g->nesterov && kind != FT_OPTIM_SGD)
        return ft_fail(FT_ERR_VALUE, "%s group %d: nesterov is an SGD option", k, i);
    if (g->amsgrad && kind != FT_OPTIM_ADAMW && kind != FT_OPTIM_ADAM)
        return ft_fail(FT_ERR_VALUE, "%s group %d: amsgrad is an Adam and AdamW option", k, i);
    if (g->lars_exclude && kind != FT_OPTIM_LAMB && kind != FT_OPTIM_LARS)
        return ft_fail(FT_ERR_VALUE, "%s group %d: lars_exclude is a LAMB and LARS option", k, i);
    if (g->centered && kind != FT_OPTIM_RMSPROP)
        return ft_fail(FT_ERR_VALUE, "%s group %d: centered is an RMSprop option", k, i);
    if (g->decoupled_weight_decay && kind != FT_OPTIM_NADAM && kind != FT_OPTIM_RADAM)
        return ft_fail(FT_ERR_VALUE, "%s group %d: decoupled_weight_decay is a NAdam and RAdam option", k, i);
    if (kind == FT_OPTIM_SGD || kind == FT_OPTIM_LARS || kind == FT_OPTIM_RMSPROP) {
        if (!finite_ge0(g->momentum))
            return ft_fail(FT_ERR_VALUE, "%s group %d: momentum must be finite and >= 0, got %g", k, i, g->momentum);
    }
    switch (kind) {
    case FT_OPTIM_SGD:
        if (!isfinite(g->dampening))
            return ft_fail(FT_ERR_VALUE, "SGD group %d: dampening must be finite, got %g", i, g->dampening);
        if (g->nesterov && (g->momentum <= 0 || g->dampening != 0))
            return ft_fail(FT_ERR_VALUE, "SGD group %d: nesterov momentum requires a momentum > 0 and zero dampening "
                                         "(got momentum %g, dampening %g)", i, g->momentum, g->dampening);
        break;
    case FT_OPTIM_ADAMW:
    case FT_OPTIM_ADAM:
    case FT_OPTIM_LAMB:
    case FT_OPTIM_ADAMAX:
    case FT_OPTIM_NADAM:
    case FT_OPTIM_RADAM:
        if (!(g->beta1 >= 0 && g->beta1 < 1) || !(g->beta2 >= 0 && g->beta2 < 1))
            return ft_fail(FT_ERR_VALUE, "%s group %d: betas must be in [0, 1), got (%g, %g)", k, i, g->beta1,
                           g->beta2);
        /* as torch.optim, but Adam's, AdamW's and LAMB's eps > 0: 0 divides 0 by 0 where a gradient is 0 */
        bool eps0 = kind == FT_OPTIM_ADAMAX || kind == FT_OPTIM_NADAM || kind == FT_OPTIM_RADAM;
        if (eps0 ? !finite_ge0(g->eps) : !(isfinite(g->eps) && g->eps > 0))
            return ft_fail(FT_ERR_VALUE, "%s group %d: eps must be finite and %s 0, got %g", k, i, eps0 ? ">=" : ">",
                           g->eps);
        if (kind == FT_OPTIM_NADAM && !finite_ge0(g->momentum_decay))
            return ft_fail(FT_ERR_VALUE, "NAdam group %d: momentum_decay must be finite and >= 0, got %g", i,
                           g->momentum_decay);
        break;
    case FT_OPTIM_ADAGRAD:
        if (!finite_ge0(g->lr_decay))
            return ft_fail(FT_ERR_VALUE, "Adagrad group %d: lr_decay must be finite and >= 0, got %g", i, g->lr_decay);
        if (!finite_ge0(g->initial_accumulator_value))
            return ft_fail(FT_ERR_VALUE, "Adagrad group %d: initial_accumulator_value must be finite and >= 0, got %g",
                           i, g->initial_accumulator_value);
        if (!finite_ge0(g->eps))
            return ft_fail(FT_ERR_VALUE, "Adagrad group %d: eps must be finite and >= 0, got %g", i, g->eps);
        break;
    case FT_OPTIM_RMSPROP:
    case FT_OPTIM_ADADELTA:
        if (!(g->alpha >= 0 && g->alpha <= 1))
            return ft_fail(FT_ERR_VALUE, "%s group %d: %s must be in [0, 1], got %g", k, i,
                           kind == FT_OPTIM_RMSPROP ? "alpha" : "rho", g->alpha);
        if (!finite_ge0(g->eps))
            return ft_fail(FT_ERR_VALUE, "%s group %d: eps must be finite and >= 0, got %g", k, i, g->eps);
        break;
    case FT_OPTIM_LARS:
        if (!(isfinite(g->trust_coefficient) && g->trust_coefficient > 0))
            return ft_fail(FT_ERR_VALUE, "LARS group %d: trust_coefficient must be finite and > 0, got %g", i,
                           g->trust_coefficient);
        if (!finite_ge0(g->eps))
            return ft_fail(FT_ERR_VALUE, "LARS group %d: eps must be finite and >= 0, got %g", i, g->eps);
        break;
    }
    return FT_OK;
}

typedef struct {
    uintptr_t lo, hi;
    int seg;
} span;

static int span_cmp(const void *a, const void *b) {
    uintptr_t x = ((const span *)a)->lo, y = ((const span *)b)->lo;
    return x < y ? -1 : x > y;
}

/* Params must not share memory with each other (the pass would update an
 * element twice, racing) nor with any grad (grads are read after params are
 * written). */
static ft_status check_memory(const ft_optimizer *opt, const float *const *grads) {
    int n = opt->plan.nseg;
    span *spans = malloc((size_t)(n ? n : 1) * sizeof *spans);
    if (!spans)
        return ft_fail(FT_ERR_NOMEM, "out of memory checking %d segments", n);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (opt->segs[i].numel > 0)
            spans[m++] = (span){(uintptr_t)opt->segs[i].param, (uintptr_t)(opt->segs[i].param + opt->segs[i].numel), i};
    qsort(spans, (size_t)m, sizeof *spans, span_cmp);
    ft_status st = FT_OK;
    for (int k = 1; k < m && st == FT_OK; k++)
        if (spans[k].lo < spans[k - 1].hi)
            st = ft_fail(FT_ERR_VALUE, "the params of segments %d and %d overlap in memory", spans[k - 1].seg,
                         spans[k].seg);
    for (int i = 0; i < n && st == FT_OK; i++) {
        if (!grads[i] || opt->segs[i].numel == 0)
            continue;
        uintptr_t lo = (uintptr_t)grads[i], hi = (uintptr_t)(grads[i] + opt->segs[i].numel);
        /* The last span starting below hi is the only one that can overlap. */
        int a = 0, b = m;
        while (a < b) {
            int mid = (a + b) / 2;
            if (spans[mid].lo < hi)
                a = mid + 1;
            else
                b = mid;
        }
        if (a > 0 && spans[a - 1].hi > lo)
            st = ft_fail(FT_ERR_VALUE, "the grad of segment %d overlaps the params of segment %d", i, spans[a - 1].seg);
    }
    free(spans);
    return st;
}

static bool needs_state(const ft_optimizer *opt, ft_optim_state s) {
    for (int i = 0; i < opt->ngroups; i++) {
        const ft_optim_group *g = &opt->groups[i];
        switch (opt->kind) {
        case FT_OPTIM_SGD:
            if (s == FT_OPTIM_MOMENTUM_BUFFER && g->momentum != 0)
                return true;
            break;
        case FT_OPTIM_ADAMW:
        case FT_OPTIM_ADAM:
            if (s == FT_OPTIM_EXP_AVG || s == FT_OPTIM_EXP_AVG_SQ || (s == FT_OPTIM_MAX_EXP_AVG_SQ && g->amsgrad))
                return true;
            break;
        case FT_OPTIM_LAMB:
            if (s == FT_OPTIM_EXP_AVG || s == FT_OPTIM_EXP_AVG_SQ)
                return true;
            break;
        case FT_OPTIM_LARS:
            if (s == FT_OPTIM_MOMENTUM_BUFFER)
                return true;
            break;
        case FT_OPTIM_RMSPROP:
            if (s == FT_OPTIM_SQUARE_AVG || (s == FT_OPTIM_MOMENTUM_BUFFER && g->momentum != 0) ||
                (s == FT_OPTIM_GRAD_AVG && g->centered))
                return true;
            break;
        case FT_OPTIM_ADADELTA:
            if (s == FT_OPTIM_SQUARE_AVG || s == FT_OPTIM_ACC_DELTA)
                return true;
            break;
        case FT_OPTIM_ADAGRAD:
            if (s == FT_OPTIM_SUM)
                return true;
            break;
        case FT_OPTIM_ADAMAX:
            if (s == FT_OPTIM_EXP_AVG || s == FT_OPTIM_EXP_INF)
                return true;
            break;
        case FT_OPTIM_NADAM:
        case FT_OPTIM_RADAM:
            if (s == FT_OPTIM_EXP_AVG || s == FT_OPTIM_EXP_AVG_SQ)
                return true;
            break;
        }
    }
    return false;
}

/* Allocates the state buffers the current groups need and do not have yet. */
static ft_status alloc_state(ft_optimizer *opt) {
    for (int s = 0; s < FT_OPTIM_NUM_STATES; s++)
        if (!opt->state[s] && needs_state(opt, (ft_optim_state)s))
            FT_TRY(new_zeroed(&opt->state[s], &opt->plan, opt->device));
    return FT_OK;
}

ft_status ft_optimizer_create(ft_optimizer **out, ft_device device, ft_optim_kind kind, int ngroups,
                                 const ft_optim_group *groups, int nsegments, const ft_optim_segment *segments) {
    *out = NULL;
    FT_TRY(check_kind(kind));
    FT_TRY(check_device(&device, kind_names[kind]));
    if (ngroups < 1)
        return ft_fail(FT_ERR_VALUE, "%s: an optimizer needs at least one parameter group, got %d", kind_names[kind],
                       ngroups);
    if (nsegments < 0)
        return ft_fail(FT_ERR_VALUE, "%s: the number of segments must be >= 0, got %d", kind_names[kind], nsegments);
    for (int i = 0; i < ngroups; i++)
        FT_TRY(ft_optim_check_group(kind, i, &groups[i]));
    for (int i = 0; i < nsegments; i++) {
        if (segments[i].group < 0 || segments[i].group >= ngroups)
            return ft_fail(FT_ERR_INDEX, "%s: segment %d is in group %d, but there are %d groups", kind_names[kind], i,
                           segments[i].group, ngroups);
        if (!segments[i].param)
            return ft_fail(FT_ERR_VALUE, "%s: segment %d has no param memory", kind_names[kind], i);
    }
    ft_optimizer *opt = calloc(1, sizeof *opt);
    int64_t *numel = calloc((size_t)(nsegments ? nsegments : 1), sizeof *numel);
    if (!opt || !numel) {
        free(opt);
        free(numel);
        return ft_fail(FT_ERR_NOMEM, "out of memory creating an optimizer");
    }
    opt->kind = kind;
    opt->device = device;
    opt->ngroups = ngroups;
    for (int i = 0; i < nsegments; i++)
        numel[i] = segments[i].numel;
    ft_status st = plan_build(&opt->plan, nsegments, numel, kind_names[kind]);
    free(numel);
    if (st != FT_OK) {
        ft_optimizer_destroy(opt);
        return st;
    }
    size_t ns = (size_t)(nsegments ? nsegments : 1);
    opt->groups = malloc((size_t)ngroups * sizeof *opt->groups);
    opt->segs = malloc(ns * sizeof *opt->segs);
    opt->seg_state = calloc(ns, sizeof *opt->seg_state);
    /* zeroed: the CUDA table copies the coefficients of segments that have not had a step yet too */
    opt->coefs = calloc(ns, sizeof *opt->coefs);
    bool cuda = device.type == FT_DEV_CUDA;
    if (cuda)
        opt->table = malloc(ns * sizeof *opt->table);
    else
        opt->partial = malloc((size_t)(opt->plan.nblocks ? opt->plan.nblocks : 1) * 2 * sizeof *opt->partial);
    const float **grads = malloc(ns * sizeof *grads);
    bool have_scratch = cuda ? opt->table != NULL : opt->partial != NULL;
    if (!opt->groups || !opt->segs || !opt->seg_state || !opt->coefs || !have_scratch || !grads) {
        free(grads);
        ft_optimizer_destroy(opt);
        return ft_fail(FT_ERR_NOMEM, "out of memory creating an optimizer");
    }
    memcpy(opt->groups, groups, (size_t)ngroups * sizeof *groups);
    if (nsegments)
        memcpy(opt->segs, segments, (size_t)nsegments * sizeof *segments);
    for (int i = 0; i < nsegments; i++)
        grads[i] = segments[i].grad;
    st = check_memory(opt, grads);
    free(grads);
    if (st == FT_OK && cuda)
        st = ft_storage_new(&opt->workspace,
                            ((size_t)opt->plan.nblocks * 2 + 1) * sizeof(double) + ns * sizeof *opt->table, device,
                            false);
    if (st == FT_OK)
        st = alloc_state(opt);
    if (st != FT_OK) {
        ft_optimizer_destroy(opt);
        return st;
    }
    *out = opt;
    return FT_OK;
}

void ft_optimizer_destroy(ft_optimizer *opt) {
    if (!opt)
        return;
    for (int s = 0; s < FT_OPTIM_NUM_STATES; s++)
        ft_storage_release(opt->state[s]);
    ft_storage_release(opt->workspace);
    plan_free(&opt->plan);
    free(opt->groups);
    free(opt->segs);
    free(opt->seg_state);
    free(opt->coefs);
    free(opt->partial);
    free(opt->table);
    free(opt->copies);
    free(opt);
}

ft_status ft_optimizer_set_copies(ft_optimizer *opt, ft_dtype dtype, void *const *copies) {
    if (!copies) {
        free(opt->copies);
        opt->copies = NULL;
        return FT_OK;
    }
    if (opt->device.type == FT_DEV_CUDA)
        return ft_fail(FT_ERR_DEVICE, "%s: low-precision copies are written on the CPU only", kind_names[opt->kind]);
    if (dtype != FT_BFLOAT16 && dtype != FT_FLOAT16)
        return ft_fail(FT_ERR_DTYPE, "%s: copies are bfloat16 or float16, not %s", kind_names[opt->kind],
                       ft_dtype_get(dtype)->name);
    size_t n = (size_t)(opt->plan.nseg ? opt->plan.nseg : 1);
    if (!opt->copies && !(opt->copies = malloc(n * sizeof *opt->copies)))
        return ft_fail(FT_ERR_NOMEM, "out of memory");
    memcpy(opt->copies, copies, (size_t)opt->plan.nseg * sizeof *copies);
    opt->copy_dtype = dtype;
    return FT_OK;
}

ft_status ft_optimizer_set_grads(ft_optimizer *opt, const float *const *grads) {
    FT_TRY(check_memory(opt, grads));
    for (int i = 0; i < opt->plan.nseg; i++)
        opt->segs[i].grad = grads[i];
    return FT_OK;
}

ft_status ft_optimizer_set_group(ft_optimizer *opt, int group, const ft_optim_group *g) {
    if (group < 0 || group >= opt->ngroups)
        return ft_fail(FT_ERR_INDEX, "%s: no parameter group %d (there are %d)", kind_names[opt->kind], group,
                       opt->ngroups);
    FT_TRY(ft_optim_check_group(opt->kind, group, g));
    ft_optim_group old = opt->groups[group];
    opt->groups[group] = *g;
    ft_status st = alloc_state(opt);
    if (st != FT_OK)
        opt->groups[group] = old;
    return st;
}

ft_optim_kind ft_optimizer_kind(const ft_optimizer *opt) { return opt->kind; }
ft_device ft_optimizer_device(const ft_optimizer *opt) { return opt->device; }
int ft_optimizer_num_groups(const ft_optimizer *opt) { return opt->ngroups; }
int ft_optimizer_num_segments(const ft_optimizer *opt) { return opt->plan.nseg; }
const ft_optim_group *ft_optimizer_group(const ft_optimizer *opt, int group) { return &opt->groups[group]; }
const ft_optim_segment *ft_optimizer_segment(const ft_optimizer *opt, int segment) { return &opt->segs[segment]; }
int64_t ft_optimizer_num_steps(const ft_optimizer *opt) { return opt->nsteps; }
ft_storage *ft_optimizer_state(const ft_optimizer *opt, ft_optim_state kind) {
    return (int)kind >= 0 && kind < FT_OPTIM_NUM_STATES ? opt->state[kind] : NULL;
}
int64_t ft_optimizer_offset(const ft_optimizer *opt, int segment) { return opt->plan.offset[segment]; }
int64_t ft_optimizer_state_numel(const ft_optimizer *opt) { return plan_total(&opt->plan); }

const char *ft_optim_state_name(ft_optim_state kind) {
    static const char *const names[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg",
                                        "grad_avg",        "acc_delta", "exp_inf",    "sum"};
    return (int)kind >= 0 && kind < FT_OPTIM_NUM_STATES ? names[kind] : "";
}

ft_optim_segment_state ft_optimizer_segment_state(const ft_optimizer *opt, int segment) {
    return opt->seg_state[segment];
}

ft_status ft_optimizer_set_segment_state(ft_optimizer *opt, int segment, ft_optim_segment_state st) {
    if (segment < 0 || segment >= opt->plan.nseg)
        return ft_fail(FT_ERR_INDEX, "%s: no segment %d (there are %d)", kind_names[opt->kind], segment,
                       opt->plan.nseg);
    if (st.steps < 0)
        return ft_fail(FT_ERR_VALUE, "%s: segment %d: the step count must be >= 0, got %lld", kind_names[opt->kind],
                       segment, (long long)st.steps);
    if (opt->kind == FT_OPTIM_NADAM && st.steps > 0 && !(st.mu_product >= 0 && st.mu_product < 1))
        return ft_fail(FT_ERR_VALUE, "NAdam: segment %d: mu_product must be in [0, 1), got %g", segment,
                       st.mu_product);
    opt->seg_state[segment] = st;
    return FT_OK;
}

/* ---- the passes ---- */

static float *state_at(const ft_optimizer *opt, ft_optim_state s, int seg) {
    return opt->state[s] ? (float *)opt->state[s]->data + opt->plan.offset[seg] : NULL;
}

FT_VEC_CLONES
static void sgd_loop(float *p, float *buf, const float *g, int64_t n, grad_xform gx, bool maximize,
                     const ft_sgd_coef *c) {
    const ft_sgd_coef k = *c;
    if (buf) {
        FT_SIMD_FOR(i, n) {
            float d = ft_sgd_direction(ft_optim_grad(g[i], gx.scale, gx.clip, maximize), p[i], &k);
            float b = ft_sgd_momentum(buf[i], d, &k);
            buf[i] = b;
            p[i] = ft_sgd_param(p[i], ft_sgd_nesterov(d, b, &k), &k);
        }
    } else {
        FT_SIMD_FOR(i, n) p[i] = ft_sgd_param(p[i], ft_sgd_direction(ft_optim_grad(g[i], gx.scale, gx.clip, maximize), p[i], &k), &k);
    }
}

FT_VEC_CLONES
static void copy_loop(uint16_t *dst, const float *p, int64_t n, bool bf16) {
    for (int64_t i = 0; i < n; i++) /* vectorized where the compiler can: a NaN takes a branch */
        dst[i] = bf16 ? ft_f32_to_bf16(p[i]) : ft_f32_to_f16(p[i]);
}

/* The gradient an update pass sees: scaled, clipped, negated for maximize, with the L2 weight decay added. */
static inline float pass_grad(float g, float p, grad_xform gx, bool maximize, float l2) {
    return ft_l2_grad(ft_optim_grad(g, gx.scale, gx.clip, maximize), p, l2);
}

FT_VEC_CLONES
static void adamw_loop(float *p, float *m, float *v, float *vmax, const float *g, int64_t n, grad_xform gx,
                       bool maximize, const ft_adamw_coef *c) {
    const ft_adamw_coef k = *c;
    if (vmax) {
        FT_SIMD_FOR(i, n) {
            float gi = pass_grad(g[i], p[i], gx, maximize, k.l2);
            float mi = ft_adam_exp_avg(m[i], gi, &k.mom), vi = ft_adam_exp_avg_sq(v[i], gi, &k.mom);
            float vm = ft_optim_max(vmax[i], vi);
            m[i] = mi;
            v[i] = vi;
            vmax[i] = vm;
            p[i] = ft_adamw_param(p[i], mi, vm, &k);
        }
    } else {
        FT_SIMD_FOR(i, n) {
            float gi = pass_grad(g[i], p[i], gx, maximize, k.l2);
            float mi = ft_adam_exp_avg(m[i], gi, &k.mom), vi = ft_adam_exp_avg_sq(v[i], gi, &k.mom);
            m[i] = mi;
            v[i] = vi;
            p[i] = ft_adamw_param(p[i], mi, vi, &k);
        }
    }
}

/* RMSprop and Adadelta: v the running mean of squared gradients; a and buf RMSprop's grad_avg (centered) and
 * momentum buffer, or u Adadelta's acc_delta (the others NULL). */
FT_VEC_CLONES
static void averages_loop(float *p, float *v, float *a, float *buf, float *u, const float *g, int64_t n,
                          grad_xform gx, bool maximize, const ft_rmsprop_coef *c) {
    const ft_rmsprop_coef k = *c;
    FT_SIMD_FOR(i, n) {
        float gi = pass_grad(g[i], p[i], gx, maximize, k.weight_decay);
        p[i] = u ? ft_adadelta_param(p[i], gi, &v[i], &u[i], &k)
                 : ft_rmsprop_param(p[i], gi, &v[i], a ? &a[i] : NULL, buf ? &buf[i] : NULL, &k);
    }
}

/* Adagrad, Adamax, NAdam and RAdam: a the sum (Adagrad) or exp_avg, b exp_inf (Adamax), exp_avg_sq or NULL. One
 * loop per kind, so that each vectorizes. */
FT_VEC_CLONES
static void moments_loop(ft_optim_kind kind, float *p, float *a, float *b, const float *g, int64_t n, grad_xform gx,
                         bool maximize, const coef *c) {
    const ft_adagrad_coef ka = c->adagrad;
    const ft_moments_coef km = c->moments;
    switch (kind) {
    case FT_OPTIM_ADAGRAD:
        FT_SIMD_FOR(i, n) p[i] = ft_adagrad_param(p[i], pass_grad(g[i], p[i], gx, maximize, ka.weight_decay), &a[i],
                                                  &ka);
        break;
    case FT_OPTIM_ADAMAX:
        FT_SIMD_FOR(i, n) p[i] = ft_adamax_param(p[i], pass_grad(g[i], p[i], gx, maximize, km.l2), &a[i], &b[i], &km);
        break;
    case FT_OPTIM_NADAM:
        FT_SIMD_FOR(i, n) p[i] = ft_nadam_param(p[i], pass_grad(g[i], p[i], gx, maximize, km.l2), &a[i], &b[i], &km);
        break;
    case FT_OPTIM_RADAM:
        FT_SIMD_FOR(i, n) p[i] = ft_radam_param(p[i], pass_grad(g[i], p[i], gx, maximize, km.l2), &a[i], &b[i], &km);
        break;
    default:
        break;
    }
}

/* Updates the moments and returns the sums of squares of the update
 * direction (sq[0]) and of the params (sq[1]). */
FT_VEC_CLONES
static void lamb_moments_loop(float *m, float *v, const float *p, const float *g, int64_t n, grad_xform gx,
                              bool maximize, const ft_lamb_coef *c, double *sq) {
    const ft_lamb_coef k = *c;
    double au[LANES] = {0}, ap[LANES] = {0};
    for (int64_t i0 = 0; i0 < n; i0 += LANES) {
        int len = n - i0 < LANES ? (int)(n - i0) : LANES;
        for (int j = 0; j < len; j++) {
            int64_t i = i0 + j;
            float gi = ft_optim_grad(g[i], gx.scale, gx.clip, maximize);
            float mi = ft_adam_exp_avg(m[i], gi, &k.mom), vi = ft_adam_exp_avg_sq(v[i], gi, &k.mom);
            m[i] = mi;
            v[i] = vi;
            double u = ft_lamb_direction(p[i], mi, vi, &k), pi = p[i];
            au[j] += u * u;
            ap[j] += pi * pi;
        }
    }
    sq[0] = sum_lanes(au);
    sq[1] = sum_lanes(ap);
}

FT_VEC_CLONES
static void lamb_param_loop(float *p, const float *m, const float *v, int64_t n, const ft_lamb_coef *c) {
    const ft_lamb_coef k = *c;
    FT_SIMD_FOR(i, n) p[i] = ft_lamb_param(p[i], ft_lamb_direction(p[i], m[i], v[i], &k), &k);
}

FT_VEC_CLONES
static void lars_loop(float *p, float *vel, const float *g, int64_t n, grad_xform gx, bool maximize,
                      const ft_lars_coef *c) {
    const ft_lars_coef k = *c;
    FT_SIMD_FOR(i, n) {
        float vi = ft_lars_velocity(vel[i], ft_optim_grad(g[i], gx.scale, gx.clip, maximize), p[i], &k);
        vel[i] = vi;
        p[i] = p[i] - vi;
    }
}

/* partial[2b] = the sum of squares of block b's scaled grads; with params,
 * partial[2b + 1] = that of its params. */
static void norm_pass(ft_optimizer *opt, float scale, bool params, bool parallel) {
    const plan *pl = &opt->plan;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < pl->nblocks; b++) {
        const block *bk = &pl->blocks[b];
        const ft_optim_segment *s = &opt->segs[bk->seg];
        if (!s->grad)
            continue;
        opt->partial[2 * b] = sum_squares(s->grad + bk->start, bk->len, scale);
        if (params)
            opt->partial[2 * b + 1] = sum_squares(s->param + bk->start, bk->len, 1.0f);
    }
}

/* The sum of partial[2b + which] over segment seg's blocks, in block order. */
static double segment_sum(const ft_optimizer *opt, int seg, int which) {
    double s = 0;
    for (int64_t b = opt->plan.first_block[seg]; b < opt->plan.first_block[seg + 1]; b++)
        s += opt->partial[2 * b + which];
    return s;
}

static void lamb_moments_pass(ft_optimizer *opt, grad_xform gx, bool parallel) {
    const plan *pl = &opt->plan;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < pl->nblocks; b++) {
        const block *bk = &pl->blocks[b];
        const ft_optim_segment *s = &opt->segs[bk->seg];
        if (!s->grad)
            continue;
        int64_t o = bk->start;
        lamb_moments_loop(state_at(opt, FT_OPTIM_EXP_AVG, bk->seg) + o, state_at(opt, FT_OPTIM_EXP_AVG_SQ, bk->seg) + o,
                          s->param + o, s->grad + o, bk->len, gx, opt->groups[s->group].maximize,
                          &opt->coefs[bk->seg].lamb, &opt->partial[2 * b]);
    }
}

static void update_pass(ft_optimizer *opt, grad_xform gx, bool parallel) {
    const plan *pl = &opt->plan;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < pl->nblocks; b++) {
        const block *bk = &pl->blocks[b];
        const ft_optim_segment *s = &opt->segs[bk->seg];
        if (!s->grad)
            continue;
        const ft_optim_group *g = &opt->groups[s->group];
        const coef *c = &opt->coefs[bk->seg];
        int64_t o = bk->start, n = bk->len;
        float *p = s->param + o;
        const float *gr = s->grad + o;
        switch (opt->kind) {
        case FT_OPTIM_SGD: {
            float *buf = g->momentum != 0 ? state_at(opt, FT_OPTIM_MOMENTUM_BUFFER, bk->seg) + o : NULL;
            sgd_loop(p, buf, gr, n, gx, g->maximize, &c->sgd);
            break;
        }
        case FT_OPTIM_ADAMW:
        case FT_OPTIM_ADAM: {
            float *vmax = g->amsgrad ? state_at(opt, FT_OPTIM_MAX_EXP_AVG_SQ, bk->seg) + o : NULL;
            adamw_loop(p, state_at(opt, FT_OPTIM_EXP_AVG, bk->seg) + o, state_at(opt, FT_OPTIM_EXP_AVG_SQ, bk->seg) + o,
                       vmax, gr, n, gx, g->maximize, &c->adamw);
            break;
        }
        case FT_OPTIM_LAMB:
            lamb_param_loop(p, state_at(opt, FT_OPTIM_EXP_AVG, bk->seg) + o,
                            state_at(opt, FT_OPTIM_EXP_AVG_SQ, bk->seg) + o, n, &c->lamb);
            break;
        case FT_OPTIM_LARS:
            lars_loop(p, state_at(opt, FT_OPTIM_MOMENTUM_BUFFER, bk->seg) + o, gr, n, gx, g->maximize, &c->lars);
            break;
        case FT_OPTIM_RMSPROP:
        case FT_OPTIM_ADADELTA:
            averages_loop(p, state_at(opt, FT_OPTIM_SQUARE_AVG, bk->seg) + o,
                          g->centered ? state_at(opt, FT_OPTIM_GRAD_AVG, bk->seg) + o : NULL,
                          opt->kind == FT_OPTIM_RMSPROP && g->momentum != 0
                              ? state_at(opt, FT_OPTIM_MOMENTUM_BUFFER, bk->seg) + o
                              : NULL,
                          opt->kind == FT_OPTIM_ADADELTA ? state_at(opt, FT_OPTIM_ACC_DELTA, bk->seg) + o : NULL, gr,
                          n, gx, g->maximize, &c->rmsprop);
            break;
        case FT_OPTIM_ADAGRAD:
        case FT_OPTIM_ADAMAX:
        case FT_OPTIM_NADAM:
        case FT_OPTIM_RADAM: {
            bool adagrad = opt->kind == FT_OPTIM_ADAGRAD;
            float *b = adagrad ? NULL
                               : state_at(opt, opt->kind == FT_OPTIM_ADAMAX ? FT_OPTIM_EXP_INF : FT_OPTIM_EXP_AVG_SQ,
                                          bk->seg) + o;
            moments_loop(opt->kind, p, state_at(opt, adagrad ? FT_OPTIM_SUM : FT_OPTIM_EXP_AVG, bk->seg) + o, b, gr,
                         n, gx, g->maximize, c);
            break;
        }
        }
        if (opt->copies && opt->copies[bk->seg]) /* the block is still in cache */
            copy_loop((uint16_t *)opt->copies[bk->seg] + o, p, n, opt->copy_dtype == FT_BFLOAT16);
    }
}

static ft_adam_moments adam_moments(const ft_optim_group *g) {
    return (ft_adam_moments){(float)g->beta1, (float)(1 - g->beta1), (float)g->beta2, (float)(1 - g->beta2)};
}

/* Adamax's, NAdam's or RAdam's coefficients of step t (as torch.optim works them out in double, rounded to float;
 * NAdam's mu_product as its float32 state tensor) after the steps of `st`. */
static ft_moments_coef moments_coef(ft_optim_kind kind, const ft_optim_group *g, double t, ft_optim_segment_state st) {
    bool decoupled = g->decoupled_weight_decay;
    ft_moments_coef c = {adam_moments(g), decoupled ? 0.0f : (float)g->weight_decay,
                         decoupled ? (float)(1 - g->lr * g->weight_decay) : 1.0f, (float)g->eps};
    double bc1 = 1 - pow(g->beta1, t), bc2 = 1 - pow(g->beta2, t);
    if (kind == FT_OPTIM_ADAMAX) {
        c.lr = (float)(g->lr / bc1);
    } else if (kind == FT_OPTIM_NADAM) {
        double mu = g->beta1 * (1 - 0.5 * pow(0.96, t * g->momentum_decay));
        double mu_next = g->beta1 * (1 - 0.5 * pow(0.96, (t + 1) * g->momentum_decay));
        c.mu_product = (float)(st.steps > 0 ? st.mu_product : 1.0) * (float)mu;
        c.bc2 = (float)bc2;
        c.grad_coef = (float)(g->lr * (1 - mu) / (1 - c.mu_product));
        c.avg_coef = (float)(g->lr * mu_next / (1 - c.mu_product * mu_next));
    } else {
        double rho_inf = 2 / (1 - g->beta2) - 1, rho_t = rho_inf - 2 * t * pow(g->beta2, t) / bc2;
        c.bc1 = (float)bc1;
        c.bc2_sqrt = (float)sqrt(bc2);
        c.lr = (float)g->lr;
        if (rho_t > 5)
            c.rect = (float)sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t));
    }
    return c;
}

/* The coefficients of segment i that do not depend on a norm pass. */
static coef segment_coef(const ft_optimizer *opt, int i) {
    const ft_optim_group *g = &opt->groups[opt->segs[i].group];
    double t = (double)(opt->seg_state[i].steps + 1);
    coef c = {0};
    switch (opt->kind) {
    case FT_OPTIM_SGD:
        c.sgd = (ft_sgd_coef){(float)g->lr, (float)g->weight_decay, (float)g->momentum, (float)(1 - g->dampening),
                              g->nesterov, !opt->seg_state[i].momentum_valid};
        break;
    case FT_OPTIM_ADAMW:
    case FT_OPTIM_ADAM: {
        double bc1 = 1 - pow(g->beta1, t), bc2 = 1 - pow(g->beta2, t);
        bool l2 = opt->kind == FT_OPTIM_ADAM;
        c.adamw = (ft_adamw_coef){adam_moments(g), l2 ? 1.0f : (float)(1 - g->lr * g->weight_decay),
                                  (float)(g->lr / bc1), (float)sqrt(bc2), (float)g->eps,
                                  l2 ? (float)g->weight_decay : 0.0f};
        break;
    }
    case FT_OPTIM_LAMB:
        c.lamb = (ft_lamb_coef){adam_moments(g), (float)(1 - pow(g->beta1, t)), (float)(1 - pow(g->beta2, t)),
                                (float)g->eps, (float)g->weight_decay, 0.0f};
        break;
    case FT_OPTIM_LARS:
        c.lars = (ft_lars_coef){(float)g->momentum, (float)g->weight_decay, 0.0f};
        break;
    case FT_OPTIM_RMSPROP:
    case FT_OPTIM_ADADELTA:
        c.rmsprop = (ft_rmsprop_coef){(float)g->lr, (float)g->weight_decay, (float)g->alpha, (float)(1 - g->alpha),
                                      (float)g->eps, (float)g->momentum};
        break;
    case FT_OPTIM_ADAGRAD:
        c.adagrad = (ft_adagrad_coef){(float)(g->lr / (1 + (t - 1) * g->lr_decay)), (float)g->weight_decay,
                                      (float)g->eps, (float)g->initial_accumulator_value,
                                      opt->seg_state[i].steps == 0};
        break;
    case FT_OPTIM_ADAMAX:
    case FT_OPTIM_NADAM:
    case FT_OPTIM_RADAM:
        c.moments = moments_coef(opt->kind, g, t, opt->seg_state[i]);
        break;
    }
    return c;
}

static double trust_ratio(const ft_optimizer *opt, int i, double clip) {
    const ft_optim_group *g = &opt->groups[opt->segs[i].group];
    return ft_optim_trust_ratio(opt->kind == FT_OPTIM_LARS, g->lars_exclude, segment_sum(opt, i, 0),
                                segment_sum(opt, i, 1), clip, g->trust_coefficient, g->weight_decay, g->eps);
}

static float *state_base(const ft_optimizer *opt, ft_optim_state s) {
    return opt->state[s] ? opt->state[s]->data : NULL;
}

/* The optimizer's device memory as the CUDA passes take it. */
static ft_cuda_optim cuda_view(const ft_optimizer *opt) {
    double *partial = opt->workspace->data;
    int64_t nb = opt->plan.nblocks;
    return (ft_cuda_optim){
        .device = opt->device.index,
        .kind = opt->kind,
        .nseg = opt->plan.nseg,
        .nblocks = nb,
        .table = (ft_cuda_optim_segment *)(partial + 2 * nb + 1),
        .momentum_buffer = state_base(opt, FT_OPTIM_MOMENTUM_BUFFER),
        .exp_avg = state_base(opt, FT_OPTIM_EXP_AVG),
        .exp_avg_sq = state_base(opt, FT_OPTIM_EXP_AVG_SQ),
        .max_exp_avg_sq = state_base(opt, FT_OPTIM_MAX_EXP_AVG_SQ),
        .square_avg = state_base(opt, FT_OPTIM_SQUARE_AVG),
        .grad_avg = state_base(opt, FT_OPTIM_GRAD_AVG),
        .acc_delta = state_base(opt, FT_OPTIM_ACC_DELTA),
        .exp_inf = state_base(opt, FT_OPTIM_EXP_INF),
        .sum = state_base(opt, FT_OPTIM_SUM),
        .partial = partial,
        .total = partial + 2 * nb,
    };
}

/* The host side of this step's CUDA table, from the segments, their groups
 * and the coefficients. */
static void fill_table(ft_optimizer *opt) {
    for (int i = 0; i < opt->plan.nseg; i++) {
        const ft_optim_segment *s = &opt->segs[i];
        const ft_optim_group *g = &opt->groups[s->group];
        opt->table[i] = (ft_cuda_optim_segment){
            .flat = {s->param, s->grad, s->numel, opt->plan.offset[i], opt->plan.first_block[i]},
            .coef = opt->coefs[i],
            .lr = g->lr,
            .weight_decay = g->weight_decay,
            .trust_coefficient = g->trust_coefficient,
            .eps = g->eps,
            .maximize = g->maximize,
            .lars_exclude = g->lars_exclude,
            .momentum = g->momentum != 0,
            .amsgrad = g->amsgrad,
            .centered = g->centered,
        };
    }
}

ft_status ft_optimizer_step(ft_optimizer *opt, float grad_scale, double max_grad_norm, double *grad_norm) {
    const char *k = kind_names[opt->kind];
    if (!(isfinite(grad_scale) && grad_scale > 0))
        return ft_fail(FT_ERR_VALUE, "%s step: grad_scale must be finite and > 0, got %g", k, (double)grad_scale);
    if (!finite_ge0(max_grad_norm))
        return ft_fail(FT_ERR_VALUE, "%s step: max_grad_norm must be finite and >= 0 (0: no clipping), got %g", k,
                       max_grad_norm);
    int nseg = opt->plan.nseg;
    int64_t active = 0;
    bool any = false;
    for (int i = 0; i < nseg; i++)
        if (opt->segs[i].grad) {
            active += opt->segs[i].numel;
            any = true;
        }
    if (grad_norm)
        *grad_norm = 0;
    if (!any)
        return FT_OK;
    bool parallel = active >= PARALLEL_MIN;
    bool lars = opt->kind == FT_OPTIM_LARS;
    bool cuda = opt->device.type == FT_DEV_CUDA;
    grad_xform gx = {grad_scale, 1.0f};
    for (int i = 0; i < nseg; i++)
        if (opt->segs[i].grad)
            opt->coefs[i] = segment_coef(opt, i);
    ft_cuda_optim o = {0};
    if (cuda) {
        o = cuda_view(opt);
        fill_table(opt);
        FT_TRY(FT_CUDA_CALL(k, optim_upload, &o, opt->table));
    }
    if (max_grad_norm > 0 || grad_norm || lars) {
        double sq = 0;
        if (cuda) {
            FT_TRY(FT_CUDA_CALL(k, optim_grad_sumsq, &o, grad_scale, lars, &sq));
        } else {
            norm_pass(opt, grad_scale, lars, parallel);
            for (int i = 0; i < nseg; i++)
                if (opt->segs[i].grad)
                    sq += segment_sum(opt, i, 0);
        }
        double norm = sqrt(sq);
        if (grad_norm)
            *grad_norm = norm;
        if (!isfinite(norm))
            return ft_fail(FT_ERR_VALUE, "%s step: the gradient norm is %g; the step was skipped and the params and "
                                         "optimizer state are unchanged", k, isnan(norm) ? NAN : norm); /* "nan", not "-nan" */
        double clip = max_grad_norm > 0 ? max_grad_norm / (norm + 1e-6) : 1.0;
        if (clip < 1.0)
            gx.clip = (float)clip;
    }
    if (cuda) {
        FT_TRY(FT_CUDA_CALL(k, optim_update, &o, gx.scale, gx.clip));
    } else {
        if (opt->kind == FT_OPTIM_LAMB)
            lamb_moments_pass(opt, gx, parallel);
        if (opt->kind == FT_OPTIM_LAMB || lars)
            for (int i = 0; i < nseg; i++) {
                if (!opt->segs[i].grad)
                    continue;
                double lr = opt->groups[opt->segs[i].group].lr * trust_ratio(opt, i, gx.clip);
                if (lars)
                    opt->coefs[i].lars.scaled_lr = (float)lr;
                else
                    opt->coefs[i].lamb.lr_trust = (float)lr;
            }
        update_pass(opt, gx, parallel);
    }
    for (int i = 0; i < nseg; i++) {
        if (!opt->segs[i].grad)
            continue;
        opt->seg_state[i].steps++;
        if (opt->kind == FT_OPTIM_SGD && opt->groups[opt->segs[i].group].momentum != 0)
            opt->seg_state[i].momentum_valid = true;
        if (opt->kind == FT_OPTIM_NADAM)
            opt->seg_state[i].mu_product = opt->coefs[i].moments.mu_product;
    }
    opt->nsteps++;
    return FT_OK;
}

/* ---- weight EMA ---- */

struct ft_ema {
    const float **params;
    plan plan;
    ft_device device;
    ft_storage *avg;
    ft_storage *table; /* CUDA: the segments as ft_cuda_flat_segment, in device memory */
};

FT_VEC_CLONES
static void ema_loop(float *avg, const float *p, int64_t n, float weight) {
    FT_SIMD_FOR(i, n) avg[i] = ft_ema_lerp(avg[i], p[i], weight);
}

/* The averages start as copies of the params. */
static void ema_init_cpu(ft_ema *ema) {
    const plan *pl = &ema->plan;
    float *avg = ema->avg->data;
#pragma omp parallel for schedule(static) if (plan_total(pl) >= PARALLEL_MIN)
    for (int64_t b = 0; b < pl->nblocks; b++) {
        const block *bk = &pl->blocks[b];
        memcpy(avg + pl->offset[bk->seg] + bk->start, ema->params[bk->seg] + bk->start, (size_t)bk->len * sizeof(float));
    }
}

/* The same on the device, and the segment table for its update pass. */
static ft_status ema_init_cuda(ft_ema *ema) {
    const plan *pl = &ema->plan;
    const ft_cuda_api *cuda = ft_cuda();
    int dev = ema->device.index;
    size_t ns = (size_t)(pl->nseg ? pl->nseg : 1);
    ft_cuda_flat_segment *table = malloc(ns * sizeof *table);
    if (!table)
        return ft_fail(FT_ERR_NOMEM, "out of memory creating an EMA");
    float *avg = ema->avg->data;
    ft_status st = ft_storage_new(&ema->table, ns * sizeof *table, ema->device, false);
    for (int i = 0; i < pl->nseg && st == FT_OK; i++) {
        int64_t n = pl->offset[i + 1] - pl->offset[i];
        /* the kernels only read the params of an EMA */
        table[i] = (ft_cuda_flat_segment){(float *)ema->params[i], NULL, n, pl->offset[i], pl->first_block[i]};
        st = cuda->memcpy(avg + pl->offset[i], ema->params[i], (size_t)n * sizeof(float), dev, NULL);
    }
    if (st == FT_OK)
        st = cuda->memcpy(ema->table->data, table, (size_t)pl->nseg * sizeof *table, dev, NULL);
    free(table);
    return st;
}

ft_status ft_ema_create(ft_ema **out, ft_device device, int nsegments, const ft_ema_segment *segments) {
    *out = NULL;
    FT_TRY(check_device(&device, "EMA"));
    if (nsegments < 0)
        return ft_fail(FT_ERR_VALUE, "EMA: the number of segments must be >= 0, got %d", nsegments);
    for (int i = 0; i < nsegments; i++)
        if (!segments[i].param)
            return ft_fail(FT_ERR_VALUE, "EMA: segment %d has no param memory", i);
    ft_ema *ema = calloc(1, sizeof *ema);
    size_t ns = (size_t)(nsegments ? nsegments : 1);
    int64_t *numel = calloc(ns, sizeof *numel);
    if (ema)
        ema->params = malloc(ns * sizeof *ema->params);
    if (!ema || !numel || !ema->params) {
        free(numel);
        ft_ema_destroy(ema);
        return ft_fail(FT_ERR_NOMEM, "out of memory creating an EMA");
    }
    ema->device = device;
    for (int i = 0; i < nsegments; i++) {
        numel[i] = segments[i].numel;
        ema->params[i] = segments[i].param;
    }
    ft_status st = plan_build(&ema->plan, nsegments, numel, "EMA");
    free(numel);
    if (st == FT_OK)
        st = ft_storage_new(&ema->avg, (size_t)plan_total(&ema->plan) * sizeof(float), device, false);
    if (st == FT_OK) {
        if (device.type == FT_DEV_CUDA)
            st = ema_init_cuda(ema);
        else
            ema_init_cpu(ema);
    }
    if (st != FT_OK) {
        ft_ema_destroy(ema);
        return st;
    }
    *out = ema;
    return FT_OK;
}

void ft_ema_destroy(ft_ema *ema) {
    if (!ema)
        return;
    ft_storage_release(ema->avg);
    ft_storage_release(ema->table);
    plan_free(&ema->plan);
    free(ema->params);
    free(ema);
}

ft_status ft_ema_update(ft_ema *ema, double decay) {
    if (!(decay >= 0 && decay <= 1))
        return ft_fail(FT_ERR_VALUE, "EMA: decay must be in [0, 1], got %g", decay);
    const plan *pl = &ema->plan;
    float *avg = ema->avg->data, weight = (float)(1 - decay);
    if (ema->device.type == FT_DEV_CUDA)
        return FT_CUDA_CALL("EMA", ema_update, avg, ema->table->data, pl->nseg, pl->nblocks, weight,
                            ema->device.index);
#pragma omp parallel for schedule(static) if (plan_total(pl) >= PARALLEL_MIN)
    for (int64_t b = 0; b < pl->nblocks; b++) {
        const block *bk = &pl->blocks[b];
        ema_loop(avg + pl->offset[bk->seg] + bk->start, ema->params[bk->seg] + bk->start, bk->len, weight);
    }
    return FT_OK;
}

ft_storage *ft_ema_average(const ft_ema *ema) { return ema->avg; }
int64_t ft_ema_offset(const ft_ema *ema, int segment) { return ema->plan.offset[segment]; }
int ft_ema_num_segments(const ft_ema *ema) { return ema->plan.nseg; }
ft_ema_segment ft_ema_get_segment(const ft_ema *ema, int segment) {
    return (ft_ema_segment){ema->params[segment], ema->plan.offset[segment + 1] - ema->plan.offset[segment]};
}
