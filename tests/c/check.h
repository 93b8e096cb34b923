/* A tiny harness for the C unit tests: CHECK counts failures and goes on,
 * check_main_result() prints the summary and gives main's exit status. */
#ifndef FT_TESTS_CHECK_H
#define FT_TESTS_CHECK_H

#include <stdio.h>

#include "core/status.h"

static int check_failures, check_count;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        check_count++;                                                                 \
        if (!(cond)) {                                                                 \
            check_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                              \
    } while (0)

/* CHECK with a printf-style note, for checks inside loops. */
#define CHECKF(cond, ...)                                                              \
    do {                                                                               \
        check_count++;                                                                 \
        if (!(cond)) {                                                                 \
            check_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

/* expr must return `want`; on a mismatch prints both and ft_last_error(). */
#define CHECK_STATUS(expr, want)                                                       \
    do {                                                                               \
        ft_status check_st_ = (expr);                                                  \
        check_count++;                                                                 \
        if (check_st_ != (want)) {                                                     \
            check_failures++;                                                          \
            fprintf(stderr, "%s:%d: %s returned status %d, expected %d (last error: %s)\n", __FILE__, \
                    __LINE__, #expr, (int)check_st_, (int)(want), ft_last_error());    \
        }                                                                              \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, FT_OK)

static inline int check_main_result(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
