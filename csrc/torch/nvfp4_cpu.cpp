// nvfp4_cpu.cpp — the CPU kernels of the NVFP4 ops (fp8mix.h "NVFP4"): quantisation to
// E2M1 codes (two per byte) with E4M3 block scales and a float32 tensor scale, its
// decoding, the scalar NVFP4 GEMM and the 16-point random Hadamard transform. Each checks
// its tensors and calls the C API; registered in ops_cpu.cpp's TORCH_LIBRARY_IMPL block.
#include "common.h"
#include "ops.h"

namespace fp8mix_torch {

namespace {

void check_cols16(int64_t cols, const char *op, const char *name)
{
    TORCH_CHECK_VALUE(cols % FP8MIX_NVFP4_BLOCK == 0, "fp8mix.", op, ": ", name,
                      "'s last dimension must be a multiple of 16 (NVFP4 blocks), got ", cols);
}

// A contiguous 2-D uint8 / float8_e4m3fn byte tensor of the given shape on the CPU.
at::Tensor byte_arg(const at::Tensor &t, int64_t rows, int64_t cols, const char *op, const char *name)
{
    check_on(t, kCPU, op, name);
    TORCH_CHECK_TYPE(t.scalar_type() == at::kByte || t.scalar_type() == at::kFloat8_e4m3fn, "fp8mix.", op, ": ", name,
                     " must be uint8 or float8_e4m3fn bytes, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, "fp8mix.", op, ": ", name,
                      " must have shape (", rows, ", ", cols, "), got ", t.sizes());
    return t.contiguous();
}

float scalar_arg(const at::Tensor &t, const char *op, const char *name)
{
    check_on(t, kCPU, op, name);
    TORCH_CHECK_VALUE(t.numel() == 1, "fp8mix.", op, ": ", name, " must hold one value, got ", t.numel());
    return t.to(at::kFloat).item<float>();
}

} // namespace

// x (..., K) -> q (rows, K/2) uint8, block_scale (rows, K/16) float8_e4m3fn, scale_inv ()
Tensors3 quantize_nvfp4_cpu(const Tensor &x, const Tensor &global_amax, bool tile_2d, bool stochastic, int64_t seed,
                            int64_t offset, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "quantize_nvfp4";
    check_on(x, kCPU, op, "x");
    const fp8mix_dtype xt = hp_dtype(x, op, "x");
    TORCH_CHECK_VALUE(x.dim() >= 1, "fp8mix.", op, ": x must have at least one dimension");
    check_cols16(x.size(-1), op, "x");
    float gam = scalar_arg(global_amax, op, "global_amax");
    TORCH_CHECK_VALUE(!(gam < 0.0f), "fp8mix.", op, ": global_amax must be >= 0, got ", gam);
    View2D v = view2d(x);
    fp8mix_cast_opts o = make_opts(FP8MIX_E4M3, true, stochastic, seed, offset);
    apply_rng(o, rng, rng_skip, op);
    auto u8 = x.options().dtype(at::kByte);
    Tensor q = new_tensor({v.rows, v.cols / 2}, u8);
    Tensor bs = new_tensor({v.rows, v.cols / FP8MIX_NVFP4_BLOCK}, x.options().dtype(at::kFloat8_e4m3fn));
    Tensor sinv = new_tensor({}, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_quantize_nvfp4(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, tile_2d ? FP8MIX_NVFP4_BLOCK : 1, gam,
                                       v.rows ? (uint8_t *)q.data_ptr() : nullptr, ld_of(v.cols / 2),
                                       v.rows ? (uint8_t *)bs.data_ptr() : nullptr, sinv.data_ptr<float>(), &o),
                 op);
    return {q, bs, sinv};
}

Tensor dequantize_nvfp4_cpu(const Tensor &q, const Tensor &block_scale, const Tensor &scale_inv, Dtype out_dtype)
{
    const char *op = "dequantize_nvfp4";
    check_on(q, kCPU, op, "q");
    TORCH_CHECK_VALUE(q.dim() == 2, "fp8mix.", op, ": q must be 2-D (rows, K/2), got ", q.sizes());
    const int64_t rows = q.size(0), cols = q.size(1) * 2;
    hp_dtype(out_dtype, op);
    Tensor qc = byte_arg(q, rows, cols / 2, op, "q");
    Tensor bs = byte_arg(block_scale, rows, cols / FP8MIX_NVFP4_BLOCK, op, "block_scale");
    check_cols16(cols, op, "q (unpacked)");
    Tensor out = new_tensor({rows, cols}, q.options().dtype(at::kFloat));
    check_status(fp8mix_dequantize_nvfp4((const uint8_t *)qc.data_ptr(), ld_of(cols / 2),
                                         (const uint8_t *)bs.data_ptr(), rows, cols,
                                         scalar_arg(scale_inv, op, "scale_inv"), out.data_ptr<float>(), ld_of(cols)),
                 op, "scale_inv must be finite and > 0");
    return out_dtype == at::kFloat ? out : out.to(out_dtype);
}

// C (M, N) float32 = A B^T, A (M, K/2) and B (N, K/2) NVFP4 codes.
Tensor nvfp4_mm_cpu(const Tensor &a, const Tensor &a_block_scale, const Tensor &a_scale_inv, const Tensor &b,
                    const Tensor &b_block_scale, const Tensor &b_scale_inv)
{
    const char *op = "nvfp4_mm";
    TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, "fp8mix.", op, ": a and b must be 2-D, got ", a.sizes(), " and ",
                      b.sizes());
    TORCH_CHECK_VALUE(a.size(1) == b.size(1), "fp8mix.", op, ": a and b must have the same K, got ", a.size(1) * 2,
                      " and ", b.size(1) * 2);
    const int64_t M = a.size(0), N = b.size(0), K = a.size(1) * 2;
    check_cols16(K, op, "a (unpacked)");
    Tensor ac = byte_arg(a, M, K / 2, op, "a"), bc = byte_arg(b, N, K / 2, op, "b");
    Tensor sa = byte_arg(a_block_scale, M, K / FP8MIX_NVFP4_BLOCK, op, "a_block_scale");
    Tensor sb = byte_arg(b_block_scale, N, K / FP8MIX_NVFP4_BLOCK, op, "b_block_scale");
    Tensor c = new_tensor({M, N}, a.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_gemm_nvfp4(M, N, K, (const uint8_t *)ac.data_ptr(), ld_of(K / 2),
                                   (const uint8_t *)sa.data_ptr(), scalar_arg(a_scale_inv, op, "a_scale_inv"),
                                   (const uint8_t *)bc.data_ptr(), ld_of(K / 2), (const uint8_t *)sb.data_ptr(),
                                   scalar_arg(b_scale_inv, op, "b_scale_inv"), c.data_ptr<float>(), ld_of(N)),
                 op, "scale_inv must be finite and > 0");
    return c;
}

Tensor rht16_cpu(const Tensor &x, int64_t signs)
{
    const char *op = "rht16";
    check_on(x, kCPU, op, "x");
    TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "fp8mix.", op, ": x must be float32, got ", x.scalar_type());
    TORCH_CHECK_VALUE(x.dim() >= 1, "fp8mix.", op, ": x must have at least one dimension");
    TORCH_CHECK_VALUE(signs >= 0 && signs <= 0xFFFF, "fp8mix.", op, ": signs must be a 16-bit mask, got ", signs);
    check_cols16(x.size(-1), op, "x");
    View2D v = view2d(x);
    Tensor y = new_tensor(x.sizes(), x.options());
    check_status(fp8mix_rht16(v.t.data_ptr<float>(), v.rows, v.cols, v.ld, (uint16_t)signs, y.data_ptr<float>(),
                              ld_of(v.cols)),
                 op);
    return y;
}

} // namespace fp8mix_torch
