/* The record file: CRC-32C, write/read round trip, checksum failures,
 * truncation and recovery. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data/record.h"

static char path[256];

static void test_crc32c(void) {
    /* The check value of CRC-32C (RFC 3720, and the CRC catalogue). */
    CHECK(ft_crc32c(0, "123456789", 9) == 0xe3069283u);
    CHECK(ft_crc32c(0, "", 0) == 0);
    /* 32 zero bytes: RFC 3720 B.4 gives aa 36 91 8a (transmitted bytes, i.e. 0x8a9136aa). */
    uint8_t zeros[32] = {0};
    CHECK(ft_crc32c(0, zeros, 32) == 0x8a9136aau);
    uint8_t ones[32];
    memset(ones, 0xff, sizeof ones);
    CHECK(ft_crc32c(0, ones, 32) == 0x62a8ab43u);
    /* A sum continued over pieces equals the sum of the whole, for odd splits too. */
    uint8_t data[1000];
    for (int i = 0; i < 1000; i++)
        data[i] = (uint8_t)(i * 7 + 3);
    uint32_t whole = ft_crc32c(0, data, sizeof data);
    for (int cut = 0; cut <= 1000; cut += 37)
        CHECKF(ft_crc32c(ft_crc32c(0, data, (size_t)cut), data + cut, 1000 - (size_t)cut) == whole, "cut %d", cut);
}

/* Record i: raw (i % 3 + 1) x 5 x (1 or 3) pixels, or fake JPEG bytes. */
static size_t record_bytes(int i, uint8_t *buf, ft_sample_kind *kind, uint32_t *h, uint32_t *w, uint32_t *c) {
    *kind = i % 4 == 3 ? FT_SAMPLE_JPEG : FT_SAMPLE_RAW;
    *h = (uint32_t)(i % 3 + 1);
    *w = 5;
    *c = i % 2 ? 3 : 1;
    size_t n = *kind == FT_SAMPLE_RAW ? (size_t)*h * *w * *c : (size_t)(i * 13 % 50 + 1);
    if (*kind == FT_SAMPLE_JPEG)
        *h = *w = *c = 0;
    for (size_t k = 0; k < n; k++)
        buf[k] = (uint8_t)(i * 31 + k);
    return n;
}

static int write_file(int count) {
    ft_record_writer *w;
    CHECK_OK(ft_record_writer_open(&w, path));
    for (int i = 0; i < count; i++) {
        uint8_t buf[256];
        ft_sample_kind kind;
        uint32_t h, ww, c;
        size_t n = record_bytes(i, buf, &kind, &h, &ww, &c);
        CHECK_OK(ft_record_writer_add(w, kind, buf, n, 1000 - i, h, ww, c));
    }
    CHECK(ft_record_writer_count(w) == count);
    const char meta[] = "{\"classes\": [\"a\", \"b\"]}";
    CHECK_OK(ft_record_writer_close(w, meta, strlen(meta)));
    return 0;
}

/* The reads' scratch, as one loader worker has. */
static ft_fetch_buf fetch;

static void check_contents(ft_record_file *f, int count) {
    for (int i = 0; i < count; i++) {
        uint8_t buf[256];
        ft_sample_kind kind;
        uint32_t h, w, c;
        size_t n = record_bytes(i, buf, &kind, &h, &w, &c);
        ft_sample s;
        CHECK_OK(ft_record_get(f, i, true, &fetch, &s));
        CHECKF(s.kind == kind && s.size == n && memcmp(s.data, buf, n) == 0 && s.label == 1000 - i, "record %d", i);
        CHECKF(kind == FT_SAMPLE_JPEG || (s.height == (int)h && s.width == (int)w && s.channels == (int)c),
               "record %d size", i);
        CHECKF(((uintptr_t)(s.data - 40) & 7) == 0, "record %d alignment", i);
    }
}

static void test_round_trip(void) {
    write_file(50);
    ft_record_file *f;
    CHECK_OK(ft_record_open(&f, path, false));
    CHECK(ft_record_count(f) == 50);
    CHECK(!ft_record_recovered(f));
    size_t len;
    const char *meta = ft_record_meta(f, &len);
    CHECK(len == strlen("{\"classes\": [\"a\", \"b\"]}") && memcmp(meta, "{\"classes\"", 10) == 0);
    check_contents(f, 50);
    ft_sample s;
    CHECK_STATUS(ft_record_get(f, 50, true, &fetch, &s), FT_ERR_INDEX);
    CHECK_STATUS(ft_record_get(f, -1, true, &fetch, &s), FT_ERR_INDEX);
    ft_record_close(f);

    /* An empty file of records is valid. */
    write_file(0);
    CHECK_OK(ft_record_open(&f, path, false));
    CHECK(ft_record_count(f) == 0);
    ft_record_close(f);
}

static long file_size(void) {
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fclose(fp);
    return n;
}

static void flip_byte(long at) {
    FILE *fp = fopen(path, "r+b");
    fseek(fp, at, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, at, SEEK_SET);
    fputc(c ^ 0x20, fp);
    fclose(fp);
}

static void test_damage(void) {
    write_file(20);
    /* One payload byte of record 0 (its header is at 64, payload at 104). */
    flip_byte(104);
    ft_record_file *f;
    CHECK_OK(ft_record_open(&f, path, false));
    ft_sample s;
    CHECK_STATUS(ft_record_get(f, 0, true, &fetch, &s), FT_ERR_FORMAT);
    CHECK(strstr(ft_last_error(), "CRC32C") != NULL && strstr(ft_last_error(), "record 0") != NULL);
    CHECK_OK(ft_record_get(f, 0, false, &fetch, &s)); /* unchecked reads still work */
    CHECK_OK(ft_record_get(f, 1, true, &fetch, &s));
    ft_record_close(f);

    /* The header. */
    write_file(20);
    flip_byte(20);
    CHECK_STATUS(ft_record_open(&f, path, false), FT_ERR_FORMAT);
    CHECK(strstr(ft_last_error(), "header checksum") != NULL);

    /* Cut short: the index is gone; recovery keeps the intact records. */
    write_file(20);
    long size = file_size();
    long tail = 20 * 8 + (long)strlen("{\"classes\": [\"a\", \"b\"]}"); /* index and meta */
    CHECK(truncate(path, size - tail) == 0);
    CHECK_STATUS(ft_record_open(&f, path, false), FT_ERR_FORMAT);
    CHECK(strstr(ft_last_error(), "truncated") != NULL);
    CHECK_OK(ft_record_open(&f, path, true));
    CHECK(ft_record_recovered(f));
    CHECK(ft_record_count(f) == 20);
    check_contents(f, 20);
    ft_record_close(f);
    /* One byte more and the last record fails its length check. */
    CHECK(truncate(path, size - tail - 1) == 0);
    CHECK_OK(ft_record_open(&f, path, true));
    CHECK(ft_record_count(f) == 19);
    ft_record_close(f);
    /* Cut inside the records: the ones before the cut survive. */
    CHECK(truncate(path, 64 + 3 * 48) == 0);
    CHECK_OK(ft_record_open(&f, path, true));
    int64_t n = ft_record_count(f);
    CHECKF(n >= 1 && n < 20, "recovered %lld", (long long)n);
    check_contents(f, (int)n);
    ft_record_close(f);
    CHECK(truncate(path, 10) == 0);
    CHECK_STATUS(ft_record_open(&f, path, true), FT_ERR_FORMAT);

    FILE *fp = fopen(path, "wb");
    fputs("not a record file at all, just some text that is long enough for a header......", fp);
    fclose(fp);
    CHECK_STATUS(ft_record_open(&f, path, false), FT_ERR_FORMAT);
    CHECK(strstr(ft_last_error(), "not a fasttrain record file") != NULL);
    unlink(path);
    CHECK_STATUS(ft_record_open(&f, path, false), FT_ERR_IO);
}

static void test_writer_checks(void) {
    ft_record_writer *w;
    CHECK_OK(ft_record_writer_open(&w, path));
    uint8_t px[12] = {0};
    CHECK_STATUS(ft_record_writer_add(w, FT_SAMPLE_RAW, px, 12, 0, 2, 2, 2), FT_ERR_VALUE); /* 2 channels */
    CHECK_STATUS(ft_record_writer_add(w, FT_SAMPLE_RAW, px, 11, 0, 2, 2, 3), FT_ERR_VALUE); /* wrong size */
    CHECK_STATUS(ft_record_writer_add(w, (ft_sample_kind)9, px, 11, 0, 0, 0, 0), FT_ERR_VALUE);
    CHECK_OK(ft_record_writer_add(w, FT_SAMPLE_RAW, px, 12, 7, 2, 2, 3));
    ft_record_writer_abort(w); /* leaves nothing behind */
    CHECK(access(path, F_OK) != 0);
    CHECK_STATUS(ft_record_writer_open(&w, "/nonexistent-dir/x.rec"), FT_ERR_IO);
}

/* Read, never mapped: a file cut short while open gives an error naming it
 * (a mapping would give SIGBUS); records before the cut still read. */
static void test_truncated_after_open(void) {
    write_file(20);
    ft_record_file *f;
    CHECK_OK(ft_record_open(&f, path, false));
    CHECK(truncate(path, file_size() / 2) == 0);
    ft_sample s;
    CHECK_OK(ft_record_get(f, 0, true, &fetch, &s));
    CHECK_STATUS(ft_record_get(f, 19, true, &fetch, &s), FT_ERR_IO);
    CHECKF(strstr(ft_last_error(), "was truncated after it was opened") && strstr(ft_last_error(), path), "%s",
           ft_last_error());
    ft_record_close(f);
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/ft_test_record_%d.rec", (int)getpid());
    test_crc32c();
    test_round_trip();
    test_damage();
    test_writer_checks();
    test_truncated_after_open();
    ft_fetch_buf_free(&fetch);
    unlink(path);
    return check_main_result("test_data_record");
}
