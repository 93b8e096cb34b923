#include "core/cuda.h"

#include "core/alloc.h"
#include "core/settings.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static bool load_tried;
static const ft_cuda_api *api;
static int device_count;
static char reason[512] = "the CUDA backend has not been loaded";

static void *copy_streams[FT_MAX_CUDA_DEVICES];

static ft_status device_alloc(void **ptr, size_t *granted, size_t nbytes, int device) {
    return ft_alloc(ptr, granted, nbytes, (ft_mem_pool){FT_MEM_CUDA, device});
}

static void device_free(void *ptr, size_t granted, int device) {
    ft_free(ptr, granted, (ft_mem_pool){FT_MEM_CUDA, device});
}

static const ft_cuda_host host = {.fail = ft_fail,
                                  .alloc = device_alloc,
                                  .free = device_free,
                                  .deterministic = ft_deterministic,
                                  .benchmark = ft_benchmark,
                                  .allow_tf32 = ft_allow_tf32};

ft_status ft_cuda_load(const char *path) {
    pthread_mutex_lock(&load_lock);
    if (load_tried)
        goto done;
    load_tried = true;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(reason, sizeof reason, "cannot load the CUDA backend: %s", dlerror());
        goto done;
    }
    ft_cuda_open_fn open_fn = (ft_cuda_open_fn)dlsym(lib, FT_CUDA_OPEN_SYMBOL);
    const ft_cuda_api *candidate = open_fn ? open_fn(&host) : NULL;
    if (!candidate || candidate->abi != FT_CUDA_ABI) {
        snprintf(reason, sizeof reason, "%s is not a fasttrain CUDA backend of ABI %d", path, FT_CUDA_ABI);
        goto done;
    }
    int n = 0;
    if (candidate->device_count(&n) != FT_OK) {
        snprintf(reason, sizeof reason, "no usable CUDA device: %s", ft_last_error());
        goto done;
    }
    if (n <= 0) {
        snprintf(reason, sizeof reason, "the CUDA runtime found no device");
        goto done;
    }
    device_count = n < FT_MAX_CUDA_DEVICES ? n : FT_MAX_CUDA_DEVICES;
    api = candidate;
    reason[0] = '\0';
done:
    pthread_mutex_unlock(&load_lock);
    return FT_OK;
}

const ft_cuda_api *ft_cuda(void) { return api; }

const struct ft_cuda_ops *ft_cuda_op_table(void) { return api ? api->ops : NULL; }

const char *ft_cuda_unavailable_reason(void) { return reason; }

int ft_cuda_device_count(void) { return device_count; }

ft_status ft_cuda_check_device(int index) {
    if (!api)
        return ft_fail(FT_ERR_DEVICE, "CUDA is not available: %s", reason);
    if (index < 0 || index >= device_count)
        return ft_fail(FT_ERR_DEVICE, "cuda:%d does not exist: this machine has %d CUDA device(s)", index,
                       device_count);
    return FT_OK;
}

ft_status ft_cuda_copy_async(void *dst, const void *src, size_t nbytes, int device) {
    FT_TRY(ft_cuda_check_device(device));
    pthread_mutex_lock(&load_lock);
    ft_status st = copy_streams[device] ? FT_OK : api->stream_create(&copy_streams[device], device);
    pthread_mutex_unlock(&load_lock);
    FT_TRY(st);
    void *queued, *done;
    FT_TRY(api->event_create(&queued, device));
    st = api->event_create(&done, device);
    if (st != FT_OK) {
        api->event_destroy(queued);
        return st;
    }
    st = api->event_record(queued, NULL);
    if (st == FT_OK)
        st = api->stream_wait_event(copy_streams[device], queued);
    if (st == FT_OK)
        st = api->memcpy(dst, src, nbytes, device, copy_streams[device]);
    if (st == FT_OK)
        st = api->event_record(done, copy_streams[device]);
    if (st == FT_OK)
        st = api->stream_wait_event(NULL, done);
    /* CUDA frees the events once the waits on them have passed */
    api->event_destroy(queued);
    api->event_destroy(done);
    return st;
}
