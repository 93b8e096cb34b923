/* The fused optimizers of optim/optim.h and their per-element math
 * (kernels/optim.h): each kind against a scalar double reference of its
 * documented formula over several steps and segments (some of them below
 * and some above one block), clipping, skipped segments, bitwise equality
 * for 1 and 2 threads, non-finite norms leaving everything untouched, the
 * validation of every argument, overlapping memory, state buffers in the
 * memory statistics, and the weight EMA. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/alloc.h"
#include "kernels/optim.h"
#include "optim/optim.h"

#define NSEG 4
static const int64_t SIZES[NSEG] = {7, FT_OPTIM_BLOCK + 5, 1, 3 * FT_OPTIM_BLOCK}; /* odd tails and several blocks */
#define STEPS 4

/* Deterministic values in [-1, 1). */
static float value(uint32_t i, uint32_t salt) {
    uint32_t x = i * 2654435761u ^ salt * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return (float)(x & 0xffffff) / (float)(1 << 23) - 1.0f;
}

typedef struct {
    float *param[NSEG], *grad[NSEG];
    ft_optim_segment seg[NSEG];
} model;

static void model_init(model *m, int ngroups) {
    for (int s = 0; s < NSEG; s++) {
        m->param[s] = malloc((size_t)SIZES[s] * sizeof(float));
        m->grad[s] = malloc((size_t)SIZES[s] * sizeof(float));
        for (int64_t i = 0; i < SIZES[s]; i++)
            m->param[s][i] = value((uint32_t)i, (uint32_t)s + 1);
        m->seg[s] = (ft_optim_segment){m->param[s], m->grad[s], SIZES[s], s % ngroups};
    }
}

static void model_grads(model *m, int step, float amplitude) {
    for (int s = 0; s < NSEG; s++)
        for (int64_t i = 0; i < SIZES[s]; i++)
            m->grad[s][i] = amplitude * value((uint32_t)i, (uint32_t)(100 * step + s + 7));
}

static void model_free(model *m) {
    for (int s = 0; s < NSEG; s++) {
        free(m->param[s]);
        free(m->grad[s]);
    }
}

static bool close_to(double got, double want, double rtol) { return fabs(got - want) <= rtol * (fabs(want) + 1e-3); }

/* ---- a double reference of every kind, one segment at a time ---- */

typedef struct {
    double *p, *a, *b, *c; /* params and up to three state arrays */
    int64_t n, t;
    bool init;
} ref_seg;

static void ref_step(ft_optim_kind kind, const ft_optim_group *g, ref_seg *r, const float *grad, double scale) {
    int64_t n = r->n;
    double *gr = malloc((size_t)(n ? n : 1) * sizeof *gr);
    double gsq = 0, psq = 0;
    for (int64_t i = 0; i < n; i++) {
        gr[i] = grad[i] * scale * (g->maximize ? -1 : 1);
        gsq += gr[i] * gr[i];
        psq += r->p[i] * r->p[i];
    }
    r->t++;
    double t = (double)r->t;
    if (kind == FT_OPTIM_SGD) {
        for (int64_t i = 0; i < n; i++) {
            double d = gr[i] + g->weight_decay * r->p[i];
            if (g->momentum != 0) {
                r->a[i] = r->init ? g->momentum * r->a[i] + (1 - g->dampening) * d : d;
                d = g->nesterov ? d + g->momentum * r->a[i] : r->a[i];
            }
            r->p[i] -= g->lr * d;
        }
        r->init = true;
    } else if (kind == FT_OPTIM_ADAMW) {
        double bc1 = 1 - pow(g->beta1, t), bc2 = 1 - pow(g->beta2, t);
        for (int64_t i = 0; i < n; i++) {
            r->p[i] *= 1 - g->lr * g->weight_decay;
            r->a[i] = g->beta1 * r->a[i] + (1 - g->beta1) * gr[i];
            r->b[i] = g->beta2 * r->b[i] + (1 - g->beta2) * gr[i] * gr[i];
            double v = r->b[i];
            if (g->amsgrad) {
                r->c[i] = fmax(r->c[i], r->b[i]);
                v = r->c[i];
            }
            r->p[i] -= g->lr / bc1 * r->a[i] / (sqrt(v) / sqrt(bc2) + g->eps);
        }
    } else if (kind == FT_OPTIM_LAMB) {
        double bc1 = 1 - pow(g->beta1, t), bc2 = 1 - pow(g->beta2, t), usq = 0;
        for (int64_t i = 0; i < n; i++) {
            r->a[i] = g->beta1 * r->a[i] + (1 - g->beta1) * gr[i];
            r->b[i] = g->beta2 * r->b[i] + (1 - g->beta2) * gr[i] * gr[i];
            r->c[i] = (r->a[i] / bc1) / (sqrt(r->b[i] / bc2) + g->eps) + g->weight_decay * r->p[i];
            usq += r->c[i] * r->c[i];
        }
        double trust = g->lars_exclude || psq == 0 || usq == 0 ? 1 : sqrt(psq) / sqrt(usq);
        for (int64_t i = 0; i < n; i++)
            r->p[i] -= g->lr * trust * r->c[i];
    } else {
        double wn = sqrt(psq), gn = sqrt(gsq);
        double local = g->lars_exclude || wn == 0 || gn == 0
                           ? 1
                           : g->trust_coefficient * wn / (gn + g->weight_decay * wn + g->eps);
        for (int64_t i = 0; i < n; i++) {
            r->a[i] = g->momentum * r->a[i] + g->lr * local * (gr[i] + g->weight_decay * r->p[i]);
            r->p[i] -= r->a[i];
        }
    }
    free(gr);
}

static void run_against_reference(const char *name, ft_optim_kind kind, int ngroups, const ft_optim_group *groups,
                                  double max_norm, float scale) {
    model m;
    model_init(&m, ngroups);
    ref_seg ref[NSEG];
    for (int s = 0; s < NSEG; s++) {
        ref[s] = (ref_seg){calloc((size_t)SIZES[s], sizeof(double)), calloc((size_t)SIZES[s], sizeof(double)),
                           calloc((size_t)SIZES[s], sizeof(double)), calloc((size_t)SIZES[s], sizeof(double)),
                           SIZES[s], 0, false};
        for (int64_t i = 0; i < SIZES[s]; i++)
            ref[s].p[i] = m.param[s][i];
    }
    ft_optimizer *opt = NULL;
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, kind, ngroups, groups, NSEG, m.seg));
    for (int step = 0; opt && step < STEPS; step++) {
        model_grads(&m, step, 1.0f);
        double norm = -1, sq = 0;
        CHECK_OK(ft_optimizer_step(opt, scale, max_norm, &norm));
        for (int s = 0; s < NSEG; s++)
            for (int64_t i = 0; i < SIZES[s]; i++)
                sq += (double)(m.grad[s][i] * scale) * (m.grad[s][i] * scale);
        CHECKF(close_to(norm, sqrt(sq), 1e-12), "%s step %d: norm %.17g, want %.17g", name, step, norm, sqrt(sq));
        double clip = max_norm > 0 && max_norm / (sqrt(sq) + 1e-6) < 1 ? max_norm / (sqrt(sq) + 1e-6) : 1;
        for (int s = 0; s < NSEG; s++)
            ref_step(kind, &groups[m.seg[s].group], &ref[s], m.grad[s], scale * clip);
        int bad = 0;
        for (int s = 0; s < NSEG; s++)
            for (int64_t i = 0; i < SIZES[s]; i++)
                /* float rounding of params of size ~1: about 1e-7 absolute per step */
                if (fabs(m.param[s][i] - ref[s].p[i]) > 2e-5 * fabs(ref[s].p[i]) + 1e-6 && bad++ < 3)
                    CHECKF(0, "%s step %d segment %d [%lld]: %.9g, reference %.9g", name, step, s, (long long)i,
                           m.param[s][i], ref[s].p[i]);
        CHECKF(bad == 0, "%s step %d: %d params differ from the reference", name, step, bad);
    }
    CHECK(opt && ft_optimizer_num_steps(opt) == STEPS);
    for (int s = 0; opt && s < NSEG; s++)
        CHECK(ft_optimizer_segment_state(opt, s).steps == STEPS);
    ft_optimizer_destroy(opt);
    for (int s = 0; s < NSEG; s++) {
        free(ref[s].p);
        free(ref[s].a);
        free(ref[s].b);
        free(ref[s].c);
    }
    model_free(&m);
}

static ft_optim_group sgd(double lr, double wd, double momentum, double dampening, bool nesterov, bool maximize) {
    return (ft_optim_group){.lr = lr, .weight_decay = wd, .momentum = momentum, .dampening = dampening,
                            .nesterov = nesterov, .maximize = maximize};
}

static ft_optim_group adam(double lr, double wd, double b1, double b2, double eps, bool amsgrad, bool maximize) {
    return (ft_optim_group){.lr = lr, .weight_decay = wd, .beta1 = b1, .beta2 = b2, .eps = eps, .amsgrad = amsgrad,
                            .maximize = maximize};
}

static void test_against_reference(void) {
    ft_optim_group g[3];
    g[0] = sgd(0.1, 0, 0, 0, false, false);
    run_against_reference("sgd plain", FT_OPTIM_SGD, 1, g, 0, 1.0f);
    g[0] = sgd(0.05, 1e-2, 0.9, 0.1, false, false);
    g[1] = sgd(0.02, 0, 0.8, 0, true, true);
    g[2] = sgd(0.1, 5e-4, 0, 0, false, false);
    run_against_reference("sgd groups", FT_OPTIM_SGD, 3, g, 0, 0.5f);
    run_against_reference("sgd clipped", FT_OPTIM_SGD, 3, g, 1.0, 1.0f);

    g[0] = adam(1e-2, 1e-2, 0.9, 0.999, 1e-8, false, false);
    g[1] = adam(3e-3, 0, 0.8, 0.99, 1e-6, true, true);
    run_against_reference("adamw", FT_OPTIM_ADAMW, 2, g, 0, 1.0f);
    run_against_reference("adamw clipped", FT_OPTIM_ADAMW, 2, g, 0.5, 0.25f);

    g[0] = adam(1e-2, 1e-2, 0.9, 0.999, 1e-6, false, false);
    g[1] = adam(5e-3, 0, 0.9, 0.99, 1e-6, false, true);
    g[1].lars_exclude = true;
    run_against_reference("lamb", FT_OPTIM_LAMB, 2, g, 0, 1.0f);
    run_against_reference("lamb clipped", FT_OPTIM_LAMB, 2, g, 2.0, 1.0f);

    g[0] = (ft_optim_group){.lr = 0.5, .weight_decay = 5e-4, .momentum = 0.9, .trust_coefficient = 1e-3};
    g[1] = (ft_optim_group){.lr = 0.1, .momentum = 0.8, .trust_coefficient = 1e-2, .eps = 1e-9, .lars_exclude = true,
                            .maximize = true};
    run_against_reference("lars", FT_OPTIM_LARS, 2, g, 0, 1.0f);
    run_against_reference("lars clipped", FT_OPTIM_LARS, 2, g, 1.0, 2.0f);
}

/* The per-element functions against their formulas in double. */
static void test_kernels(void) {
    ft_sgd_coef c = {0.1f, 0.01f, 0.9f, 0.75f, true, false};
    float p = 0.5f, g = -0.25f;
    float d = ft_sgd_direction(g, p, &c);
    CHECK(d == g + 0.01f * p);
    float b = ft_sgd_momentum(2.0f, d, &c);
    CHECK(b == 0.9f * 2.0f + 0.75f * d);
    CHECK(ft_sgd_nesterov(d, b, &c) == d + 0.9f * b);
    c.first = true;
    CHECK(ft_sgd_momentum(2.0f, d, &c) == d);
    c.weight_decay = 0;
    CHECK(ft_sgd_direction(g, INFINITY, &c) == g); /* no decay term at all, as PyTorch skips it */
    CHECK(ft_optim_grad(3.0f, 0.5f, 0.25f, true) == -0.375f);

    ft_adam_moments mo = {0.9f, 0.1f, 0.999f, 0.001f};
    CHECK(ft_adam_exp_avg(1.0f, 2.0f, &mo) == 0.9f * 1.0f + 0.1f * 2.0f);
    CHECK(ft_adam_exp_avg_sq(1.0f, 2.0f, &mo) == 0.999f * 1.0f + 0.001f * 2.0f * 2.0f);
    CHECK(ft_optim_max(1.0f, 2.0f) == 2.0f && ft_optim_max(3.0f, 2.0f) == 3.0f);
    CHECK(isnan(ft_optim_max(NAN, 2.0f)) && isnan(ft_optim_max(1.0f, NAN)));
    ft_adamw_coef ac = {mo, 0.99f, 0.01f, 0.5f, 1e-8f};
    double want = 0.5 * 0.99 - 0.01 * (0.2 / (sqrt(0.04) / 0.5 + 1e-8));
    CHECK(close_to(ft_adamw_param(0.5f, 0.2f, 0.04f, &ac), want, 1e-6));
    ft_lamb_coef lc = {mo, 0.1f, 0.001f, 1e-6f, 0.01f, 0.05f};
    double u = (0.2 / 0.1) / (sqrt(0.04 / 0.001) + 1e-6) + 0.01 * 0.5;
    CHECK(close_to(ft_lamb_direction(0.5f, 0.2f, 0.04f, &lc), u, 1e-6));
    CHECK(close_to(ft_lamb_param(0.5f, (float)u, &lc), 0.5 - 0.05 * u, 1e-6));
    ft_lars_coef rc = {0.9f, 0.01f, 0.2f};
    CHECK(close_to(ft_lars_velocity(1.0f, 0.5f, 2.0f, &rc), 0.9 + 0.2 * (0.5 + 0.01 * 2.0), 1e-6));
    CHECK(ft_ema_lerp(1.0f, 3.0f, 0.25f) == 1.5f && ft_ema_lerp(1.0f, 3.0f, 0.75f) == 2.5f);
    CHECK(ft_ema_lerp(1.0f, 3.0f, 0.0f) == 1.0f && ft_ema_lerp(1.0f, 3.0f, 1.0f) == 3.0f);
    /* Adagrad's sum starts at initial_accumulator_value, whatever its memory holds before the first step. */
    ft_adagrad_coef gc = {0.5f, 0.0f, 0.0f, 3.0f, true};
    float sum = 7.0f;
    CHECK(ft_adagrad_param(1.0f, 1.0f, &sum, &gc) == 1.0f - 0.5f * (1.0f / 2.0f) && sum == 4.0f);
    gc.first = false;
    CHECK(ft_adagrad_param(1.0f, 0.0f, &sum, &gc) == 1.0f && sum == 4.0f);
}

/* Runs `steps` steps with `threads` threads from the same start; returns the params and the last norm. */
static double run_threads(ft_optim_kind kind, const ft_optim_group *g, int ngroups, int threads, float **out) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    model m;
    model_init(&m, ngroups);
    ft_optimizer *opt = NULL;
    double norm = 0;
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, kind, ngroups, g, NSEG, m.seg));
    for (int step = 0; opt && step < STEPS; step++) {
        model_grads(&m, step, 1.0f);
        CHECK_OK(ft_optimizer_step(opt, 1.0f, 0.5, &norm));
    }
    for (int s = 0; s < NSEG; s++) {
        out[s] = m.param[s];
        m.param[s] = NULL;
    }
    ft_optimizer_destroy(opt);
    model_free(&m);
    omp_set_num_threads(saved);
    return norm;
}

static void test_thread_count_invariance(void) {
    ft_optim_group g[2] = {adam(1e-2, 1e-2, 0.9, 0.999, 1e-6, false, false), adam(1e-3, 0, 0.9, 0.99, 1e-6, false, false)};
    ft_optim_group lars[2] = {{.lr = 0.5, .weight_decay = 5e-4, .momentum = 0.9, .trust_coefficient = 1e-3},
                              {.lr = 0.5, .momentum = 0.9, .trust_coefficient = 1e-3, .lars_exclude = true}};
    ft_optim_group sg[1] = {sgd(0.1, 1e-4, 0.9, 0, true, false)};
    struct {
        ft_optim_kind kind;
        const ft_optim_group *g;
        int n;
    } cases[] = {{FT_OPTIM_LAMB, g, 2}, {FT_OPTIM_ADAMW, g, 2}, {FT_OPTIM_LARS, lars, 2}, {FT_OPTIM_SGD, sg, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float *one[NSEG], *two[NSEG];
        double n1 = run_threads(cases[c].kind, cases[c].g, cases[c].n, 1, one);
        double n2 = run_threads(cases[c].kind, cases[c].g, cases[c].n, 2, two);
        CHECKF(memcmp(&n1, &n2, sizeof n1) == 0, "kind %d: norms %.17g and %.17g", (int)cases[c].kind, n1, n2);
        for (int s = 0; s < NSEG; s++) {
            CHECKF(memcmp(one[s], two[s], (size_t)SIZES[s] * sizeof(float)) == 0, "kind %d segment %d differs",
                   (int)cases[c].kind, s);
            free(one[s]);
            free(two[s]);
        }
    }
}

static void test_nonfinite_and_skips(void) {
    model m;
    model_init(&m, 1);
    ft_optim_group g = adam(1e-2, 1e-2, 0.9, 0.999, 1e-8, true, false);
    ft_optimizer *opt = NULL;
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_ADAMW, 1, &g, NSEG, m.seg));
    model_grads(&m, 0, 1.0f);
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 0, NULL));
    float *before = malloc((size_t)SIZES[3] * sizeof(float));
    memcpy(before, m.param[3], (size_t)SIZES[3] * sizeof(float));
    ft_storage *m1 = ft_optimizer_state(opt, FT_OPTIM_EXP_AVG);
    float m1_before = ((float *)m1->data)[ft_optimizer_offset(opt, 3) + 5];
    m.grad[3][5] = NAN;
    double norm = 0;
    CHECK_STATUS(ft_optimizer_step(opt, 1.0f, 0, &norm), FT_ERR_VALUE);
    CHECK(strstr(ft_last_error(), "gradient norm is nan") != NULL);
    m.grad[3][5] = INFINITY;
    CHECK_STATUS(ft_optimizer_step(opt, 1.0f, 1.0, NULL), FT_ERR_VALUE);
    CHECK(memcmp(before, m.param[3], (size_t)SIZES[3] * sizeof(float)) == 0);
    CHECK(((float *)m1->data)[ft_optimizer_offset(opt, 3) + 5] == m1_before);
    CHECK(ft_optimizer_segment_state(opt, 3).steps == 1 && ft_optimizer_num_steps(opt) == 1);
    /* A huge but finite gradient overflows float squares, not the double norm. */
    m.grad[3][5] = 3e38f;
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 1.0, &norm));
    CHECK(isfinite(norm) && norm >= 3e38);

    /* NULL grads skip a segment: no update, no step, not in the norm. */
    const float *grads[NSEG] = {m.grad[0], NULL, m.grad[2], NULL};
    CHECK_OK(ft_optimizer_set_grads(opt, grads));
    memcpy(before, m.param[3], (size_t)SIZES[3] * sizeof(float));
    model_grads(&m, 1, 1.0f);
    double sq = 0;
    for (int s = 0; s < NSEG; s += 2)
        for (int64_t i = 0; i < SIZES[s]; i++)
            sq += (double)m.grad[s][i] * m.grad[s][i];
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 0, &norm));
    CHECK(close_to(norm, sqrt(sq), 1e-12));
    CHECK(memcmp(before, m.param[3], (size_t)SIZES[3] * sizeof(float)) == 0);
    CHECK(ft_optimizer_segment_state(opt, 3).steps == 2 && ft_optimizer_segment_state(opt, 0).steps == 3);
    const float *none[NSEG] = {NULL, NULL, NULL, NULL};
    CHECK_OK(ft_optimizer_set_grads(opt, none));
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 1.0, &norm));
    CHECK(norm == 0 && ft_optimizer_num_steps(opt) == 3);
    free(before);
    ft_optimizer_destroy(opt);
    model_free(&m);
}

static void test_validation(void) {
    model m;
    model_init(&m, 1);
    ft_optimizer *opt = NULL;
    struct {
        ft_optim_kind kind;
        ft_optim_group g;
        const char *msg;
    } bad[] = {
        {FT_OPTIM_SGD, sgd(NAN, 0, 0, 0, false, false), "lr must be finite"},
        {FT_OPTIM_SGD, sgd(-1, 0, 0, 0, false, false), "lr must be finite and >= 0"},
        {FT_OPTIM_SGD, sgd(INFINITY, 0, 0, 0, false, false), "lr"},
        {FT_OPTIM_SGD, sgd(0.1, -1, 0, 0, false, false), "weight_decay"},
        {FT_OPTIM_SGD, sgd(0.1, 0, -0.5, 0, false, false), "momentum"},
        {FT_OPTIM_SGD, sgd(0.1, 0, 0.9, NAN, false, false), "dampening"},
        {FT_OPTIM_SGD, sgd(0.1, 0, 0, 0, true, false), "nesterov momentum requires"},
        {FT_OPTIM_SGD, sgd(0.1, 0, 0.9, 0.1, true, false), "nesterov momentum requires"},
        {FT_OPTIM_ADAMW, adam(1e-3, 0, 1.0, 0.999, 1e-8, false, false), "betas must be in [0, 1)"},
        {FT_OPTIM_ADAMW, adam(1e-3, 0, 0.9, -0.1, 1e-8, false, false), "betas"},
        {FT_OPTIM_ADAMW, adam(1e-3, 0, NAN, 0.9, 1e-8, false, false), "betas"},
        {FT_OPTIM_ADAMW, adam(1e-3, 0, 0.9, 0.999, 0, false, false), "eps must be finite and > 0"},
        {FT_OPTIM_LAMB, adam(1e-3, 0, 0.9, 0.999, 1e-6, true, false), "amsgrad is an Adam and AdamW option"},
        {FT_OPTIM_ADAMW, {.lr = 1, .beta1 = 0.9, .beta2 = 0.9, .eps = 1, .nesterov = true}, "nesterov is an SGD"},
        {FT_OPTIM_SGD, {.lr = 1, .lars_exclude = true}, "lars_exclude is a LAMB and LARS option"},
        {FT_OPTIM_LARS, {.lr = 1, .momentum = 0.9, .trust_coefficient = 0}, "trust_coefficient"},
        {FT_OPTIM_LARS, {.lr = 1, .momentum = 0.9, .trust_coefficient = 1e-3, .eps = -1}, "eps must be finite and >= 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, bad[i].kind, 1, &bad[i].g, NSEG, m.seg), FT_ERR_VALUE);
        CHECKF(strstr(ft_last_error(), bad[i].msg) != NULL, "case %zu: '%s' lacks '%s'", i, ft_last_error(),
               bad[i].msg);
        CHECK(opt == NULL);
        CHECK_STATUS(ft_optim_check_group(bad[i].kind, 0, &bad[i].g), FT_ERR_VALUE);
    }
    ft_optim_group g = sgd(0.1, 0, 0, 0, false, false);
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, (ft_optim_kind)FT_OPTIM_NKINDS, 1, &g, NSEG, m.seg), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 0, &g, NSEG, m.seg), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, -1, m.seg), FT_ERR_VALUE);
    ft_optim_segment segs[NSEG];
    memcpy(segs, m.seg, sizeof segs);
    segs[1].group = 1;
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, segs), FT_ERR_INDEX);
    memcpy(segs, m.seg, sizeof segs);
    segs[2].numel = -1;
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, segs), FT_ERR_VALUE);
    memcpy(segs, m.seg, sizeof segs);
    segs[0].param = NULL;
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, segs), FT_ERR_VALUE);
    /* Overlaps: two params sharing memory, a grad inside a param. */
    memcpy(segs, m.seg, sizeof segs);
    segs[2].param = m.param[1] + 10;
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, segs), FT_ERR_VALUE);
    CHECK(strstr(ft_last_error(), "overlap") != NULL);
    memcpy(segs, m.seg, sizeof segs);
    segs[0].grad = m.param[3] + SIZES[3] - 3;
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, segs), FT_ERR_VALUE);
    CHECK(strstr(ft_last_error(), "the grad of segment 0 overlaps the params of segment 3") != NULL);
    memcpy(segs, m.seg, sizeof segs);
    segs[3].grad = m.param[3]; /* in place is refused too */
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, segs), FT_ERR_VALUE);
    /* Adjacent memory is fine. */
    float *flat = malloc(20 * sizeof(float)), *gflat = calloc(20, sizeof(float));
    ft_optim_segment adj[2] = {{flat, gflat, 10, 0}, {flat + 10, gflat + 10, 10, 0}};
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, 2, adj));
    const float *overlap[2] = {flat + 5, NULL};
    CHECK_STATUS(ft_optimizer_set_grads(opt, overlap), FT_ERR_VALUE);
    CHECK(ft_optimizer_segment(opt, 0)->grad == gflat); /* unchanged on failure */

    /* Step and group arguments. */
    CHECK_STATUS(ft_optimizer_step(opt, NAN, 0, NULL), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_step(opt, 0.0f, 0, NULL), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_step(opt, -1.0f, 0, NULL), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_step(opt, 1.0f, -1, NULL), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_step(opt, 1.0f, NAN, NULL), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_step(opt, 1.0f, INFINITY, NULL), FT_ERR_VALUE);
    ft_optim_group h = *ft_optimizer_group(opt, 0);
    h.lr = NAN;
    CHECK_STATUS(ft_optimizer_set_group(opt, 0, &h), FT_ERR_VALUE);
    h.lr = 0.25;
    CHECK_STATUS(ft_optimizer_set_group(opt, 1, &h), FT_ERR_INDEX);
    CHECK_STATUS(ft_optimizer_set_group(opt, -1, &h), FT_ERR_INDEX);
    CHECK(ft_optimizer_group(opt, 0)->lr == 0.1);
    CHECK_OK(ft_optimizer_set_group(opt, 0, &h));
    CHECK(ft_optimizer_group(opt, 0)->lr == 0.25);
    CHECK_STATUS(ft_optimizer_set_segment_state(opt, 2, (ft_optim_segment_state){0, false}), FT_ERR_INDEX);
    CHECK_STATUS(ft_optimizer_set_segment_state(opt, 0, (ft_optim_segment_state){-1, false}), FT_ERR_VALUE);
    ft_optimizer_destroy(opt);
    free(flat);
    free(gflat);

    /* No segments at all is a valid, empty optimizer. */
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_ADAMW, 1, &(ft_optim_group){.lr = 1, .beta1 = 0.5, .beta2 = 0.5, .eps = 1},
                                 0, NULL));
    double norm = -1;
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 1.0, &norm));
    CHECK(norm == 0);
    ft_optimizer_destroy(opt);
    model_free(&m);
}

/* State buffers: allocated through ft_alloc, zeroed, in segment order, and
 * grown when set_group turns on an option that needs one. */
static void test_state_buffers(void) {
    model m;
    model_init(&m, 1);
    ft_mem_pool host = {FT_MEM_HOST, 0};
    int64_t total = 0;
    for (int s = 0; s < NSEG; s++)
        total += SIZES[s];
    int64_t before = ft_memory_stats(host).allocated;
    ft_optim_group g = sgd(0.1, 0, 0, 0, false, false);
    ft_optimizer *opt = NULL;
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_SGD, 1, &g, NSEG, m.seg));
    CHECK(ft_optimizer_state(opt, FT_OPTIM_MOMENTUM_BUFFER) == NULL);
    CHECK(ft_optimizer_state_numel(opt) == total);
    model_grads(&m, 0, 1.0f);
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 0, NULL));
    CHECK(!ft_optimizer_segment_state(opt, 0).momentum_valid);
    g.momentum = 0.9;
    CHECK_OK(ft_optimizer_set_group(opt, 0, &g));
    ft_storage *buf = ft_optimizer_state(opt, FT_OPTIM_MOMENTUM_BUFFER);
    CHECK(buf && buf->nbytes == (size_t)total * sizeof(float));
    CHECK(ft_memory_stats(host).allocated >= before + total * (int64_t)sizeof(float));
    bool zero = true;
    for (int64_t i = 0; buf && i < total; i++)
        zero = zero && ((float *)buf->data)[i] == 0.0f;
    CHECK(zero);
    /* The first momentum step copies d into the buffer (PyTorch's rule). */
    float p0 = m.param[1][3];
    CHECK_OK(ft_optimizer_step(opt, 1.0f, 0, NULL));
    CHECK(ft_optimizer_segment_state(opt, 1).momentum_valid);
    CHECK(((float *)buf->data)[ft_optimizer_offset(opt, 1) + 3] == m.grad[1][3]);
    CHECK(m.param[1][3] == p0 - 0.1f * m.grad[1][3]);
    CHECK(ft_optimizer_offset(opt, 0) == 0 && ft_optimizer_offset(opt, 3) == total - SIZES[3]);
    ft_optimizer_destroy(opt);
    CHECK(ft_memory_stats(host).allocated == before);

    ft_optim_group a = adam(1e-3, 0, 0.9, 0.999, 1e-8, false, false);
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_ADAMW, 1, &a, NSEG, m.seg));
    CHECK(ft_optimizer_state(opt, FT_OPTIM_EXP_AVG) && ft_optimizer_state(opt, FT_OPTIM_EXP_AVG_SQ));
    CHECK(!ft_optimizer_state(opt, FT_OPTIM_MAX_EXP_AVG_SQ) && !ft_optimizer_state(opt, FT_OPTIM_MOMENTUM_BUFFER));
    a.amsgrad = true;
    CHECK_OK(ft_optimizer_set_group(opt, 0, &a));
    CHECK(ft_optimizer_state(opt, FT_OPTIM_MAX_EXP_AVG_SQ) != NULL);
    CHECK(ft_optimizer_state(opt, FT_OPTIM_NUM_STATES) == NULL);
    CHECK(strcmp(ft_optim_state_name(FT_OPTIM_EXP_AVG_SQ), "exp_avg_sq") == 0);
    CHECK(strcmp(ft_optim_state_name(FT_OPTIM_SUM), "sum") == 0);
    CHECK(strcmp(ft_optim_kind_name(FT_OPTIM_LARS), "LARS") == 0);
    CHECK(strcmp(ft_optim_kind_name(FT_OPTIM_RADAM), "RAdam") == 0);
    ft_optimizer_destroy(opt);

    /* NAdam keeps each segment's product of momentum coefficients (float32, as torch's state tensor). */
    a.amsgrad = false;
    a.momentum_decay = -4e-3;
    CHECK_STATUS(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_NADAM, 1, &a, NSEG, m.seg), FT_ERR_VALUE);
    a.momentum_decay = 4e-3;
    CHECK_OK(ft_optimizer_create(&opt, FT_CPU, FT_OPTIM_NADAM, 1, &a, NSEG, m.seg));
    CHECK(!ft_optimizer_state(opt, FT_OPTIM_SUM) && ft_optimizer_state(opt, FT_OPTIM_EXP_AVG_SQ));
    float mu_product = 1.0f;
    for (int t = 1; t <= 2; t++) {
        model_grads(&m, t, 1.0f);
        CHECK_OK(ft_optimizer_step(opt, 1.0f, 0, NULL));
        mu_product *= (float)(0.9 * (1 - 0.5 * pow(0.96, t * 4e-3)));
    }
    CHECK(ft_optimizer_segment_state(opt, 2).mu_product == mu_product);
    CHECK_STATUS(ft_optimizer_set_segment_state(opt, 0, (ft_optim_segment_state){2, false, 1.0}), FT_ERR_VALUE);
    CHECK_STATUS(ft_optimizer_set_segment_state(opt, 0, (ft_optim_segment_state){2, false, NAN}), FT_ERR_VALUE);
    CHECK_OK(ft_optimizer_set_segment_state(opt, 0, (ft_optim_segment_state){0, false, 1.0})); /* read as 1 anyway */
    ft_optimizer_destroy(opt);
    model_free(&m);
}

static void test_ema(void) {
    model m;
    model_init(&m, 1);
    ft_ema_segment segs[NSEG];
    for (int s = 0; s < NSEG; s++)
        segs[s] = (ft_ema_segment){m.param[s], SIZES[s]};
    ft_ema *ema = NULL;
    CHECK_OK(ft_ema_create(&ema, FT_CPU, NSEG, segs));
    const float *avg = ema ? ft_ema_average(ema)->data : NULL;
    CHECK(ema && ft_ema_num_segments(ema) == NSEG);
    for (int s = 0; ema && s < NSEG; s++)
        CHECK(memcmp(avg + ft_ema_offset(ema, s), m.param[s], (size_t)SIZES[s] * sizeof(float)) == 0);
    float a0 = m.param[1][2];
    m.param[1][2] += 1.0f;
    CHECK_OK(ft_ema_update(ema, 0.9));
    float w = (float)(1 - 0.9);
    CHECK(avg[ft_ema_offset(ema, 1) + 2] == a0 + w * (m.param[1][2] - a0));
    CHECK(avg[ft_ema_offset(ema, 3) + 7] == m.param[3][7]);
    CHECK_STATUS(ft_ema_update(ema, 1.5), FT_ERR_VALUE);
    CHECK_STATUS(ft_ema_update(ema, NAN), FT_ERR_VALUE);
    CHECK_OK(ft_ema_update(ema, 0.0));
    CHECK(avg[ft_ema_offset(ema, 1) + 2] == m.param[1][2]);
    CHECK(ft_ema_get_segment(ema, 2).param == m.param[2] && ft_ema_get_segment(ema, 2).numel == SIZES[2]);
    ft_ema_destroy(ema);
    segs[0].param = NULL;
    CHECK_STATUS(ft_ema_create(&ema, FT_CPU, NSEG, segs), FT_ERR_VALUE);
    CHECK_STATUS(ft_ema_create(&ema, FT_CPU, -1, segs), FT_ERR_VALUE);
    model_free(&m);
}

int main(void) {
    test_kernels();
    test_against_reference();
    test_thread_count_invariance();
    test_nonfinite_and_skips();
    test_validation();
    test_state_buffers();
    test_ema();
    return check_main_result("test_optim");
}
