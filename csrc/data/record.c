#include "data/record.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- CRC-32C ---- */

static uint32_t crc_table[8][256];
static bool crc_have_sse42;

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xff];
    __builtin_cpu_init();
    crc_have_sse42 = __builtin_cpu_supports("sse4.2");
}

/* Slicing-by-8: the portable path. */
static uint32_t crc_soft(uint32_t c, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
            crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
            crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

/* The SSE4.2 crc32 instruction computes exactly this polynomial, 8 bytes
 * per instruction. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n) {
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}

uint32_t ft_crc32c(uint32_t crc, const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    uint32_t c = ~crc;
    c = crc_have_sse42 ? crc_hw(c, data, n) : crc_soft(c, data, n);
    return ~c;
}

/* ---- little-endian fields ---- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static size_t pad8(size_t n) { return (8 - (n & 7)) & 7; }

bool ft_raw_size_ok(uint32_t height, uint32_t width, uint32_t channels, size_t n) {
    /* Sides are bounded before multiplying: the product of three 32-bit
     * fields can wrap around 64 bits onto a small byte count. */
    return height >= 1 && height <= FT_RECORD_MAX_SIDE && width >= 1 && width <= FT_RECORD_MAX_SIDE &&
           (channels == 1 || channels == 3) && (uint64_t)height * width * channels == (uint64_t)n;
}

/* ---- writer ---- */

struct ft_record_writer {
    FILE *fp;
    char *path, *tmp_path;
    uint64_t offset; /* bytes written so far */
    uint64_t *offsets;
    int64_t count, cap;
};

static ft_status write_all(ft_record_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->fp) != n)
        return ft_fail(FT_ERR_IO, "writing %s: %s", w->tmp_path, strerror(errno));
    w->offset += n;
    return FT_OK;
}

static void writer_free(ft_record_writer *w, bool remove_tmp) {
    if (w->fp)
        fclose(w->fp);
    if (remove_tmp && w->tmp_path)
        unlink(w->tmp_path);
    free(w->path);
    free(w->tmp_path);
    free(w->offsets);
    free(w);
}

ft_status ft_record_writer_open(ft_record_writer **out, const char *path) {
    ft_record_writer *w = calloc(1, sizeof *w);
    size_t len = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp_path = malloc(len + 32))) {
        if (w)
            writer_free(w, false);
        return ft_fail(FT_ERR_NOMEM, "out of memory opening a record writer");
    }
    snprintf(w->tmp_path, len + 32, "%s.tmp%ld", path, (long)getpid());
    w->fp = fopen(w->tmp_path, "wb");
    if (!w->fp) {
        int err = errno;
        writer_free(w, false);
        return ft_fail(FT_ERR_IO, "cannot create %s.tmp*: %s", path, strerror(err));
    }
    setvbuf(w->fp, NULL, _IOFBF, 1 << 20);
    /* The real header is written at close; until then the file has none. */
    uint8_t zero[FT_RECORD_HEADER_SIZE] = {0};
    ft_status s = write_all(w, zero, sizeof zero);
    if (s != FT_OK) {
        writer_free(w, true);
        return s;
    }
    *out = w;
    return FT_OK;
}

ft_status ft_record_writer_add(ft_record_writer *w, ft_sample_kind kind, const void *data, size_t n, int64_t label,
                               uint32_t height, uint32_t width, uint32_t channels) {
    if (kind != FT_SAMPLE_JPEG && kind != FT_SAMPLE_RAW)
        return ft_fail(FT_ERR_VALUE, "unknown record kind %d", (int)kind);
    if (kind == FT_SAMPLE_RAW && !ft_raw_size_ok(height, width, channels, n))
        return ft_fail(FT_ERR_VALUE, "a raw record of %u x %u x %u pixels must have 1 to %u rows and columns, 1 or 3 "
                                     "channels and one byte per value, got %zu bytes",
                       height, width, channels, FT_RECORD_MAX_SIDE, n);
    if (w->count == w->cap) {
        int64_t cap = w->cap ? w->cap * 2 : 1024;
        uint64_t *grown = realloc(w->offsets, (size_t)cap * sizeof *grown);
        if (!grown)
            return ft_fail(FT_ERR_NOMEM, "out of memory growing a record index");
        w->offsets = grown;
        w->cap = cap;
    }
    uint8_t head[FT_RECORD_ENTRY_SIZE] = {0};
    put_u32(head + 4, (uint32_t)kind);
    put_u64(head + 8, n);
    put_u64(head + 16, (uint64_t)label);
    put_u32(head + 24, height);
    put_u32(head + 28, width);
    put_u32(head + 32, channels);
    uint32_t crc = ft_crc32c(ft_crc32c(0, head + 4, FT_RECORD_ENTRY_SIZE - 4), data, n);
    put_u32(head, crc);
    uint64_t at = w->offset;
    static const uint8_t zeros[8] = {0};
    FT_TRY(write_all(w, head, sizeof head));
    FT_TRY(write_all(w, data, n));
    FT_TRY(write_all(w, zeros, pad8(n)));
    w->offsets[w->count++] = at;
    return FT_OK;
}

int64_t ft_record_writer_count(const ft_record_writer *w) { return w->count; }

static ft_status writer_finish(ft_record_writer *w, const void *meta, size_t meta_len) {
    uint64_t index_offset = w->offset;
    uint32_t index_crc = 0;
    uint8_t buf[8];
    for (int64_t i = 0; i < w->count; i++) {
        put_u64(buf, w->offsets[i]);
        index_crc = ft_crc32c(index_crc, buf, 8);
        FT_TRY(write_all(w, buf, 8));
    }
    uint64_t meta_offset = w->offset;
    index_crc = ft_crc32c(index_crc, meta, meta_len);
    FT_TRY(write_all(w, meta, meta_len));

    uint8_t head[FT_RECORD_HEADER_SIZE] = {0};
    memcpy(head, FT_RECORD_MAGIC, 8);
    put_u32(head + 8, FT_RECORD_VERSION);
    put_u64(head + 16, (uint64_t)w->count);
    put_u64(head + 24, index_offset);
    put_u64(head + 32, meta_offset);
    put_u64(head + 40, meta_len);
    put_u32(head + 48, index_crc);
    put_u32(head + 52, ft_crc32c(0, head, 52));
    if (fseek(w->fp, 0, SEEK_SET) != 0 || fwrite(head, 1, sizeof head, w->fp) != sizeof head || fflush(w->fp) != 0 ||
        fsync(fileno(w->fp)) != 0)
        return ft_fail(FT_ERR_IO, "writing %s: %s", w->tmp_path, strerror(errno));
    FILE *fp = w->fp;
    w->fp = NULL;
    if (fclose(fp) != 0)
        return ft_fail(FT_ERR_IO, "closing %s: %s", w->tmp_path, strerror(errno));
    if (rename(w->tmp_path, w->path) != 0)
        return ft_fail(FT_ERR_IO, "renaming %s to %s: %s", w->tmp_path, w->path, strerror(errno));
    return FT_OK;
}

ft_status ft_record_writer_close(ft_record_writer *w, const void *meta, size_t meta_len) {
    ft_status s = writer_finish(w, meta ? meta : "", meta ? meta_len : 0);
    writer_free(w, s != FT_OK);
    return s;
}

void ft_record_writer_abort(ft_record_writer *w) { writer_free(w, true); }

/* ---- reader ---- */

/* The most bytes a read of an entry guesses it needs. */
#define GUESS_MAX ((uint64_t)1 << 20)

struct ft_record_file {
    char *path;
    int fd; /* -1 until opened */
    uint64_t size; /* at open: reads past it are refused before they are tried */
    uint64_t data_end; /* where records end (the index, or the file's end when recovered) */
    uint64_t *offsets; /* (count) record offsets, from the index or recovered; the meta bytes follow */
    bool recovered;
    int64_t count;
    const uint8_t *meta;
    size_t meta_len;
};

void ft_record_close(ft_record_file *f) {
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    free(f->offsets);
    free(f->path);
    free(f);
}

/* The length of the entry at `off` from its 40-byte header, or false when the
 * entry does not fit in the records' part of the file. */
static bool entry_length(const ft_record_file *f, uint64_t off, const uint8_t *hdr, uint64_t *len) {
    *len = get_u64(hdr + 8);
    return *len <= f->data_end - off - FT_RECORD_ENTRY_SIZE;
}

static bool entry_placed(const ft_record_file *f, uint64_t off) {
    return off >= FT_RECORD_HEADER_SIZE && off % 8 == 0 && off <= f->data_end &&
           f->data_end - off >= FT_RECORD_ENTRY_SIZE;
}

/* Reads the entry at `off` (header and payload) into buf, which the caller
 * has filled with the entry's first `have` bytes (at least its header). */
static ft_status read_entry_rest(const ft_record_file *f, uint64_t off, uint64_t len, size_t have, ft_fetch_buf *buf) {
    size_t total = FT_RECORD_ENTRY_SIZE + (size_t)len;
    if (have >= total)
        return FT_OK;
    FT_TRY(ft_fetch_buf_reserve(buf, total));
    return ft_read_at(f->fd, off + have, buf->data + have, total - have, f->path);
}

static bool entry_crc_ok(const uint8_t *entry, uint64_t len) {
    return ft_crc32c(0, entry + 4, FT_RECORD_ENTRY_SIZE - 4 + len) == get_u32(entry);
}

static ft_status recover_index(ft_record_file *f) {
    int64_t cap = 1024, n = 0;
    uint64_t *offs = malloc((size_t)cap * sizeof *offs);
    if (!offs)
        return ft_fail(FT_ERR_NOMEM, "out of memory recovering %s", f->path);
    f->data_end = f->size;
    ft_fetch_buf buf = {0};
    ft_status st = FT_OK;
    uint64_t off = FT_RECORD_HEADER_SIZE, len;
    while (entry_placed(f, off) && (st = ft_fetch_buf_reserve(&buf, FT_RECORD_ENTRY_SIZE)) == FT_OK &&
           (st = ft_read_at(f->fd, off, buf.data, FT_RECORD_ENTRY_SIZE, f->path)) == FT_OK &&
           entry_length(f, off, buf.data, &len)) {
        uint32_t kind = get_u32(buf.data + 4);
        if (kind != FT_SAMPLE_JPEG && kind != FT_SAMPLE_RAW)
            break;
        if ((st = read_entry_rest(f, off, len, FT_RECORD_ENTRY_SIZE, &buf)) != FT_OK || !entry_crc_ok(buf.data, len))
            break;
        if (n == cap) {
            uint64_t *grown = realloc(offs, (size_t)(cap *= 2) * sizeof *grown);
            if (!grown) {
                st = ft_fail(FT_ERR_NOMEM, "out of memory recovering %s", f->path);
                break;
            }
            offs = grown;
        }
        offs[n++] = off;
        uint64_t end = off + FT_RECORD_ENTRY_SIZE + len;
        off = end + pad8(end);
    }
    ft_fetch_buf_free(&buf);
    if (st != FT_OK) {
        free(offs);
        return st;
    }
    f->offsets = offs;
    f->recovered = true;
    f->count = n;
    return FT_OK;
}

/* Checks the header and reads the index and meta; FT_ERR_FORMAT with the
 * reason when they do not hold. */
static ft_status read_layout(ft_record_file *f, const uint8_t *h) {
    if (get_u32(h + 52) != ft_crc32c(0, h, 52)) {
        if (get_u64(h + 24) == 0 && get_u32(h + 52) == 0)
            return ft_fail(FT_ERR_FORMAT, "%s was never closed by its writer (no index)", f->path);
        return ft_fail(FT_ERR_FORMAT, "%s: the header checksum does not match (damaged file)", f->path);
    }
    uint32_t version = get_u32(h + 8);
    if (version != FT_RECORD_VERSION)
        return ft_fail(FT_ERR_FORMAT, "%s: record format version %u, this build reads version %u", f->path, version,
                       FT_RECORD_VERSION);
    /* A writer that sets a flag means something this reader does not know. */
    if (get_u32(h + 12) != 0)
        return ft_fail(FT_ERR_FORMAT, "%s: header flags 0x%x are not known to this build (reserved, must be 0)",
                       f->path, get_u32(h + 12));
    uint64_t count = get_u64(h + 16), index_off = get_u64(h + 24), meta_off = get_u64(h + 32),
             meta_len = get_u64(h + 40);
    if (index_off % 8 || index_off < FT_RECORD_HEADER_SIZE || count > (UINT64_MAX - index_off) / 8 ||
        index_off + count * 8 > f->size || meta_off != index_off + count * 8 || meta_len > f->size - meta_off)
        return ft_fail(FT_ERR_FORMAT,
                       "%s is truncated or damaged: its index (%llu records at byte %llu, then %llu meta bytes) "
                       "does not fit in its %llu bytes",
                       f->path, (unsigned long long)count, (unsigned long long)index_off,
                       (unsigned long long)meta_len, (unsigned long long)f->size);
    size_t n = (size_t)(count * 8 + meta_len);
    uint8_t *raw = malloc(n ? n : 1);
    if (!raw)
        return ft_fail(FT_ERR_NOMEM, "out of memory reading the index of %s (%zu bytes)", f->path, n);
    ft_status st = ft_read_at(f->fd, index_off, raw, n, f->path);
    if (st == FT_OK && ft_crc32c(0, raw, n) != get_u32(h + 48))
        st = ft_fail(FT_ERR_FORMAT, "%s: the index checksum does not match (damaged file)", f->path);
    if (st != FT_OK) {
        free(raw);
        return st;
    }
    /* The offsets replace their little-endian bytes in place; the meta follows them. */
    f->offsets = (uint64_t *)raw;
    for (uint64_t i = 0; i < count; i++)
        f->offsets[i] = get_u64(raw + 8 * i);
    f->count = (int64_t)count;
    f->data_end = index_off;
    f->meta = raw + count * 8;
    f->meta_len = (size_t)meta_len;
    return FT_OK;
}

/* Whether the header is intact (its checksum holds) but of a version or with flags this build does not know:
 * a newer writer's file, which recovery would misread rather than repair. */
static bool newer_header(const uint8_t *h) {
    return get_u32(h + 52) == ft_crc32c(0, h, 52) && (get_u32(h + 8) != FT_RECORD_VERSION || get_u32(h + 12) != 0);
}

ft_status ft_record_open(ft_record_file **out, const char *path, bool recover) {
    ft_record_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return ft_fail(FT_ERR_NOMEM, "out of memory opening %s", path);
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0) {
        ft_status s = ft_fail(FT_ERR_IO, "cannot open record file %s: %s", path, strerror(errno));
        ft_record_close(f);
        return s;
    }
    f->size = (uint64_t)st.st_size;
    uint8_t h[FT_RECORD_HEADER_SIZE];
    ft_status s = FT_OK;
    if (f->size < FT_RECORD_HEADER_SIZE || (s = ft_read_at(f->fd, 0, h, sizeof h, path)) != FT_OK ||
        memcmp(h, FT_RECORD_MAGIC, 8) != 0) {
        if (s == FT_OK)
            s = ft_fail(FT_ERR_FORMAT, "%s is not a fasttrain record file (no FTRECORD header)", path);
    } else {
        s = read_layout(f, h);
        if (s == FT_ERR_FORMAT && recover && !newer_header(h))
            s = recover_index(f);
    }
    if (s != FT_OK) {
        ft_record_close(f);
        return s;
    }
    *out = f;
    return FT_OK;
}

int64_t ft_record_count(const ft_record_file *f) { return f->count; }
const char *ft_record_path(const ft_record_file *f) { return f->path; }
bool ft_record_recovered(const ft_record_file *f) { return f->recovered; }

const char *ft_record_meta(const ft_record_file *f, size_t *len) {
    *len = f->meta_len;
    return (const char *)f->meta;
}

ft_status ft_record_get(const ft_record_file *f, int64_t i, bool verify, ft_fetch_buf *buf, ft_sample *out) {
    if (i < 0 || i >= f->count)
        return ft_fail(FT_ERR_INDEX, "record %lld is out of range for %s with %lld records", (long long)i, f->path,
                       (long long)f->count);
    uint64_t off = f->offsets[i];
    if (!entry_placed(f, off))
        return ft_fail(FT_ERR_FORMAT, "%s: record %lld at byte %llu does not fit in the file (damaged index)",
                       f->path, (long long)i, (unsigned long long)off);
    /* One read in the usual case: records are written in order, so the next
     * offset bounds this entry (a wrong guess costs a second read). */
    uint64_t next = i + 1 < f->count && f->offsets[i + 1] > off ? f->offsets[i + 1] : f->data_end;
    size_t guess = next - off <= GUESS_MAX ? (size_t)(next - off) : FT_RECORD_ENTRY_SIZE;
    if (guess < FT_RECORD_ENTRY_SIZE)
        guess = FT_RECORD_ENTRY_SIZE;
    FT_TRY(ft_fetch_buf_reserve(buf, guess));
    FT_TRY(ft_read_at(f->fd, off, buf->data, guess, f->path));
    uint64_t len;
    if (!entry_length(f, off, buf->data, &len))
        return ft_fail(FT_ERR_FORMAT, "%s: record %lld at byte %llu does not fit in the file (damaged index)",
                       f->path, (long long)i, (unsigned long long)off);
    FT_TRY(read_entry_rest(f, off, len, guess, buf));
    const uint8_t *h = buf->data;
    if (verify && !entry_crc_ok(h, len))
        return ft_fail(FT_ERR_FORMAT, "%s: record %lld fails its CRC32C check (damaged data)", f->path, (long long)i);
    uint32_t kind = get_u32(h + 4);
    out->kind = (ft_sample_kind)kind;
    out->data = h + FT_RECORD_ENTRY_SIZE;
    out->size = (size_t)len;
    out->label = (int64_t)get_u64(h + 16);
    out->height = (int)get_u32(h + 24);
    out->width = (int)get_u32(h + 28);
    out->channels = (int)get_u32(h + 32);
    if (kind == FT_SAMPLE_RAW) {
        if (!ft_raw_size_ok(get_u32(h + 24), get_u32(h + 28), get_u32(h + 32), out->size))
            return ft_fail(FT_ERR_FORMAT, "%s: record %lld claims %u x %u x %u pixels but holds %zu bytes", f->path,
                           (long long)i, get_u32(h + 24), get_u32(h + 28), get_u32(h + 32), out->size);
    } else if (kind != FT_SAMPLE_JPEG) {
        return ft_fail(FT_ERR_FORMAT, "%s: record %lld has unknown kind %u", f->path, (long long)i, kind);
    }
    return FT_OK;
}
