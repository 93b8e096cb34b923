/* The MPI backend of ft.distributed (core/dist.h): built with mpicc into
 * libfasttrain_mpi.so, which the core opens on ft.distributed.init(). Every
 * call is on MPI_COMM_WORLD; counts larger than an int are sent in chunks.
 * Every collective is started non-blocking and waited for with a timeout, so
 * that the ranks still waiting for one that stopped (exited, returned, or
 * never compiled the same program) end the job instead of waiting forever:
 * a collective left running cannot be taken back (MPI may still write its
 * buffers), so a timeout aborts, as PyTorch's watchdog does. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime in -std=c11 */

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/dist.h"

#define CHUNK ((int64_t)1 << 30)

static char message[MPI_MAX_ERROR_STRING];
static double timeout = 1800.0; /* seconds */

static void set_timeout(double seconds) { timeout = seconds; }

/* Waits for n requests, or ends the job after `timeout` seconds. Open MPI
 * moves a collective along only inside MPI calls: MPI_Testall polls, as
 * MPI_Wait's own loop does. */
static int wait_for(int n, MPI_Request *reqs) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long polls = 0;; polls++) {
        int done, code = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (code || done)
            return code;
        if (polls % 1024 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec) > timeout) {
                int rank = 0;
                MPI_Comm_rank(MPI_COMM_WORLD, &rank);
                fprintf(stderr, "fasttrain.distributed: rank %d: not every rank took part in a collective within %g s "
                        "(a rank stopped: it exited, returned, or runs another program); ending the job. "
                        "ft.distributed.init(timeout=) sets the wait\n", rank, timeout);
                fflush(stderr);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
}

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
        MPI_Request req;
        int code = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + at * size, count, type, MPI_SUM, MPI_COMM_WORLD, &req);
        if (!code)
            code = wait_for(1, &req);
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
    int code = npending ? wait_for(npending, pending) : 0;
    npending = 0;
    return code;
}
static int allreduce_sum_f64(double *buf, int64_t n) { return allreduce(buf, n, MPI_DOUBLE, sizeof *buf); }

static int bcast(void *buf, int64_t bytes, int root) {
    for (int64_t at = 0; at < bytes; at += CHUNK) {
        int count = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        MPI_Request req;
        int code = MPI_Ibcast((char *)buf + at, count, MPI_BYTE, root, MPI_COMM_WORLD, &req);
        if (!code)
            code = wait_for(1, &req);
        if (code)
            return code;
    }
    return 0;
}

static int barrier(void) {
    MPI_Request req;
    int code = MPI_Ibarrier(MPI_COMM_WORLD, &req);
    return code ? code : wait_for(1, &req);
}
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
    .set_timeout = set_timeout,
    .error_string = error_string,
};

__attribute__((visibility("default"))) const ft_dist_api *ft_dist_backend(void) { return &backend; }
