/* Helpers of the harnesses. The readers under test take a path and mmap it, so each input becomes an
 * anonymous in-memory file reached through /proc/self/fd: no disk writes per
 * execution, and nothing left behind when a run is killed. */
#ifndef FT_FUZZ_FILE_H
#define FT_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    int fd;
    char path[64];
} fuzz_file;

static inline void fuzz_file_open(fuzz_file *f, const uint8_t *data, size_t size) {
    f->fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (f->fd < 0) {
        perror("memfd_create");
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t n = write(f->fd, data + done, size - done);
        if (n <= 0) {
            perror("write");
            abort();
        }
        done += (size_t)n;
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

static inline void fuzz_file_close(fuzz_file *f) { close(f->fd); }

/* Reads every byte of a sample the reader hands out, so that a bound it got
 * wrong shows as an out-of-range read (ASan, or SIGBUS/SIGSEGV past the
 * mapping) rather than going unnoticed. */
static inline unsigned fuzz_touch(const uint8_t *p, size_t n) {
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += p[i];
    return sum;
}

/* n bytes ending at a PROT_NONE page (the system decoders are not
 * instrumented: a write past what a wrapper promised faults at once). Free
 * with fuzz_guarded_free(p, n). */
static inline uint8_t *fuzz_guarded_alloc(size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (n + page - 1) / page * page;
    uint8_t *base = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        abort();
    mprotect(base + span, page, PROT_NONE);
    return base + span - n;
}

static inline void fuzz_guarded_free(uint8_t *p, size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (n + page - 1) / page * page;
    munmap(p + n - span, span + page);
}

#endif
