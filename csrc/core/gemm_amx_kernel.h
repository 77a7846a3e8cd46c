/*
 * gemm_amx_kernel.h — the AMX GEMM microkernel, written once against five tile
 * operations and compiled twice: with the hardware instructions
 * (x86/gemm_amx.c, -mamx-tile -mamx-bf16) and with their scalar emulation
 * (gemm_amx_ref.c, any CPU), so that the kernel's blocking, packing and
 * epilogue run in every test.  The includer defines:
 *   AMX_NAME(x)           the suffixed name of a static function (x##_hw, x##_emu)
 *   AMX_PUBLIC(x)         the name of an entry point of gemm_internal.h (x, x##_emu)
 *   AMX_STATE             a declaration of the tile state of one call (or nothing)
 *   AMX_CFG()             ldtilecfg of CFG (below)
 *   AMX_ZERO(t)           tilezero tmm t
 *   AMX_LOAD(t, p, s)     tileloadd tmm t from p, row stride s bytes
 *   AMX_STORE(t, p, s)    tilestored tmm t to p, row stride s bytes
 *   AMX_DP(d, a, b)       tdpbf16ps tmm d += tmm a . tmm b
 *
 * Tile: 32 x 32 of C in four 16 x 16 float32 tiles (tmm0-3: rows 0-15 / 16-31 x
 * columns 0-15 / 16-31), A in tmm4-5 (16 rows x 16 bf16 pairs), B in tmm6-7
 * (16 pair-rows x 16 columns, the VNNI pair layout).  Per 32-deep chunk of K:
 *   A panel (gemm_amx_ref.c's packing): word a[t * 512 + r * 16 + u] is the bf16
 *     pair (k = 32t + 2u, 32t + 2u + 1) of row r: rows 0-15 are one tile (stride
 *     64 bytes), rows 16-31 the next;
 *   B sliver (the bf16 packing of gemm_internal.h with NR = 32, padded to 32 k):
 *     word b[(16t + u) * 32 + c]: a tile is 16 rows of 16 words at stride 128 bytes.
 * The summation order is tdpbf16ps's (fp8mix.h, fp8mix_gemm_order): it is the
 * NATIVE order on AMX machines, never the canonical one.
 */

/* Palette 1, tiles 0-7 all 16 rows x 64 bytes (the 64-byte ldtilecfg operand). */
static const unsigned char AMX_NAME(cfg)[64] = {
    1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0};

/* C (32 x 32 at c, row stride ldc floats) = (load ? C : +0) + the products of kc
 * (a multiple of 32) k-steps, in the tiles' order. */
static void AMX_NAME(run)(int64_t kc, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc, int load)
{
    AMX_STATE;
    const int64_t sc = ldc * (int64_t)sizeof(float);
    AMX_CFG();
    if (load) {
        AMX_LOAD(0, c, sc);
        AMX_LOAD(1, c + 16, sc);
        AMX_LOAD(2, c + 16 * ldc, sc);
        AMX_LOAD(3, c + 16 * ldc + 16, sc);
    } else {
        AMX_ZERO(0);
        AMX_ZERO(1);
        AMX_ZERO(2);
        AMX_ZERO(3);
    }
    for (int64_t t = 0; t < kc / 32; t++, a += 512, b += 512) {
        AMX_LOAD(4, a, 64);
        AMX_LOAD(5, a + 256, 64);
        AMX_LOAD(6, b, 128);
        AMX_LOAD(7, b + 16, 128);
        AMX_DP(0, 4, 6);
        AMX_DP(1, 4, 7);
        AMX_DP(2, 5, 6);
        AMX_DP(3, 5, 7);
    }
    AMX_STORE(0, c, sc);
    AMX_STORE(1, c + 16, sc);
    AMX_STORE(2, c + 16 * ldc, sc);
    AMX_STORE(3, c + 16 * ldc + 16, sc);
}

/* fp8mix_gemm_ukernel_fn: with rs the block-scale mode (the part summed in the tiles
 * from +0, then C = (load_c ? C : +0) + part * rs[r] here, mul then add). */
void AMX_PUBLIC(fp8mix_gemm_ukernel_bf16_32x32__amx)(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                                     int load_c, const float *rs)
{
    if (!rs) {
        AMX_NAME(run)(kc, (const uint32_t *)ap, (const uint32_t *)bp, c, ldc, load_c);
        return;
    }
    float part[32 * 32];
    AMX_NAME(run)(kc, (const uint32_t *)ap, (const uint32_t *)bp, part, 32, 0);
    for (int r = 0; r < 32; r++)
        for (int x = 0; x < 32; x++) {
            float o = load_c ? c[r * ldc + x] : 0.0f;
            c[r * ldc + x] = o + part[r * 32 + x] * rs[r];
        }
}

/* fp8mix_gemm_ukernel_mx_fn: one tile pass per 32-deep block from +0, then
 * C = (load_c || q > 0 ? C : +0) + part * (sa[r] * sb[c]). */
void AMX_PUBLIC(fp8mix_gemm_ukernel_mx_bf16_32x32__amx)(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                                        int load_c, const float *sa, const float *sb)
{
    float part[32 * 32];
    for (int64_t q = 0; q * 32 < kc; q++) {
        AMX_NAME(run)(32, (const uint32_t *)ap + q * 512, (const uint32_t *)bp + q * 512, part, 32, 0);
        const int add = load_c || q > 0;
        for (int r = 0; r < 32; r++)
            for (int x = 0; x < 32; x++) {
                float o = add ? c[r * ldc + x] : 0.0f;
                c[r * ldc + x] = o + part[r * 32 + x] * (sa[q * 32 + r] * sb[q * 32 + x]);
            }
    }
}
