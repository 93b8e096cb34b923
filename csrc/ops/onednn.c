#include "ops/onednn.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

ft_status ft_dnnl_check(dnnl_status_t s, const char *what) {
    switch (s) {
    case dnnl_success: return FT_OK;
    case dnnl_out_of_memory: return ft_fail(FT_ERR_NOMEM, "%s: oneDNN ran out of memory", what);
    case dnnl_invalid_arguments: return ft_fail(FT_ERR_VALUE, "%s: oneDNN rejected the arguments", what);
    case dnnl_unimplemented:
        return ft_fail(FT_ERR_RUNTIME, "%s: oneDNN has no implementation for these shapes and dtypes", what);
    default: return ft_fail(FT_ERR_RUNTIME, "%s: oneDNN failed with status %d", what, (int)s);
    }
}

static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static dnnl_status_t engine_status;

/* oneDNN's own primitive cache is off: it would hand a descriptor planned for one thread (deterministic
 * mode's row slices) a primitive built for another thread count, which splits and sums differently; the cache
 * below keys on the thread count. */
static void create_engine(void) {
    engine_status = dnnl_set_primitive_cache_capacity(0);
    if (engine_status == dnnl_success)
        engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

ft_status ft_dnnl_engine(dnnl_engine_t *out) {
    pthread_once(&engine_once, create_engine);
    *out = engine;
    return ft_dnnl_check(engine_status, "creating the oneDNN CPU engine");
}

/* A CPU stream is cheap but not safe to share between threads that execute
 * at the same time (the data loader's threads and the training thread). */
static pthread_key_t stream_key;
static pthread_once_t stream_key_once = PTHREAD_ONCE_INIT;

static void destroy_stream(void *s) { dnnl_stream_destroy(s); }
static void create_stream_key(void) { pthread_key_create(&stream_key, destroy_stream); }

static ft_status thread_stream(dnnl_stream_t *out) {
    pthread_once(&stream_key_once, create_stream_key);
    dnnl_stream_t s = pthread_getspecific(stream_key);
    if (!s) {
        dnnl_engine_t e;
        FT_TRY(ft_dnnl_engine(&e));
        FT_TRY(ft_dnnl_check(dnnl_stream_create(&s, e, dnnl_stream_default_flags), "creating a oneDNN stream"));
        pthread_setspecific(stream_key, s);
    }
    *out = s;
    return FT_OK;
}

static ft_status dnnl_dtype(dnnl_data_type_t *out, ft_dtype dt) {
    switch (dt) {
    case FT_FLOAT32: *out = dnnl_f32; return FT_OK;
    case FT_BFLOAT16: *out = dnnl_bf16; return FT_OK;
    case FT_FLOAT16: *out = dnnl_f16; return FT_OK;
    case FT_INT32: *out = dnnl_s32; return FT_OK;
    case FT_INT8: *out = dnnl_s8; return FT_OK;
    case FT_UINT8: *out = dnnl_u8; return FT_OK;
    default: return ft_fail(FT_ERR_DTYPE, "oneDNN does not take %s tensors", ft_dtype_get(dt)->name);
    }
}

ft_status ft_dnnl_md_strided(dnnl_memory_desc_t *md, ft_dtype dtype, int ndim, const int64_t *dims,
                             const int64_t *strides) {
    dnnl_data_type_t dt = dnnl_f32;
    FT_TRY(dnnl_dtype(&dt, dtype));
    dnnl_dims_t d, s;
    for (int i = 0; i < ndim; i++) {
        if (strides[i] < 0)
            return ft_fail(FT_ERR_SHAPE, "oneDNN needs non-negative strides");
        d[i] = dims[i];
        s[i] = strides[i];
    }
    return ft_dnnl_check(dnnl_memory_desc_init_by_strides(md, ndim, d, dt, s), "describing a tensor for oneDNN");
}

ft_status ft_dnnl_md_any(dnnl_memory_desc_t *md, ft_dtype dtype, int ndim, const int64_t *dims) {
    dnnl_data_type_t dt = dnnl_f32;
    FT_TRY(dnnl_dtype(&dt, dtype));
    dnnl_dims_t d;
    for (int i = 0; i < ndim; i++)
        d[i] = dims[i];
    return ft_dnnl_check(dnnl_memory_desc_init_by_tag(md, ndim, d, dt, dnnl_format_tag_any),
                         "describing a tensor for oneDNN");
}

/* ---- the primitive cache: open hashing on the key bytes ---- */

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    int threads;
    size_t key_len;
    ft_dnnl_prim prim;
    unsigned char key[];
} entry;

#define BUCKETS 1024
static entry *buckets[BUCKETS];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static entry *find(uint64_t h, int threads, const void *key, size_t len) {
    for (entry *e = buckets[h % BUCKETS]; e; e = e->next)
        if (e->hash == h && e->threads == threads && e->key_len == len && memcmp(e->key, key, len) == 0)
            return e;
    return NULL;
}

ft_status ft_dnnl_get(const ft_dnnl_prim **out, const void *key, size_t key_len, ft_dnnl_build_fn build,
                      const void *arg) {
    /* a primitive splits its work for the thread count it is created
     * under, and runs that many threads: another count gets its own */
    int threads = omp_get_max_threads();
    uint64_t h = fnv1a(key, key_len) ^ (uint64_t)threads;
    pthread_mutex_lock(&cache_lock);
    entry *e = find(h, threads, key, key_len);
    pthread_mutex_unlock(&cache_lock);
    if (e) {
        *out = &e->prim;
        return FT_OK;
    }
    /* Built outside the lock: creation can take milliseconds (JIT). */
    dnnl_primitive_desc_t pd = NULL;
    FT_TRY(build(&pd, arg));
    dnnl_primitive_t prim;
    ft_status s = ft_dnnl_check(dnnl_primitive_create(&prim, pd), "creating a oneDNN primitive");
    dnnl_primitive_desc_destroy(pd); /* the primitive keeps a copy, which ft_dnnl_run queries */
    if (s != FT_OK)
        return s;
    entry *fresh = malloc(sizeof *fresh + key_len);
    if (!fresh) {
        dnnl_primitive_destroy(prim);
        return ft_fail(FT_ERR_NOMEM, "out of memory caching a primitive");
    }
    fresh->hash = h;
    fresh->threads = threads;
    fresh->key_len = key_len;
    fresh->prim = (ft_dnnl_prim){prim};
    memcpy(fresh->key, key, key_len);
    pthread_mutex_lock(&cache_lock);
    e = find(h, threads, key, key_len); /* another thread may have built it meanwhile */
    if (!e) {
        fresh->next = buckets[h % BUCKETS];
        buckets[h % BUCKETS] = e = fresh;
        fresh = NULL;
    }
    pthread_mutex_unlock(&cache_lock);
    if (fresh) {
        dnnl_primitive_destroy(fresh->prim.prim);
        free(fresh);
    }
    *out = &e->prim;
    return FT_OK;
}

#define MAX_ARGS 12

static bool is_output(int arg) {
    return arg == DNNL_ARG_DST || arg == DNNL_ARG_DIFF_SRC || arg == DNNL_ARG_DIFF_WEIGHTS ||
           arg == DNNL_ARG_DIFF_BIAS;
}

typedef struct {
    dnnl_memory_desc_t from, to;
} reorder_key;

static ft_status build_reorder(dnnl_primitive_desc_t *pd, const void *arg) {
    const reorder_key *k = arg;
    dnnl_engine_t e;
    FT_TRY(ft_dnnl_engine(&e));
    return ft_dnnl_check(dnnl_reorder_primitive_desc_create(pd, &k->from, e, &k->to, e, NULL), "a oneDNN reorder");
}

/* dst (in md `to`) = src (in md `from`). */
static ft_status reorder(const dnnl_memory_desc_t *from, void *src, const dnnl_memory_desc_t *to, void *dst) {
    reorder_key k;
    memset(&k, 0, sizeof k);
    k.from = *from;
    k.to = *to;
    const ft_dnnl_prim *p = NULL;
    FT_TRY(ft_dnnl_get(&p, &k, sizeof k, build_reorder, &k));
    ft_dnnl_arg args[2] = {{DNNL_ARG_FROM, from, src}, {DNNL_ARG_TO, to, dst}};
    return ft_dnnl_run(p, 2, args);
}

ft_status ft_dnnl_run(const ft_dnnl_prim *p, int n, const ft_dnnl_arg *args) {
    dnnl_engine_t e;
    dnnl_stream_t stream;
    FT_TRY(ft_dnnl_engine(&e));
    FT_TRY(thread_stream(&stream));
    if (n > MAX_ARGS)
        return ft_fail(FT_ERR_RUNTIME, "too many oneDNN arguments");
    ft_mem_pool host = {FT_MEM_HOST, 0};
    const_dnnl_primitive_desc_t pd;
    FT_TRY(ft_dnnl_check(dnnl_primitive_get_primitive_desc(p->prim, &pd), "querying a oneDNN primitive"));
    /* Arguments the primitive wants in its own layout (weights created with
     * format "any") go through a temporary in that layout. */
    void *tmp[MAX_ARGS] = {0};
    size_t tmp_size[MAX_ARGS] = {0};
    const dnnl_memory_desc_t *want[MAX_ARGS];
    ft_status s = FT_OK;
    for (int i = 0; i < n && s == FT_OK; i++) {
        want[i] = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, args[i].arg);
        if (!want[i] || dnnl_memory_desc_equal(want[i], args[i].md)) {
            want[i] = args[i].md;
            continue;
        }
        s = ft_alloc(&tmp[i], &tmp_size[i], dnnl_memory_desc_get_size(want[i]), host);
        if (s == FT_OK && !is_output(args[i].arg))
            s = reorder(args[i].md, args[i].data, want[i], tmp[i]);
    }
    dnnl_exec_arg_t exec[MAX_ARGS + 1];
    dnnl_memory_t mems[MAX_ARGS + 1];
    int m = 0;
    for (int i = 0; i < n && s == FT_OK; i++) {
        s = ft_dnnl_check(dnnl_memory_create(&mems[m], want[i], e, tmp[i] ? tmp[i] : args[i].data),
                          "wrapping memory for oneDNN");
        if (s == FT_OK) {
            exec[m] = (dnnl_exec_arg_t){args[i].arg, mems[m]};
            m++;
        }
    }
    /* The primitive's scratchpad comes from the caching allocator: no
     * per-call malloc of large blocks, and it shows in memory_stats. */
    const dnnl_memory_desc_t *scratch_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t scratch_bytes = scratch_md ? dnnl_memory_desc_get_size(scratch_md) : 0;
    void *scratch = NULL;
    size_t granted = 0;
    if (s == FT_OK && scratch_bytes) {
        s = ft_alloc(&scratch, &granted, scratch_bytes, host);
        if (s == FT_OK) {
            s = ft_dnnl_check(dnnl_memory_create(&mems[m], scratch_md, e, scratch), "wrapping the scratchpad");
            if (s == FT_OK) {
                exec[m] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mems[m]};
                m++;
            }
        }
    }
    if (s == FT_OK)
        s = ft_dnnl_check(dnnl_primitive_execute(p->prim, stream, m, exec), "running a oneDNN primitive");
    if (s == FT_OK)
        s = ft_dnnl_check(dnnl_stream_wait(stream), "waiting for oneDNN");
    for (int i = 0; i < m; i++)
        dnnl_memory_destroy(mems[i]);
    for (int i = 0; i < n; i++) {
        if (!tmp[i])
            continue;
        if (s == FT_OK && is_output(args[i].arg))
            s = reorder(want[i], tmp[i], args[i].md, args[i].data);
        ft_free(tmp[i], tmp_size[i], host);
    }
    if (scratch)
        ft_free(scratch, granted, host);
    return s;
}

ft_status ft_dnnl_attr(dnnl_primitive_attr_t *attr) {
    FT_TRY(ft_dnnl_check(dnnl_primitive_attr_create(attr), "creating oneDNN attributes"));
    ft_status s = ft_dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user),
                                "asking for a user scratchpad");
    if (s != FT_OK)
        dnnl_primitive_attr_destroy(*attr);
    return s;
}

bool ft_dnnl_fuses(ft_act act) {
    return act.kind != FT_ACT_RELU && !(act.kind == FT_ACT_LEAKY_RELU && act.alpha == 0.0f);
}

ft_status ft_dnnl_append_act(dnnl_post_ops_t po, ft_act act) {
    dnnl_alg_kind_t alg;
    float alpha = 0;
    switch (act.kind) {
    case FT_ACT_NONE: return FT_OK;
    case FT_ACT_RELU: alg = dnnl_eltwise_relu; break;
    case FT_ACT_LEAKY_RELU: alg = dnnl_eltwise_relu, alpha = act.alpha; break;
    case FT_ACT_GELU: alg = dnnl_eltwise_gelu_erf; break;
    case FT_ACT_GELU_TANH: alg = dnnl_eltwise_gelu_tanh; break;
    case FT_ACT_SILU: alg = dnnl_eltwise_swish, alpha = 1; break;
    case FT_ACT_SIGMOID: alg = dnnl_eltwise_logistic; break;
    case FT_ACT_TANH: alg = dnnl_eltwise_tanh; break;
    case FT_ACT_HARDSWISH: alg = dnnl_eltwise_hardswish; break;
    case FT_ACT_ABS: alg = dnnl_eltwise_abs; break;
    default: return ft_fail(FT_ERR_VALUE, "unknown activation %d", (int)act.kind);
    }
    return ft_dnnl_check(dnnl_post_ops_append_eltwise(po, 1.0f, alg, alpha, 0.0f), "an activation post-op");
}
