/* The CUDA runtime side of the backend: devices, memory, streams, events.
 *
 * Each function is a thin checked wrapper over one or two CUDA runtime calls.
 * Functions that take a device make it current first, because the runtime
 * resolves allocations, the NULL stream and new streams and events against
 * the calling thread's current device. */
#include <stdarg.h>
#include <stdio.h>

#include "backend.h"
#include "ops/cuda_ops.h"

/* Set once by ft_cuda_open, which the core calls before anything else. */
static const ft_cuda_host *host;

ft_status ft_cuda_fail(ft_status status, const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return host->fail(status, "%s", message);
}

ft_status ft_cuda_check(cudaError_t err, const char *what) {
    if (err == cudaSuccess)
        return FT_OK;
    /* Reported now: clear the thread's last-error slot so that the check of
     * a later kernel launch sees only that launch (sticky errors stay). */
    (void)cudaGetLastError();
    ft_status status = err == cudaErrorMemoryAllocation ? FT_ERR_NOMEM : FT_ERR_CUDA;
    return ft_cuda_fail(status, "%s failed: %s", what, cudaGetErrorString(err));
}

static ft_status set_device(int device) { return ft_cuda_check(cudaSetDevice(device), "cudaSetDevice"); }

bool ft_cuda_deterministic(void) { return host->deterministic(); }

bool ft_cuda_benchmark(void) { return host->benchmark(); }

bool ft_cuda_allow_tf32(void) { return host->allow_tf32(); }

ft_status ft_cuda_use_device(const ft_tensor *t) { return set_device(ft_tensor_device(t).index); }

ft_status ft_cuda_scratch_alloc(ft_cuda_scratch *s, size_t nbytes, int device) {
    s->device = device;
    /* The allocator's address for zero bytes is a host one; the libraries
     * check a workspace's alignment even when it is empty, and take NULL. */
    if (nbytes == 0) {
        s->ptr = NULL, s->granted = 0;
        return FT_OK;
    }
    return host->alloc(&s->ptr, &s->granted, nbytes, device);
}

void ft_cuda_scratch_free(ft_cuda_scratch *s) {
    if (s->ptr)
        host->free(s->ptr, s->granted, s->device);
    s->ptr = NULL;
}

static ft_status rt_device_count(int *count) {
    *count = 0;
    cudaError_t err = cudaGetDeviceCount(count);
    /* The runtime says "driver version is insufficient" both for an old
     * driver and for none at all; this message is what a user without CUDA
     * reads from ft.cuda.is_available()'s reason, so tell the two apart. */
    int driver = 0, runtime = 0;
    if (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess &&
        cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
        if (driver == 0)
            return ft_cuda_fail(FT_ERR_CUDA, "cudaGetDeviceCount failed: %s (no CUDA driver is installed)",
                                cudaGetErrorString(err));
        return ft_cuda_fail(FT_ERR_CUDA, "cudaGetDeviceCount failed: %s (the driver supports CUDA %d.%d, this "
                            "backend needs %d.%d)", cudaGetErrorString(err), driver / 1000, driver % 1000 / 10,
                            runtime / 1000, runtime % 1000 / 10);
    }
    return ft_cuda_check(err, "cudaGetDeviceCount");
}

static ft_status rt_device_props(int device, char *name, size_t len, int *major, int *minor) {
    cudaDeviceProp prop;
    FT_TRY(ft_cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
    if (len > 0)
        snprintf(name, len, "%s", prop.name);
    *major = prop.major, *minor = prop.minor;
    return FT_OK;
}

static ft_status rt_malloc(void **ptr, size_t nbytes, int device) {
    *ptr = NULL;
    FT_TRY(set_device(device));
    return ft_cuda_check(cudaMalloc(ptr, nbytes), "cudaMalloc");
}

static ft_status rt_free(void *ptr, int device) {
    /* Like free(NULL): a no-op that must not initialise a CUDA context. */
    if (!ptr)
        return FT_OK;
    FT_TRY(set_device(device));
    return ft_cuda_check(cudaFree(ptr), "cudaFree");
}

static ft_status rt_host_alloc(void **ptr, size_t nbytes) {
    *ptr = NULL;
    /* Portable: the pinned buffer serves copies to and from every device,
     * not only the one current when it was allocated. */
    return ft_cuda_check(cudaHostAlloc(ptr, nbytes, cudaHostAllocPortable), "cudaHostAlloc");
}

static ft_status rt_host_free(void *ptr) {
    if (!ptr)
        return FT_OK;
    return ft_cuda_check(cudaFreeHost(ptr), "cudaFreeHost");
}

static ft_status rt_memcpy(void *dst, const void *src, size_t nbytes, int device, void *stream) {
    if (nbytes == 0)
        return FT_OK;
    FT_TRY(set_device(device));
    /* cudaMemcpyDefault lets unified addressing tell host, pinned and device
     * pointers apart, so the core need not track which kind each side is. */
    if (stream)
        return ft_cuda_check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, (cudaStream_t)stream),
                             "cudaMemcpyAsync");
    return ft_cuda_check(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault), "cudaMemcpy");
}

static ft_status rt_stream_create(void **stream, int device) {
    *stream = NULL;
    FT_TRY(set_device(device));
    cudaStream_t s;
    /* Non-blocking: work on the stream does not serialise against the legacy
     * NULL stream; ordering between streams is the caller's, through events. */
    FT_TRY(ft_cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    *stream = (void *)s;
    return FT_OK;
}

static ft_status rt_stream_destroy(void *stream) {
    /* The NULL stream is the device's own and is never destroyed. */
    if (!stream)
        return FT_OK;
    return ft_cuda_check(cudaStreamDestroy((cudaStream_t)stream), "cudaStreamDestroy");
}

static ft_status rt_stream_synchronize(void *stream) {
    return ft_cuda_check(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

static ft_status rt_event_create(void **event, int device) {
    *event = NULL;
    FT_TRY(set_device(device));
    cudaEvent_t e;
    /* Events only order and fence work here; timing would make recording
     * and querying them slower. */
    FT_TRY(ft_cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
    *event = (void *)e;
    return FT_OK;
}

static ft_status rt_event_destroy(void *event) {
    if (!event)
        return FT_OK;
    return ft_cuda_check(cudaEventDestroy((cudaEvent_t)event), "cudaEventDestroy");
}

static ft_status rt_event_record(void *event, void *stream, int device) {
    FT_TRY(set_device(device));
    return ft_cuda_check(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), "cudaEventRecord");
}

static ft_status rt_event_query(void *event, bool *done) {
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    *done = err == cudaSuccess;
    /* cudaErrorNotReady is an answer, not a failure; it still sets the
     * last-error slot, which a later launch check must not see. */
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return FT_OK;
    }
    return ft_cuda_check(err, "cudaEventQuery");
}

static ft_status rt_event_synchronize(void *event) {
    return ft_cuda_check(cudaEventSynchronize((cudaEvent_t)event), "cudaEventSynchronize");
}

static ft_status rt_stream_wait_event(void *stream, void *event) {
    return ft_cuda_check(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0), "cudaStreamWaitEvent");
}

static ft_status rt_device_synchronize(int device) {
    FT_TRY(set_device(device));
    return ft_cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/* Designated initialisers are C++20, but nvcc and its GCC or Clang host
 * compiler accept them in C++17 (only -Wpedantic objects). They are worth it
 * here: many members share one pointer type, and C++ rejects designators out
 * of declaration order, so a reordered cuda.h fails to compile instead of
 * silently swapping two entries. */
/* Filled by the ops' register functions when the library is opened. */
static ft_cuda_ops ops;

const ft_cuda_ops *ft_cuda_table(void) { return &ops; }

static const ft_cuda_api api = {
    .abi = FT_CUDA_ABI,
    .device_count = rt_device_count,
    .device_props = rt_device_props,
    .malloc = rt_malloc,
    .free = rt_free,
    .host_alloc = rt_host_alloc,
    .host_free = rt_host_free,
    .memcpy = rt_memcpy,
    .copy_strided = ft_cuda_copy_strided,
    .stream_create = rt_stream_create,
    .stream_destroy = rt_stream_destroy,
    .stream_synchronize = rt_stream_synchronize,
    .event_create = rt_event_create,
    .event_destroy = rt_event_destroy,
    .event_record = rt_event_record,
    .event_query = rt_event_query,
    .event_synchronize = rt_event_synchronize,
    .stream_wait_event = rt_stream_wait_event,
    .device_synchronize = rt_device_synchronize,
    .nccl_unique_id = ft_cuda_nccl_unique_id,
    .nccl_init = ft_cuda_nccl_init,
    .nccl_allreduce_sum_f32 = ft_cuda_nccl_allreduce_sum_f32,
    .nccl_destroy = ft_cuda_nccl_destroy,
    .ops = &ops,
};

/* Touches no CUDA API: a machine without a driver must still load the
 * library, and learns why CUDA is unusable from device_count. */
extern "C" __attribute__((visibility("default"))) const ft_cuda_api *ft_cuda_open(const ft_cuda_host *h) {
    if (!h || !h->fail || !h->alloc || !h->free || !h->deterministic || !h->benchmark || !h->allow_tf32)
        return NULL;
    host = h;
    ft_cuda_register_attention(&ops);
    ft_cuda_register_layout(&ops);
    ft_cuda_register_conv(&ops);
    ft_cuda_register_linear(&ops);
    ft_cuda_register_norm(&ops);
    ft_cuda_register_groupnorm(&ops);
    ft_cuda_register_embedding(&ops);
    ft_cuda_register_upsample(&ops);
    ft_cuda_register_optim(&ops);
    ft_cuda_register_pool(&ops);
    ft_cuda_register_pointwise(&ops);
    ft_cuda_register_math(&ops);
    ft_cuda_register_softmax(&ops);
    return &api;
}
