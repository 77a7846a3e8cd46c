/*
 * fuzz_philox.c — libFuzzer target for the stochastic-rounding random stream.
 *
 * For a random seed, start (offset + index, often near the 2^64 wrap and at
 * every phase mod 4) and length n (0..300):
 *   - fp8mix_random_words(seed, start, n) must equal fp8mix_random_word(seed,
 *     offset, index + t) for every t, for any split of start into offset +
 *     index (the bulk generator and the per-element definition agree);
 *   - fp8mix_random_word must equal the header's formula evaluated here:
 *     c = offset + n (mod 2^64), out = philox4x32_10({lo(c/4), hi(c/4), 0, 0},
 *     {lo(seed), hi(seed)}), r = out[c % 4];
 *   - fp8mix_philox4x32_10 must equal an independent Philox4x32-10 written
 *     here from Salmon et al. (SC'11) for a random counter and key;
 *   - the three Random123 known-answer vectors hold (checked on every input:
 *     cheap, and a sanity check that the build is the real generator).
 * The output buffer has exactly n words, so an overrun past n is an ASan
 * error; a word written twice or skipped shows up as a mismatch.
 */
#include "fuzz_common.h"

static void philox_indep(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) { /* key schedule: bump before every round but the first */
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t m0 = (uint64_t)x0 * 0xD2511F53u, m1 = (uint64_t)x2 * 0xCD9E8D57u;
        uint32_t hi0 = (uint32_t)(m0 >> 32), lo0 = (uint32_t)m0, hi1 = (uint32_t)(m1 >> 32), lo1 = (uint32_t)m1;
        uint32_t y0 = hi1 ^ x1 ^ k0, y1 = lo1, y2 = hi0 ^ x3 ^ k1, y3 = lo0;
        x0 = y0; x1 = y1; x2 = y2; x3 = y3;
    }
    out[0] = x0; out[1] = x1; out[2] = x2; out[3] = x3;
}

static void kat(void)
{
    static const struct { uint32_t c[4], k[2], o[4]; } v[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t o[4], o2[4];
        fp8mix_philox4x32_10(v[i].c, v[i].k, o);
        philox_indep(v[i].c, v[i].k, o2);
        for (int w = 0; w < 4; w++) {
            FUZZ_CHECK(o[w] == v[i].o[w], "Random123 KAT %d word %d: 0x%08x, expected 0x%08x", i, w, o[w], v[i].o[w]);
            FUZZ_CHECK(o2[w] == v[i].o[w], "independent Philox KAT %d word %d", i, w);
        }
    }
}

/* Declared in csrc/core/internal.h (not the public header). */
void fp8mix_random_words(uint64_t seed, uint64_t offset_plus_index, int64_t n, uint32_t *r);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    kat();
    uint64_t seed = fz_u64(&f);
    uint8_t k = fz_u8(&f);
    uint64_t offset;
    switch (k & 3) {
    case 0: offset = fz_below(&f, 64); break;
    case 1: offset = UINT64_MAX - fz_below(&f, 400); break;               /* wraps */
    case 2: offset = ((uint64_t)fz_u32(&f) << 2) - fz_below(&f, 8); break; /* 32-bit counter carry */
    default: offset = fz_u64(&f); break;
    }
    uint64_t index = (k & 4) ? fz_below(&f, 1000) : 0;
    int64_t n = fz_below(&f, 301);

    uint32_t *r = n ? (uint32_t *)malloc((size_t)n * 4) : NULL;
    fp8mix_random_words(seed, offset + index, n, r);
    for (int64_t t = 0; t < n; t++) {
        uint32_t w = fp8mix_random_word(seed, offset, index + (uint64_t)t);
        FUZZ_CHECK(r[t] == w, "random_words(seed 0x%016llx, start 0x%016llx, n %lld)[%lld] = 0x%08x, "
                   "random_word 0x%08x", (unsigned long long)seed, (unsigned long long)(offset + index),
                   (long long)n, (long long)t, r[t], w);
        /* the header's formula */
        uint64_t c = offset + index + (uint64_t)t, blk = c >> 2;
        uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, 0};
        uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
        philox_indep(ctr, key, out);
        FUZZ_CHECK(w == out[c & 3], "random_word(seed 0x%016llx, offset 0x%016llx, n %llu) = 0x%08x, formula 0x%08x",
                   (unsigned long long)seed, (unsigned long long)offset, (unsigned long long)(index + t), w,
                   out[c & 3]);
    }
    free(r);

    /* the block function itself on a random counter and key */
    uint32_t ctr[4], key[2], o1[4], o2[4];
    for (int i = 0; i < 4; i++) ctr[i] = fz_u32(&f);
    key[0] = fz_u32(&f);
    key[1] = fz_u32(&f);
    fp8mix_philox4x32_10(ctr, key, o1);
    philox_indep(ctr, key, o2);
    FUZZ_CHECK(memcmp(o1, o2, sizeof o1) == 0, "philox4x32_10 differs from the independent implementation");
    return 0;
}
