/* The PNG wrapper (data/png.c) on arbitrary bytes: its own IHDR reader, then
 * full decodes to RGB and to gray, as augment.c sizes them, from that header.
 *
 * libpng is the system library, not instrumented: ASan cannot see its
 * writes, so each output buffer ends at a PROT_NONE page and a write past the
 * size the wrapper promised faults at once. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "data/png.h"
#include "fuzz_file.h"

/* Larger images are valid, but decoding them only spends the fuzzer's time
 * and memory limit without reaching other code. */
#define MAX_PIXELS (1 << 22)

static void decode_guarded(const uint8_t *data, size_t size, const ft_png_info *info, int channels) {
    size_t n = (size_t)info->width * info->height * (size_t)channels;
    uint8_t *out = fuzz_guarded_alloc(n);
    ft_png_decode(data, size, info, channels, out, (size_t)info->width * channels);
    fuzz_guarded_free(out, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_png_info info;
    if (ft_png_read_info(data, size, &info) != FT_OK)
        return 0;
    if (info.width < 1 || info.height < 1 || info.bit_depth < 1 || info.bit_depth > 16 || info.color_type > 6)
        __builtin_trap(); /* read_info promised to reject these */
    if ((int64_t)info.width * info.height > MAX_PIXELS)
        return 0;
    decode_guarded(data, size, &info, 3);
    decode_guarded(data, size, &info, 1);
    return 0;
}
