/* The record file: many samples in one file, read with pread (never mapped:
 * a file cut short while open must give an error, not SIGBUS), so that any
 * number of readers (threads or processes) share the page cache.
 *
 * Byte layout (all integers little-endian; docs/record-format.md has it in
 * full):
 *
 *   header   64 bytes: "FTRECORD", u32 version (1), u32 flags (0),
 *            u64 count, u64 index_offset, u64 meta_offset, u64 meta_length,
 *            u32 crc32c of the index and meta bytes, u32 crc32c of header
 *            bytes [0, 52), 8 bytes zero
 *   records  from offset 64, each at a multiple of 8: a 40-byte record
 *            header (u32 crc32c of the record's bytes [4, 40 + length),
 *            u32 kind, u64 length, i64 label, u32 height, u32 width,
 *            u32 channels, u32 zero) then `length` payload bytes, then zero
 *            padding to a multiple of 8
 *   index    count u64 record offsets, at index_offset
 *   meta     meta_length bytes of UTF-8 JSON chosen by the writer
 *
 * A writer fills a temporary file and renames it into place when closed, so
 * a file under its final name is always complete; a file cut short anyway
 * (a partial copy) loses its index, and ft_record_open with `recover` then
 * rebuilds one from the records whose checksums still hold. */
#ifndef FT_DATA_RECORD_H
#define FT_DATA_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "data/sample.h"

#define FT_RECORD_MAGIC "FTRECORD"
#define FT_RECORD_VERSION 1u
#define FT_RECORD_HEADER_SIZE 64
#define FT_RECORD_ENTRY_SIZE 40
/* The largest height or width of a raw record, as for array sources. */
#define FT_RECORD_MAX_SIDE (1u << 24)

/* CRC-32C (Castagnoli, as iSCSI and ext4): ft_crc32c(0, "123456789", 9) is
 * 0xe3069283; pass a previous result as `crc` to continue a sum. */
uint32_t ft_crc32c(uint32_t crc, const void *data, size_t n);

typedef struct ft_record_writer ft_record_writer;

ft_status ft_record_writer_open(ft_record_writer **out, const char *path);

/* Whether a raw record of these sizes may hold n bytes: sides in
 * [1, FT_RECORD_MAX_SIDE], channels 1 or 3, height * width * channels == n. */
bool ft_raw_size_ok(uint32_t height, uint32_t width, uint32_t channels, size_t n);

/* Appends one record. JPEG records may give 0 for the sizes; raw records
 * need ft_raw_size_ok. */
ft_status ft_record_writer_add(ft_record_writer *w, ft_sample_kind kind, const void *data, size_t n, int64_t label,
                               uint32_t height, uint32_t width, uint32_t channels);

int64_t ft_record_writer_count(const ft_record_writer *w);

/* Writes the index and `meta`, and moves the file into place. Frees w
 * whatever happens; on failure the partial file is removed. */
ft_status ft_record_writer_close(ft_record_writer *w, const void *meta, size_t meta_len);

/* Frees w and removes the partial file. */
void ft_record_writer_abort(ft_record_writer *w);

typedef struct ft_record_file ft_record_file;

/* Opens the file, checks its header and reads its index. With `recover`, a file
 * whose index is missing or damaged is read by walking its records from the
 * start, keeping those whose length and checksum hold. */
ft_status ft_record_open(ft_record_file **out, const char *path, bool recover);
void ft_record_close(ft_record_file *f);

int64_t ft_record_count(const ft_record_file *f);
const char *ft_record_path(const ft_record_file *f);
/* True when the index was rebuilt by `recover`. */
bool ft_record_recovered(const ft_record_file *f);

/* The writer's meta bytes (not NUL-terminated). */
const char *ft_record_meta(const ft_record_file *f, size_t *len);

/* Record i, read into buf, as a sample pointing into buf; with `verify` its
 * checksum is checked first (FT_ERR_FORMAT on a mismatch). Safe from any
 * number of threads with distinct bufs. */
ft_status ft_record_get(const ft_record_file *f, int64_t i, bool verify, ft_fetch_buf *buf, ft_sample *out);

#endif
