/* Status codes and the thread-local error message of the C core.
 *
 * Every core function returns ft_status. On failure it has called ft_fail(),
 * which records a message that csrc/bind/ turns into one Python exception.
 * The core never exits, aborts or asserts on user input. */
#ifndef FT_CORE_STATUS_H
#define FT_CORE_STATUS_H

#include <stdint.h>

typedef enum {
    FT_OK = 0,
    FT_ERR_VALUE,    /* a bad argument value                  -> ValueError */
    FT_ERR_SHAPE,    /* shapes or strides do not fit          -> ValueError */
    FT_ERR_INDEX,    /* an index out of range                 -> IndexError */
    FT_ERR_DTYPE,    /* an unsupported or mismatched dtype    -> TypeError */
    FT_ERR_DEVICE,   /* a device that is absent or mismatched -> RuntimeError */
    FT_ERR_OVERFLOW, /* a size or value that does not fit     -> OverflowError */
    FT_ERR_NOMEM,    /* allocation failed                     -> MemoryError */
    FT_ERR_IO,       /* a file or OS call failed              -> OSError */
    FT_ERR_FORMAT,   /* malformed data in a file or capsule   -> ValueError */
    FT_ERR_BUFFER,   /* memory that cannot be shared as asked -> BufferError */
    FT_ERR_READONLY, /* a write into read-only memory         -> ValueError */
    FT_ERR_CUDA,     /* a CUDA library reported an error      -> RuntimeError */
    FT_ERR_RUNTIME,  /* any other failure                     -> RuntimeError */
} ft_status;

/* Records a printf-style message for the calling thread and returns `status`,
 * so that failures read `return ft_fail(FT_ERR_SHAPE, "...", ...);`. */
ft_status ft_fail(ft_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of the calling thread's last failure ("" if none). */
const char *ft_last_error(void);

#define FT_ERROR_LEN 1024

/* A failure carried to another thread. The message is the failing thread's:
 * an iteration of an OpenMP parallel region that fails records it on a worker
 * thread, which the caller never reads, so each iteration keeps its status in
 * one of these and the caller takes the first with ft_error_first. */
typedef struct {
    ft_status status;
    char message[FT_ERROR_LEN];
} ft_error;

/* Keeps `status` in *e, with the calling thread's message when it is a
 * failure; returns `status`. */
ft_status ft_error_keep(ft_error *e, ft_status status);

/* The first failure of errors[0..n) in index order (so the same one whatever
 * the thread count), its message recorded for the calling thread; FT_OK when
 * every one succeeded. */
ft_status ft_error_first(const ft_error *errors, int64_t n);

#define FT_TRY(expr)                          \
    do {                                      \
        ft_status ft_try_status_ = (expr);    \
        if (ft_try_status_ != FT_OK)          \
            return ft_try_status_;            \
    } while (0)

#endif
