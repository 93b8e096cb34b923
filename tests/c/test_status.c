/* Failures inside OpenMP parallel regions reach the calling thread with
 * their own message (core/status.h: ft_error_keep, ft_error_first), and the
 * first failure in iteration order wins whatever thread ran it. */
#include <omp.h>
#include <string.h>

#include "check.h"
#include "core/status.h"

#define CHUNKS 8

/* Iterations in `failing` fail with a message naming them; returns the OpenMP
 * thread that ran the last failing one. */
static int run_region(const int *failing, int nfailing, ft_error *err) {
    int ran_on = -1;
#pragma omp parallel for schedule(static) num_threads(2)
    for (int c = 0; c < CHUNKS; c++) {
        ft_status st = FT_OK;
        for (int k = 0; k < nfailing; k++)
            if (failing[k] == c) {
                st = ft_fail(FT_ERR_SHAPE, "chunk %d: primitive creation failed", c);
                ran_on = omp_get_thread_num();
            }
        ft_error_keep(&err[c], st);
    }
    return ran_on;
}

static void test_message_reaches_the_caller(void) {
    ft_fail(FT_ERR_VALUE, "an older failure of the calling thread");
    ft_error err[CHUNKS];
    int failing[] = {CHUNKS - 1};
    int ran_on = run_region(failing, 1, err);
    /* schedule(static) gives the last chunk to the last thread: not the caller */
    if (omp_get_max_threads() > 1)
        CHECKF(ran_on != 0, "the failing chunk ran on thread %d", ran_on);
    CHECK_STATUS(ft_error_first(err, CHUNKS), FT_ERR_SHAPE);
    CHECKF(strcmp(ft_last_error(), "chunk 7: primitive creation failed") == 0, "got \"%s\"", ft_last_error());
}

static void test_first_failure_wins(void) {
    ft_error err[CHUNKS];
    int failing[] = {6, 2, 5};
    run_region(failing, 3, err);
    CHECK_STATUS(ft_error_first(err, CHUNKS), FT_ERR_SHAPE);
    CHECKF(strcmp(ft_last_error(), "chunk 2: primitive creation failed") == 0, "got \"%s\"", ft_last_error());
}

static void test_success_keeps_no_message(void) {
    ft_error err[CHUNKS];
    run_region(NULL, 0, err);
    ft_fail(FT_ERR_VALUE, "untouched");
    CHECK_OK(ft_error_first(err, CHUNKS));
    CHECK(strcmp(ft_last_error(), "untouched") == 0);
    for (int c = 0; c < CHUNKS; c++)
        CHECK(err[c].status == FT_OK && err[c].message[0] == '\0');
}

/* A message longer than the buffer is cut, not overrun. */
static void test_long_message(void) {
    char big[3 * FT_ERROR_LEN];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ft_error e;
    CHECK_STATUS(ft_error_keep(&e, ft_fail(FT_ERR_IO, "%s", big)), FT_ERR_IO);
    CHECK_STATUS(ft_error_first(&e, 1), FT_ERR_IO);
    CHECK(strlen(ft_last_error()) == FT_ERROR_LEN - 1);
}

/* A failure that wraps the last one's message (ft_fail(st, "context: %s", ft_last_error())) reads it whole: it was
 * formatted over itself, repeating the context and cutting the message. */
static void test_wrapping_the_last_message(void) {
    ft_fail(FT_ERR_DEVICE, "CUDA is not available: no CUDA driver is installed");
    CHECK_STATUS(ft_fail(FT_ERR_DEVICE, "device='cuda:0' needs a usable CUDA device: %s", ft_last_error()),
                 FT_ERR_DEVICE);
    CHECKF(strcmp(ft_last_error(), "device='cuda:0' needs a usable CUDA device: CUDA is not available: no CUDA "
                                   "driver is installed") == 0,
           "got \"%s\"", ft_last_error());
}

int main(void) {
    omp_set_dynamic(0);
    test_message_reaches_the_caller();
    test_first_failure_wins();
    test_success_keeps_no_message();
    test_long_message();
    test_wrapping_the_last_message();
    return check_main_result("test_status");
}
