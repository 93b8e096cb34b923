/* Refcounted memory shared by tensors.
 *
 * A storage either owns a block from ft_alloc or borrows memory from a
 * foreign owner (a NumPy array, a DLPack producer); `release` is then called
 * once, when the last reference goes, from whatever thread drops it. */
#ifndef FT_CORE_STORAGE_H
#define FT_CORE_STORAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/device.h"
#include "core/status.h"

typedef struct ft_storage {
    atomic_long refcount;
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
