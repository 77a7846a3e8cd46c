/*
 * gemm_amx_ref.c — the AMX GEMM kernel on any CPU: a scalar emulation of the
 * tile instructions it uses (ldtilecfg, tilezero, tileloadd, tilestored,
 * tdpbf16ps, following the Intel SDM's pseudo-code), the kernel of
 * gemm_amx_kernel.h compiled against it, and the packing every AMX kernel
 * (emulated or x86/gemm_amx.c's hardware one) uses: A in the tile-row layout,
 * B in the VNNI pair layout, both padded to 32-deep chunks.  The emulated
 * kernel is the oracle of the hardware one (bit for bit, tests/c/test_gemm_amx.c)
 * and lets CI test the AMX blocking, packing and epilogue without AMX.
 * Not here: when AMX is used (dispatch.c), the order's definition (fp8mix.h).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gemm_internal.h"

/* ---- the tile emulation ------------------------------------------------- */

/* Eight tiles of 16 rows x 64 bytes and the palette-1 shape of each. */
typedef struct amx_emu {
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} amx_emu;

/* ldtilecfg: palette 1's per-tile rows and bytes per row; every tile zeroed. */
static void emu_cfg(amx_emu *s, const unsigned char *cfg)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 8; i++) {
        s->colsb[i] = (uint16_t)(cfg[16 + 2 * i] | cfg[17 + 2 * i] << 8);
        s->rows[i] = cfg[48 + i];
    }
}

static void emu_zero(amx_emu *s, int t) { memset(s->t[t], 0, sizeof s->t[t]); }

/* tileloadd: rows [0, rows) from base + r * stride, colsb bytes each; the rest zero. */
static void emu_load(amx_emu *s, int t, const void *base, int64_t stride)
{
    emu_zero(s, t);
    for (int r = 0; r < s->rows[t]; r++) memcpy(s->t[t][r], (const uint8_t *)base + r * stride, s->colsb[t]);
}

static void emu_store(const amx_emu *s, int t, void *base, int64_t stride)
{
    for (int r = 0; r < s->rows[t]; r++) memcpy((uint8_t *)base + r * stride, s->t[t][r], s->colsb[t]);
}

/* DAZ on an input, FTZ on a result: a subnormal becomes a zero of its sign. */
static inline float flush(float x)
{
    uint32_t u = f32_bits(x);
    return (u & 0x7F800000u) == 0 ? bits_f32(u & 0x80000000u) : x;
}

static inline float bf16_at(const uint8_t *row, int i)
{
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    return flush(bits_f32((uint32_t)h << 16));
}

/* tdpbf16ps d += a . b (SDM): per row m and column n two float32 partials, of the
 * even and of the odd element of each pair, start at +0 and take the products of
 * k = 0 .. colsb(a)/4 - 1 in order (FMA, round to nearest even, DAZ/FTZ); then
 * d[m][n] = d[m][n] + (even + odd), each add rounded with DAZ/FTZ. */
static void emu_dp(amx_emu *s, int d, int a, int b)
{
    int M = s->rows[d], N = s->colsb[d] / 4, K = s->colsb[a] / 4;
    for (int m = 0; m < M; m++) {
        float tmp[32];
        for (int i = 0; i < 32; i++) tmp[i] = 0.0f;
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                for (int h = 0; h < 2; h++) {
                    float x = bf16_at(s->t[a][m], 2 * k + h), y = bf16_at(s->t[b][k], 2 * n + h);
                    tmp[2 * n + h] = flush(fmaf(x, y, tmp[2 * n + h]));
                }
        for (int n = 0; n < N; n++) {
            float acc;
            memcpy(&acc, s->t[d][m] + 4 * n, 4);
            float sum = flush(tmp[2 * n] + tmp[2 * n + 1]);
            acc = flush(flush(acc) + sum);
            memcpy(s->t[d][m] + 4 * n, &acc, 4);
        }
    }
}

#define AMX_NAME(x) x##_emu
#define AMX_PUBLIC(x) x##_emu
#define AMX_STATE amx_emu st_
#define AMX_CFG() emu_cfg(&st_, cfg_emu)
#define AMX_ZERO(t) emu_zero(&st_, t)
#define AMX_LOAD(t, p, s) emu_load(&st_, t, p, s)
#define AMX_STORE(t, p, s) emu_store(&st_, t, p, s)
#define AMX_DP(d, a, b) emu_dp(&st_, d, a, b)
#include "gemm_amx_kernel.h"

/* ---- packing ------------------------------------------------------------ */

static inline uint32_t bf16_bits(const float *t, const uint8_t *src, int64_t step, int64_t k, int64_t kc)
{
    return k < kc ? f32_bits(t[src[k * step]]) >> 16 : 0u;
}

/* A in the tile-row layout (gemm_amx_kernel.h): rows r < nv of kc k-steps, element
 * (r, k) at src + r * rstep + k * kstep; rows nv .. w-1 and k-steps up to the next
 * multiple of 32 zero. */
static void pack_a(const uint8_t *src, int64_t rstep, int64_t kstep, int nv, int w, int64_t kc, fp8mix_format fmt,
                   uint32_t *dst)
{
    const float *t = fp8mix_decode_table(fmt);
    int64_t chunks = (kc + 31) / 32;
    for (int64_t c = 0; c < chunks; c++)
        for (int r = 0; r < w; r++)
            for (int u = 0; u < 16; u++) {
                int64_t k = c * 32 + 2 * u;
                const uint8_t *row = src + r * rstep;
                dst[(c * w + r) * 16 + u] =
                    r < nv ? bf16_bits(t, row, kstep, k, kc) | bf16_bits(t, row, kstep, k + 1, kc) << 16 : 0u;
            }
}

void fp8mix_gemm_pack_a_krows_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst)
{
    (void)bf16;
    pack_a(src, ld, 1, nv, w, kc, fmt, (uint32_t *)dst);
}

void fp8mix_gemm_pack_a_kcols_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst)
{
    (void)bf16;
    pack_a(src, 1, ld, nv, w, kc, fmt, (uint32_t *)dst);
}

void fp8mix_gemm_pack_amx_pad(int w, int64_t kc, void *dst)
{
    int64_t from = (kc + 1) / 2, to = (kc + 31) / 32 * 16; /* pair rows written / needed */
    memset((uint32_t *)dst + from * w, 0, (size_t)((to - from) * w) * sizeof(uint32_t));
}

/* B: the bf16 pair packing of gemm_internal.h, then zero pair rows up to 32 k. */
void fp8mix_gemm_pack_b_krows_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst)
{
    (void)bf16;
    fp8mix_gemm_pack_krows_ref(src, ld, nv, w, kc, fmt, 1, dst);
    fp8mix_gemm_pack_amx_pad(w, kc, dst);
}

void fp8mix_gemm_pack_b_kcols_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst)
{
    (void)bf16;
    fp8mix_gemm_pack_kcols_ref(src, ld, nv, w, kc, fmt, 1, dst);
    fp8mix_gemm_pack_amx_pad(w, kc, dst);
}
