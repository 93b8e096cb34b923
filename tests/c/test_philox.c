/* Philox4x32-10 against the published known-answer vectors. */
#include <stdint.h>

#include "check.h"
#include "kernels/philox.h"

/* The philox4x32 10 lines of Random123's known-answer file
 * (DEShawResearch/random123, tests/kat_vectors; columns: counter[4] key[2]
 * expected[4]):
 *
 *   philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
 *   philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
 *   philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
 *
 * and two of the single-bit lines of the Random123 manual's examples/kat_vectors
 * (girving/random123-manual), same columns. */
static const struct {
    uint32_t ctr[4], key[2], expected[4];
} kat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    {{0x00000001, 0x00000000, 0x00000000, 0x00000000}, {0x00000001, 0x00000000},
     {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0x00000000, 0xffffffff},
     {0x08f7720c, 0x845ee9e0, 0x502ccd3d, 0xa9a00e27}},
};

static int block_eq(ft_philox_block b, const uint32_t *w) {
    return b.v[0] == w[0] && b.v[1] == w[1] && b.v[2] == w[2] && b.v[3] == w[3];
}

static void test_known_answers(void) {
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        ft_philox_block ctr = {{kat[i].ctr[0], kat[i].ctr[1], kat[i].ctr[2], kat[i].ctr[3]}};
        ft_philox_block r = ft_philox4x32_10(ctr, kat[i].key[0], kat[i].key[1]);
        CHECKF(block_eq(r, kat[i].expected), "vector %zu: got %08x %08x %08x %08x", i, r.v[0], r.v[1], r.v[2],
               r.v[3]);
    }
}

/* ft_philox(seed, stream, block): counter = (block lo, block hi, stream lo,
 * stream hi), key = (seed lo, seed hi), as philox.h documents. */
static void test_counter_layout(void) {
    CHECK(block_eq(ft_philox(0, 0, 0), kat[0].expected));
    CHECK(block_eq(ft_philox(UINT64_MAX, UINT64_MAX, UINT64_MAX), kat[1].expected));
    CHECK(block_eq(ft_philox(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull), kat[2].expected));
    CHECK(block_eq(ft_philox(1, 0, 1), kat[3].expected));
}

static void test_uniform_mapping(void) {
    /* 24 (11, 8) top bits scaled by 2^-24 (2^-11, 2^-8): never 1. */
    CHECK(ft_uniform_f32(0, 24) == 0.0f);
    CHECK(ft_uniform_f32(0xffffffffu, 24) == 1.0f - 0x1p-24f);
    CHECK(ft_uniform_f32(0xffffffffu, 11) == 1.0f - 0x1p-11f);
    CHECK(ft_uniform_f32(0xffffffffu, 8) == 1.0f - 0x1p-8f);
    CHECK(ft_uniform_f32(0x80000000u, 24) == 0.5f);
    CHECK(ft_uniform_f32(0x000000ffu, 24) == 0.0f); /* only the top bits count */
    CHECK(ft_uniform_f32(0x00000100u, 24) == 0x1p-24f);
    CHECK(ft_uniform_f32(0x00200000u, 11) == 0x1p-11f);
    CHECK(ft_uniform_f64(0, 0) == 0.0);
    CHECK(ft_uniform_f64(0xffffffffu, 0xffffffffu) == 1.0 - 0x1p-53);
    CHECK(ft_uniform_f64(0, 0x80000000u) == 0.5);        /* hi word holds the top bits */
    CHECK(ft_uniform_f64(0x00000800u, 0) == 0x1p-53);    /* bit 11 of lo is the lowest kept */
    CHECK(ft_uniform_f64(0x000007ffu, 0) == 0.0);
}

int main(void) {
    test_known_answers();
    test_counter_layout();
    test_uniform_mapping();
    return check_main_result("test_philox");
}
