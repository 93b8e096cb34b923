/* The CUDA backend loader of core/cuda.h when the load fails: the reason
 * names the library dlopen could not open (the driver's on a machine without
 * one, else the backend's), every CUDA request fails with that reason, and the
 * answer, once given, does not change. */
#include <string.h>

#include "check.h"
#include "core/cuda.h"

#define MISSING "/nonexistent/libfasttrain_cuda.so"

int main(void) {
    ft_cuda_set_library(MISSING);
    CHECK(ft_cuda() == NULL);
    const char *reason = ft_cuda_unavailable_reason();
    CHECKF(strstr(reason, "cannot open shared object file") != NULL, "reason: %s", reason);
    CHECKF(strstr(reason, "libcuda.so.1") != NULL || strstr(reason, MISSING) != NULL, "reason: %s", reason);

    CHECK_STATUS(ft_cuda_check_device(0), FT_ERR_DEVICE);
    CHECKF(strstr(ft_last_error(), reason) != NULL, "error: %s", ft_last_error());
    CHECK(ft_cuda_device_count() == 0);
    CHECK(ft_cuda_op_table() == NULL);

    /* a later name cannot change an answer already given */
    char first[4096];
    snprintf(first, sizeof first, "%s", reason);
    ft_cuda_set_library("/another/libfasttrain_cuda.so");
    CHECK(ft_cuda() == NULL);
    CHECK(strcmp(ft_cuda_unavailable_reason(), first) == 0);
    return check_main_result("test_cuda_loader");
}
