/*
 * cast_nvfp4.c — NVFP4 quantisation (fp8mix.h "NVFP4"): E2M1 elements in
 * 1x16 (or 16x16) blocks with E4M3 block scales and one float32 tensor scale,
 * in Transformer Engine's scale arithmetic; its decoding; the 16-point random
 * Hadamard transform the recipe applies to the weight gradient's operands.
 *
 * Scalar code: the element encoder is fp8_rules.h's FP8 encoder with E2M1's
 * parameters (1 mantissa bit, bias 1, always saturating), so E2M1 rounds by
 * exactly the integer steps every FP8 cast uses.  Not here: the GEMM on
 * NVFP4 operands (gemm_nvfp4.c).
 */
#include "internal.h"

#define NB FP8MIX_NVFP4_BLOCK
#define E4M3_NAN 0x7Fu
#define NV_GRAIN (1 << 16) /* elements per worker before threads pay off */

static const float k_e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float fp8mix_e2m1_decode(uint8_t code)
{
    float v = k_e2m1[code & 7u];
    return (code & 8u) ? -v : v;
}

static fp8_params e2m1_params(int stochastic)
{
    fp8_params p;
    memset(&p, 0, sizeof p);
    p.mbits = 1;
    p.bias = 1;
    p.emin = 0;
    p.max_code = 7;
    p.ovf_code = 7; /* no inf: overflow saturates */
    p.nan_code = 0;
    p.stochastic = stochastic;
    p.saturate = 1;
    p.fmt = FP8MIX_E4M3; /* unused by the encoder */
    return p;
}

/* |y|'s code from the shared FP8 encoder, the sign moved to bit 3. */
static uint8_t e2m1_encode(const fp8_params *p, float y, uint32_t r)
{
    uint32_t bits = f32_bits(y);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0;
    uint8_t code = fp8_encode(p, bits_f32(bits & 0x7FFFFFFFu), r);
    return (uint8_t)(code | ((bits >> 28) & 8u));
}

uint8_t fp8mix_e2m1_encode_ref(float y, fp8mix_rounding rounding, uint32_t r)
{
    fp8_params p = e2m1_params(rounding == FP8MIX_ROUND_STOCHASTIC);
    return e2m1_encode(&p, y, r);
}

float fp8mix_nvfp4_tensor_scale(float global_amax)
{
    uint32_t a = f32_bits(global_amax) & 0x7FFFFFFFu;
    if (a == 0 || a >= 0x7F800000u) return 1.0f; /* 0, inf, NaN */
    float s = fp8r_div(2688.0f, global_amax);
    if ((f32_bits(s) & 0x7FFFFFFFu) == 0x7F800000u) s = FP8R_FLT_MAX;
    return s;
}

/* The E4M3 decode-scale byte of a block with amax bits `am`, and its encode
 * factor e_b (the rule of fp8mix.h). */
static uint8_t block_scale(uint32_t am, float s_enc, float s_dec, float *enc)
{
    if (am >= 0x7F800000u) { /* NaN or inf in the block */
        *enc = 0.0f;
        return E4M3_NAN;
    }
    static const fp8_params e4m3 = {3, 7, -6, 0x7E, 0x7E, 0x7F, 0, 1, 0, FP8MIX_E4M3};
    float t = fp8r_mul(s_enc, 1.0f / 6.0f);
    uint8_t d = fp8_encode(&e4m3, fp8r_mul(bits_f32(am), t), 0);
    float den = fp8r_mul(fp8mix_decode_ref(d, FP8MIX_E4M3), s_dec);
    float e = fp8r_div(1.0f, den);
    if (!(e <= FP8R_FLT_MAX)) e = FP8R_FLT_MAX; /* den 0: +inf */
    *enc = e;
    return d;
}

typedef struct nv_job {
    const uint8_t *x;
    fp8mix_dtype xt;
    size_t esz;
    int64_t rows, cols, ld_x, ld_q;
    int tile_rows;
    float s_enc, s_dec;
    uint8_t *q, *bs;
    int stochastic;
    uint64_t seed, offset;
} nv_job;

/* One group of tile_rows rows. */
static void nv_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    const nv_job *J = (const nv_job *)ctx;
    fp8_params p = e2m1_params(J->stochastic);
    int64_t r0 = task * J->tile_rows, r1 = r0 + J->tile_rows < J->rows ? r0 + J->tile_rows : J->rows;
    int64_t nb = J->cols / NB;
    for (int64_t b = 0; b < nb; b++) {
        uint32_t am = 0;
        for (int64_t i = r0; i < r1; i++) {
            const uint8_t *row = J->x + (size_t)(i * J->ld_x) * J->esz;
            for (int64_t t = 0; t < NB; t++) {
                uint32_t u = f32_bits(load_f32(row, J->xt, b * NB + t)) & 0x7FFFFFFFu;
                if (u > am) am = u; /* NaN bits exceed inf's: NaN wins */
            }
        }
        float enc;
        uint8_t d = block_scale(am, J->s_enc, J->s_dec, &enc);
        for (int64_t i = r0; i < r1; i++) {
            const uint8_t *row = J->x + (size_t)(i * J->ld_x) * J->esz;
            uint8_t *qrow = J->q + i * J->ld_q + b * (NB / 2);
            uint32_t r[NB] = {0};
            if (J->stochastic) fp8mix_random_words(J->seed, J->offset + (uint64_t)(i * J->cols + b * NB), NB, r);
            for (int64_t t = 0; t < NB; t += 2) {
                uint8_t lo = 0, hi = 0;
                if (d != E4M3_NAN) {
                    lo = e2m1_encode(&p, fp8r_mul(load_f32(row, J->xt, b * NB + t), enc), r[t]);
                    hi = e2m1_encode(&p, fp8r_mul(load_f32(row, J->xt, b * NB + t + 1), enc), r[t + 1]);
                }
                qrow[t / 2] = (uint8_t)(lo | (hi << 4));
            }
            J->bs[i * nb + b] = d;
        }
    }
}

fp8mix_status fp8mix_quantize_nvfp4(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                    int tile_rows, float global_amax, uint8_t *q, int64_t ld_q,
                                    uint8_t *block_scale_out, float *scale_inv, const fp8mix_cast_opts *opts)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    if ((xt != FP8MIX_F32 && xt != FP8MIX_BF16 && xt != FP8MIX_F16) || opts->fmt != FP8MIX_E4M3 ||
        (opts->rounding != FP8MIX_ROUND_NEAREST && opts->rounding != FP8MIX_ROUND_STOCHASTIC))
        return FP8MIX_ERR_BAD_ENUM;
    if (tile_rows != 1 && tile_rows != NB) return FP8MIX_ERR_BAD_ARG;
    if (global_amax < 0.0f) return FP8MIX_ERR_BAD_ARG;
    if (bad_2d(rows, cols, ld_x) || cols % NB != 0 || ld_q < cols / 2) return FP8MIX_ERR_BAD_SHAPE;
    float s_enc = fp8mix_nvfp4_tensor_scale(global_amax);
    float s_dec = fp8r_div(1.0f, s_enc);
    if (scale_inv) *scale_inv = s_dec;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!x || !q || !block_scale_out) return FP8MIX_ERR_NULL_POINTER;
    nv_job J = {(const uint8_t *)x, xt, dtype_size(xt), rows, cols, ld_x, ld_q, tile_rows, s_enc, s_dec, q,
                block_scale_out, opts->rounding == FP8MIX_ROUND_STOCHASTIC, opts->seed, opts->offset};
    int64_t ntasks = ceil_div(rows, tile_rows);
    fp8mix_parallel_for(ntasks, fp8mix_workers_for(rows * cols * (J.stochastic ? 8 : 1), NV_GRAIN), nv_task, &J);
    return FP8MIX_OK;
}

fp8mix_status fp8mix_dequantize_nvfp4(const uint8_t *q, int64_t ld_q, const uint8_t *block_scale_in, int64_t rows,
                                      int64_t cols, float scale_inv, float *out, int64_t ld_out)
{
    if (bad_2d(rows, cols, ld_out) || cols % NB != 0 || ld_q < cols / 2) return FP8MIX_ERR_BAD_SHAPE;
    if (!(scale_inv > 0.0f) || !(scale_inv <= FP8R_FLT_MAX)) return FP8MIX_ERR_BAD_SCALE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!q || !block_scale_in || !out) return FP8MIX_ERR_NULL_POINTER;
    int64_t nb = cols / NB;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint8_t byte = q[i * ld_q + j / 2];
            float v = fp8mix_e2m1_decode((uint8_t)((j & 1) ? byte >> 4 : byte));
            float d = fp8mix_decode_ref(block_scale_in[i * nb + j / NB], FP8MIX_E4M3);
            out[i * ld_out + j] = fp8r_mul(fp8r_mul(v, d), scale_inv);
        }
    return FP8MIX_OK;
}

/* (-1)^popcount(v) of a 4-bit v: H16's sign at (r, c) for v = r & c. */
static int parity4(int v)
{
    v ^= v >> 2;
    v ^= v >> 1;
    return v & 1;
}

fp8mix_status fp8mix_rht16(const float *x, int64_t rows, int64_t cols, int64_t ld_x, uint16_t signs, float *y,
                           int64_t ld_y)
{
    if (bad_2d(rows, cols, ld_x) || bad_2d(rows, cols, ld_y) || cols % NB != 0) return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!x || !y) return FP8MIX_ERR_NULL_POINTER;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < cols; g += NB) {
            float in[NB];
            for (int c = 0; c < NB; c++) { /* s_c * x: a sign flip, exact */
                float v = x[i * ld_x + g + c];
                in[c] = ((signs >> c) & 1u) ? -v : v;
            }
            for (int r = 0; r < NB; r++) {
                float s = 0.0f;
                for (int c = 0; c < NB; c++) s = parity4(r & c) ? s - in[c] : s + in[c];
                y[i * ld_y + g + r] = fp8r_mul(s, 0.25f);
            }
        }
    return FP8MIX_OK;
}
