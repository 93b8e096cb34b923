#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[FT_ERROR_LEN];

ft_status ft_fail(ft_status status, const char *fmt, ...) {
    /* formatted apart first: an argument may be the last error itself, a message this one wraps */
    char message[FT_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    memcpy(last_error, message, sizeof message);
    return status;
}

const char *ft_last_error(void) { return last_error; }

ft_status ft_error_keep(ft_error *e, ft_status status) {
    e->status = status;
    e->message[0] = '\0';
    if (status != FT_OK)
        snprintf(e->message, sizeof e->message, "%s", last_error);
    return status;
}

ft_status ft_error_first(const ft_error *errors, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (errors[i].status != FT_OK)
            return ft_fail(errors[i].status, "%s", errors[i].message);
    return FT_OK;
}
