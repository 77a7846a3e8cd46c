"""CUDA backend vs the CPU oracle (csrc/cuda vs csrc/core).

Every cast mode must give the CPU's bytes exactly (rounding, stochastic rounding with
the same Philox stream, every granularity, transpose, f32/bf16/f16 inputs, saturating
and not), amax and quantize_current the CPU's bits; the delayed-scaling kernel must
match a plain re-derivation; scaled_mm (cuBLASLt) must agree with the CPU GEMM up to
summation order and with torch._scaled_mm closely; fp8mix.Linear on CUDA must track
the CPU layer.  Skipped cleanly without a GPU or without a CUDA build of fp8mix.
"""
from __future__ import annotations

import math

import pytest
import torch

import fp8mix
from fp8mix import ops

_HAS_CUDA_KERNELS = torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key(
    "fp8mix::cast", "CUDA")
if not _HAS_CUDA_KERNELS:  # one skip for the module, not one per parametrized case
    pytest.skip("needs an NVIDIA GPU and fp8mix built with CUDA (FP8MIX_FORCE_CUDA=1)", allow_module_level=True)

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
HP = (torch.float32, torch.bfloat16, torch.float16)
# rows x cols: aligned (vector path), odd (scalar path / partial tiles), tall, tiny, empty
SHAPES = [(256, 384), (130, 200), (1, 16), (3, 17), (257, 129), (64, 4096), (0, 32), (5, 0)]
GRANS = [0, 1, 2, 3]


def _x(shape, dtype, seed=0, specials=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 3)
    if specials and x.numel() >= 8:
        f = x.view(-1)
        f[0], f[1], f[2], f[3] = float("inf"), -float("inf"), 0.0, -0.0
        f[4], f[5] = 1e-30, -470.0
    return x.to(dtype)


def _scales(x, gran, seed=1):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    cols = x.shape[-1]
    n = {0: 1, 1: rows, 2: rows * ((cols + 127) // 128),
         3: ((rows + 127) // 128) * ((cols + 127) // 128)}[gran]
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(max(n, 0), generator=g) * 4 + 0.05).reshape(-1) if gran else torch.tensor(1.7)


def _bytes(t):
    return t.view(torch.uint8).cpu()


def _bits(t):
    return t.float().view(torch.int32).cpu() if t.dtype == torch.float32 else t.view(torch.int16).cpu()


@pytest.fixture(params=[True, False], ids=["hwcvt", "intenc"])
def hw_convert(request):
    """Both encoder paths (the sm_89 cvt instruction and the integer port) must give the CPU bytes."""
    old = torch.ops.fp8mix.cuda_get_hw_convert()
    torch.ops.fp8mix.cuda_set_hw_convert(request.param)
    yield request.param
    torch.ops.fp8mix.cuda_set_hw_convert(old)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nonsat"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize("transpose", [False, True], ids=["q", "qqt"])
def test_cast_bytes_match_cpu(shape, dtype, gran, fmt, saturate, stochastic, transpose, hw_convert):
    x = _x(shape, dtype)
    s = _scales(x, gran)
    args = (fmt, gran, saturate, stochastic, 12345678901, 4 * 7, True, transpose)
    q0, qt0, a0 = ops.cast(x, s, *args)
    q1, qt1, a1 = ops.cast(x.cuda(), s.cuda(), *args)
    assert torch.equal(_bytes(q1), _bytes(q0))
    if transpose:
        assert torch.equal(_bytes(qt1), _bytes(qt0))
    assert torch.equal(_bits(a1), _bits(a0))


@pytest.mark.parametrize("dtype", HP, ids=str)
def test_cast_qt_only_and_strided_input(dtype):
    base = _x((96, 160), dtype)
    x = base[:, 16:144]  # row stride 160, inner stride 1: no copy on either device
    s = torch.tensor(0.75)
    for want_q in (True, False):
        c = ops.cast(x, s, E4, 0, True, False, 0, 0, want_q, True)
        g = ops.cast(x.cuda(), s.cuda(), E4, 0, True, False, 0, 0, want_q, True)
        assert torch.equal(_bytes(g[1]), _bytes(c[1]))
        if want_q:
            assert torch.equal(_bytes(g[0]), _bytes(c[0]))


def test_stochastic_offset_not_multiple_of_4_and_big_seed():
    x = _x((33, 48), torch.float32)
    for off in (0, 1, 2, 3, 2**40 + 1):
        for seed in (0, 2**63 - 1, -5):
            c = ops.cast(x, torch.tensor(3.0), E5, 0, True, True, seed, off)
            g = ops.cast(x.cuda(), torch.tensor(3.0).cuda(), E5, 0, True, True, seed, off)
            assert torch.equal(_bytes(g[0]), _bytes(c[0])), (off, seed)


def test_every_float16_and_bfloat16_pattern():
    """All 65536 bit patterns (NaNs, infs, subnormals) through every format/mode."""
    pats = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    for dt in (torch.float16, torch.bfloat16):
        x = pats.view(dt).reshape(256, 256)
        for fmt in (E4, E5):
            for sat in (True, False):
                for sc in (1.0, 0.0078125, 300.0):
                    s = torch.tensor(sc)
                    c = ops.cast(x, s, fmt, 0, sat, False, 0, 0)
                    g = ops.cast(x.cuda(), s.cuda(), fmt, 0, sat, False, 0, 0)
                    assert torch.equal(_bytes(g[0]), _bytes(c[0])), (dt, fmt, sat, sc)
                    assert torch.equal(_bits(g[2]), _bits(c[2]))


def test_float32_edge_patterns():
    """Ties, subnormal boundaries and overflow thresholds of both formats."""
    vals = []
    for e in range(-30, 20):
        for m in range(0, 64):
            v = math.ldexp(1 + m / 64, e)
            vals += [v, -v, math.nextafter(v, 0), math.nextafter(v, math.inf)]
    vals += [448, 464, 464.00003, 480, 57344, 61440, 61441, 2**-9, 2**-10, 2**-16, 2**-17, 3 * 2**-11]
    x = torch.tensor(vals, dtype=torch.float32)
    x = torch.cat([x, x.new_full((16 - x.numel() % 16,), 1.0)]).reshape(-1, 16)
    for fmt in (E4, E5):
        for sat in (True, False):
            for sr in (False, True):
                c = ops.cast(x, torch.tensor(1.0), fmt, 0, sat, sr, 99, 0)
                g = ops.cast(x.cuda(), torch.tensor(1.0).cuda(), fmt, 0, sat, sr, 99, 0)
                assert torch.equal(_bytes(g[0]), _bytes(c[0])), (fmt, sat, sr)


@pytest.mark.parametrize("shape", SHAPES + [(3, 5, 256)], ids=str)
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("gran", GRANS)
def test_amax_matches_cpu(shape, dtype, gran):
    x = _x(shape, dtype, seed=3)
    a0 = ops.amax(x, gran)
    a1 = ops.amax(x.cuda(), gran)
    assert a1.shape == a0.shape
    assert torch.equal(_bits(a1), _bits(a0))


def test_amax_nan_rules():
    x = torch.zeros(300, 260)
    x[7, 3] = float("nan")
    x[200, 250] = -float("inf")
    for g in GRANS:
        assert torch.equal(_bits(ops.amax(x.cuda(), g)), _bits(ops.amax(x, g)))
    y = -torch.tensor([float("nan")] * 16).view(1, 16)  # negative NaN -> canonical 0x7FC00000
    assert ops.amax(y.cuda(), 0).view(torch.int32).item() == 0x7FC00000


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("transpose", [False, True], ids=["q", "qqt"])
@pytest.mark.parametrize("mode", ["plain", "pow2_margin_eps", "sr"])
def test_quantize_current_matches_cpu(shape, dtype, gran, fmt, transpose, mode, hw_convert):
    x = _x(shape, dtype, seed=5)
    margin, pow2, eps = (2, True, 1e-3) if mode == "pow2_margin_eps" else (0, False, 0.0)
    sr = mode == "sr"
    args = (fmt, gran, margin, pow2, eps, True, sr, 777, 8, True, transpose)
    c = ops.quantize_current(x, *args)
    g = ops.quantize_current(x.cuda(), *args)
    assert torch.equal(_bytes(g[0]), _bytes(c[0]))
    if transpose:
        assert torch.equal(_bytes(g[1]), _bytes(c[1]))
    assert g[2].shape == c[2].shape and g[3].shape == c[3].shape
    assert torch.equal(_bits(g[2]), _bits(c[2]))
    assert torch.equal(_bits(g[3]), _bits(c[3]))


@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("margin", [0, 3])
@pytest.mark.parametrize("pow2", [False, True])
def test_compute_scale_matches_cpu(fmt, margin, pow2):
    a = torch.tensor([0.0, -0.0, 1e-45, 1e-38, 1e-30, 0.5, 1.0, 448.0, 3e38, float("inf"), float("nan"),
                      1.17549435e-38, 7.0, 1e-3] * 2)
    for eps in (0.0, 1e-4):
        c = ops.compute_scale(a, fmt, margin, pow2, eps)
        g = ops.compute_scale(a.cuda(), fmt, margin, pow2, eps)
        assert torch.equal(_bits(g[0]), _bits(c[0])) and torch.equal(_bits(g[1]), _bits(c[1]))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("out", HP, ids=str)
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
def test_dequantize_matches_cpu(shape, out, gran, fmt):
    g8 = torch.Generator().manual_seed(11)
    q = torch.randint(0, 256, shape, generator=g8, dtype=torch.uint8).view(fmt)
    x = _x(shape, torch.float32)
    s = _scales(x, gran, seed=4)
    c = ops.dequantize(q, s, gran, out)
    g = ops.dequantize(q.cuda(), s.cuda(), gran, out)
    assert torch.equal(_bits(g), _bits(c))


def test_invalid_scale_flag(monkeypatch):
    monkeypatch.setenv("FP8MIX_CUDA_CHECK_SCALES", "1")
    x = torch.randn(32, 32, device="cuda")
    with pytest.raises(ValueError):
        ops.cast(x, torch.tensor(float("nan"), device="cuda"), E4, 0)
    with pytest.raises(ValueError):
        ops.dequantize(torch.zeros(4, 16, dtype=torch.uint8, device="cuda").view(E4),
                       torch.tensor(-1.0, device="cuda"), 0, torch.float32)
    ops.cast(x, torch.tensor(2.0, device="cuda"), E4, 0)  # valid: no error


# ---- delayed scaling ----------------------------------------------------------------

def _rederive(h, am, scale, steps, fmax, margin, pow2, algo, interval):
    """The plain-torch derivation fp8mix.linear uses (roll, insert, scale, keep on 0/non-finite)."""
    h = torch.roll(h, 1, 0)
    h[0] = am
    steps = steps + 1
    a = h.amax() if algo == "max" else h[0]
    fmt = E4 if fmax == 448.0 else E5
    s, _ = ops.compute_scale(a.reshape(1).cpu(), fmt, margin, pow2, 0.0)
    ok = bool(torch.isfinite(a) and a > 0) and (steps % interval == 0)
    return h, (s[0] if ok else scale), steps


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("interval", [1, 3])
@pytest.mark.parametrize("pow2", [False, True])
def test_delayed_update_kernel_matches_rederivation(algo, interval, pow2):
    torch.manual_seed(0)
    lens = [1, 2, 16, 255, 256, 257, 1024, 3000] * 20  # 160 tensors: two launches
    hist = torch.zeros(3000, len(lens), device="cuda")
    for i, L in enumerate(lens):
        hist[:L, i] = torch.rand(L, device="cuda") * 10 ** torch.randint(-6, 6, (1,)).item()
    specials = [0.0, float("nan"), float("inf"), 1e-40, 3e38]
    amax = torch.rand(len(lens), device="cuda") * 100
    amax[:len(specials)] = torch.tensor(specials)
    scale = torch.rand(len(lens), device="cuda") + 0.5
    sinv = torch.empty_like(scale)
    steps = torch.randint(0, 5, (len(lens),), device="cuda")
    fmax = [448.0 if i % 2 else 57344.0 for i in range(len(lens))]
    ref = [(hist[:L, i].clone().cpu(), amax[i].cpu(), scale[i].cpu(), int(steps[i])) for i, L in enumerate(lens)]
    hs = [hist[:L, i] for i, L in enumerate(lens)]
    for step in range(3):
        torch.ops.fp8mix.delayed_scale_update(hs, list(amax.split(1)), [scale[i] for i in range(len(lens))],
                                              [sinv[i] for i in range(len(lens))], [steps[i] for i in range(len(lens))],
                                              fmax, 1, pow2, algo, interval)
        new = []
        for i, (h, am, sc, st) in enumerate(ref):
            h, sc, st = _rederive(h, am, sc, st, fmax[i], 1, pow2, algo, interval)
            new.append((h, am, sc, st))
        ref = new
        for i, (h, _, sc, st) in enumerate(ref):
            assert torch.equal(_bits(hs[i]), _bits(h)), (step, i)
            assert torch.equal(_bits(scale[i]), _bits(sc)), (step, i)
            assert torch.equal(_bits(sinv[i]), _bits(torch.reciprocal(sc))), (step, i)
            assert int(steps[i]) == st


# ---- scaled_mm -------------------------------------------------------------------------

def _rel_fro(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _fp8(shape, fmt, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 8).to(fmt)


@pytest.mark.parametrize("mnk", [(128, 256, 512), (1, 16, 16), (77, 48, 144), (256, 384, 4096)], ids=str)
@pytest.mark.parametrize("fmts", [(E4, E4), (E5, E4), (E4, E5)], ids=["e4e4", "e5e4", "e4e5"])
@pytest.mark.parametrize("out", HP, ids=str)
@pytest.mark.parametrize("scales", ["tensor", "row", "block"])
@pytest.mark.parametrize("bias", [None, "out", "f32", "bf16"])
def test_scaled_mm_matches_cpu(mnk, fmts, out, scales, bias):
    M, N, K = mnk
    a = _fp8((M, K), fmts[0], 1)
    b = _fp8((N, K), fmts[1], 2).t()  # column-major (K, N)
    if scales == "tensor":
        sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    elif scales == "row":
        sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    else:
        if torch.cuda.get_device_capability() < (9, 0):
            pytest.skip("block scales need sm_90")
        kb = (K + 127) // 128
        sa, sb = torch.rand(M, kb) + 0.5, torch.rand(kb, (N + 127) // 128) + 0.5
    bt = {None: None, "out": out, "f32": torch.float32, "bf16": torch.bfloat16}[bias]
    bv = (torch.randn(N) * 10).to(bt) if bt is not None else None
    c = ops.scaled_mm(a, b, sa, sb, bv, out, "fp32", 128)
    g = ops.scaled_mm(a.cuda(), b.cuda(), sa.cuda(), sb.cuda(), None if bv is None else bv.cuda(), out, "fp32", 128)
    assert g.dtype == out and g.shape == (M, N)
    tol = 1e-5 if out == torch.float32 else 4e-3  # bf16/f16 outputs: one rounding apart at most
    assert _rel_fro(g, c) < tol


def test_scaled_mm_vs_torch_scaled_mm():
    M, N, K = 512, 768, 1024
    a = _fp8((M, K), E4, 3).cuda()
    b = _fp8((N, K), E4, 4).cuda().t()
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    for out in (torch.bfloat16, torch.float32):
        ref = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out)
        got = ops.scaled_mm(a, b, sa, sb, None, out, "fp32", 128)
        assert _rel_fro(got, ref) < (1e-6 if out == torch.float32 else 1e-3)
    sa_r, sb_r = torch.rand(M, 1, device="cuda") + 0.5, torch.rand(1, N, device="cuda") + 0.5
    try:
        ref = torch._scaled_mm(a, b, scale_a=sa_r, scale_b=sb_r, out_dtype=torch.bfloat16)
    except RuntimeError as e:  # older torch / cuBLAS without row-wise scaling
        pytest.skip(f"torch._scaled_mm row-wise unavailable: {e}")
    got = ops.scaled_mm(a, b, sa_r, sb_r, None, torch.bfloat16, "fp32", 128)
    assert _rel_fro(got, ref) < 1e-3


def test_scaled_mm_row_major_b_and_errors():
    a = _fp8((64, 64), E4, 5)
    b = _fp8((64, 32), E4, 6)  # row-major (K, N): transposed by a copy on CUDA
    s = torch.tensor(1.0)
    c = ops.scaled_mm(a, b, s, s, None, torch.float32, "fp32", 128)
    g = ops.scaled_mm(a.cuda(), b.cuda(), s.cuda(), s.cuda(), None, torch.float32, "fp32", 128)
    assert _rel_fro(g, c) < 1e-5
    with pytest.raises(ValueError, match="E5M2 x E5M2"):
        ops.scaled_mm(_fp8((64, 64), E5, 1).cuda(), _fp8((32, 64), E5, 2).cuda().t(), s.cuda(), s.cuda(), None,
                      torch.float32, "fp32", 128)


def test_scaled_mm_fast_accum_runs():
    a = _fp8((256, 512), E4, 7).cuda()
    b = _fp8((256, 512), E4, 8).cuda().t()
    s = torch.tensor(1.0, device="cuda")
    exact = ops.scaled_mm(a, b, s, s, None, torch.float32, "fp32", 128)
    fast = ops.scaled_mm(a, b, s, s, None, torch.float32, "fp22", 128)
    assert _rel_fro(fast, exact) < 1e-2


# ---- fp8mix.Linear --------------------------------------------------------------------

def _sqnr_db(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum().clamp_min(1e-300))).item()


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
def test_linear_cuda_tracks_cpu(recipe):
    torch.manual_seed(0)
    rec = {"delayed": fp8mix.recipe.DelayedScaling(amax_history_len=4),
           "current": fp8mix.recipe.CurrentScaling(),
           "block": fp8mix.recipe.BlockScaling()}[recipe]
    if recipe == "block" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("block scales need sm_90")
    lin_c = fp8mix.Linear(256, 384)
    lin_g = fp8mix.Linear(256, 384).cuda()
    lin_g.load_state_dict(lin_c.state_dict())
    for step in range(3):
        x = torch.randn(128, 256)
        xc, xg = x.clone().requires_grad_(), x.cuda().requires_grad_()
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=rec):
            yc, yg = lin_c(xc), lin_g(xg)
        dy = torch.randn_like(yc)
        yc.backward(dy)
        yg.backward(dy.cuda())
        assert _sqnr_db(yg, yc) > 40, step
        assert _sqnr_db(xg.grad, xc.grad) > 40, step
        assert _sqnr_db(lin_g.weight.grad, lin_c.weight.grad) > 40, step
        assert _sqnr_db(lin_g.bias.grad, lin_c.bias.grad) > 40, step
        lin_c.zero_grad()
        lin_g.zero_grad()
