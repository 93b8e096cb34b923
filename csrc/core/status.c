#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

ft_status ft_fail(ft_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *ft_last_error(void) { return last_error; }
