#include "core/cuda.h"

#include "core/alloc.h"
#include "core/settings.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define DRIVER_LIBRARY "libcuda.so.1"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool load_started;
static char library[4096];
static const ft_cuda_api *api;
static int device_count;
static char reason[sizeof library + FT_ERROR_LEN];

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

void ft_cuda_set_library(const char *path) {
    pthread_mutex_lock(&lock);
    if (!load_started && !library[0])
        snprintf(library, sizeof library, "%s", path);
    pthread_mutex_unlock(&lock);
}

/* Runs once, on the first thread that asks; the others wait in pthread_once,
 * and its writes are visible to every caller after it returns. */
static void load(void) {
    pthread_mutex_lock(&lock);
    load_started = true;
    pthread_mutex_unlock(&lock);
    if (!library[0]) {
        snprintf(reason, sizeof reason,
                 "this fasttrain build has no CUDA backend (nvcc or cuDNN was not found, or FASTTRAIN_CUDA=0)");
        return;
    }
    /* The runtime finds the driver by this very dlopen and gives up without
     * it; asking first spares a machine without a driver the mapping of
     * cudart, cuBLAS and cuDNN (about 150 MB) for an answer known already.
     * The handle stays open for the runtime's own dlopen. */
    if (!dlopen(DRIVER_LIBRARY, RTLD_LAZY | RTLD_LOCAL)) {
        snprintf(reason, sizeof reason, "no CUDA driver is installed: %s", dlerror());
        return;
    }
    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(reason, sizeof reason, "cannot load the CUDA backend: %s", dlerror());
        return;
    }
    ft_cuda_open_fn open_fn = (ft_cuda_open_fn)dlsym(lib, FT_CUDA_OPEN_SYMBOL);
    const ft_cuda_api *candidate = open_fn ? open_fn(&host) : NULL;
    if (!candidate || candidate->abi != FT_CUDA_ABI) {
        snprintf(reason, sizeof reason, "%s is not a fasttrain CUDA backend of ABI %d", library, FT_CUDA_ABI);
        return;
    }
    int n = 0;
    if (candidate->device_count(&n) != FT_OK) {
        snprintf(reason, sizeof reason, "no usable CUDA device: %s", ft_last_error());
        return;
    }
    if (n <= 0) {
        snprintf(reason, sizeof reason, "the CUDA runtime found no device");
        return;
    }
    device_count = n < FT_MAX_CUDA_DEVICES ? n : FT_MAX_CUDA_DEVICES;
    api = candidate;
}

const ft_cuda_api *ft_cuda(void) {
    pthread_once(&load_once, load);
    return api;
}

const struct ft_cuda_ops *ft_cuda_op_table(void) { return ft_cuda() ? api->ops : NULL; }

const char *ft_cuda_unavailable_reason(void) { return ft_cuda() ? "" : reason; }

int ft_cuda_device_count(void) { return ft_cuda() ? device_count : 0; }

ft_status ft_cuda_check_device(int index) {
    if (!ft_cuda())
        return ft_fail(FT_ERR_DEVICE, "CUDA is not available: %s", reason);
    if (index < 0 || index >= device_count)
        return ft_fail(FT_ERR_DEVICE, "cuda:%d does not exist: this machine has %d CUDA device(s)", index,
                       device_count);
    return FT_OK;
}

ft_status ft_cuda_copy_async(void *dst, const void *src, size_t nbytes, int device) {
    FT_TRY(ft_cuda_check_device(device));
    pthread_mutex_lock(&lock);
    ft_status st = copy_streams[device] ? FT_OK : api->stream_create(&copy_streams[device], device);
    pthread_mutex_unlock(&lock);
    FT_TRY(st);
    void *queued, *done;
    FT_TRY(api->event_create(&queued, device));
    st = api->event_create(&done, device);
    if (st != FT_OK) {
        api->event_destroy(queued);
        return st;
    }
    st = api->event_record(queued, NULL, device);
    if (st == FT_OK)
        st = api->stream_wait_event(copy_streams[device], queued);
    if (st == FT_OK)
        st = api->memcpy(dst, src, nbytes, device, copy_streams[device]);
    if (st == FT_OK)
        st = api->event_record(done, copy_streams[device], device);
    if (st == FT_OK)
        st = api->stream_wait_event(NULL, done);
    /* CUDA frees the events once the waits on them have passed */
    api->event_destroy(queued);
    api->event_destroy(done);
    return st;
}
