"""Tests of fp8mix.scaled_mm, the scaled FP8 GEMM (csrc/core/gemm.c).

What is checked (see csrc/include/fp8mix.h, "scaled GEMM"):
  * accuracy against a float64 product of the dequantised operands (FP8 decoded
    by torch, scales expanded per tile in float64), over edge / prime / ragged
    shapes, every scale layout, every format pair, bias dtypes, both b layouts;
  * the documented float32 numerics bit for bit: a numpy float32 model of the
    canonical pair order (k = 1,0,3,2,...), the epilogue and the block-scale
    accumulation, and of the fp22 (Hopper-like) accumulator with promotion;
  * bf16 / f16 outputs are the float32 result rounded once;
  * bit-identical results for both layouts of b, every ISA and thread count;
  * agreement with torch._scaled_mm on CPU where this torch supports the case;
  * fp22 error behaviour, the Float8Tensor form, bad input, empty shapes,
    torch.compile.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

import fp8mix
from fp8mix import ops

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FMT_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)]
FMT_IDS = ["e4m3xe4m3", "e4m3xe5m2", "e5m2xe4m3", "e5m2xe5m2"]
LOWP = (torch.bfloat16, torch.float16)
ISAS = ["scalar", "avx2", "avx512", "avx512bf16"]
# Scale layouts: (kind of scale_a, kind of scale_b).
KINDS = {
    "tensor": ("tensor", "tensor"),
    "row_col": ("row", "col"),
    "row_tensor": ("row", "tensor"),
    "tensor_col": ("tensor", "col"),
    "block": ("block", "block"),
}
EXC = (ValueError, TypeError, RuntimeError)
U = 2.0 ** -24  # unit roundoff of float32


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def cdiv(a, b):
    return (a + b - 1) // b


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of a float tensor (so -0 != +0 and NaN == NaN)."""
    t = t.contiguous()
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16,
                   torch.float16: torch.int16}[t.dtype])


def assert_same_bits(x: torch.Tensor, y: torch.Tensor, what: str = ""):
    assert x.dtype == y.dtype and x.shape == y.shape, (what, x.dtype, y.dtype, x.shape, y.shape)
    bx, by = bits(x), bits(y)
    if not torch.equal(bx, by):
        bad = (bx != by).nonzero()
        i = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} of {x.numel()} elements differ; first at {i}: "
                             f"{x[i].item()!r} vs {y[i].item()!r}")


def fp8_bytes(rows, cols, dtype, gen, zero_rows=(), zero_cols=()):
    """Random FP8 codes over the whole byte range (huge dynamic range: E5M2 spans
    2^-16 .. 57344), NaN and inf codes replaced by finite ones."""
    u = torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.int32)
    if dtype == E4M3:
        u = torch.where((u & 0x7F) == 0x7F, u - 1, u)            # NaN -> +-448
    else:
        u = torch.where((u & 0x7C) == 0x7C, u ^ 0x40, u)         # inf/NaN -> exponent 15
    u = u.to(torch.uint8)
    for r in zero_rows:
        if r < rows:
            u[r] = 0
    for c in zero_cols:
        if c < cols:
            u[:, c] = 0x80  # -0
    return u.view(dtype)


def fp8_randn(rows, cols, dtype, gen, row_range=0.0):
    """Quantised Gaussian data; with row_range > 0 the rows span 2^+-row_range
    before quantisation (large dynamic range across rows)."""
    x = torch.randn(rows, cols, generator=gen)
    if row_range:
        x = x * torch.exp2(torch.empty(rows, 1).uniform_(-row_range, row_range, generator=gen))
    mx = 448.0 if dtype == E4M3 else 57344.0
    return x.clamp(-mx, mx).to(dtype)


def rand_scales(shape, gen, lo=-6.0, hi=6.0):
    """Positive float32 scales spanning 2^lo .. 2^hi, not powers of two."""
    e = torch.empty(shape).uniform_(lo, hi, generator=gen)
    return (torch.exp2(e) * (1 + torch.rand(shape, generator=gen) * 0.9)).float()


def make_scale(kind, M, K, N, gen, is_a):
    kb, nb = cdiv(K, 128), cdiv(N, 128)
    if kind == "tensor":
        return rand_scales((), gen)
    if kind == "row":
        return rand_scales((M, 1), gen)
    if kind == "col":
        return rand_scales((1, N), gen)
    if kind == "block":
        return rand_scales((M, kb), gen) if is_a else rand_scales((kb, nb), gen)
    raise AssertionError(kind)


def expand_a(s, M, K):
    """scale_a as an (M, K) float64 array of per-element factors."""
    s = s.double()
    if s.numel() == 1:
        return s.reshape(()).expand(M, K)
    if s.shape == (M, 1):
        return s.expand(M, K)
    assert s.shape == (M, cdiv(K, 128))
    return s.repeat_interleave(128, dim=1)[:, :K]


def expand_b(s, K, N):
    """scale_b as a (K, N) float64 array of per-element factors."""
    s = s.double()
    if s.numel() == 1:
        return s.reshape(()).expand(K, N)
    if s.dim() == 2 and s.shape == (cdiv(K, 128), cdiv(N, 128)):
        return s.repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:K, :N]
    assert s.shape == (1, N)
    return s.expand(K, N)


def reference(a, b, sa, sb, bias=None, _cache={}):
    """float64 (a * sa) @ (b * sb) + bias with FP8 decoded by torch, and the
    componentwise magnitude |a * sa| @ |b * sb| + |bias| (for error bounds)."""
    key = (id(a), id(b), id(sa), id(sb))
    hit = _cache.get("last")
    if hit is not None and hit[0] == key and all(x is y for x, y in zip(hit[1], (a, b, sa, sb))):
        out, mag = hit[2]
    else:
        M, K = a.shape
        N = b.shape[1]
        A = a.to(torch.float64) * expand_a(sa, M, K)
        B = b.to(torch.float64) * expand_b(sb, K, N)
        out, mag = A @ B, A.abs() @ B.abs()
        _cache["last"] = (key, (a, b, sa, sb), (out, mag))
    if bias is not None:
        return out + bias.to(torch.float64), mag + bias.to(torch.float64).abs()
    return out, mag


def rel_fro(x, ref):
    d = (x.to(torch.float64) - ref).norm()
    n = ref.norm()
    return (d / n).item() if n > 0 else d.item()


def operands(M, K, N, fa, fb, gen, data="bytes"):
    """a (M, K) and w (N, K), so that b = w.t() is the column-major operand."""
    if data == "bytes":
        a = fp8_bytes(M, K, fa, gen, zero_rows=(1, M // 2))
        w = fp8_bytes(N, K, fb, gen, zero_rows=(2,), zero_cols=(K - 1,) if K > 2 else ())
    else:
        a = fp8_randn(M, K, fa, gen, row_range=8.0)
        w = fp8_randn(N, K, fb, gen)
        if M > 1:
            a[M // 2] = 0.0
    return a, w


@pytest.fixture(autouse=True)
def _restore_isa_threads(request):
    """Restore the ISA cap and torch's thread count after every test.  Tests run
    single-threaded unless decorated with `threaded` (small torch ops in parallel regions
    crawl when the 2-core machine is busy); fp8mix's thread counts are covered by
    the threaded tests."""
    n = torch.get_num_threads()
    if not getattr(request.function, "threaded", False):
        torch.set_num_threads(1)
    yield
    ops.set_max_isa("avx512bf16")
    torch.set_num_threads(n)


def threaded(fn):
    """Run this test with torch's (and so fp8mix's) default thread count."""
    fn.threaded = True
    return fn


def best_isa() -> int:
    ops.set_max_isa("avx512bf16")
    return ISAS.index(ops.cpu_isa())


# ---------------------------------------------------------------------------
# numpy float32 model of the documented numerics (bit-exact oracle)
# ---------------------------------------------------------------------------

def _trunc22(x):
    u = x.view(np.uint32)
    keep = np.where((u & 0x7F800000) == 0x7F800000, np.uint32(0xFFFFFFFF), np.uint32(0xFFFFFC00))
    return (u & keep).view(np.float32)


def model(a, b, sa, sb, kinds, bias=None, out_dtype=torch.float32, accumulate="fp32", promote=128):
    """fp8mix_gemm's rules from fp8mix.h / gemm.c, in numpy float32 (each op rounded)."""
    A = a.to(torch.float32).numpy()
    B = b.to(torch.float32).numpy()
    M, K = A.shape
    N = B.shape[1]
    f32 = np.float32
    block = kinds[0] == "block"
    runs = [(p, min(p + 128, K)) for p in range(0, K, 128)] if block else [(0, K)]
    acc = np.zeros((M, N), f32)
    if block:
        SA = sa.numpy().astype(f32)
        SB = sb.numpy().astype(f32)
        colblk = np.arange(N) // 128
    for p0, p1 in runs:
        if accumulate == "fp32":
            s = np.zeros((M, N), f32)
            for p in range(p0, p1, 2):
                if p + 1 < p1:
                    s = s + np.outer(A[:, p + 1], B[p + 1]).astype(f32)
                s = s + np.outer(A[:, p], B[p]).astype(f32)
            part = s
        else:
            P = np.zeros((M, N), f32)
            s = np.zeros((M, N), f32)
            cnt = 0
            for p in range(p0, p1):
                s = _trunc22((s + np.outer(A[:, p], B[p]).astype(f32)).astype(f32))
                cnt += 1
                if promote > 0 and cnt == promote:
                    P = P + s
                    s = np.zeros((M, N), f32)
                    cnt = 0
            part = P + s
        if block:
            kb = p0 // 128
            fac = (SA[:, kb][:, None] * SB[kb][colblk][None, :]).astype(f32)
            acc = acc + (part * fac).astype(f32)
        else:
            acc = part
    if not block:
        sa_v = sa.numpy().astype(f32).reshape(-1, 1) if kinds[0] == "row" else sa.numpy().astype(f32).reshape(1, 1)
        sb_v = sb.numpy().astype(f32).reshape(1, -1) if kinds[1] == "col" else sb.numpy().astype(f32).reshape(1, 1)
        acc = (sa_v * sb_v).astype(f32) * acc
    if bias is not None:
        acc = acc + bias.to(torch.float32).numpy()[None, :]
    return torch.from_numpy(np.ascontiguousarray(acc, dtype=f32)).to(out_dtype)


# ---------------------------------------------------------------------------
# accuracy vs float64, layouts, out dtypes, bias
# ---------------------------------------------------------------------------

SHAPES = [  # (M, K, N)
    (1, 1, 1), (1, 7, 13), (13, 1, 7), (7, 13, 1), (1, 257, 131), (257, 131, 1),
    (13, 131, 257), (7, 300, 13), (131, 257, 129), (64, 128, 128), (33, 385, 200), (3, 129, 2),
]


def _ids(shape):
    return "x".join(map(str, shape))


@pytest.mark.parametrize("fmts", FMT_PAIRS, ids=FMT_IDS)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_vs_float64_layouts_outdtypes(shape, kind, fmts):
    M, K, N = shape
    fa, fb = fmts
    gen = torch.Generator().manual_seed(zlib.crc32(repr((shape, kind, fa, fb)).encode()))
    data = "bytes" if (M * K * N) % 2 else "randn"
    a, w = operands(M, K, N, fa, fb, gen, data)
    ka, kb_ = KINDS[kind]
    sa, sb = make_scale(ka, M, K, N, gen, True), make_scale(kb_, M, K, N, gen, False)
    b_col, b_row = w.t(), w.t().contiguous()
    assert b_row.is_contiguous() and (N == 1 or K == 1 or not b_col.is_contiguous())
    bias32 = torch.randn(N, generator=gen) * 100
    f32_by_bias = {}
    for bname, bias in [("none", None), ("f32", bias32), ("bf16", bias32.bfloat16()), ("f16", bias32.half())]:
        out = fp8mix.scaled_mm(a, b_col, sa, sb, bias=bias)
        assert out.shape == (M, N) and out.dtype == torch.float32
        out_r = fp8mix.scaled_mm(a, b_row, sa, sb, bias=bias)
        assert_same_bits(out, out_r, f"layouts differ (bias {bname})")
        ref, absref = reference(a, b_col, sa, sb, bias)
        err = rel_fro(out, ref)
        assert err <= 1e-6, f"relative Frobenius error {err:.3g} (bias {bname}, data {data})"
        # componentwise bound: |out - ref| <= gamma * (|A| |B| + |bias|)
        gamma = (K + cdiv(K, 128) + 8) * U
        dev = (out.double() - ref).abs()
        tol = gamma * absref + 1e-300
        worst = (dev / tol).max().item() if dev.numel() else 0.0
        assert worst <= 1.0, f"componentwise error bound exceeded by {worst:.3g}x (bias {bname})"
        f32_by_bias[bname] = out
    for od in LOWP:
        for bname, bias in [("none", None), ("f32", bias32), ("out", bias32.to(od))]:
            key = bname if bname != "out" else ("bf16" if od == torch.bfloat16 else "f16")
            out = fp8mix.scaled_mm(a, b_col, sa, sb, bias=bias, out_dtype=od)
            assert out.dtype == od and out.shape == (M, N)
            assert_same_bits(out, f32_by_bias[key].to(od), f"{od} output is not the float32 one rounded once "
                                                               f"(bias {bname})")
            assert_same_bits(out, fp8mix.scaled_mm(a, b_row, sa, sb, bias=bias, out_dtype=od),
                             f"{od}: layouts differ")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("shape", [(5, 1, 3), (16, 64, 48), (33, 385, 200), (150, 256, 130), (3, 1000, 300)],
                         ids=_ids)
def test_bit_exact_vs_documented_model(shape, kind):
    """The documented float32 rules (pair order, epilogue, block accumulation)."""
    M, K, N = shape
    gen = torch.Generator().manual_seed(7 + M * 131 + K * 7 + N)
    for (fa, fb), data in [((E4M3, E4M3), "randn"), ((E5M2, E4M3), "bytes"), ((E5M2, E5M2), "bytes")]:
        a, w = operands(M, K, N, fa, fb, gen, data)
        ka, kb_ = KINDS[kind]
        sa, sb = make_scale(ka, M, K, N, gen, True), make_scale(kb_, M, K, N, gen, False)
        bias = (torch.randn(N, generator=gen) * 10).bfloat16()
        for od in (torch.float32, torch.bfloat16):
            got = fp8mix.scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=od)
            assert_same_bits(got, model(a, w.t(), sa, sb, KINDS[kind], bias, od), f"{fa}x{fb} {data} {od}")


@threaded
@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
@pytest.mark.parametrize("shape", [(1100, 8200, 40), (40, 8200, 1100)], ids=_ids)
def test_large_k_packing_chunks(shape, kind):
    """Shapes whose packed panels exceed one chunk (rows resp. columns split).
    An output element does not depend on the tiling, so the product equals the
    products of 128-aligned row / column slices bit for bit."""
    M, K, N = shape
    gen = torch.Generator().manual_seed(99)
    a, w = operands(M, K, N, E4M3, E5M2, gen, "randn")
    ka, kb_ = KINDS[kind]
    sa, sb = make_scale(ka, M, K, N, gen, True), make_scale(kb_, M, K, N, gen, False)
    out = fp8mix.scaled_mm(a, w.t(), sa, sb)
    assert_same_bits(out, fp8mix.scaled_mm(a, w.t().contiguous(), sa, sb), "layouts differ")
    step = 256
    if M > N:
        parts = [fp8mix.scaled_mm(a[i:i + step], w.t(), sa if sa.dim() == 0 else sa[i:i + step], sb)
                 for i in range(0, M, step)]
        assert_same_bits(out, torch.cat(parts, 0), "row slices")
    else:
        def sb_cols(j):
            if kb_ == "col":
                return sb[:, j:j + step]
            if kb_ == "block":
                return sb[:, j // 128:(j + step) // 128 + 1][:, :cdiv(min(step, N - j), 128)].contiguous()
            return sb
        parts = [fp8mix.scaled_mm(a, w[j:j + step].t(), sa, sb_cols(j)) for j in range(0, N, step)]
        assert_same_bits(out, torch.cat(parts, 1), "column slices")
    ref, _ = reference(a, w.t(), sa, sb)
    assert rel_fro(out, ref) <= 4e-6


def test_scale_shapes_of_one_value_agree():
    gen = torch.Generator().manual_seed(3)
    a, w = operands(9, 40, 11, E4M3, E5M2, gen, "randn")
    s = torch.tensor(0.37)
    base = fp8mix.scaled_mm(a, w.t(), s, s)
    for shp in [(1,), (1, 1)]:
        assert_same_bits(base, fp8mix.scaled_mm(a, w.t(), s.reshape(shp), s.reshape(shp)), str(shp))
    # a per-row scale whose rows are all equal is the per-tensor scale
    assert_same_bits(base, fp8mix.scaled_mm(a, w.t(), s.expand(9, 1).contiguous(), s.expand(1, 11).contiguous()))


def test_strided_operands():
    """Non-contiguous / padded operands give the same bits as contiguous ones."""
    gen = torch.Generator().manual_seed(5)
    M, K, N = 37, 300, 45
    a, w = operands(M, K, N, E4M3, E4M3, gen, "randn")
    sa, sb = rand_scales((M, cdiv(K, 128)), gen), rand_scales((cdiv(K, 128), cdiv(N, 128)), gen)
    base = fp8mix.scaled_mm(a, w.t(), sa, sb)
    a_pad = torch.zeros(M, K + 9, dtype=torch.uint8).view(E4M3)
    a_pad[:, :K] = a
    w_pad = torch.zeros(N, K + 5, dtype=torch.uint8).view(E4M3)
    w_pad[:, :K] = w
    b_pad = torch.zeros(K, N + 7, dtype=torch.uint8).view(E4M3)
    b_pad[:, :N] = w.t()
    a_colmajor = a.t().contiguous().t()  # read in place (the C GEMM's K x M layout, as wgrad's dy^T)
    a_km_pad = torch.zeros(K, M + 11, dtype=torch.uint8).view(E4M3)
    a_km_pad[:, :M] = a.t()
    b_2 = torch.zeros(K, 2 * N, dtype=torch.uint8).view(E4M3)
    b_2[:, ::2] = w.t()
    for what, aa, bb in [("a padded rows", a_pad[:, :K], w.t()), ("a column-major", a_colmajor, w.t()),
                         ("a column-major ld>M", a_km_pad[:, :M].t(), w.t()),
                         ("a column-major, b row-major", a_colmajor, w.t().contiguous()),
                         ("b col-major ld>K", a, w_pad[:, :K].t()), ("b row-major ld>N", a, b_pad[:, :N]),
                         ("b strided", a, b_2[:, ::2])]:
        assert_same_bits(base, fp8mix.scaled_mm(aa, bb, sa, sb), what)


def test_expanded_and_degenerate_strides():
    """Stride-0 (expanded) and other odd layouts are read correctly."""
    gen = torch.Generator().manual_seed(15)
    M, K, N = 9, 140, 11
    s = torch.tensor(0.75)
    a1, w1 = operands(1, K, 1, E4M3, E5M2, gen, "randn")
    a, w = a1.expand(M, K), w1.expand(N, K)
    base = fp8mix.scaled_mm(a.contiguous(), w.contiguous().t(), s, s)
    assert_same_bits(base, fp8mix.scaled_mm(a, w.t(), s, s), "expanded a, expanded w.t()")
    assert_same_bits(base, fp8mix.scaled_mm(a, w.t().contiguous(), s, s), "expanded a")


def test_k0_with_expanded_operands():
    """K = 0 with an expanded (row stride 0) `a` gives the (3, 4) bias, as a contiguous
    K = 0 `a` does. (A regression test: the operand layout rule, now
    fp8mix_gemm_operand_layout in csrc/core/mm_layout.c, once passed lda = a.stride(0) = 0,
    which fp8mix_gemm rejects (every ld >= 1) as "invalid shape or leading dimension".)"""
    a = torch.zeros(1, 0, dtype=torch.uint8).view(E4M3).expand(3, 0)
    assert a.stride() == (0, 1)
    b = torch.zeros(4, 0, dtype=torch.uint8).view(E4M3).t()
    s = torch.tensor(1.0)
    bias = torch.arange(4.0)
    out = fp8mix.scaled_mm(a, b, s, s, bias=bias)
    assert_same_bits(out, bias.expand(3, 4).contiguous())


@pytest.mark.parametrize("out_dtype", LOWP + (torch.float32,), ids=str)
def test_output_rounding_matches_torch(out_dtype):
    """The single rounding to out_dtype is torch's (nearest even, overflow to inf,
    subnormals, NaN): checked on arbitrary float32 values reaching the epilogue
    through the bias (K = 0: v = +0 + bias) and through a scale (K = 1: v = 1 * s)."""
    gen = torch.Generator().manual_seed(16)
    u = torch.randint(-2 ** 31, 2 ** 31 - 1, (3000,), generator=gen, dtype=torch.int64).to(torch.int32)
    special = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 65519.99,
                            65520.0, 2 ** -25, 3 * 2 ** -25, 1.5 * 2 ** -24, 2 ** -14, 3.3895314e38, 3.4028235e38,
                            1e-40, 2 ** -133, 0.0, math.inf, math.nan])
    vals = torch.cat([u.view(torch.float32), special, -special])
    M = 2
    a0 = torch.zeros(M, 0, dtype=torch.uint8).view(E4M3)
    b0 = torch.zeros(vals.numel(), 0, dtype=torch.uint8).view(E4M3).t()
    one = torch.tensor(1.0)
    got = fp8mix.scaled_mm(a0, b0, one, one, bias=vals, out_dtype=out_dtype)
    exp = (torch.zeros(()) + vals).to(out_dtype).expand(M, -1)
    nan = got.isnan() & exp.isnan()
    assert torch.equal(got.isnan(), exp.isnan())
    assert torch.equal(bits(got)[~nan], bits(exp)[~nan])
    # through a per-column scale: out = (1 * s_j) * (+-1)
    pos = vals.abs()
    pos = pos[torch.isfinite(pos) & (pos > 0)]
    a1 = torch.tensor([[1.0], [-1.0]]).to(E4M3)
    b1 = torch.ones(1, pos.numel()).to(E4M3)
    got = fp8mix.scaled_mm(a1, b1, one, pos[None].contiguous(), out_dtype=out_dtype)
    assert_same_bits(got, torch.stack([pos, -pos]).to(out_dtype), "scale path")


def test_nan_and_inf_propagate():
    """IEEE semantics of (A * sa) @ (B * sb): a NaN in a row makes the row NaN, +inf
    times positive values gives +inf, inf - inf gives NaN, on every ISA."""
    best = best_isa()
    gen = torch.Generator().manual_seed(17)
    M, K, N = 8, 300, 40
    a = fp8_randn(M, K, E5M2, gen)
    w = (torch.rand(N, K, generator=gen) + 0.1).to(E4M3)
    a[2, 5] = math.nan
    a[4] = a[4].float().abs().to(E5M2)
    a[4, 7] = math.inf
    a[6, 9], a[6, 200] = -math.inf, math.inf
    for isa in ISAS[: best + 1]:
        ops.set_max_isa(isa)
        for acc in ("fp32", "fp22"):
            for sa, sb in [(torch.tensor(1.0), torch.tensor(1.0)), (torch.ones(M, 3), torch.ones(3, 1))]:
                o = fp8mix.scaled_mm(a, w.t(), sa, sb, accumulate=acc)
                what = f"{isa} {acc} {tuple(sa.shape)}"
                assert o[2].isnan().all() and o[6].isnan().all(), what
                assert (o[4] == math.inf).all(), what
                assert o[[0, 1, 3, 5, 7]].isfinite().all(), what


# ---------------------------------------------------------------------------
# ISAs and threads
# ---------------------------------------------------------------------------

def test_isa_names_and_restore():
    b = best_isa()
    assert ISAS[b] == ops.cpu_isa()
    ops.set_max_isa("scalar")
    assert ops.cpu_isa() == "scalar"
    ops.set_max_isa("avx512bf16")
    assert ISAS.index(ops.cpu_isa()) == b
    with pytest.raises(ValueError, match="ISA"):
        ops.set_max_isa("sse9")


@threaded
@pytest.mark.parametrize("accumulate", ["fp32", "fp22"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("isa", ISAS)
def test_bit_identical_across_isas_and_threads(isa, kind, accumulate):
    """Every ISA at 1, 2 and 3 threads gives the bytes of the scalar path at 1 thread."""
    best = best_isa()
    if ISAS.index(isa) > best:
        pytest.skip(f"{isa} is above this CPU's ISA ({ISAS[best]})")
    gen = torch.Generator().manual_seed(11)
    cases = [(200, 300, 260), (1, 700, 515), (61, 129, 1)] if accumulate == "fp32" else [(70, 300, 300)]
    for M, K, N in cases:
        for fa, fb in [(E4M3, E4M3), (E5M2, E4M3)]:
            a, w = operands(M, K, N, fa, fb, gen, "bytes" if fa == E5M2 else "randn")
            ka, kb_ = KINDS[kind]
            sa, sb = make_scale(ka, M, K, N, gen, True), make_scale(kb_, M, K, N, gen, False)
            bias = torch.randn(N, generator=gen)

            def run(b):
                return [fp8mix.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=od, accumulate=accumulate)
                        for od in (torch.float32, torch.bfloat16)]

            ops.set_max_isa("scalar")
            torch.set_num_threads(1)
            want = run(w.t())
            ops.set_max_isa(isa)
            assert ops.cpu_isa() == isa
            for nt in (1, 2, 3):
                torch.set_num_threads(nt)
                for b in (w.t(), w.t().contiguous()):
                    for o, f in zip(run(b), want):
                        assert_same_bits(o, f, f"{(M, K, N)} {fa}x{fb} isa={isa} threads={nt} "
                                               f"b {'row' if b.is_contiguous() else 'col'}-major")
    ops.set_max_isa("avx512bf16")


# ---------------------------------------------------------------------------
# torch._scaled_mm on CPU
# ---------------------------------------------------------------------------

TORCH_SHAPES = [(1, 1, 1), (7, 13, 131), (64, 256, 48), (33, 385, 200)]


@pytest.mark.parametrize("bias_kind", ["none", "f32", "out"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("fmts", FMT_PAIRS, ids=FMT_IDS)
def test_vs_torch_scaled_mm(fmts, kind, out_dtype, bias_kind):
    fa, fb = fmts
    gen = torch.Generator().manual_seed(21)
    for M, K, N in TORCH_SHAPES:
        a, w = operands(M, K, N, fa, fb, gen, "randn")
        ka, kb_ = KINDS[kind]
        sa, sb = make_scale(ka, M, K, N, gen, True), make_scale(kb_, M, K, N, gen, False)
        bias = None if bias_kind == "none" else torch.randn(N, generator=gen) * 4
        if bias is not None and bias_kind == "out":
            bias = bias.to(out_dtype)
        for b in (w.t(), w.t().contiguous()):
            try:
                t = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
            except Exception as e:  # noqa: BLE001 — torch's CPU coverage varies by version
                msg = str(e).splitlines()[0][:160]
                pytest.skip(f"torch {torch.__version__} CPU _scaled_mm rejects {kind} {fa}x{fb} "
                            f"out={out_dtype} bias={bias_kind} b={'col' if b.stride(0) == 1 else 'row'}-major "
                            f"(M,K,N)={(M, K, N)}: {type(e).__name__}: {msg}")
            f = fp8mix.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
            assert t.dtype == f.dtype and t.shape == f.shape
            ref, absref = reference(a, b, sa, sb, bias)
            if out_dtype == torch.float32:
                d = rel_fro(f, t.double())
                assert d <= 1e-5, f"{(M, K, N)}: fp8mix vs torch relative difference {d:.3g}"
            else:
                # both round a float32 value once: they may differ by one ulp where the
                # float32 sums (added in another order) straddle a rounding boundary, and
                # by the float32 summation error where the sum cancels
                ulp = 2.0 ** (-7 if out_dtype == torch.bfloat16 else -10)
                td, fd = t.double(), f.double()
                mag = torch.maximum(td.abs(), fd.abs())
                tol = ulp * mag + 2 * (K + 8) * U * absref + 1e-30
                close = (td == fd) | ((td - fd).abs() <= tol)  # == covers equal infinities (f16 overflow)
                assert torch.all(close), f"{(M, K, N)}: {(~close).sum().item()} outputs more than 1 ulp apart"
                frac = ((td != fd).sum().item() / max(1, td.numel()))
                assert frac <= 0.02, f"{(M, K, N)}: {frac:.1%} of outputs differ"
            fin = torch.isfinite(t) & torch.isfinite(f)
            assert torch.equal(torch.isfinite(t), torch.isfinite(f))
            assert rel_fro(f[fin], ref[fin]) <= rel_fro(t[fin], ref[fin]) * 1.5 + 1e-7


def test_torch_scaled_mm_tensorwise_bit_equal_small_k():
    """With short K (no reordering possible in float32) torch and fp8mix agree exactly."""
    gen = torch.Generator().manual_seed(2)
    a, w = operands(17, 2, 19, E4M3, E4M3, gen, "randn")
    s1, s2 = torch.tensor(0.5), torch.tensor(2.0)
    try:
        t = torch._scaled_mm(a, w.t(), s1, s2, out_dtype=torch.float32)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch CPU _scaled_mm unavailable: {e}")
    assert_same_bits(fp8mix.scaled_mm(a, w.t(), s1, s2), t)


# ---------------------------------------------------------------------------
# fp22 accumulation
# ---------------------------------------------------------------------------

def test_fp22_error_grows_without_promotion():
    gen = torch.Generator().manual_seed(4)
    M, K, N = 4, 8192, 64
    x = torch.rand(M, K, generator=gen)
    w = torch.rand(N, K, generator=gen)
    a8, w8 = fp8mix.quantize(x), fp8mix.quantize(w)
    a, b, sa, sb = a8.data, w8.data.t(), a8.scale_inv, w8.scale_inv
    ref, _ = reference(a, b, sa, sb)
    e32 = rel_fro(fp8mix.scaled_mm(a, b, sa, sb), ref)
    e_np = rel_fro(fp8mix.scaled_mm(a, b, sa, sb, accumulate="fp22", promote_interval=0), ref)
    e_p = rel_fro(fp8mix.scaled_mm(a, b, sa, sb, accumulate="fp22", promote_interval=128), ref)
    assert e_np > 10 * e_p, (e_np, e_p)
    assert e_p < 1e-3, e_p
    assert e_p > e32 and e_np > e32, (e32, e_p, e_np)
    # truncation toward zero: positive data come out low
    o = fp8mix.scaled_mm(a, b, sa, sb, accumulate="fp22", promote_interval=0)
    assert torch.all(o.double() <= ref)
    # unpromoted error grows with K; promoted stays bounded
    errs_np, errs_p = [], []
    for k in (256, 1024, 4096, 8192):
        r, _ = reference(a[:, :k], b[:k], sa, sb)
        errs_np.append(rel_fro(fp8mix.scaled_mm(a[:, :k], b[:k], sa, sb, accumulate="fp22",
                                                promote_interval=0), r))
        errs_p.append(rel_fro(fp8mix.scaled_mm(a[:, :k], b[:k], sa, sb, accumulate="fp22",
                                               promote_interval=128), r))
    assert all(x < y for x, y in zip(errs_np, errs_np[1:])), errs_np
    assert max(errs_p) < 1e-3 and max(errs_p) < 2 * min(errs_p), errs_p


@pytest.mark.parametrize("promote", [0, 1, 5, 128, 1000])
@pytest.mark.parametrize("kind", ["tensor", "row_col", "block"])
def test_fp22_bit_exact_vs_model(kind, promote):
    gen = torch.Generator().manual_seed(8 + promote)
    for (M, K, N), (fa, fb) in [((5, 300, 40), (E4M3, E4M3)), ((3, 257, 260), (E5M2, E4M3)),
                                ((2, 1, 3), (E4M3, E5M2))]:
        a, w = operands(M, K, N, fa, fb, gen, "randn")
        ka, kb_ = KINDS[kind]
        sa, sb = make_scale(ka, M, K, N, gen, True), make_scale(kb_, M, K, N, gen, False)
        bias = torch.randn(N, generator=gen)
        got = fp8mix.scaled_mm(a, w.t(), sa, sb, bias=bias, accumulate="fp22", promote_interval=promote)
        assert_same_bits(got, model(a, w.t(), sa, sb, KINDS[kind], bias, accumulate="fp22", promote=promote),
                         f"{(M, K, N)} {fa}x{fb}")
        assert_same_bits(got, fp8mix.scaled_mm(a, w.t().contiguous(), sa, sb, bias=bias, accumulate="fp22",
                                               promote_interval=promote), "layouts differ")


def test_fp22_promote_every_product_equals_plain_order_fp32():
    """promote_interval=1: each product is truncated alone (exact for FP8 products) and
    summed in float32 in order k = 0,1,..; with K = 2 that is the fp32 result when
    one term is zero."""
    gen = torch.Generator().manual_seed(1)
    a, w = operands(6, 1, 7, E4M3, E4M3, gen, "randn")
    s = torch.tensor(1.0)
    assert_same_bits(fp8mix.scaled_mm(a, w.t(), s, s),
                     fp8mix.scaled_mm(a, w.t(), s, s, accumulate="fp22", promote_interval=1))


# ---------------------------------------------------------------------------
# Float8Tensor form
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("ga,gb", [("tensor", "tensor"), ("row", "tensor"), ("block", "block2d"),
                                   ("tensor", "block2d")])
def test_float8tensor_form_equals_raw(ga, gb):
    gen = torch.Generator().manual_seed(6)
    M, K, N = 45, 300, 140
    x = torch.randn(M, K, generator=gen) * 3
    w = torch.randn(N, K, generator=gen) * 0.1
    x8 = fp8mix.quantize(x, granularity=ga)
    w8 = fp8mix.quantize(w, "E5M2" if gb == "tensor" else "E4M3", granularity=gb)
    bias = torch.randn(N, generator=gen)
    if (ga == "block") != (gb == "block2d"):  # block must pair with block
        with pytest.raises(ValueError, match="scale_b has shape"):
            fp8mix.scaled_mm(x8, w8.t())
        return
    got = fp8mix.scaled_mm(x8, w8.t(), bias=bias, out_dtype=torch.bfloat16)
    sa = x8.scale_inv.reshape(()) if ga == "tensor" else x8.scale_inv
    sb = w8.scale_inv.reshape(()) if gb == "tensor" else w8.scale_inv.t()
    raw = fp8mix.scaled_mm(x8.data, w8.data.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16)
    assert_same_bits(got, raw)
    ref = x8.dequantize().double() @ w8.dequantize().double().t() + bias.double()
    assert rel_fro(got, ref) < 2 ** -8
    # cast_transpose gives the row-major (K, N) operand: same bits
    if gb in ("tensor", "block2d"):
        q, qt = fp8mix.cast_transpose(w, "E5M2" if gb == "tensor" else "E4M3", granularity=gb)
        assert qt.shape == (K, N)
        assert_same_bits(fp8mix.scaled_mm(x8, qt, bias=bias, out_dtype=torch.bfloat16),
                         fp8mix.scaled_mm(x8, q.t(), bias=bias, out_dtype=torch.bfloat16), "cast_transpose")


def test_float8tensor_misuse():
    x8 = fp8mix.quantize(torch.randn(4, 8))
    w8 = fp8mix.quantize(torch.randn(5, 8))
    with pytest.raises(TypeError, match="Float8Tensor"):
        fp8mix.scaled_mm(x8, w8.data.t(), torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(ValueError, match="scale"):
        fp8mix.scaled_mm(x8, w8.t(), x8.scale_inv, w8.scale_inv)
    w8r = fp8mix.quantize(torch.randn(5, 8), granularity="row")
    with pytest.raises(ValueError, match="row"):
        w8r.t()
    with pytest.raises(ValueError, match="scal"):
        fp8mix.scaled_mm(x8, fp8mix.quantize(torch.randn(8, 5), granularity="row"))
    with pytest.raises(ValueError, match="block2d"):
        fp8mix.scaled_mm(fp8mix.quantize(torch.randn(4, 8), granularity="block2d"), w8.t())


# ---------------------------------------------------------------------------
# bad input, empty shapes
# ---------------------------------------------------------------------------

def _ops():
    gen = torch.Generator().manual_seed(0)
    a, w = operands(4, 8, 5, E4M3, E4M3, gen, "randn")
    return a, w.t(), torch.tensor(1.0)


BAD = [
    ("K mismatch", lambda a, b, s: fp8mix.scaled_mm(a, b[:7], s, s), ValueError, "inner dimension"),
    ("a float32", lambda a, b, s: fp8mix.scaled_mm(a.float(), b, s, s), TypeError, "FP8"),
    ("b float32", lambda a, b, s: fp8mix.scaled_mm(a, b.float(), s, s), TypeError, "FP8"),
    ("a int8", lambda a, b, s: fp8mix.scaled_mm(a.view(torch.int8), b, s, s), TypeError, "FP8"),
    ("b uint8", lambda a, b, s: fp8mix.scaled_mm(a, b.view(torch.uint8), s, s), TypeError, "FP8"),
    ("a bf16", lambda a, b, s: fp8mix.scaled_mm(a.bfloat16(), b, s, s), TypeError, "FP8"),
    ("scale_a float64", lambda a, b, s: fp8mix.scaled_mm(a, b, s.double(), s), TypeError, "scale_a.*float32"),
    ("scale_b float16", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s.half()), TypeError, "scale_b.*float32"),
    ("scale_a python float", lambda a, b, s: fp8mix.scaled_mm(a, b, 1.0, s), TypeError, "scale_a"),
    ("scale_b None", lambda a, b, s: fp8mix.scaled_mm(a, b, s, None), TypeError, "scale_b"),
    ("scale_a (M,)", lambda a, b, s: fp8mix.scaled_mm(a, b, torch.ones(4), s), ValueError, "scale_a.*shape"),
    ("scale_a (1,M)", lambda a, b, s: fp8mix.scaled_mm(a, b, torch.ones(1, 4), s), ValueError, "scale_a.*shape"),
    ("scale_a (M,2)", lambda a, b, s: fp8mix.scaled_mm(a, b, torch.ones(4, 2), s), ValueError, "scale_a.*shape"),
    ("scale_b (N,1)", lambda a, b, s: fp8mix.scaled_mm(a, b, s, torch.ones(5, 1)), ValueError, "scale_b.*shape"),
    ("scale_b (N,)", lambda a, b, s: fp8mix.scaled_mm(a, b, s, torch.ones(5)), ValueError, "scale_b.*shape"),
    ("scale_a 3-D", lambda a, b, s: fp8mix.scaled_mm(a, b, torch.ones(4, 1, 1), s), ValueError, "scale_a"),
    ("scale_a NaN", lambda a, b, s: fp8mix.scaled_mm(a, b, torch.tensor(math.nan), s), ValueError, "scale"),
    ("scale_a inf", lambda a, b, s: fp8mix.scaled_mm(a, b, torch.tensor(math.inf), s), ValueError, "scale"),
    ("scale_b 0", lambda a, b, s: fp8mix.scaled_mm(a, b, s, torch.tensor(0.0)), ValueError, "scale"),
    ("scale_b -0", lambda a, b, s: fp8mix.scaled_mm(a, b, s, torch.tensor(-0.0)), ValueError, "scale"),
    ("scale_b negative", lambda a, b, s: fp8mix.scaled_mm(a, b, s, torch.tensor(-2.0)), ValueError, "scale"),
    ("row scale with one NaN", lambda a, b, s: fp8mix.scaled_mm(
        a, b, torch.tensor([[1.0], [1.0], [math.nan], [1.0]]), s), ValueError, "scale"),
    ("col scale with one -inf", lambda a, b, s: fp8mix.scaled_mm(
        a, b, s, torch.tensor([[1.0, 1.0, 1.0, 1.0, -math.inf]])), ValueError, "scale"),
    ("block scale with one 0", lambda a, b, s: fp8mix.scaled_mm(
        a, b, torch.tensor([[1.0], [1.0], [1.0], [1.0]]) * torch.tensor([[1.0], [0.0], [1.0], [1.0]]),
        torch.ones(1, 1)), ValueError, "scale"),
    ("a 1-D", lambda a, b, s: fp8mix.scaled_mm(a[0], b, s, s), ValueError, "2-D"),
    ("b 1-D", lambda a, b, s: fp8mix.scaled_mm(a, b[:, 0], s, s), ValueError, "2-D"),
    ("a 3-D", lambda a, b, s: fp8mix.scaled_mm(a[None], b, s, s), ValueError, "2-D"),
    ("b 3-D", lambda a, b, s: fp8mix.scaled_mm(a, b[None], s, s), ValueError, "2-D"),
    ("bias wrong length", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, bias=torch.ones(4)), ValueError, "bias"),
    ("bias 2-D", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, bias=torch.ones(1, 5)), ValueError, "bias"),
    ("bias float64", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, bias=torch.ones(5, dtype=torch.float64)),
     TypeError, "bias"),
    ("bias int32", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, bias=torch.ones(5, dtype=torch.int32)),
     TypeError, "bias"),
    ("bias fp8", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, bias=torch.ones(5).to(E4M3)), TypeError, "bias"),
    ("accumulate unknown", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, accumulate="fp16"), ValueError,
     "accumulate"),
    ("accumulate upper case", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, accumulate="FP32"), ValueError,
     "accumulate"),
    ("promote_interval < 0", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, accumulate="fp22", promote_interval=-1),
     ValueError, "promote_interval"),
    ("promote_interval float", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, promote_interval=1.5), EXC,
     "promote_interval"),
    ("out_dtype float64", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, out_dtype=torch.float64), TypeError,
     "out_dtype"),
    ("out_dtype fp8", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, out_dtype=E4M3), TypeError, "out_dtype"),
    ("out_dtype string", lambda a, b, s: fp8mix.scaled_mm(a, b, s, s, out_dtype="float32"), TypeError,
     "out_dtype"),
    ("block a with tensor b", lambda a, b, s: fp8mix.scaled_mm(
        torch.zeros(4, 300, dtype=torch.uint8).view(E4M3), torch.zeros(300, 5, dtype=torch.uint8).view(E4M3),
        torch.ones(4, 3), s), ValueError, "scale_a"),
    ("block b with tensor a", lambda a, b, s: fp8mix.scaled_mm(
        torch.zeros(4, 300, dtype=torch.uint8).view(E4M3), torch.zeros(300, 5, dtype=torch.uint8).view(E4M3),
        s, torch.ones(3, 1)), ValueError, "scale_b"),
    ("block b wrong blocks", lambda a, b, s: fp8mix.scaled_mm(
        torch.zeros(4, 300, dtype=torch.uint8).view(E4M3), torch.zeros(300, 5, dtype=torch.uint8).view(E4M3),
        torch.ones(4, 3), torch.ones(2, 1)), ValueError, "scale"),
]


@pytest.mark.parametrize("call,exc,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises(call, exc, match):
    a, b, s = _ops()
    with pytest.raises(exc, match=f"(?i){match}"):
        call(a, b, s)


@pytest.mark.parametrize("accumulate", ["fp32", "fp22"])
def test_empty_and_k0(accumulate):
    gen = torch.Generator().manual_seed(0)
    M, K, N = 6, 200, 9
    a, w = operands(M, K, N, E4M3, E4M3, gen, "randn")
    s = torch.tensor(0.5)
    mm = lambda *x, **kw: fp8mix.scaled_mm(*x, accumulate=accumulate, **kw)  # noqa: E731
    for od in (torch.float32, torch.bfloat16, torch.float16):
        o = mm(a[:0], w.t(), s, s, out_dtype=od)
        assert o.shape == (0, N) and o.dtype == od
        o = mm(a, w[:0].t(), s, s, out_dtype=od)
        assert o.shape == (M, 0) and o.dtype == od
        o = mm(a[:0], w[:0].t(), s, s, out_dtype=od)
        assert o.shape == (0, 0)
        # per-row / block scales of empty M
        assert mm(a[:0], w.t(), torch.ones(0, 1), torch.ones(1, N), out_dtype=od).shape == (0, N)
        assert mm(a[:0], w.t(), torch.ones(0, 2), torch.ones(2, 1), out_dtype=od).shape == (0, N)
        assert mm(a, w[:0].t(), torch.ones(M, 2), torch.ones(2, 0), out_dtype=od).shape == (M, 0)
        # K = 0: zeros, or the bias
        a0, b0 = a[:, :0], w[:, :0].t()
        for b_ in (b0, b0.contiguous()):
            z = mm(a0, b_, s, s, out_dtype=od)
            assert z.shape == (M, N) and z.dtype == od
            assert_same_bits(z, torch.zeros(M, N, dtype=od), "K=0 must give +0")
            bias = torch.randn(N, generator=gen)
            assert_same_bits(mm(a0, b_, s, s, bias=bias, out_dtype=od), bias.to(od).expand(M, N).contiguous())
            assert_same_bits(mm(a0, b_, torch.ones(M, 1), torch.ones(1, N), bias=bias.to(od), out_dtype=od),
                             bias.to(od).expand(M, N).contiguous())
            assert_same_bits(mm(a0, b_, torch.ones(M, 0), torch.ones(0, 1), bias=bias, out_dtype=od),
                             bias.to(od).expand(M, N).contiguous(), "K=0, block scales")


def test_zero_rows_and_columns_are_exact_zeros():
    gen = torch.Generator().manual_seed(12)
    M, K, N = 20, 260, 30
    a, w = operands(M, K, N, E5M2, E4M3, gen, "bytes")
    a[3] = 0.0
    w[7] = 0.0
    out = fp8mix.scaled_mm(a, w.t(), rand_scales((M, 3), gen), rand_scales((3, 1), gen))
    assert torch.all(out[3] == 0) and torch.all(out[:, 7] == 0)
    assert not torch.signbit(out[3]).any()


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------

@threaded
def test_torch_compile_matches_eager():
    gen = torch.Generator().manual_seed(13)
    M, K, N = 33, 300, 70
    a, w = operands(M, K, N, E4M3, E5M2, gen, "randn")
    sa, sb = rand_scales((M, 3), gen), rand_scales((3, 1), gen)
    st = torch.tensor(0.25)
    bias = torch.randn(N, generator=gen).bfloat16()

    def f(a, b, sa, sb, st, bias):
        y = fp8mix.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
        z = fp8mix.scaled_mm(a, b, st, st, accumulate="fp22", promote_interval=64)
        return y.float() * 2 + z

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = cf(a, w.t(), sa, sb, st, bias)
    assert_same_bits(got, f(a, w.t(), sa, sb, st, bias), "compiled vs eager")
