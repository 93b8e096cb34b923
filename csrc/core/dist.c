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

/* A collective: FT_ERR_RUNTIME before init, else `call` under the lock of the
 * calls, its MPI error named after `mpi`. */
#define COLLECTIVE(what, mpi, call)                                \
    do {                                                           \
        FT_TRY(check_ready(what));                                 \
        pthread_mutex_lock(&calls);                                \
        int code = call;                                           \
        pthread_mutex_unlock(&calls);                              \
        return code ? failed(mpi, code) : FT_OK;                   \
    } while (0)

ft_status ft_dist_allreduce_sum_f32(float *buf, int64_t n) {
    COLLECTIVE("all_reduce", "MPI_Allreduce", api->allreduce_sum_f32(buf, n));
}

ft_status ft_dist_allreduce_sum_f64(double *buf, int64_t n) {
    COLLECTIVE("all_reduce", "MPI_Allreduce", api->allreduce_sum_f64(buf, n));
}

ft_status ft_dist_iallreduce_sum_f32(float *buf, int64_t n) {
    COLLECTIVE("all_reduce", "MPI_Iallreduce", api->iallreduce_sum_f32(buf, n));
}

ft_status ft_dist_progress(void) { COLLECTIVE("all_reduce", "MPI_Testall", api->progress()); }

ft_status ft_dist_wait_all(void) { COLLECTIVE("all_reduce", "MPI_Waitall", api->wait_all()); }

ft_status ft_dist_bcast(void *buf, int64_t bytes, int root) {
    if (ready && (root < 0 || root >= world_size))
        return ft_fail(FT_ERR_VALUE, "broadcast: src %d is not a rank of %d", root, world_size);
    COLLECTIVE("broadcast", "MPI_Bcast", api->bcast(buf, bytes, root));
}

ft_status ft_dist_barrier(void) { COLLECTIVE("barrier", "MPI_Barrier", api->barrier()); }

ft_status ft_dist_set_timeout(double seconds) {
    FT_TRY(check_ready("set_timeout"));
    if (!(seconds > 0))
        return ft_fail(FT_ERR_VALUE, "timeout must be a positive number of seconds, got %g", seconds);
    pthread_mutex_lock(&calls);
    api->set_timeout(seconds);
    pthread_mutex_unlock(&calls);
    return FT_OK;
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
