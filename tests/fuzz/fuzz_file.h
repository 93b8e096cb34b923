/* The readers under test take a path and mmap it, so each input becomes an
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

static void fuzz_file_open(fuzz_file *f, const uint8_t *data, size_t size) {
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

static void fuzz_file_close(fuzz_file *f) { close(f->fd); }

/* Reads every byte of a sample the reader hands out, so that a bound it got
 * wrong shows as an out-of-range read (ASan, or SIGBUS/SIGSEGV past the
 * mapping) rather than going unnoticed. */
static unsigned fuzz_touch(const uint8_t *p, size_t n) {
    unsigned sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += p[i];
    return sum;
}

#endif
