/* The record file reader (data/record.c) on arbitrary bytes: open with and
 * without recovery, then every record with and without checksum
 * verification, and the meta bytes.
 *
 * Almost every mutation breaks a CRC-32C, which would stop the fuzzer at the
 * header check; so each input is also read a second time with its header,
 * index and record checksums made to hold, which lets mutated counts,
 * offsets and lengths reach the code behind those checks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/record.h"
#include "fuzz_file.h"

static volatile unsigned sink;

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Rewrites the checksums the reader compares, where the bytes they cover lie
 * inside the input (little-endian hosts, as the format). */
static void fix_checksums(uint8_t *m, size_t size) {
    if (size < FT_RECORD_HEADER_SIZE)
        return;
    uint64_t count = get_u64(m + 16), index_off = get_u64(m + 24), meta_len = get_u64(m + 40);
    if (index_off <= size && count <= (size - index_off) / 8 && meta_len <= size - index_off - count * 8)
        put_u32(m + 48, ft_crc32c(0, m + index_off, count * 8 + meta_len));
    put_u32(m + 52, ft_crc32c(0, m, 52));
    for (size_t off = FT_RECORD_HEADER_SIZE; size - off >= FT_RECORD_ENTRY_SIZE;) {
        uint64_t len = get_u64(m + off + 8);
        if (len > size - off - FT_RECORD_ENTRY_SIZE)
            break;
        put_u32(m + off, ft_crc32c(0, m + off + 4, FT_RECORD_ENTRY_SIZE - 4 + len));
        off += FT_RECORD_ENTRY_SIZE + len;
        off += (8 - off % 8) % 8;
        if (off > size)
            break;
    }
}

static void read_all(const uint8_t *data, size_t size) {
    fuzz_file file;
    fuzz_file_open(&file, data, size);
    ft_fetch_buf buf = {0};
    for (int recover = 0; recover < 2; recover++) {
        ft_record_file *f = NULL;
        if (ft_record_open(&f, file.path, recover) != FT_OK)
            continue;
        size_t meta_len;
        const char *meta = ft_record_meta(f, &meta_len);
        if (meta)
            sink += fuzz_touch((const uint8_t *)meta, meta_len);
        int64_t n = ft_record_count(f);
        for (int64_t i = 0; i < n; i++) {
            for (int verify = 0; verify < 2; verify++) {
                ft_sample s;
                if (ft_record_get(f, i, verify, &buf, &s) == FT_OK)
                    sink += fuzz_touch(s.data, s.size) + (unsigned)s.label;
            }
        }
        /* Out-of-range indices must fail, not read. */
        ft_sample s;
        if (ft_record_get(f, n, true, &buf, &s) == FT_OK || ft_record_get(f, -1, true, &buf, &s) == FT_OK)
            __builtin_trap();
        ft_record_close(f);
    }
    ft_fetch_buf_free(&buf);
    fuzz_file_close(&file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_all(data, size);
    uint8_t *fixed = malloc(size ? size : 1);
    if (!fixed)
        abort();
    memcpy(fixed, data, size);
    fix_checksums(fixed, size);
    if (memcmp(fixed, data, size) != 0)
        read_all(fixed, size);
    free(fixed);
    return 0;
}
