/* The JPEG wrapper (data/jpeg.c) on arbitrary bytes: its own frame header
 * reader, then decodes at the scales and pixel formats the loader uses, into
 * buffers sized from that header as augment.c sizes them.
 *
 * libjpeg-turbo is the system library, not instrumented: ASan cannot see its
 * writes, so each output buffer ends at a PROT_NONE page and a write past the
 * size the wrapper promised faults at once. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "data/jpeg.h"
#include "fuzz_file.h"

/* Larger frames are valid, but decoding them only spends the fuzzer's time
 * and memory limit without reaching other code. */
#define MAX_PIXELS (1 << 22)

static ft_jpeg_decoder *decoder;

static void decode_guarded(const uint8_t *data, size_t size, const ft_jpeg_info *info, int num, int bpp) {
    size_t w = (size_t)ft_jpeg_scaled(info->width, num), h = (size_t)ft_jpeg_scaled(info->height, num);
    size_t n = w * h * (size_t)bpp;
    uint8_t *out = fuzz_guarded_alloc(n);
    ft_jpeg_decode(decoder, data, size, info, num, bpp, out, w * (size_t)bpp);
    fuzz_guarded_free(out, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!decoder && ft_jpeg_decoder_new(&decoder) != FT_OK)
        abort();
    ft_jpeg_info info;
    if (ft_jpeg_read_info(data, size, &info) != FT_OK)
        return 0;
    if (info.width < 1 || info.height < 1 || !(info.components == 1 || info.components == 3 || info.components == 4))
        __builtin_trap(); /* read_info promised to reject these */
    if ((int64_t)info.width * info.height > MAX_PIXELS)
        return 0;
    /* Full size as RGB (the Python decode), 1/8 as RGBX and 1/2 as luma (the
     * loader's DCT-scaled paths). */
    decode_guarded(data, size, &info, 8, 3);
    decode_guarded(data, size, &info, 1, 4);
    decode_guarded(data, size, &info, 4, 1);
    return 0;
}
