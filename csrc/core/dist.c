#include "core/dist.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* MPI runs MPI_THREAD_SERIALIZED: the collectives take this one at a time,
 * whichever threads call them (a train step runs without the GIL). */
static pthread_mutex_t calls = PTHREAD_MUTEX_INITIALIZER;
static char library[4096];
static const ft_dist_api *api;
static bool ready, finalized;
static int rank, world_size = 1, local_rank;

void ft_dist_set_library(const char *path) {
    pthread_mutex_lock(&lock);
    if (!library[0])
        snprintf(library, sizeof library, "%s", path);
    pthread_mutex_unlock(&lock);
}

static ft_status failed(const char *what, int code) {
    return ft_fail(FT_ERR_RUNTIME, "%s failed: %s", what, api->error_string(code));
}

ft_status ft_dist_init(void) {
    pthread_mutex_lock(&lock);
    ft_status s = FT_OK;
    if (ready) {
        pthread_mutex_unlock(&lock);
        return FT_OK;
    }
    if (finalized) {
        s = ft_fail(FT_ERR_RUNTIME, "ft.distributed was finalized: MPI cannot be initialised twice in a process");
    } else if (!library[0]) {
        s = ft_fail(FT_ERR_RUNTIME, "this fasttrain build has no MPI backend: install MPI (Debian: apt-get install "
                                    "openmpi-bin libopenmpi-dev) and rebuild");
    } else if (!api) {
        void *lib = dlopen(library, RTLD_NOW | RTLD_GLOBAL); /* GLOBAL: Open MPI's plugins need libmpi's symbols */
        const ft_dist_api *(*entry)(void) = lib ? (const ft_dist_api *(*)(void))dlsym(lib, FT_DIST_BACKEND_SYMBOL)
                                                : NULL;
        if (!entry)
            s = ft_fail(FT_ERR_RUNTIME, "cannot load the MPI backend %s: %s (install openmpi-bin and "
                                        "libopenmpi-dev)", library, dlerror());
        else
            api = entry();
    }
    if (s == FT_OK) {
        int code = api->init(&rank, &world_size, &local_rank);
        if (code)
            s = failed("MPI_Init_thread", code);
        else
            ready = true;
    }
    pthread_mutex_unlock(&lock);
    return s;
}

bool ft_dist_ready(void) { return ready; }
int ft_dist_rank(void) { return ready ? rank : 0; }
int ft_dist_world_size(void) { return ready ? world_size : 1; }
int ft_dist_local_rank(void) { return ready ? local_rank : 0; }

static ft_status check_ready(const char *what) {
    return ready ? FT_OK : ft_fail(FT_ERR_RUNTIME, "%s: call ft.distributed.init() first", what);
}

ft_status ft_dist_allreduce_sum_f32(float *buf, int64_t n) {
    FT_TRY(check_ready("all_reduce"));
    pthread_mutex_lock(&calls);
    int code = api->allreduce_sum_f32(buf, n);
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Allreduce", code) : FT_OK;
}

ft_status ft_dist_allreduce_sum_f64(double *buf, int64_t n) {
    FT_TRY(check_ready("all_reduce"));
    pthread_mutex_lock(&calls);
    int code = api->allreduce_sum_f64(buf, n);
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Allreduce", code) : FT_OK;
}

ft_status ft_dist_iallreduce_sum_f32(float *buf, int64_t n) {
    FT_TRY(check_ready("all_reduce"));
    pthread_mutex_lock(&calls);
    int code = api->iallreduce_sum_f32(buf, n);
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Iallreduce", code) : FT_OK;
}

ft_status ft_dist_progress(void) {
    FT_TRY(check_ready("all_reduce"));
    pthread_mutex_lock(&calls);
    int code = api->progress();
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Testall", code) : FT_OK;
}

ft_status ft_dist_wait_all(void) {
    FT_TRY(check_ready("all_reduce"));
    pthread_mutex_lock(&calls);
    int code = api->wait_all();
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Waitall", code) : FT_OK;
}

ft_status ft_dist_bcast(void *buf, int64_t bytes, int root) {
    FT_TRY(check_ready("broadcast"));
    if (root < 0 || root >= world_size)
        return ft_fail(FT_ERR_VALUE, "broadcast: src %d is not a rank of %d", root, world_size);
    pthread_mutex_lock(&calls);
    int code = api->bcast(buf, bytes, root);
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Bcast", code) : FT_OK;
}

ft_status ft_dist_barrier(void) {
    FT_TRY(check_ready("barrier"));
    pthread_mutex_lock(&calls);
    int code = api->barrier();
    pthread_mutex_unlock(&calls);
    return code ? failed("MPI_Barrier", code) : FT_OK;
}

void ft_dist_abort(int code) {
    if (ready)
        api->abort(code);
}

ft_status ft_dist_finalize(void) {
    pthread_mutex_lock(&lock);
    int code = ready ? api->finalize() : 0;
    if (ready)
        finalized = true;
    ready = false;
    pthread_mutex_unlock(&lock);
    return code ? failed("MPI_Finalize", code) : FT_OK;
}
