/* The DLPack 1.x ABI (https://dmlc.github.io/dlpack/latest/c_api.html):
 * the structs a producer and a consumer exchange through a PyCapsule. */
#ifndef FT_BIND_DLPACK_H
#define FT_BIND_DLPACK_H

#include <stdint.h>

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1

#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct {
    int32_t device_type; /* kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, ... */
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;   /* (ndim,) */
    int64_t *strides; /* (ndim,) in elements; NULL means C-contiguous */
    uint64_t byte_offset;
} DLTensor;

/* The legacy (pre-1.0) managed tensor, in capsules named "dltensor". */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* The 1.x managed tensor, in capsules named "dltensor_versioned". */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif
