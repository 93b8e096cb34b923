/* The tar shard reader (ft_source_open_tar in data/source.c: ustar, GNU long
 * names, base-256 sizes, pax extended headers) on arbitrary bytes as one
 * shard: open, then fetch and describe every sample. */
#include <stdbool.h>
#include <stdint.h>

#include "data/source.h"
#include "fuzz_file.h"

static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file file;
    fuzz_file_open(&file, data, size);
    const char *paths[] = {file.path};
    ft_source *src = NULL;
    if (ft_source_open_tar(&src, paths, 1) == FT_OK) {
        ft_fetch_buf buf = {0};
        int64_t n = ft_source_count(src);
        for (int64_t i = 0; i < n; i++) {
            ft_sample s;
            if (ft_source_get(src, i, true, &buf, &s) == FT_OK)
                sink += fuzz_touch(s.data, s.size) + (unsigned)s.label;
            char name[512];
            ft_source_describe(src, i, name, sizeof name);
            sink += (unsigned)name[0];
        }
        ft_fetch_buf_free(&buf);
        ft_source_release(src);
    }
    fuzz_file_close(&file);
    return 0;
}
