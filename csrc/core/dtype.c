#include "core/dtype.h"

static const ft_dtype_info dtype_table[FT_NUM_DTYPES] = {
#define FT_DTYPE_INFO(id, nm, code, nbits) {.name = #nm, .dl_code = code, .bits = nbits, .itemsize = (nbits + 7) / 8},
    FT_FOR_EACH_DTYPE(FT_DTYPE_INFO)
#undef FT_DTYPE_INFO
};

bool ft_dtype_valid(int dt) { return dt >= 0 && dt < FT_NUM_DTYPES; }

const ft_dtype_info *ft_dtype_get(ft_dtype dt) { return &dtype_table[dt]; }

bool ft_dtype_is_float(ft_dtype dt) {
    return dt == FT_FLOAT16 || dt == FT_BFLOAT16 || dt == FT_FLOAT32 || dt == FT_FLOAT64;
}

bool ft_dtype_is_complex(ft_dtype dt) { return dt == FT_COMPLEX64 || dt == FT_COMPLEX128; }

ft_status ft_dtype_from_dlpack(ft_dtype *out, int code, int bits, int lanes) {
    if (lanes == 1) {
        for (int i = 0; i < FT_NUM_DTYPES; i++) {
            if (dtype_table[i].dl_code == code && dtype_table[i].bits == bits) {
                *out = (ft_dtype)i;
                return FT_OK;
            }
        }
    }
    return ft_fail(FT_ERR_DTYPE, "DLPack dtype (code=%d, bits=%d, lanes=%d) is not supported by fasttrain",
                   code, bits, lanes);
}

/* Kinds in promotion order: a value of a lower kind always fits a higher one. */
enum { KIND_BOOL, KIND_INT, KIND_FLOAT, KIND_COMPLEX };

static int kind_of(ft_dtype dt) {
    switch (dtype_table[dt].dl_code) {
    case FT_DL_BOOL: return KIND_BOOL;
    case FT_DL_INT:
    case FT_DL_UINT: return KIND_INT;
    case FT_DL_COMPLEX: return KIND_COMPLEX;
    default: return KIND_FLOAT;
    }
}

static ft_dtype signed_of_bits(int bits) {
    return bits <= 8 ? FT_INT8 : bits <= 16 ? FT_INT16 : bits <= 32 ? FT_INT32 : FT_INT64;
}

ft_dtype ft_dtype_promote(ft_dtype a, ft_dtype b) {
    if (a == b)
        return a;
    int ka = kind_of(a), kb = kind_of(b);
    if (ka != kb) {
        /* The higher kind wins; an integer joins complex as complex64. */
        return ka > kb ? a : b;
    }
    const ft_dtype_info *ia = &dtype_table[a], *ib = &dtype_table[b];
    switch (ka) {
    case KIND_INT: {
        if (ia->dl_code == ib->dl_code)
            return ia->bits >= ib->bits ? a : b;
        const ft_dtype_info *u = ia->dl_code == FT_DL_UINT ? ia : ib;
        const ft_dtype_info *s = ia->dl_code == FT_DL_UINT ? ib : ia;
        if (s->bits > u->bits)
            return s == ia ? a : b;
        return u->bits < 64 ? signed_of_bits(u->bits * 2) : FT_FLOAT64;
    }
    case KIND_FLOAT:
        /* float16 with bfloat16 has no exact common 16-bit type. */
        if (ia->bits == 16 && ib->bits == 16)
            return FT_FLOAT32;
        return ia->bits >= ib->bits ? a : b;
    default:
        return ia->bits >= ib->bits ? a : b;
    }
}
