/* Devices, with DLPack's device type codes. */
#ifndef FT_CORE_DEVICE_H
#define FT_CORE_DEVICE_H

#include <stdbool.h>

enum { FT_DEV_CPU = 1, FT_DEV_CUDA = 2, FT_DEV_CUDA_HOST = 3 };

#define FT_MAX_CUDA_DEVICES 16

/* Most dimensions a tensor may have. */
#define FT_MAX_DIMS 16

typedef struct {
    int type;  /* FT_DEV_CPU or FT_DEV_CUDA */
    int index; /* 0 for the CPU */
} ft_device;

static inline bool ft_device_eq(ft_device a, ft_device b) { return a.type == b.type && a.index == b.index; }

static const ft_device FT_CPU = {FT_DEV_CPU, 0};

#endif
