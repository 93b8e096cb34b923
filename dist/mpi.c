/* The MPI backend of ft.distributed (core/dist.h): built with mpicc into
 * libfasttrain_mpi.so, which the core opens on ft.distributed.init(). Every
 * call is on MPI_COMM_WORLD; counts larger than an int are sent in chunks. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "core/dist.h"

#define CHUNK ((int64_t)1 << 30)

static char message[MPI_MAX_ERROR_STRING];

static int init(int *rank, int *size, int *local_rank) {
    int inited, provided, code = MPI_Initialized(&inited);
    /* SERIALIZED: the training step calls from a thread without the GIL,
     * never two threads at once (core/dist.c takes the calls one at a time). */
    if (!code && !inited)
        code = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (!code)
        code = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (!code)
        code = MPI_Comm_rank(MPI_COMM_WORLD, rank);
    if (!code)
        code = MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm node;
    if (!code)
        code = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
    if (!code) {
        code = MPI_Comm_rank(node, local_rank);
        MPI_Comm_free(&node);
    }
    return code;
}

static int allreduce(void *buf, int64_t n, MPI_Datatype type, int64_t size) {
    for (int64_t at = 0; at < n; at += CHUNK) {
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        int code = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * size, count, type, MPI_SUM, MPI_COMM_WORLD);
        if (code)
            return code;
    }
    return 0;
}

static int allreduce_sum_f32(float *buf, int64_t n) { return allreduce(buf, n, MPI_FLOAT, sizeof *buf); }

/* The requests of the sums started and not yet waited for. */
static MPI_Request *pending;
static int npending, cap;

static int iallreduce_sum_f32(float *buf, int64_t n) {
    for (int64_t at = 0; at < n; at += CHUNK) {
        if (npending == cap) {
            int more = cap ? 2 * cap : 64;
            MPI_Request *grown = realloc(pending, (size_t)more * sizeof *grown);
            if (!grown)
                return MPI_ERR_NO_MEM;
            pending = grown, cap = more;
        }
        int count = (int)(n - at < CHUNK ? n - at : CHUNK);
        int code = MPI_Iallreduce(MPI_IN_PLACE, buf + at, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                                  &pending[npending]);
        if (code)
            return code;
        npending++;
    }
    return 0;
}

/* Open MPI moves a non-blocking collective along only inside MPI calls. */
static int progress(void) {
    int done;
    return npending ? MPI_Testall(npending, pending, &done, MPI_STATUSES_IGNORE) : 0;
}

static int wait_all(void) {
    int code = npending ? MPI_Waitall(npending, pending, MPI_STATUSES_IGNORE) : 0;
    npending = 0;
    return code;
}
static int allreduce_sum_f64(double *buf, int64_t n) { return allreduce(buf, n, MPI_DOUBLE, sizeof *buf); }

static int bcast(void *buf, int64_t bytes, int root) {
    for (int64_t at = 0; at < bytes; at += CHUNK) {
        int count = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        int code = MPI_Bcast((char *)buf + at, count, MPI_BYTE, root, MPI_COMM_WORLD);
        if (code)
            return code;
    }
    return 0;
}

static int barrier(void) { return MPI_Barrier(MPI_COMM_WORLD); }
static void abort_all(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static int finalize(void) {
    int done, code = MPI_Finalized(&done);
    return code || done ? code : MPI_Finalize();
}

static const char *error_string(int code) {
    int len = 0;
    if (MPI_Error_string(code, message, &len) != MPI_SUCCESS)
        return "unknown MPI error";
    return message;
}

static const ft_dist_api backend = {
    .init = init,
    .allreduce_sum_f32 = allreduce_sum_f32,
    .allreduce_sum_f64 = allreduce_sum_f64,
    .iallreduce_sum_f32 = iallreduce_sum_f32,
    .progress = progress,
    .wait_all = wait_all,
    .bcast = bcast,
    .barrier = barrier,
    .abort = abort_all,
    .finalize = finalize,
    .error_string = error_string,
};

__attribute__((visibility("default"))) const ft_dist_api *ft_dist_backend(void) { return &backend; }
