/* Refcounted memory shared by tensors.
 *
 * A storage either owns a block from ft_alloc or borrows memory from a
 * foreign owner (a NumPy array, a DLPack producer); `release` is then called
 * once, when the last reference goes, from whatever thread drops it. */
#ifndef FT_CORE_STORAGE_H
#define FT_CORE_STORAGE_H

#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <stdbool.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
/* The CUDA backend (C++) reads storages but never counts references. */
typedef long ft_refcount;
#else
typedef atomic_long ft_refcount;
_Static_assert(sizeof(atomic_long) == sizeof(long) && _Alignof(atomic_long) == _Alignof(long),
               "the C++ view of ft_storage needs atomic_long to have long's layout");
#endif

typedef struct ft_storage {
    ft_refcount refcount;
    void *data;
    size_t nbytes;
    ft_device device;
    bool pinned;   /* page-locked host memory */
    bool readonly; /* writes through any view are refused */
    size_t granted;            /* for owned memory: the size ft_alloc gave */
    void (*release)(void *owner); /* NULL for owned memory */
    void *owner;
} ft_storage;

ft_status ft_storage_new(ft_storage **out, size_t nbytes, ft_device device, bool pinned);

/* Wraps foreign memory. On failure nothing is taken: the caller still owns `owner`. */
ft_status ft_storage_borrow(ft_storage **out, void *data, size_t nbytes, ft_device device, bool readonly,
                            void (*release)(void *owner), void *owner);

/* A `release` for memory that outlives every use of the storage (a caller's
 * stack buffer during one synchronous call). */
void ft_storage_unowned(void *owner);

void ft_storage_retain(ft_storage *s);
void ft_storage_release(ft_storage *s);

#endif
