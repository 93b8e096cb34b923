#include "core/storage.h"

#include <stdlib.h>

static ft_mem_pool pool_of(ft_device device, bool pinned) {
    if (device.type == FT_DEV_CUDA)
        return (ft_mem_pool){FT_MEM_CUDA, device.index};
    return (ft_mem_pool){pinned ? FT_MEM_PINNED : FT_MEM_HOST, 0};
}

ft_status ft_storage_new(ft_storage **out, size_t nbytes, ft_device device, bool pinned) {
    ft_storage *s = calloc(1, sizeof *s);
    if (!s)
        return ft_fail(FT_ERR_NOMEM, "out of memory allocating a storage");
    ft_status st = ft_alloc(&s->data, &s->granted, nbytes, pool_of(device, pinned));
    if (st != FT_OK) {
        free(s);
        return st;
    }
    atomic_init(&s->refcount, 1);
    s->nbytes = nbytes;
    s->device = device;
    s->pinned = pinned;
    *out = s;
    return FT_OK;
}

ft_status ft_storage_borrow(ft_storage **out, void *data, size_t nbytes, ft_device device, bool readonly,
                            void (*release)(void *owner), void *owner) {
    ft_storage *s = calloc(1, sizeof *s);
    if (!s)
        return ft_fail(FT_ERR_NOMEM, "out of memory allocating a storage");
    atomic_init(&s->refcount, 1);
    s->data = data;
    s->nbytes = nbytes;
    s->device = device;
    s->readonly = readonly;
    s->release = release;
    s->owner = owner;
    *out = s;
    return FT_OK;
}

void ft_storage_unowned(void *owner) { (void)owner; }

void ft_storage_retain(ft_storage *s) { atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed); }

void ft_storage_release(ft_storage *s) {
    if (!s || atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1)
        return;
    if (s->release)
        s->release(s->owner);
    else
        ft_free(s->data, s->granted, pool_of(s->device, s->pinned));
    free(s);
}
