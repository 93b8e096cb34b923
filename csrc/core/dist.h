/* Data parallelism across processes through MPI, loaded at run time.
 *
 * The MPI backend (dist/mpi.c) is a separate shared library,
 * libfasttrain_mpi.so, built with mpicc when MPI is installed and opened
 * with dlopen by ft_dist_init (ft.distributed.init()): a process that never
 * asks maps no MPI library, and a build without MPI still imports and runs
 * everything on one process. The backend is a table of functions over
 * MPI_COMM_WORLD; the core adds the checks and the error messages. */
#ifndef FT_CORE_DIST_H
#define FT_CORE_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

/* What the backend library gives (its ft_dist_backend() returns it). Each
 * collective returns an MPI error code (0 is success) that error_string
 * describes; counts are elements. Calls come from one thread at a time
 * (the core serializes them). */
typedef struct {
    int (*init)(int *rank, int *size, int *local_rank); /* MPI_Init_thread, once */
    int (*allreduce_sum_f32)(float *buf, int64_t n);    /* in place, every rank */
    int (*allreduce_sum_f64)(double *buf, int64_t n);
    int (*iallreduce_sum_f32)(float *buf, int64_t n);   /* started, in place; done at wait_all */
    int (*progress)(void);                              /* moves the started sums along */
    int (*wait_all)(void);                              /* waits for every started sum */
    int (*bcast)(void *buf, int64_t bytes, int root);
    int (*barrier)(void);
    void (*abort)(int code); /* every rank, for a failure one rank cannot recover from */
    int (*finalize)(void);
    const char *(*error_string)(int code);
    void (*set_timeout)(double seconds); /* how long a collective waits for every rank before the job ends */
} ft_dist_api;

#define FT_DIST_BACKEND_SYMBOL "ft_dist_backend"

/* Names the backend library that ft_dist_init opens. */
void ft_dist_set_library(const char *path);

/* Opens the backend and initialises MPI (once; later calls return the same
 * answer). FT_ERR_RUNTIME naming what is missing when the build has no
 * backend or libmpi cannot be loaded. */
ft_status ft_dist_init(void);

/* Whether ft_dist_init succeeded (and ft_dist_finalize has not run). */
bool ft_dist_ready(void);
int ft_dist_rank(void);       /* 0 when not initialised */
int ft_dist_world_size(void); /* 1 when not initialised */
int ft_dist_local_rank(void); /* the rank among the processes of this machine */

/* Collectives over every rank (FT_ERR_RUNTIME before ft_dist_init). The
 * sums reduce in the fixed order of MPI's algorithm for the world size.
 * Calls from several threads are taken one at a time; the order in which
 * every rank issues them is the callers' to keep the same. */
ft_status ft_dist_allreduce_sum_f32(float *buf, int64_t n);
ft_status ft_dist_allreduce_sum_f64(double *buf, int64_t n);

/* A sum started now and finished by ft_dist_wait_all, buf untouched
 * meanwhile; every rank starts the same sums in the same order. Between the
 * two, ft_dist_progress lets MPI move them along. */
ft_status ft_dist_iallreduce_sum_f32(float *buf, int64_t n);
ft_status ft_dist_progress(void);
ft_status ft_dist_wait_all(void);
ft_status ft_dist_bcast(void *buf, int64_t bytes, int root);
ft_status ft_dist_barrier(void);
void ft_dist_abort(int code);
ft_status ft_dist_finalize(void);
/* How long a collective waits for every rank before it ends the job
 * (MPI_Abort, saying why): a rank that stopped would keep the others waiting
 * forever. 30 minutes until set, as PyTorch's default. */
ft_status ft_dist_set_timeout(double seconds);

#endif
