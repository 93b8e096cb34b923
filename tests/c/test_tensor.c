/* Tensors: creation and view bounds, copies between every pair of dtypes,
 * strided and overlapping copies, fill, read-only memory, borrowed memory
 * and the parallel copy path. Expected values come from plain C casts and
 * from the float16/bfloat16 bit layouts written out here. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/tensor.h"

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

static ft_tensor make(int ndim, const int64_t *shape, ft_dtype dt) {
    ft_tensor t = {0};
    ft_status st = ft_tensor_empty(&t, ndim, shape, dt, FT_CPU, false);
    if (st != FT_OK) {
        fprintf(stderr, "ft_tensor_empty failed: %s\n", ft_last_error());
        exit(2);
    }
    return t;
}

/* ---- exact float16 / bfloat16 encodings of values that fit ---------------- */

/* The binary16 pattern of v, which must be exactly representable. */
static uint16_t half_bits(double v) {
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    double a = fabs(v);
    if (a == 0)
        return sign;
    if (isinf(a))
        return sign | 0x7c00;
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    if (e - 1 < -14)
        return sign | (uint16_t)ldexp(a, 24); /* subnormal */
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(ldexp(a, 11 - e) - 1024);
}

static double half_value(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

static uint16_t bf16_bits(double v) { /* exact: the top half of the float's bits */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static double bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Whether v is exactly an element of dt. */
static int fits(ft_dtype dt, double v) {
    int e;
    switch (dt) {
    case FT_BOOL: return v == 0 || v == 1;
    case FT_UINT8: return v == trunc(v) && v >= 0 && v <= UINT8_MAX;
    case FT_INT8: return v == trunc(v) && v >= INT8_MIN && v <= INT8_MAX;
    case FT_INT16: return v == trunc(v) && v >= INT16_MIN && v <= INT16_MAX;
    case FT_INT32: return v == trunc(v) && v >= INT32_MIN && v <= INT32_MAX;
    case FT_INT64: return v == trunc(v) && v >= -0x1p63 && v < 0x1p63;
    case FT_UINT16: return v == trunc(v) && v >= 0 && v <= UINT16_MAX;
    case FT_UINT32: return v == trunc(v) && v >= 0 && v <= UINT32_MAX;
    case FT_UINT64: return v == trunc(v) && v >= 0 && v < 0x1p64;
    case FT_FLOAT16:
        frexp(v, &e);
        return fabs(v) <= 65504 && (v == 0 || e - 1 >= -14 ? ldexp(v, 11 - e) == trunc(ldexp(v, 11 - e))
                                                          : ldexp(v, 24) == trunc(ldexp(v, 24)));
    case FT_BFLOAT16:
        frexp(v, &e);
        return (double)(float)v == v && ldexp(v, 8 - e) == trunc(ldexp(v, 8 - e));
    case FT_FLOAT32: return (double)(float)v == v;
    default: return 1;
    }
}

/* Stores v (which fits dt) with a plain C cast. */
static void put(void *p, ft_dtype dt, double v) {
    switch (dt) {
    case FT_BOOL: *(uint8_t *)p = v != 0; break;
    case FT_UINT8: *(uint8_t *)p = (uint8_t)v; break;
    case FT_INT8: *(int8_t *)p = (int8_t)v; break;
    case FT_INT16: *(int16_t *)p = (int16_t)v; break;
    case FT_INT32: *(int32_t *)p = (int32_t)v; break;
    case FT_INT64: *(int64_t *)p = (int64_t)v; break;
    case FT_UINT16: *(uint16_t *)p = (uint16_t)v; break;
    case FT_UINT32: *(uint32_t *)p = (uint32_t)v; break;
    case FT_UINT64: *(uint64_t *)p = (uint64_t)v; break;
    case FT_FLOAT16: *(uint16_t *)p = half_bits(v); break;
    case FT_BFLOAT16: *(uint16_t *)p = bf16_bits(v); break;
    case FT_FLOAT32: *(float *)p = (float)v; break;
    default: *(double *)p = v; break;
    }
}

static double get(const void *p, ft_dtype dt) {
    switch (dt) {
    case FT_BOOL: return *(const uint8_t *)p;
    case FT_UINT8: return *(const uint8_t *)p;
    case FT_INT8: return *(const int8_t *)p;
    case FT_INT16: return *(const int16_t *)p;
    case FT_INT32: return *(const int32_t *)p;
    case FT_INT64: return (double)*(const int64_t *)p;
    case FT_UINT16: return *(const uint16_t *)p;
    case FT_UINT32: return *(const uint32_t *)p;
    case FT_UINT64: return (double)*(const uint64_t *)p;
    case FT_FLOAT16: return half_value(*(const uint16_t *)p);
    case FT_BFLOAT16: return bf16_value(*(const uint16_t *)p);
    case FT_FLOAT32: return *(const float *)p;
    default: return *(const double *)p;
    }
}

/* What a copy of v to dt gives, by C's conversion rules, when defined:
 * bool is v != 0, integers truncate toward zero when the result fits, floats
 * keep values they can hold. Returns 0 when the case is not tested here. */
static int expected(ft_dtype dt, double v, double *out) {
    if (dt == FT_BOOL) {
        *out = v != 0;
        return 1;
    }
    if (ft_dtype_is_float(dt)) {
        *out = v;
        return fits(dt, v);
    }
    *out = trunc(v) + 0.0; /* -0.5 truncates to -0, stored as 0 */
    return fits(dt, *out);
}

static const char *dt_name(ft_dtype dt) { return ft_dtype_get(dt)->name; }

/* ---- creation and views ---------------------------------------------------- */

static void test_empty(void) {
    ft_tensor t;
    CHECK_OK(ft_tensor_empty(&t, 2, SHAPE(2, 3), FT_FLOAT32, FT_CPU, false));
    CHECK(t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3 && t.strides[0] == 3 && t.strides[1] == 1);
    CHECK(t.offset == 0 && t.storage->nbytes == 24 && ft_tensor_numel(&t) == 6 && ft_tensor_is_contiguous(&t));
    CHECK((uintptr_t)ft_tensor_data(&t) % 64 == 0);
    ft_tensor_release(&t);

    CHECK_OK(ft_tensor_empty(&t, 0, SHAPE(0), FT_INT64, FT_CPU, false)); /* a scalar (shape unread) */
    CHECK(ft_tensor_numel(&t) == 1 && t.storage->nbytes == 8);
    ft_tensor_release(&t);

    CHECK_OK(ft_tensor_empty(&t, 2, SHAPE(0, 5), FT_FLOAT32, FT_CPU, false));
    CHECK(ft_tensor_numel(&t) == 0 && t.storage->nbytes == 0 && t.storage->data != NULL);
    ft_tensor_release(&t);

    CHECK_STATUS(ft_tensor_empty(&t, 2, SHAPE(INT64_C(1) << 32, INT64_C(1) << 32), FT_UINT8, FT_CPU, false),
                 FT_ERR_OVERFLOW);
    CHECK_STATUS(ft_tensor_empty(&t, 1, SHAPE(INT64_C(1) << 61), FT_FLOAT64, FT_CPU, false), FT_ERR_OVERFLOW);
    CHECK_STATUS(ft_tensor_empty(&t, 2, SHAPE(INT64_C(1) << 62, 4), FT_FLOAT32, FT_CPU, false), FT_ERR_OVERFLOW);
    CHECK_STATUS(ft_tensor_empty(&t, 1, SHAPE(INT64_MAX), FT_INT16, FT_CPU, false), FT_ERR_OVERFLOW);
    CHECK_STATUS(ft_tensor_empty(&t, 2, SHAPE(2, -1), FT_FLOAT32, FT_CPU, false), FT_ERR_VALUE);
    CHECK_STATUS(ft_tensor_empty(&t, 1, SHAPE(INT64_MIN), FT_FLOAT32, FT_CPU, false), FT_ERR_VALUE);
    int64_t many[FT_MAX_DIMS + 1];
    for (int i = 0; i <= FT_MAX_DIMS; i++)
        many[i] = 1;
    CHECK_STATUS(ft_tensor_empty(&t, FT_MAX_DIMS + 1, many, FT_FLOAT32, FT_CPU, false), FT_ERR_VALUE);
    CHECK_STATUS(ft_tensor_empty(&t, -1, many, FT_FLOAT32, FT_CPU, false), FT_ERR_VALUE);
    CHECK_OK(ft_tensor_empty(&t, FT_MAX_DIMS, many, FT_FLOAT32, FT_CPU, false));
    ft_tensor_release(&t);
    /* No CUDA backend is loaded in these tests. */
    CHECK_STATUS(ft_tensor_empty(&t, 1, SHAPE(4), FT_FLOAT32, (ft_device){FT_DEV_CUDA, 0}, false), FT_ERR_DEVICE);
}

static void check_view(ft_status want, const ft_tensor *base, int ndim, const int64_t *shape,
                       const int64_t *strides, int64_t offset, int line) {
    ft_tensor v = {0};
    ft_status st = ft_tensor_view(&v, base, ndim, shape, strides, offset);
    CHECKF(st == want, "line %d: ft_tensor_view returned %d, expected %d (%s)", line, (int)st, (int)want,
           ft_last_error());
    if (st == FT_OK)
        ft_tensor_release(&v);
}
#define VIEW(want, base, shape, strides, offset) \
    check_view(want, base, (int)(sizeof(shape) / sizeof(int64_t)), shape, strides, offset, __LINE__)

static void test_view_bounds(void) {
    ft_tensor base = make(2, SHAPE(2, 3), FT_FLOAT32); /* 24 bytes */
    VIEW(FT_OK, &base, SHAPE(2, 3), SHAPE(3, 1), 0);
    VIEW(FT_OK, &base, SHAPE(6), SHAPE(1), 0);
    VIEW(FT_OK, &base, SHAPE(5), SHAPE(1), 4);
    VIEW(FT_OK, &base, SHAPE(3, 2), SHAPE(1, 3), 0);   /* transposed */
    VIEW(FT_OK, &base, SHAPE(6), SHAPE(-1), 20);       /* reversed */
    VIEW(FT_OK, &base, SHAPE(2, 3), SHAPE(-3, 1), 12);
    VIEW(FT_OK, &base, SHAPE(100), SHAPE(0), 20);      /* broadcast of the last element */
    VIEW(FT_OK, &base, SHAPE(0), SHAPE(1), 1000);      /* addresses nothing */
    VIEW(FT_OK, &base, SHAPE(1), SHAPE(INT64_MAX), 0); /* a size-1 dimension's stride is never used */

    VIEW(FT_ERR_SHAPE, &base, SHAPE(2, 3), SHAPE(3, 1), 4);  /* one element past the end */
    VIEW(FT_ERR_SHAPE, &base, SHAPE(2, 3), SHAPE(3, 1), -4); /* one element before the start */
    VIEW(FT_ERR_SHAPE, &base, SHAPE(7), SHAPE(1), 0);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(2, 3), SHAPE(4, 1), 0);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(6), SHAPE(-1), 16);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(2, 3), SHAPE(-3, 1), 0);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(100), SHAPE(0), 24);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(1), SHAPE(1), INT64_MAX);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(1), SHAPE(1), INT64_MIN);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(2), SHAPE(INT64_MAX / 2), 0); /* stride * itemsize overflows */
    VIEW(FT_ERR_SHAPE, &base, SHAPE(3), SHAPE(INT64_MIN), 0);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(2), SHAPE(INT64_MIN), 0);
    VIEW(FT_ERR_SHAPE, &base, SHAPE(INT64_C(1) << 40, INT64_C(1) << 20), SHAPE(1 << 20, 1), 0);

    VIEW(FT_ERR_OVERFLOW, &base, SHAPE(INT64_C(1) << 62, 4), SHAPE(0, 0), 0);
    VIEW(FT_ERR_OVERFLOW, &base, SHAPE(INT64_C(1) << 61), SHAPE(0), 0); /* 2^61 floats: 2^63 bytes */
    VIEW(FT_ERR_VALUE, &base, SHAPE(2, -3), SHAPE(3, 1), 0);
    VIEW(FT_ERR_VALUE, &base, SHAPE(-1), SHAPE(1), 0);

    /* The view shares the storage and sees its bytes. */
    float *data = (float *)ft_tensor_data(&base);
    for (int i = 0; i < 6; i++)
        data[i] = (float)i;
    ft_tensor v;
    CHECK_OK(ft_tensor_view(&v, &base, 1, SHAPE(3), SHAPE(-2), 20));
    CHECK(v.storage == base.storage && atomic_load(&base.storage->refcount) == 2);
    CHECK(*(float *)ft_tensor_data(&v) == 5.0f);
    ft_tensor_release(&v);
    CHECK(atomic_load(&base.storage->refcount) == 1);
    ft_tensor_release(&base);
}

/* Strides whose last byte lies exactly one past INT64_MAX: computing the
 * view's end overflows int64. The view must be refused, not accepted or
 * undefined. Run in a child process: with UBSan the overflow aborts. */
static void view_extent_overflow(void) {
    ft_tensor base = make(1, SHAPE(16), FT_UINT8), v;
    ft_status st = ft_tensor_view(&v, &base, 1, SHAPE(2), SHAPE(INT64_MAX), 0);
    CHECKF(st == FT_ERR_SHAPE, "uint8 view shape {2} strides {INT64_MAX}: status %d (%s)", (int)st,
           ft_last_error());
    if (st == FT_OK)
        ft_tensor_release(&v);
    ft_tensor f32 = make(1, SHAPE(16), FT_FLOAT32);
    st = ft_tensor_view(&v, &f32, 1, SHAPE(2), SHAPE(INT64_MAX / 4), 0);
    CHECKF(st == FT_ERR_SHAPE, "float32 view shape {2} strides {INT64_MAX/4}: status %d (%s)", (int)st,
           ft_last_error());
    if (st == FT_OK)
        ft_tensor_release(&v);
    ft_tensor_release(&base);
    ft_tensor_release(&f32);
}

/* tensor.h: a zero in the shape makes any other sizes fine, even ones whose
 * product overflows. Isolated: computing the strides may overflow. */
static void empty_zero_size_huge_dims(void) {
    ft_tensor t;
    CHECK_OK(ft_tensor_empty(&t, 3, SHAPE(INT64_C(1) << 40, INT64_C(1) << 40, 0), FT_FLOAT64, FT_CPU, false));
    CHECK(ft_tensor_numel(&t) == 0 && t.storage->nbytes == 0);
    ft_tensor_release(&t);
    CHECK_OK(ft_tensor_empty(&t, 4, SHAPE(2, INT64_C(1) << 40, INT64_C(1) << 40, 0), FT_UINT8, FT_CPU, false));
    CHECK(ft_tensor_numel(&t) == 0);
    ft_tensor_release(&t);
}

static void borrow_extent_overflow(void) {
    static uint8_t bytes[16];
    ft_tensor t;
    ft_status st = ft_tensor_borrow(&t, bytes, 1, SHAPE(2), SHAPE(INT64_MAX), FT_UINT8, FT_CPU, false,
                                    ft_storage_unowned, NULL);
    CHECKF(st == FT_ERR_SHAPE, "borrow uint8 shape {2} strides {INT64_MAX}: status %d (%s)", (int)st,
           ft_last_error());
    if (st == FT_OK)
        ft_tensor_release(&t);
}

/* Runs fn in a child process so that a crash or a sanitizer abort counts as
 * one failure instead of ending the test program. */
static void isolated(void (*fn)(void), const char *name) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int before = check_failures;
        fn();
        fflush(NULL);
        _exit(check_failures != before);
    }
    int status = 0;
    CHECKF(pid > 0 && waitpid(pid, &status, 0) == pid, "fork for %s", name);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child %s %d", name,
           WIFEXITED(status) ? "exited with" : "killed by signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* ---- copies ------------------------------------------------------------- */

static const double copy_values[] = {0, 1, 2, 3, 7, 100, 127, 255, 1000, 65504, -1, -5, -128, 0.5, -0.5, 2.5, -2.75,
                                     1e9, 4294967295.0, -2147483648.0, 0x1p40 + 1, 0x1p-20};
#define NVALUES (sizeof copy_values / sizeof copy_values[0])

static void test_copy_all_dtypes(void) {
    int bad = 0;
    for (int s = 0; s < FT_NUM_DTYPES; s++) {
        if (ft_dtype_is_complex((ft_dtype)s))
            continue;
        double vals[NVALUES];
        int64_t n = 0;
        for (size_t i = 0; i < NVALUES; i++)
            if (fits((ft_dtype)s, copy_values[i]))
                vals[n++] = copy_values[i];
        ft_tensor src = make(1, &n, (ft_dtype)s);
        size_t ssz = ft_dtype_get((ft_dtype)s)->itemsize;
        for (int64_t i = 0; i < n; i++)
            put(ft_tensor_data(&src) + i * ssz, (ft_dtype)s, vals[i]);
        for (int d = 0; d < FT_NUM_DTYPES; d++) {
            if (ft_dtype_is_complex((ft_dtype)d))
                continue;
            ft_tensor dst = make(1, &n, (ft_dtype)d);
            size_t dsz = ft_dtype_get((ft_dtype)d)->itemsize;
            CHECK_OK(ft_tensor_copy(&dst, &src, false));
            for (int64_t i = 0; i < n && bad < 20; i++) {
                double want, got = get(ft_tensor_data(&dst) + i * dsz, (ft_dtype)d);
                if (!expected((ft_dtype)d, vals[i], &want))
                    continue;
                CHECKF(got == want, "%s %.17g -> %s gave %.17g, want %.17g", dt_name((ft_dtype)s), vals[i],
                       dt_name((ft_dtype)d), got, want);
                bad += got != want;
            }
            if (d == FT_BOOL)
                for (int64_t i = 0; i < n; i++)
                    CHECK(((uint8_t *)ft_tensor_data(&dst))[i] <= 1);
            ft_tensor_release(&dst);
        }
        ft_tensor_release(&src);
    }

    /* A bool byte other than 0 or 1 still reads as true. */
    uint8_t raw[3] = {0, 2, 255};
    ft_tensor b, i32 = make(1, SHAPE(3), FT_INT32);
    CHECK_OK(ft_tensor_borrow(&b, raw, 1, SHAPE(3), SHAPE(1), FT_BOOL, FT_CPU, true, ft_storage_unowned, NULL));
    CHECK_OK(ft_tensor_copy(&i32, &b, false));
    int32_t *o = (int32_t *)ft_tensor_data(&i32);
    CHECK(o[0] == 0 && o[1] == 1 && o[2] == 1);
    ft_tensor_release(&b);
    ft_tensor_release(&i32);

    /* Integers to a narrower unsigned type wrap modulo 2^bits, as in C. */
    int32_t ints[3] = {-1, 256 + 7, -200};
    ft_tensor it, u8 = make(1, SHAPE(3), FT_UINT8);
    CHECK_OK(ft_tensor_borrow(&it, ints, 1, SHAPE(3), SHAPE(1), FT_INT32, FT_CPU, true, ft_storage_unowned, NULL));
    CHECK_OK(ft_tensor_copy(&u8, &it, false));
    uint8_t *u = (uint8_t *)ft_tensor_data(&u8);
    CHECK(u[0] == (uint8_t)-1 && u[1] == 7 && u[2] == (uint8_t)-200);
    ft_tensor_release(&it);
    ft_tensor_release(&u8);

    /* Large int64 and uint64 values to floats: one C conversion. */
    int64_t big[3] = {INT64_MAX, INT64_MIN, (INT64_C(1) << 53) + 1};
    ft_tensor bt, f64 = make(1, SHAPE(3), FT_FLOAT64), f32 = make(1, SHAPE(3), FT_FLOAT32);
    CHECK_OK(ft_tensor_borrow(&bt, big, 1, SHAPE(3), SHAPE(1), FT_INT64, FT_CPU, true, ft_storage_unowned, NULL));
    CHECK_OK(ft_tensor_copy(&f64, &bt, false));
    CHECK_OK(ft_tensor_copy(&f32, &bt, false));
    for (int i = 0; i < 3; i++) {
        CHECK(((double *)ft_tensor_data(&f64))[i] == (double)big[i]);
        CHECK(((float *)ft_tensor_data(&f32))[i] == (float)big[i]);
    }
    ft_tensor_release(&bt);
    ft_tensor_release(&f64);
    ft_tensor_release(&f32);

    /* Complex types copy only to themselves. */
    ft_tensor c64 = make(1, SHAPE(2), FT_COMPLEX64), c64b = make(1, SHAPE(2), FT_COMPLEX64);
    ft_tensor c128 = make(1, SHAPE(2), FT_COMPLEX128), r32 = make(1, SHAPE(2), FT_FLOAT32);
    float cv[4] = {1.5f, -2.0f, 3.0f, 0.25f};
    memcpy(ft_tensor_data(&c64), cv, sizeof cv);
    CHECK_OK(ft_tensor_copy(&c64b, &c64, false));
    CHECK(memcmp(ft_tensor_data(&c64b), cv, sizeof cv) == 0);
    CHECK_STATUS(ft_tensor_copy(&r32, &c64, false), FT_ERR_DTYPE);
    CHECK_STATUS(ft_tensor_copy(&c64, &r32, false), FT_ERR_DTYPE);
    CHECK_STATUS(ft_tensor_copy(&c128, &c64, false), FT_ERR_DTYPE);
    ft_tensor_release(&c64);
    ft_tensor_release(&c64b);
    ft_tensor_release(&c128);
    ft_tensor_release(&r32);

    /* Shapes must match. */
    ft_tensor a3 = make(1, SHAPE(3), FT_FLOAT32), a4 = make(1, SHAPE(4), FT_FLOAT32), a13 = make(2, SHAPE(1, 3), FT_FLOAT32);
    CHECK_STATUS(ft_tensor_copy(&a3, &a4, false), FT_ERR_SHAPE);
    CHECK_STATUS(ft_tensor_copy(&a13, &a3, false), FT_ERR_SHAPE);
    ft_tensor_release(&a3);
    ft_tensor_release(&a4);
    ft_tensor_release(&a13);
}

static ft_tensor iota_i32(int ndim, const int64_t *shape) {
    ft_tensor t = make(ndim, shape, FT_INT32);
    int32_t *p = (int32_t *)ft_tensor_data(&t);
    for (int64_t i = 0; i < ft_tensor_numel(&t); i++)
        p[i] = (int32_t)i;
    return t;
}

static void test_copy_strides(void) {
    ft_tensor src = iota_i32(1, SHAPE(8)), rev, dst = make(1, SHAPE(8), FT_INT32);
    CHECK_OK(ft_tensor_view(&rev, &src, 1, SHAPE(8), SHAPE(-1), 28));
    CHECK_OK(ft_tensor_copy(&dst, &rev, false));
    for (int i = 0; i < 8; i++)
        CHECK(((int32_t *)ft_tensor_data(&dst))[i] == 7 - i);

    /* A reversed destination. */
    ft_tensor dst2 = make(1, SHAPE(8), FT_INT32), drev;
    CHECK_OK(ft_tensor_view(&drev, &dst2, 1, SHAPE(8), SHAPE(-1), 28));
    CHECK_OK(ft_tensor_copy(&drev, &src, false));
    for (int i = 0; i < 8; i++)
        CHECK(((int32_t *)ft_tensor_data(&dst2))[i] == 7 - i);

    /* Reversed with a conversion, every other element. */
    ft_tensor f64 = make(1, SHAPE(4), FT_FLOAT64), rev2;
    CHECK_OK(ft_tensor_view(&rev2, &src, 1, SHAPE(4), SHAPE(-2), 28));
    CHECK_OK(ft_tensor_copy(&f64, &rev2, false));
    for (int i = 0; i < 4; i++)
        CHECK(((double *)ft_tensor_data(&f64))[i] == 7 - 2 * i);

    /* Zero strides broadcast. */
    ft_tensor row, col, b34 = make(2, SHAPE(3, 4), FT_INT32), b43 = make(2, SHAPE(4, 3), FT_FLOAT32);
    CHECK_OK(ft_tensor_view(&row, &src, 2, SHAPE(3, 4), SHAPE(0, 1), 0));
    CHECK_OK(ft_tensor_copy(&b34, &row, false));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            CHECK(((int32_t *)ft_tensor_data(&b34))[i * 4 + j] == j);
    CHECK_OK(ft_tensor_view(&col, &src, 2, SHAPE(4, 3), SHAPE(1, 0), 8));
    CHECK_OK(ft_tensor_copy(&b43, &col, false));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            CHECK(((float *)ft_tensor_data(&b43))[i * 3 + j] == (float)(i + 2));

    /* A transpose, and a 3-d view reversed along two dimensions, to float16. */
    ft_tensor m = iota_i32(2, SHAPE(3, 4)), mt, t43 = make(2, SHAPE(4, 3), FT_INT32);
    CHECK_OK(ft_tensor_view(&mt, &m, 2, SHAPE(4, 3), SHAPE(1, 4), 0));
    CHECK_OK(ft_tensor_copy(&t43, &mt, false));
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            CHECK(((int32_t *)ft_tensor_data(&t43))[a * 3 + b] == b * 4 + a);
    ft_tensor c = iota_i32(3, SHAPE(2, 3, 4)), cv, h = make(3, SHAPE(2, 3, 4), FT_FLOAT16);
    CHECK_OK(ft_tensor_view(&cv, &c, 3, SHAPE(2, 3, 4), SHAPE(-12, 4, -1), 60));
    CHECK_OK(ft_tensor_copy(&h, &cv, false));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                CHECK(((uint16_t *)ft_tensor_data(&h))[(i * 3 + j) * 4 + k] ==
                      half_bits((1 - i) * 12 + j * 4 + (3 - k)));

    ft_tensor *all[] = {&src, &rev, &dst, &dst2, &drev, &f64, &rev2, &row, &col, &b34, &b43, &m, &mt, &t43, &c, &cv, &h};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ft_tensor_release(all[i]);
}

/* Copies between views of one storage give what copying through a
 * temporary gives: the source read completely first. */
static void test_copy_overlap(void) {
    float old[16], *buf;
    for (int i = 0; i < 16; i++)
        old[i] = (float)i;
    ft_tensor base = make(1, SHAPE(16), FT_FLOAT32), a, b;
    buf = (float *)ft_tensor_data(&base);

    CHECK_OK(ft_tensor_view(&a, &base, 1, SHAPE(12), SHAPE(1), 0));
    CHECK_OK(ft_tensor_view(&b, &base, 1, SHAPE(12), SHAPE(1), 16));
    memcpy(buf, old, sizeof old);
    CHECK_OK(ft_tensor_copy(&a, &b, false)); /* buf[0..12) = old[4..16) */
    for (int i = 0; i < 16; i++)
        CHECK(buf[i] == (i < 12 ? old[i + 4] : old[i]));
    memcpy(buf, old, sizeof old);
    CHECK_OK(ft_tensor_copy(&b, &a, false)); /* buf[4..16) = old[0..12) */
    for (int i = 0; i < 16; i++)
        CHECK(buf[i] == (i < 4 ? old[i] : old[i - 4]));
    ft_tensor_release(&a);
    ft_tensor_release(&b);

    /* In-place reversal. */
    CHECK_OK(ft_tensor_view(&a, &base, 1, SHAPE(16), SHAPE(-1), 60));
    memcpy(buf, old, sizeof old);
    CHECK_OK(ft_tensor_copy(&base, &a, false));
    for (int i = 0; i < 16; i++)
        CHECK(buf[i] == old[15 - i]);
    ft_tensor_release(&a);

    /* Strided, shifted by one step: a forward loop would smear old[0]. */
    CHECK_OK(ft_tensor_view(&a, &base, 1, SHAPE(7), SHAPE(2), 0));
    CHECK_OK(ft_tensor_view(&b, &base, 1, SHAPE(7), SHAPE(2), 8));
    memcpy(buf, old, sizeof old);
    CHECK_OK(ft_tensor_copy(&b, &a, false));
    for (int i = 0; i < 16; i++)
        CHECK(buf[i] == (i >= 2 && i % 2 == 0 ? old[i - 2] : old[i]));
    ft_tensor_release(&a);
    ft_tensor_release(&b);

    /* In-place transpose of a 4x4 matrix. */
    CHECK_OK(ft_tensor_view(&a, &base, 2, SHAPE(4, 4), SHAPE(4, 1), 0));
    CHECK_OK(ft_tensor_view(&b, &base, 2, SHAPE(4, 4), SHAPE(1, 4), 0));
    memcpy(buf, old, sizeof old);
    CHECK_OK(ft_tensor_copy(&a, &b, false));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            CHECK(buf[i * 4 + j] == old[j * 4 + i]);
    ft_tensor_release(&a);
    ft_tensor_release(&b);
    ft_tensor_release(&base);
}

/* Two borrowed tensors over overlapping parts of one foreign buffer (as
 * ft.from_numpy(x[:-2]) and ft.from_numpy(x[2:]) give): separate storages,
 * overlapping memory. tensor.h: "Overlapping memory is handled as if src were
 * read completely first." */
static void test_copy_overlap_borrowed(void) {
    float arr[16], old[16];
    for (int i = 0; i < 16; i++)
        arr[i] = old[i] = (float)i;
    ft_tensor a, b;
    CHECK_OK(ft_tensor_borrow(&a, &arr[0], 1, SHAPE(7), SHAPE(2), FT_FLOAT32, FT_CPU, false, ft_storage_unowned, NULL));
    CHECK_OK(ft_tensor_borrow(&b, &arr[2], 1, SHAPE(7), SHAPE(2), FT_FLOAT32, FT_CPU, false, ft_storage_unowned, NULL));
    CHECK_OK(ft_tensor_copy(&b, &a, false)); /* arr[2k+2] = old[2k] */
    int ok = 1;
    for (int i = 0; i < 16; i++)
        ok &= arr[i] == (i >= 2 && i % 2 == 0 ? old[i - 2] : old[i]);
    CHECKF(ok, "copy between borrowed overlapping tensors: got %g %g %g %g %g %g ..., want 0 1 0 3 2 5 ...",
           (double)arr[0], (double)arr[1], (double)arr[2], (double)arr[3], (double)arr[4], (double)arr[5]);
    ft_tensor_release(&a);
    ft_tensor_release(&b);
}

static void test_fill(void) {
    ft_tensor i32 = make(1, SHAPE(10), FT_INT32);
    int32_t *pi = (int32_t *)ft_tensor_data(&i32);
    CHECK_OK(ft_tensor_fill(&i32, (ft_scalar){.kind = FT_SCALAR_INT, .i = 7}));
    for (int i = 0; i < 10; i++)
        CHECK(pi[i] == 7);
    CHECK_OK(ft_tensor_fill(&i32, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = -2.5}));
    for (int i = 0; i < 10; i++)
        CHECK(pi[i] == (int32_t)-2.5);

    /* Only the elements a view addresses. */
    ft_tensor i16 = make(1, SHAPE(10), FT_INT16), every2;
    int16_t *ps = (int16_t *)ft_tensor_data(&i16);
    CHECK_OK(ft_tensor_fill(&i16, (ft_scalar){.kind = FT_SCALAR_INT, .i = 0}));
    CHECK_OK(ft_tensor_view(&every2, &i16, 1, SHAPE(5), SHAPE(2), 2));
    CHECK_OK(ft_tensor_fill(&every2, (ft_scalar){.kind = FT_SCALAR_INT, .i = -3}));
    for (int i = 0; i < 10; i++)
        CHECK(ps[i] == (i % 2 ? -3 : 0));

    ft_tensor h = make(2, SHAPE(2, 3), FT_FLOAT16);
    uint16_t *ph = (uint16_t *)ft_tensor_data(&h);
    CHECK_OK(ft_tensor_fill(&h, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 2.5}));
    for (int i = 0; i < 6; i++)
        CHECK(ph[i] == 0x4100);
    CHECK_OK(ft_tensor_fill(&h, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0.1}));
    CHECK(ph[5] == 0x2e66);
    CHECK_OK(ft_tensor_fill(&h, (ft_scalar){.kind = FT_SCALAR_INT, .i = 100000}));
    CHECK(ph[0] == 0x7c00);

    ft_tensor bf = make(1, SHAPE(3), FT_BFLOAT16);
    CHECK_OK(ft_tensor_fill(&bf, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = -1.0}));
    CHECK(((uint16_t *)ft_tensor_data(&bf))[2] == 0xbf80);

    ft_tensor u64 = make(1, SHAPE(2), FT_UINT64), f64 = make(1, SHAPE(2), FT_FLOAT64);
    uint64_t big = (UINT64_C(1) << 63) + 1;
    CHECK_OK(ft_tensor_fill(&u64, (ft_scalar){.kind = FT_SCALAR_UINT, .u = big}));
    CHECK(((uint64_t *)ft_tensor_data(&u64))[1] == big);
    CHECK_OK(ft_tensor_fill(&f64, (ft_scalar){.kind = FT_SCALAR_UINT, .u = big}));
    CHECK(((double *)ft_tensor_data(&f64))[1] == (double)big);
    CHECK_OK(ft_tensor_fill(&f64, (ft_scalar){.kind = FT_SCALAR_INT, .i = INT64_MIN}));
    CHECK(((double *)ft_tensor_data(&f64))[0] == -0x1p63);

    ft_tensor bl = make(1, SHAPE(2), FT_BOOL);
    CHECK_OK(ft_tensor_fill(&bl, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 0.0}));
    CHECK(((uint8_t *)ft_tensor_data(&bl))[0] == 0);
    CHECK_OK(ft_tensor_fill(&bl, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = NAN}));
    CHECK(((uint8_t *)ft_tensor_data(&bl))[1] == (_Bool)NAN);
    CHECK_OK(ft_tensor_fill(&bl, (ft_scalar){.kind = FT_SCALAR_INT, .i = -5}));
    CHECK(((uint8_t *)ft_tensor_data(&bl))[1] == 1);

    ft_tensor empty = make(2, SHAPE(0, 4), FT_FLOAT32);
    CHECK_OK(ft_tensor_fill(&empty, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 1.0}));

    ft_tensor *all[] = {&i32, &i16, &every2, &h, &bf, &u64, &f64, &bl, &empty};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ft_tensor_release(all[i]);
}

static void test_readonly(void) {
    float ro_data[4] = {1, 2, 3, 4};
    ft_tensor ro, src = make(1, SHAPE(4), FT_FLOAT32), dst = make(1, SHAPE(4), FT_FLOAT32), v;
    CHECK_OK(ft_tensor_borrow(&ro, ro_data, 1, SHAPE(4), SHAPE(1), FT_FLOAT32, FT_CPU, true, ft_storage_unowned,
                              NULL));
    CHECK_OK(ft_tensor_fill(&src, (ft_scalar){.kind = FT_SCALAR_FLOAT, .f = 9.0}));
    CHECK_STATUS(ft_tensor_copy(&ro, &src, false), FT_ERR_READONLY);
    CHECK(ft_last_error()[0] != '\0');
    CHECK_STATUS(ft_tensor_fill(&ro, (ft_scalar){.kind = FT_SCALAR_INT, .i = 0}), FT_ERR_READONLY);
    CHECK_STATUS(ft_tensor_check_writable(&ro, "test"), FT_ERR_READONLY);
    CHECK_OK(ft_tensor_view(&v, &ro, 1, SHAPE(2), SHAPE(2), 0));
    CHECK_STATUS(ft_tensor_fill(&v, (ft_scalar){.kind = FT_SCALAR_INT, .i = 0}), FT_ERR_READONLY);
    CHECK(ro_data[0] == 1 && ro_data[1] == 2 && ro_data[2] == 3 && ro_data[3] == 4);
    /* Reading is fine. */
    CHECK_OK(ft_tensor_copy(&dst, &ro, false));
    CHECK(memcmp(ft_tensor_data(&dst), ro_data, sizeof ro_data) == 0);
    CHECK_OK(ft_tensor_check_writable(&dst, "test"));

    /* A writable borrow writes through to the owner's memory. */
    float rw_data[4] = {0};
    ft_tensor rw;
    CHECK_OK(ft_tensor_borrow(&rw, rw_data, 1, SHAPE(4), SHAPE(1), FT_FLOAT32, FT_CPU, false, ft_storage_unowned,
                              NULL));
    CHECK_OK(ft_tensor_copy(&rw, &ro, false));
    CHECK(rw_data[0] == 1 && rw_data[3] == 4);

    ft_tensor *all[] = {&ro, &src, &dst, &v, &rw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ft_tensor_release(all[i]);
}

typedef struct {
    int calls;
} owner_t;

static void count_release(void *owner) { ((owner_t *)owner)->calls++; }

static void test_borrow(void) {
    int32_t arr[6] = {0, 1, 2, 3, 4, 5};
    owner_t owner = {0};
    ft_tensor t, t2, v;
    CHECK_OK(ft_tensor_borrow(&t, arr, 2, SHAPE(2, 3), SHAPE(3, 1), FT_INT32, FT_CPU, false, count_release, &owner));
    CHECK(ft_tensor_data(&t) == (char *)arr && t.storage->nbytes == sizeof arr && !t.storage->readonly);
    ft_tensor_share(&t2, &t);
    CHECK_OK(ft_tensor_view(&v, &t, 1, SHAPE(3), SHAPE(1), 12));
    CHECK(*(int32_t *)ft_tensor_data(&v) == 3);
    ft_tensor_release(&t);
    ft_tensor_release(&t2);
    CHECK(owner.calls == 0);
    ft_tensor_release(&v);
    CHECK(owner.calls == 1);

    /* Negative strides: the storage spans the bytes the strides reach, and
     * element (0, 0) is at the pointer given. */
    owner = (owner_t){0};
    CHECK_OK(ft_tensor_borrow(&t, &arr[5], 2, SHAPE(2, 3), SHAPE(-3, -1), FT_INT32, FT_CPU, true, count_release,
                              &owner));
    CHECK(t.storage->data == (void *)arr && t.storage->nbytes == sizeof arr && t.offset == 20);
    CHECK(ft_tensor_data(&t) == (char *)&arr[5] && t.storage->readonly);
    ft_tensor c = make(2, SHAPE(2, 3), FT_INT32);
    CHECK_OK(ft_tensor_copy(&c, &t, false));
    for (int i = 0; i < 6; i++)
        CHECK(((int32_t *)ft_tensor_data(&c))[i] == 5 - i);
    ft_tensor_release(&c);
    ft_tensor_release(&t);
    CHECK(owner.calls == 1);

    /* Zero-size and broadcast borrows. */
    owner = (owner_t){0};
    CHECK_OK(ft_tensor_borrow(&t, arr, 1, SHAPE(0), SHAPE(1), FT_INT32, FT_CPU, false, count_release, &owner));
    ft_tensor_release(&t);
    CHECK_OK(ft_tensor_borrow(&t, arr, 1, SHAPE(5), SHAPE(0), FT_INT32, FT_CPU, false, count_release, &owner));
    CHECK(t.storage->nbytes == 4);
    ft_tensor_release(&t);
    CHECK(owner.calls == 2);

    /* On failure nothing is taken: release is not called. */
    owner = (owner_t){0};
    CHECK_STATUS(ft_tensor_borrow(&t, arr, 1, SHAPE(-1), SHAPE(1), FT_INT32, FT_CPU, false, count_release, &owner),
                 FT_ERR_VALUE);
    CHECK_STATUS(ft_tensor_borrow(&t, arr, 2, SHAPE(INT64_C(1) << 62, 4), SHAPE(4, 1), FT_INT32, FT_CPU, false,
                                  count_release, &owner),
                 FT_ERR_OVERFLOW);
    CHECK_STATUS(ft_tensor_borrow(&t, arr, 1, SHAPE(2), SHAPE(INT64_MAX / 2), FT_INT32, FT_CPU, false, count_release,
                                  &owner),
                 FT_ERR_SHAPE);
    CHECK(owner.calls == 0);
}

/* Copies of several MiB run split over the thread pool: 1 and 2 threads
 * give the same bytes, and the bytes C computes. */
static void large_copy(ft_tensor *out, const ft_tensor *src, ft_dtype dt, int threads) {
    omp_set_num_threads(threads);
    CHECK(omp_get_max_threads() == threads);
    *out = make(src->ndim, src->shape, dt);
    CHECK_OK(ft_tensor_copy(out, src, false));
}

static void test_large_copies(void) {
    enum { N = 1024 };
    /* float32 [N][N] (4 MiB), transposed, to float16 (2 MiB). */
    ft_tensor m = make(2, SHAPE(N, N), FT_FLOAT32), mt, h1, h2;
    float *pm = (float *)ft_tensor_data(&m);
    for (int i = 0; i < N * N; i++)
        pm[i] = (float)(i % 2048 - 1024);
    CHECK_OK(ft_tensor_view(&mt, &m, 2, SHAPE(N, N), SHAPE(1, N), 0));
    large_copy(&h1, &mt, FT_FLOAT16, 1);
    large_copy(&h2, &mt, FT_FLOAT16, 2);
    CHECK(memcmp(ft_tensor_data(&h1), ft_tensor_data(&h2), (size_t)N * N * 2) == 0);
    int bad = 0;
    for (int a = 0; a < N && bad < 5; a++)
        for (int b = 0; b < N && bad < 5; b++) {
            uint16_t got = ((uint16_t *)ft_tensor_data(&h2))[a * N + b], want = half_bits((b * N + a) % 2048 - 1024);
            CHECKF(got == want, "[%d][%d]: 0x%04x, want 0x%04x", a, b, got, want);
            bad += got != want;
        }

    /* int64, 3 MiB, reversed, same dtype. */
    int64_t n = 3 << 17;
    ft_tensor v = make(1, &n, FT_INT64), vr, r1, r2;
    for (int64_t i = 0; i < n; i++)
        ((int64_t *)ft_tensor_data(&v))[i] = i * 7919 - 12345;
    CHECK_OK(ft_tensor_view(&vr, &v, 1, &n, SHAPE(-1), (n - 1) * 8));
    large_copy(&r1, &vr, FT_INT64, 1);
    large_copy(&r2, &vr, FT_INT64, 2);
    CHECK(memcmp(ft_tensor_data(&r1), ft_tensor_data(&r2), (size_t)n * 8) == 0);
    bad = 0;
    for (int64_t i = 0; i < n && bad < 5; i++) {
        int64_t got = ((int64_t *)ft_tensor_data(&r2))[i];
        CHECKF(got == (n - 1 - i) * 7919 - 12345, "element %lld", (long long)i);
        bad += got != (n - 1 - i) * 7919 - 12345;
    }

    /* float64 (8 MiB) to int32 (4 MiB), contiguous: truncation toward zero. */
    int64_t nf = 1 << 20;
    ft_tensor f = make(1, &nf, FT_FLOAT64), i1, i2;
    for (int64_t i = 0; i < nf; i++)
        ((double *)ft_tensor_data(&f))[i] = (double)(i - nf / 2) * 0.75;
    large_copy(&i1, &f, FT_INT32, 1);
    large_copy(&i2, &f, FT_INT32, 2);
    CHECK(memcmp(ft_tensor_data(&i1), ft_tensor_data(&i2), (size_t)nf * 4) == 0);
    bad = 0;
    for (int64_t i = 0; i < nf && bad < 5; i++) {
        int32_t got = ((int32_t *)ft_tensor_data(&i2))[i], want = (int32_t)((double)(i - nf / 2) * 0.75);
        CHECKF(got == want, "element %lld: %d, want %d", (long long)i, got, want);
        bad += got != want;
    }

    /* An overlapping large copy takes the temporary and then the parallel path. */
    ft_tensor s1, s2;
    int64_t half = n / 2;
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)ft_tensor_data(&v))[i] = i;
        CHECK_OK(ft_tensor_view(&s1, &v, 1, &half, SHAPE(1), 0));
        CHECK_OK(ft_tensor_view(&s2, &v, 1, &half, SHAPE(1), 8 * 1000));
        CHECK_OK(ft_tensor_copy(&s2, &s1, false));
        bad = 0;
        for (int64_t i = 0; i < n && bad < 5; i++) {
            int64_t want = i >= 1000 && i < 1000 + half ? i - 1000 : i;
            CHECKF(((int64_t *)ft_tensor_data(&v))[i] == want, "%d threads, element %lld", threads, (long long)i);
            bad += ((int64_t *)ft_tensor_data(&v))[i] != want;
        }
        ft_tensor_release(&s1);
        ft_tensor_release(&s2);
    }

    ft_tensor *all[] = {&m, &mt, &h1, &h2, &v, &vr, &r1, &r2, &f, &i1, &i2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ft_tensor_release(all[i]);
}

int main(void) {
    /* First, before the thread pool exists: these may abort under UBSan. */
    isolated(view_extent_overflow, "view_extent_overflow");
    isolated(borrow_extent_overflow, "borrow_extent_overflow");
    isolated(empty_zero_size_huge_dims, "empty_zero_size_huge_dims");
    test_empty();
    test_view_bounds();
    test_copy_all_dtypes();
    test_copy_strides();
    test_copy_overlap();
    test_copy_overlap_borrowed();
    test_fill();
    test_readonly();
    test_borrow();
    test_large_copies();
    return check_main_result("test_tensor");
}
