/* The bytes of samples: the fetch buffer and exact reads of a file. */
#include "data/sample.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ft_fetch_buf_free(ft_fetch_buf *b) {
    free(b->data);
    b->data = NULL;
    b->cap = 0;
}

ft_status ft_fetch_buf_reserve(ft_fetch_buf *b, size_t n) {
    if (n <= b->cap)
        return FT_OK;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < n)
        cap = cap > SIZE_MAX / 2 ? n : cap * 2;
    uint8_t *grown = realloc(b->data, cap);
    if (!grown)
        return ft_fail(FT_ERR_NOMEM, "out of memory reading a sample of %zu bytes", n);
    b->data = grown;
    b->cap = cap;
    return FT_OK;
}

ft_status ft_read_at(int fd, uint64_t offset, void *dst, size_t n, const char *path) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (uint8_t *)dst + done, n - done, (off_t)(offset + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return ft_fail(FT_ERR_IO, "reading %s: %s", path, strerror(errno));
        if (r == 0)
            return ft_fail(FT_ERR_IO, "%s was truncated after it was opened (it ends before byte %llu)", path,
                           (unsigned long long)(offset + n));
        done += (size_t)r;
    }
    return FT_OK;
}
