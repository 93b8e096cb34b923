/* Element types. Each carries its DLPack (code, bits) pair so that the bridge
 * and the DLPack exporter translate without a second table.
 *
 * Complex types are storage-only: they can be shared, viewed, copied and
 * exported, but not cast to or from another type. */
#ifndef FT_CORE_DTYPE_H
#define FT_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* DLPack's DLDataTypeCode values. */
enum { FT_DL_INT = 0, FT_DL_UINT = 1, FT_DL_FLOAT = 2, FT_DL_BFLOAT = 4, FT_DL_COMPLEX = 5, FT_DL_BOOL = 6 };

/* The order is the promotion order inside each kind (see ft_dtype_promote). */
#define FT_FOR_EACH_DTYPE(X)                                   \
    X(BOOL, bool, FT_DL_BOOL, 8)                               \
    X(UINT8, uint8, FT_DL_UINT, 8)                             \
    X(INT8, int8, FT_DL_INT, 8)                                \
    X(INT16, int16, FT_DL_INT, 16)                             \
    X(INT32, int32, FT_DL_INT, 32)                             \
    X(INT64, int64, FT_DL_INT, 64)                             \
    X(UINT16, uint16, FT_DL_UINT, 16)                          \
    X(UINT32, uint32, FT_DL_UINT, 32)                          \
    X(UINT64, uint64, FT_DL_UINT, 64)                          \
    X(FLOAT16, float16, FT_DL_FLOAT, 16)                       \
    X(BFLOAT16, bfloat16, FT_DL_BFLOAT, 16)                    \
    X(FLOAT32, float32, FT_DL_FLOAT, 32)                       \
    X(FLOAT64, float64, FT_DL_FLOAT, 64)                       \
    X(COMPLEX64, complex64, FT_DL_COMPLEX, 64)                 \
    X(COMPLEX128, complex128, FT_DL_COMPLEX, 128)

typedef enum {
#define FT_DTYPE_ENUM(id, name, code, bits) FT_##id,
    FT_FOR_EACH_DTYPE(FT_DTYPE_ENUM)
#undef FT_DTYPE_ENUM
    FT_NUM_DTYPES
} ft_dtype;

typedef struct {
    const char *name; /* "float32" */
    uint8_t dl_code;  /* DLPack type code */
    uint8_t bits;
    size_t itemsize;
} ft_dtype_info;

const ft_dtype_info *ft_dtype_get(ft_dtype dt);
bool ft_dtype_valid(int dt);
bool ft_dtype_is_float(ft_dtype dt);   /* float16, bfloat16, float32, float64 */
bool ft_dtype_is_complex(ft_dtype dt);

/* The dtype of a DLPack (code, bits, lanes) triple, or FT_ERR_DTYPE. */
ft_status ft_dtype_from_dlpack(ft_dtype *out, int code, int bits, int lanes);

/* The smallest dtype that holds values of both, as torch.promote_types
 * (uint8 with int8 gives int16; unsigned 16-64 bit with signed give the next
 * signed size, uint64 with a signed type gives float64 like NumPy). */
ft_dtype ft_dtype_promote(ft_dtype a, ft_dtype b);

#endif
