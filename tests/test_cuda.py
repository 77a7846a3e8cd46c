"""CUDA backend vs the CPU oracle (csrc/cuda vs csrc/core).

Cheap smoke tests come first (one cast, one GEMM, one Linear step, the self-check), so
that a broken build shows at once. Then: every cast mode must give the CPU's bytes
exactly (rounding, stochastic rounding with the same Philox stream, every granularity,
transpose, f32/bf16/f16 inputs, saturating and not, inf_to_nan, empty tensors), amax,
quantize_current and quant_stats the CPU's bits / counts; the delayed-scaling kernel
must match a plain re-derivation; the per-tensor recipes' ops (delayed_cast,
delayed_record, delayed_flush, grad_cast with its pending max and column sums, tensor-
held rng streams) the CPU's outputs and state bit for bit, with their documented launch
counts and no host sync; scaled_mm (cuBLASLt) must agree with the CPU GEMM and with
torch._scaled_mm to within summation order and Hopper's FP22 accumulation
(fp8mix.cuda.compare's tolerance); the torch._scaled_mm fallback likewise; one
fp8mix.Linear training step must capture into a CUDA graph and replay to the eager
result; fp8mix.Linear on CUDA must track the CPU layer (and, under delayed scaling, keep
the CPU's state bits). Skipped cleanly without a GPU or without a CUDA build of fp8mix;
FP8MIX_CUDA_TESTS_ON=cpu dry-runs the file's own code on the CPU.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from helpers import sqnr_db

import fp8mix
from fp8mix import ops
from fp8mix.cuda import _capi, fallback, selfcheck
from fp8mix.cuda import recipe_cases as rc
from fp8mix.cuda.compare import Case, gemm_bound, verify

# FP8MIX_CUDA_TESTS_ON=cpu: a dry run of this file's own code with the CPU standing in for
# the device (both halves on the CPU; GPU-only tests skip). Otherwise the device is CUDA.
DEV = os.environ.get("FP8MIX_CUDA_TESTS_ON", "cuda")
ON_GPU = DEV == "cuda"
_HAS_CUDA_KERNELS = torch.cuda.is_available() and ops.has_kernels("cast", torch.device("cuda"))
if ON_GPU and not _HAS_CUDA_KERNELS:  # one skip for the module, not one per parametrized case
    pytest.skip("needs an NVIDIA GPU and fp8mix built with CUDA (FP8MIX_FORCE_CUDA=1)", allow_module_level=True)
gpu_only = pytest.mark.skipif(not ON_GPU, reason="a CUDA device itself (dry run on the CPU)")

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
SPEC4 = ops.DelayedSpec(history_len=4)  # margin 0, no power-of-two scales, "max", interval 1
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
    rows = math.prod(x.shape[:-1])  # (5, 0) has 5 rows: 5 row scales, no elements
    cols = x.shape[-1]
    n = {0: 1, 1: rows, 2: rows * ((cols + 127) // 128),
         3: ((rows + 127) // 128) * ((cols + 127) // 128)}[gran]
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(max(n, 0), generator=g) * 4 + 0.05).reshape(-1) if gran else torch.tensor(1.7)


def _bytes(t):
    return t.view(torch.uint8).cpu()


def _bits(t):
    return t.float().view(torch.int32).cpu() if t.dtype == torch.float32 else t.view(torch.int16).cpu()


def _mm_or_fallback(name, allow_refusal, a, b, sa, sb, bias, out, **kw):
    """ops.scaled_mm on the device: fp8mix's CUDA GEMM, or torch._scaled_mm through the
    fallback when cuBLASLt refuses the problem, which the rules must allow here (any other
    error propagates)."""
    got, refused = selfcheck.scaled_mm_noting_fallback(a, b, sa, sb, bias, out, **kw)
    assert allow_refusal or not refused, f"scaled_mm {name} must not be refused on this device: {refused}"
    return got


def _gemm_case(name, got, a, b, sa, sb, kind, bias, want) -> None:
    """got vs want to within summation order and FP22 accumulation (the self-check's rule)."""
    bound = gemm_bound(a.cpu(), b.cpu(), sa.cpu(), sb.cpu(), kind, None if bias is None else bias.cpu())
    verify([Case(name, got.cpu(), want.cpu(), "gemm", bound)])


# ---- smoke tests: one of each, first -----------------------------------------------------

def test_smoke_cast():
    x = _x((64, 256), torch.bfloat16)
    s = torch.tensor(2.0)
    c, g = ops.cast(x, s, E4), ops.cast(x.to(DEV), s.to(DEV), E4)
    assert torch.equal(_bytes(g[0]), _bytes(c[0])) and torch.equal(_bits(g[2]), _bits(c[2]))


def test_smoke_gemm():
    a, b = _fp8((128, 256), E4, 1), _fp8((64, 256), E4, 2).t()
    s = torch.tensor(0.5)
    c = ops.scaled_mm(a, b, s, s, out_dtype=torch.float32)
    g = _mm_or_fallback("smoke", False, a.to(DEV), b.to(DEV), s.to(DEV), s.to(DEV), None, torch.float32)
    _gemm_case("smoke scaled_mm", g, a, b, s, s, "tensor", None, c)


def test_smoke_linear_step():
    lin = fp8mix.Linear(256, 128).to(DEV)
    x = torch.randn(64, 256, device=DEV, requires_grad=True)
    with fp8mix.fp8_autocast(enabled=True, fp8_recipe=fp8mix.recipe.DelayedScaling()):
        y = lin(x)
    y.sum().backward()
    ref = torch.nn.functional.linear(x.detach(), lin.weight.detach(), lin.bias.detach())
    assert torch.isfinite(x.grad).all() and sqnr_db(ref, y.detach()) > 20


@gpu_only
def test_smoke_selfcheck():
    if not selfcheck.selfcheck_enabled():
        pytest.skip("FP8MIX_CUDA_SELFCHECK=0")
    rep = selfcheck.run_selfcheck(torch.device("cuda", torch.cuda.current_device()))
    assert rep["cases"] > 100 and rep["elements"] > 100_000


@pytest.fixture(params=[True, False], ids=["hwcvt", "intenc"])
def hw_convert(request):
    """Both encoder paths (the sm_89 cvt instruction and the integer port) must give the CPU bytes."""
    if not ON_GPU:
        yield request.param
        return
    old = ops.cuda_hw_convert()
    ops.cuda_hw_convert(request.param)
    yield request.param
    ops.cuda_hw_convert(old)


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
    kw = dict(granularity=gran, saturate=saturate, stochastic=stochastic, seed=12345678901, offset=4 * 7, want_q=True,
              transpose=transpose)
    q0, qt0, a0 = ops.cast(x, s, fmt, **kw)
    q1, qt1, a1 = ops.cast(x.to(DEV), s.to(DEV), fmt, **kw)
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
        c = ops.cast(x, s, E4, want_q=want_q, transpose=True)
        g = ops.cast(x.to(DEV), s.to(DEV), E4, want_q=want_q, transpose=True)
        assert torch.equal(_bytes(g[1]), _bytes(c[1]))
        if want_q:
            assert torch.equal(_bytes(g[0]), _bytes(c[0]))


def test_stochastic_offset_not_multiple_of_4_and_big_seed():
    x = _x((33, 48), torch.float32)
    for off in (0, 1, 2, 3, 2**40 + 1):
        for seed in (0, 2**63 - 1, -5):
            c = ops.cast(x, torch.tensor(3.0), E5, stochastic=True, seed=seed, offset=off)
            g = ops.cast(x.to(DEV), torch.tensor(3.0).to(DEV), E5, stochastic=True, seed=seed, offset=off)
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
                    c = ops.cast(x, s, fmt, saturate=sat)
                    g = ops.cast(x.to(DEV), s.to(DEV), fmt, saturate=sat)
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
                c = ops.cast(x, torch.tensor(1.0), fmt, saturate=sat, stochastic=sr, seed=99)
                g = ops.cast(x.to(DEV), torch.tensor(1.0).to(DEV), fmt, saturate=sat, stochastic=sr, seed=99)
                assert torch.equal(_bytes(g[0]), _bytes(c[0])), (fmt, sat, sr)


@gpu_only
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nonsat"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["rn", "sr"])
@pytest.mark.parametrize("dtype", HP, ids=str)
def test_inf_to_nan_matches_cpu(fmt, saturate, stochastic, dtype, hw_convert):
    """fp8mix_cast_opts.inf_to_nan (no op argument yet: the C entry points through ctypes)
    in both encoder paths: an infinite input gives the signed NaN byte, finite overflow
    still follows `saturate`, exactly as the C core."""
    x = _x((48, 160), dtype)  # +inf, -inf, 0, -0, 1e-30, -470 in front
    x.view(-1)[6] = float("nan")
    for sc in (1.0, 300.0):  # 300: finite values overflow too
        s = torch.tensor(sc)
        kw = dict(saturate=saturate, stochastic=stochastic, seed=5, offset=9, inf_to_nan=True)
        c = _capi.cast_raw(x, s, fmt, **kw)
        g = _capi.cast_raw(x.to(DEV), s.to(DEV), fmt, **kw)
        assert torch.equal(_bytes(g), _bytes(c)), sc
        nan = 0x7F if fmt == E4 else 0x7E
        assert int(_bytes(c).view(-1)[0]) == nan and int(_bytes(c).view(-1)[1]) == nan | 0x80


@pytest.mark.parametrize("shape", [(0, 32), (5, 0), (0, 0)], ids=str)
@pytest.mark.parametrize("transpose", [False, True], ids=["q", "qqt"])
def test_empty_tensors_as_on_cpu(shape, transpose):
    """The C core accepts empty tensors (fp8mix.h); so must every CUDA launcher."""
    x = torch.empty(shape)
    for gran in GRANS:
        s = _scales(x, gran)
        c = ops.cast(x, s, E4, granularity=gran, transpose=transpose)
        g = ops.cast(x.to(DEV), s.to(DEV), E4, granularity=gran, transpose=transpose)
        assert g[0].shape == c[0].shape and g[1].shape == c[1].shape and torch.equal(_bits(g[2]), _bits(c[2]))
        cq = ops.quantize_current(x, E5, granularity=gran, transpose=transpose)
        gq = ops.quantize_current(x.to(DEV), E5, granularity=gran, transpose=transpose)
        assert [t.shape for t in gq] == [t.shape for t in cq]
        assert torch.equal(_bits(gq[2]), _bits(cq[2])) and torch.equal(_bits(gq[3]), _bits(cq[3]))  # 1 and 0


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nonsat"])
def test_quant_stats_on_cuda_matches_cpu(gran, fmt, saturate):
    """The CUDA quant_stats kernel: counts exact, float64 energies to rounding."""
    for dtype, shape in ((torch.bfloat16, (257, 129)), (torch.float32, (64, 4096)), (torch.float16, (3, 17))):
        x = _x(shape, dtype, seed=gran)
        q, _, sinv, _ = ops.quantize_current(x, fmt, granularity=gran, saturate=saturate)
        c = ops.quant_stats(x, q, sinv, granularity=gran)
        g = ops.quant_stats(x.to(DEV), q.to(DEV), sinv.to(DEV), granularity=gran)
        assert g.device.type == torch.device(DEV).type and g.dtype == torch.float64
        verify([Case(f"quant_stats {dtype} {shape}", g.cpu(), c, "stats")])
    empty = ops.quant_stats(torch.empty(0, 8, device=DEV), torch.empty(0, 8, device=DEV).to(E4),
                            torch.ones((), device=DEV), granularity=0).cpu()
    assert empty[:9].eq(0).all() and math.isinf(float(empty[9]))


@pytest.mark.parametrize("shape", SHAPES + [(3, 5, 256)], ids=str)
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("gran", GRANS)
def test_amax_matches_cpu(shape, dtype, gran):
    x = _x(shape, dtype, seed=3)
    a0 = ops.amax(x, granularity=gran)
    a1 = ops.amax(x.to(DEV), granularity=gran)
    assert a1.shape == a0.shape
    assert torch.equal(_bits(a1), _bits(a0))


def test_amax_nan_rules():
    x = torch.zeros(300, 260)
    x[7, 3] = float("nan")
    x[200, 250] = -float("inf")
    for g in GRANS:
        assert torch.equal(_bits(ops.amax(x.to(DEV), granularity=g)), _bits(ops.amax(x, granularity=g)))
    y = -torch.tensor([float("nan")] * 16).view(1, 16)  # negative NaN -> canonical 0x7FC00000
    assert ops.amax(y.to(DEV)).view(torch.int32).item() == 0x7FC00000


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
    kw = dict(granularity=gran, margin=margin, power_2_scale=pow2, amax_epsilon=eps, saturate=True, stochastic=sr,
              seed=777, offset=8, want_q=True, transpose=transpose)
    c = ops.quantize_current(x, fmt, **kw)
    g = ops.quantize_current(x.to(DEV), fmt, **kw)
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
        c = ops.compute_scale(a, fmt, margin=margin, power_2_scale=pow2, amax_epsilon=eps)
        g = ops.compute_scale(a.to(DEV), fmt, margin=margin, power_2_scale=pow2, amax_epsilon=eps)
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
    c = ops.dequantize(q, s, granularity=gran, out_dtype=out)
    g = ops.dequantize(q.to(DEV), s.to(DEV), granularity=gran, out_dtype=out)
    assert torch.equal(_bits(g), _bits(c))


@gpu_only
def test_invalid_scale_flag():
    old = ops.cuda_check_scales()
    ops.cuda_check_scales(True)  # FP8MIX_CUDA_CHECK_SCALES=1 is read once, at first use
    try:
        x = torch.randn(32, 32, device=DEV)
        with pytest.raises(ValueError, match="finite and > 0"):
            ops.cast(x, torch.tensor(float("nan"), device=DEV), E4)
        with pytest.raises(ValueError, match="finite and > 0"):
            ops.dequantize(torch.zeros(4, 16, dtype=torch.uint8, device=DEV).view(E4),
                           torch.tensor(-1.0, device=DEV), out_dtype=torch.float32)
        q, _, si, _ = ops.quantize_current(x, E4)
        with pytest.raises(ValueError, match="finite and > 0"):
            ops.quant_stats(x, q, torch.tensor(0.0, device=DEV), granularity=0)
        ops.cast(x, torch.tensor(2.0, device=DEV), E4)  # valid: no error
    finally:
        ops.cuda_check_scales(old)


# ---- delayed scaling ----------------------------------------------------------------

def _rederive(h, am, scale, steps, fmax, margin, pow2, algo, interval):
    """The plain-torch derivation fp8mix.linear uses (roll, insert, scale, keep on 0/non-finite)."""
    h = torch.roll(h, 1, 0)
    h[0] = am
    steps = steps + 1
    a = h.amax() if algo == "max" else h[0]
    fmt = E4 if fmax == 448.0 else E5
    s, _ = ops.compute_scale(a.reshape(1).cpu(), fmt, margin=margin, power_2_scale=pow2)
    ok = bool(torch.isfinite(a) and a > 0) and (steps % interval == 0)
    return h, (s[0] if ok else scale), steps


@gpu_only  # a CUDA-only op: the CPU has no delayed_scale_update
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("interval", [1, 3])
@pytest.mark.parametrize("pow2", [False, True])
def test_delayed_update_kernel_matches_rederivation(algo, interval, pow2):
    torch.manual_seed(0)
    lens = [1, 2, 16, 255, 256, 257, 1024, 3000] * 20  # 160 tensors: two launches
    hist = torch.zeros(3000, len(lens), device=DEV)
    for i, L in enumerate(lens):
        hist[:L, i] = torch.rand(L, device=DEV) * 10 ** torch.randint(-6, 6, (1,)).item()
    specials = [0.0, float("nan"), float("inf"), 1e-40, 3e38]
    amax = torch.rand(len(lens), device=DEV) * 100
    amax[:len(specials)] = torch.tensor(specials)
    scale = torch.rand(len(lens), device=DEV) + 0.5
    sinv = torch.empty_like(scale)
    steps = torch.randint(0, 5, (len(lens),), device=DEV)
    fmax = [448.0 if i % 2 else 57344.0 for i in range(len(lens))]
    ref = [(hist[:L, i].clone().cpu(), amax[i].cpu(), scale[i].cpu(), int(steps[i])) for i, L in enumerate(lens)]
    hs = [hist[:L, i] for i, L in enumerate(lens)]
    for step in range(3):
        ops.delayed_scale_update(hs, list(amax.split(1)), [scale[i] for i in range(len(lens))], fp8_max=fmax,
                                 scale_inv=[sinv[i] for i in range(len(lens))],
                                 steps=[steps[i] for i in range(len(lens))], margin=1, power_2_scale=pow2, algo=algo,
                                 interval=interval)
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


# ---- per-tensor recipes: delayed_cast / delayed_record / delayed_flush / grad_cast -------
# Each case runs the op on DEV and on the CPU from one state and compares the outputs and
# every state tensor afterwards (history, scale, steps, pending ring, next slot) bit for bit
# (fp8mix.cuda.recipe_cases, the self-check's builders, here over many more modes).

def _verify_pairs(pairs) -> None:
    assert pairs, "a case compared nothing"
    verify([Case(name, got.cpu(), want) for name, got, want in pairs])


_RECIPE_SHAPES = [((64, 256), True, False), ((37, 203), False, True), ((1, 16), True, True), ((257, 129), True, False),
                  ((0, 32), True, False), ((3, 5, 48), False, False)]  # (shape, transpose, stochastic rounding)


@pytest.mark.parametrize("spec", rc.SPECS, ids=str)
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("use", ["steady", "first_use", "first_use_fresh_amax"])
@pytest.mark.parametrize("record", [True, False], ids=["record", "norecord"])
def test_delayed_cast_matches_cpu(spec, dtype, fmt, use, record):
    out: list = []
    for i, (shape, transpose, sr) in enumerate(_RECIPE_SHAPES):
        rc.delayed_cast_case(DEV, out, shape=shape, dtype=dtype, fmt=fmt, spec=spec, role=i % rc.ROLES, record=record,
                             transpose=transpose, first_use=use != "steady", fresh=use == "first_use_fresh_amax",
                             sr=sr, seed=i)
    _verify_pairs(out)


@pytest.mark.parametrize("spec", rc.SPECS + (rc.Spec(history_len=16, algo="most_recent", interval=1),), ids=str)
@pytest.mark.parametrize("fmt", [E4, E5], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("first_use", [False, True], ids=["steady", "first_use"])
def test_delayed_record_and_rescale_match_cpu(spec, fmt, first_use):
    out: list = []
    for seed in range(3):
        rc.record_case(DEV, out, spec=spec, fmt=fmt, first_use=first_use, seed=seed)
    _verify_pairs(out)


# (filled slots, head): in order, wrapping, full, empty, a head outside the ring (restarts at 0)
_RINGS = [((1, 2), 1), ((0, 3), 3), ((0, 1, 2, 3), 2), ((), 0), ((2,), 9), ((1,), -4)]


@pytest.mark.parametrize("spec", rc.SPECS, ids=str)
@pytest.mark.parametrize("ring", _RINGS, ids=str)
@pytest.mark.parametrize("mode", ["record_reserve", "record", "plan_only"])
@pytest.mark.parametrize("first_use", [False, True], ids=["steady", "first_use"])
def test_delayed_flush_matches_cpu(spec, ring, mode, first_use):
    out: list = []
    rc.flush_case(DEV, out, spec=spec, filled=ring[0], head=ring[1], record=mode != "plan_only",
                  reserve=mode == "record_reserve", first_use=first_use, seed=len(ring[0]))
    _verify_pairs(out)


# (slot, value it holds first): empty, smaller, larger than the cast's amax (the pending max)
_SLOTS = [(1, -1.0), (3, 1e-9), (0, 1e9), (None, 0.0)]


@pytest.mark.parametrize("plan", ["delayed", "fresh", "none"])
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("slot", _SLOTS, ids=str)
@pytest.mark.parametrize("scaling", [(0, False, 0.0), (2, True, 1e-3)], ids=["plain", "margin_pow2_eps"])
def test_grad_cast_matches_cpu(plan, dtype, slot, scaling):
    out: list = []
    # the column sums over many rows and odd widths: each column summed in row order 0..M-1
    for i, (shape, transpose, sr) in enumerate(_RECIPE_SHAPES + [((1031, 67), True, False), ((512, 600), False, True)]):
        rc.grad_cast_case(DEV, out, shape=shape, dtype=dtype, fmt=E5 if i % 2 else E4, plan=plan, slot=slot[0],
                          slot_value=slot[1], colsum=i % 3 != 2, transpose=transpose, margin=scaling[0],
                          pow2=scaling[1], eps=scaling[2], sr=sr, seed=i)
    _verify_pairs(out)


@pytest.mark.parametrize("spec", rc.SPECS, ids=str)
@pytest.mark.parametrize("dtype", HP, ids=str)
@pytest.mark.parametrize("sr", [False, True], ids=["rn", "sr"])
def test_delayed_training_chain_matches_cpu(spec, dtype, sr):
    """flush -> x / W casts (first use at step 0) -> 0, 1 or 2 grad casts into the slot,
    for more steps than the ring and the history hold (wrap-around, interval, merges)."""
    out: list = []
    rc.chain_case(DEV, out, steps=7, spec=spec, dtype=dtype, sr=sr, backwards=(1, 2, 0, 1), seed=3)
    _verify_pairs(out)


@pytest.mark.parametrize("op", ["cast", "quantize"])
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("offset_skip", [(0, 0), (6, 3), (2**40 + 1, 17)], ids=str)
@pytest.mark.parametrize("transpose", [False, True], ids=["q", "qqt"])
def test_rng_tensor_streams_match_cpu(op, gran, offset_skip, transpose):
    out: list = []
    for i, (shape, dtype) in enumerate((((37, 203), torch.float16), ((64, 256), torch.bfloat16),
                                        ((130, 200), torch.float32))):
        rc.rng_cast_case(DEV, out, op=op, gran=gran, shape=shape, dtype=dtype, fmt=E5 if i % 2 else E4,
                         offset=offset_skip[0], skip=offset_skip[1], transpose=transpose, seed=i)
    _verify_pairs(out)


def test_rng_tensor_stream_is_not_the_seed_arguments():
    """The tensor-held stream decides the bits: a different key or offset changes them,
    the plain seed / offset arguments then do not (a check of the comparison's power)."""
    x = rc.values((64, 256), torch.float32, 1, specials=False).to(DEV)
    s = torch.tensor(1.3, device=DEV)

    def q(key, off, seed):
        rng = torch.tensor([key, off], dtype=torch.int64, device=DEV)
        return _bytes(ops.cast(x, s, E4, seed=seed, inf_to_nan=True, rng=rng)[0])

    base = q(5, 8, 1)
    assert torch.equal(q(5, 8, 2), base)
    assert not torch.equal(q(6, 8, 1), base) and not torch.equal(q(5, 12, 1), base)


def test_recipe_ops_reject_bad_state():
    x = torch.randn(16, 32, device=DEV)
    st = {k: v.to(DEV) for k, v in rc.make_state(0).items()}
    kw = dict(fp8_dtype=E4, record=True)
    with pytest.raises(ValueError, match="history_len"):
        ops.delayed_cast(x, st["history"], st["scale"], st["steps"], role=0, spec=ops.DelayedSpec(99), **kw)
    with pytest.raises((ValueError, IndexError), match="role"):
        ops.delayed_cast(x, st["history"], st["scale"], st["steps"], role=7, spec=SPEC4, **kw)
    with pytest.raises(TypeError, match="steps"):
        ops.delayed_cast(x, st["history"], st["scale"], st["steps"].int(), role=0, spec=SPEC4, **kw)
    with pytest.raises(ValueError, match="pending and slot"):
        ops.grad_cast(x, E5, pending=st["pending"], inf_to_nan=False)
    with pytest.raises(ValueError, match="reserve"):
        ops.delayed_flush(st["history"], st["scale"], st["steps"], st["pending"], st["next_slot"], role=2, fp8_dtype=E5,
                          spec=SPEC4, record=False, reserve=True)


@gpu_only
def test_recipe_ops_do_not_sync_and_launch_as_documented():
    """fp8mix_cuda.h's launch counts (delayed_cast 2, grad_cast 2, record 1, flush 1), and
    no host sync: torch's sync debug mode raises on any synchronising call."""
    from torch.profiler import ProfilerActivity, profile

    st = {k: v.to(DEV) for k, v in rc.make_state(0, fresh_roles=(0,)).items()}
    x, dy = torch.randn(256, 512, device=DEV), torch.randn(256, 384, device=DEV)
    h, s, n = st["history"], st["scale"], st["steps"]
    plan = torch.tensor([0.5, 0.0], device=DEV)
    calls = {
        "delayed_cast first use": (2, lambda: ops.delayed_cast(x, h, s, n, role=0, fp8_dtype=E4, spec=SPEC4,
                                                               record=True, transpose=True)),
        "delayed_cast": (2, lambda: ops.delayed_cast(x, h, s, n, role=1, fp8_dtype=E4, spec=SPEC4, record=True,
                                                     transpose=True)),
        "delayed_flush": (1, lambda: ops.delayed_flush(h, s, n, st["pending"], st["next_slot"], role=2, fp8_dtype=E5,
                                                       spec=SPEC4, record=True, reserve=True)),
        "grad_cast": (2, lambda: ops.grad_cast(dy, E5, plan=plan, pending=st["pending"], slot=st["next_slot"],
                                               transpose=True, colsum=True)),
        "delayed_record": (1, lambda: ops.delayed_record(h, s, n, s[0], role=2, fp8_dtype=E5, spec=SPEC4)),
    }
    with profile(activities=[ProfilerActivity.CUDA]):  # CUPTI's start-up, outside the counted runs
        torch.ones(1, device=DEV).add_(1)
        torch.cuda.synchronize()
    for name, (want, fn) in calls.items():
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        got = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        assert len(got) == want, (name, got)  # kernels only: no memset, no copy


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
        kb = (K + 127) // 128
        sa, sb = torch.rand(M, kb) + 0.5, torch.rand(kb, (N + 127) // 128) + 0.5
    bt = {None: None, "out": out, "f32": torch.float32, "bf16": torch.bfloat16}[bias]
    bv = (torch.randn(N) * 10).to(bt) if bt is not None else None
    c = ops.scaled_mm(a, b, sa, sb, bias=bv, out_dtype=out)
    # Refusals are allowed only where the layout rules expect them (row-wise / block scales
    # off sm_90, or a format pair cuBLASLt may lack); then the fallback must be right.
    sm90 = not ON_GPU or torch.cuda.get_device_capability()[0] == 9
    allow = scales != "tensor" and not (sm90 and fmts == (E4, E4))
    g = _mm_or_fallback(f"{mnk} {fmts} {scales}", allow, a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV),
                        None if bv is None else bv.to(DEV), out)
    assert g.dtype == out and g.shape == (M, N)
    # Hopper accumulates FP8 products in ~14 bits between promotions: exact-sum agreement
    # (a 1e-5 tolerance) is not to be had; the self-check's FP22-aware rule is.
    _gemm_case(f"scaled_mm {mnk} {scales} {out} bias={bias}", g, a, b, sa, sb, scales, bv, c)


@gpu_only
def test_scaled_mm_vs_torch_scaled_mm():
    M, N, K = 512, 768, 1024
    a = _fp8((M, K), E4, 3).to(DEV)
    b = _fp8((N, K), E4, 4).to(DEV).t()
    sa, sb = torch.tensor(0.5, device=DEV), torch.tensor(0.25, device=DEV)
    for out in (torch.bfloat16, torch.float32):
        ref = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out)
        got = _mm_or_fallback(f"vs torch._scaled_mm {out}", False, a, b, sa, sb, None, out)
        # both are cuBLASLt FP8 GEMMs, but with different heuristic inputs (alignment
        # preferences, workspace): maybe different algorithms, so summation order differs
        _gemm_case(f"scaled_mm vs torch._scaled_mm {out}", got, a, b, sa, sb, "tensor", None, ref)
    sa_r, sb_r = torch.rand(M, 1, device=DEV) + 0.5, torch.rand(1, N, device=DEV) + 0.5
    try:
        ref = torch._scaled_mm(a, b, scale_a=sa_r, scale_b=sb_r, out_dtype=torch.bfloat16)
    except RuntimeError as e:  # older torch / cuBLAS without row-wise scaling
        pytest.skip(f"torch._scaled_mm row-wise unavailable: {e}")
    got = _mm_or_fallback("vs torch._scaled_mm row-wise", False, a, b, sa_r, sb_r, None, torch.bfloat16)
    _gemm_case("scaled_mm vs torch._scaled_mm row-wise", got, a, b, sa_r, sb_r, "row", None, ref)


@gpu_only
def test_scaled_mm_row_major_b_and_errors():
    a = _fp8((64, 64), E4, 5)
    b = _fp8((64, 32), E4, 6)  # row-major (K, N): transposed by a copy on CUDA
    s = torch.tensor(1.0)
    c = ops.scaled_mm(a, b, s, s, out_dtype=torch.float32)
    g = _mm_or_fallback("row-major b", False, a.to(DEV), b.to(DEV), s.to(DEV), s.to(DEV), None, torch.float32)
    _gemm_case("scaled_mm row-major b", g, a, b, s, s, "tensor", None, c)
    with pytest.raises(ValueError, match="E5M2 x E5M2"):
        ops.scaled_mm(_fp8((64, 64), E5, 1).to(DEV), _fp8((32, 64), E5, 2).to(DEV).t(), s.to(DEV), s.to(DEV),
                      out_dtype=torch.float32)


@pytest.mark.parametrize("offset", [1, 3, 8])
def test_scaled_mm_misaligned_bias_and_operand_views(offset):
    """A bias view at an odd offset (a slice of fused QKV biases) and operand views that
    start off a 16-byte boundary are copied, not refused."""
    M, N, K = 40, 48, 96
    big_a = _fp8((M, K + 16), E4, 7)
    a = big_a[:, offset:offset + K]
    b = _fp8((N, K), E4, 8).t()
    big_bias = torch.randn(N + 16).to(torch.bfloat16)
    bias = big_bias[offset:offset + N]
    s = torch.tensor(0.75)
    c = ops.scaled_mm(a, b, s, s, bias=bias, out_dtype=torch.bfloat16)
    g = _mm_or_fallback(f"misaligned views +{offset}", False, big_a.to(DEV)[:, offset:offset + K], b.to(DEV),
                        s.to(DEV), s.to(DEV), big_bias.to(DEV)[offset:offset + N], torch.bfloat16)
    _gemm_case(f"scaled_mm misaligned views +{offset}", g, a, b, s, s, "tensor", bias, c)


@gpu_only
@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
def test_fallback_on_cuda_matches_cpu(kind):
    """fp8mix.cuda.fallback.scaled_mm_fallback on this device (torch._scaled_mm) agrees with
    the CPU GEMM; and a refusal of fp8mix's own call, where it happens, is the distinct
    NotImplementedError the fallback keys on."""
    M, N, K = 77, 40, 272
    a, b = _fp8((M, K), E4, 9), _fp8((N, K), E4, 10).t()
    if kind == "tensor":
        sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    elif kind == "row":
        sa, sb = torch.rand(M, 1) + 0.5, torch.rand(1, N) + 0.5
    else:
        sa, sb = torch.rand(M, 3) + 0.5, torch.rand(3, 1) + 0.5
    bias = torch.randn(N).to(torch.bfloat16)
    c = ops.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    g = fallback.scaled_mm_fallback(a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV), bias.to(DEV), torch.bfloat16)
    _gemm_case(f"scaled_mm_fallback {kind}", g, a, b, sa, sb, kind, bias, c)
    # (a NotImplementedError other than the refusal propagates from ops.scaled_mm)
    _mm_or_fallback(f"{kind} scales", kind != "tensor", a.to(DEV), b.to(DEV), sa.to(DEV), sb.to(DEV), bias.to(DEV),
                    torch.bfloat16)  # per-tensor scales must never be refused on an FP8 device


@gpu_only
def test_scaled_mm_fast_accum_runs():
    a = _fp8((256, 512), E4, 7).to(DEV)
    b = _fp8((256, 512), E4, 8).to(DEV).t()
    s = torch.tensor(1.0, device=DEV)
    exact = _mm_or_fallback("fp32 accumulation", False, a, b, s, s, None, torch.float32)
    fast = _mm_or_fallback("fp22 accumulation", False, a, b, s, s, None, torch.float32, accumulate="fp22")
    assert _rel_fro(fast, exact) < 1e-2


# ---- fp8mix.Linear --------------------------------------------------------------------

@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
def test_linear_cuda_tracks_cpu(recipe):
    torch.manual_seed(0)
    rec = {"delayed": fp8mix.recipe.DelayedScaling(amax_history_len=4),
           "current": fp8mix.recipe.CurrentScaling(),
           "block": fp8mix.recipe.BlockScaling()}[recipe]
    if recipe == "block" and ON_GPU and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("block scales need sm_90")
    lin_c = fp8mix.Linear(256, 384)
    lin_g = fp8mix.Linear(256, 384).to(DEV)
    lin_g.load_state_dict(lin_c.state_dict())
    for step in range(3):
        x = torch.randn(128, 256)
        xc, xg = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=rec):
            yc, yg = lin_c(xc), lin_g(xg)
        dy = torch.randn_like(yc)
        yc.backward(dy)
        yg.backward(dy.to(DEV))
        assert sqnr_db(yc, yg) > 40, step
        assert sqnr_db(xc.grad, xg.grad) > 40, step
        assert sqnr_db(lin_c.weight.grad, lin_g.weight.grad) > 40, step
        assert sqnr_db(lin_c.bias.grad, lin_g.bias.grad) > 40, step
        if recipe == "delayed":  # the state ops are bit-identical: history, scales, steps, ring, slot, rng
            bufs_c, bufs_g = dict(lin_c.named_buffers()), dict(lin_g.named_buffers())
            for name in ("fp8_amax_history", "fp8_scale", "fp8_steps", "fp8_grad_pending", "fp8_grad_slot", "fp8_rng"):
                assert torch.equal(bufs_g[name].cpu(), bufs_c[name]), (step, name)
        lin_c.zero_grad()
        lin_g.zero_grad()


# ---- CUDA graphs ------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_linear_training_step_captures_and_replays(recipe):
    """One fp8mix.Linear fwd+bwd step in a CUDA graph (static shapes, no host sync, no
    data-dependent allocation): capture, replay on new data, compare with eager."""
    torch.manual_seed(0)
    rec = fp8mix.recipe.CurrentScaling() if recipe == "current" else fp8mix.recipe.DelayedScaling()
    lin = fp8mix.Linear(256, 384).to(DEV)
    eager = fp8mix.Linear(256, 384).to(DEV)
    eager.load_state_dict(lin.state_dict())
    x = torch.randn(128, 256, device=DEV, requires_grad=True)
    dy = torch.randn(128, 384, device=DEV)

    def step(mod, inp):
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=rec):
            y = mod(inp)
        y.backward(dy)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (autograd, cuBLASLt handles, caches) off the capture
        for _ in range(3):
            step(lin, x)
            step(eager, x.detach().requires_grad_())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    lin.zero_grad(set_to_none=False)
    x.grad = None
    with torch.cuda.graph(graph):
        y_static = step(lin, x)
    prev = None
    for trial in range(2):
        new = torch.randn(128, 256, device=DEV)
        with torch.no_grad():
            x.copy_(new)
        lin.weight.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        xe = new.clone().requires_grad_()
        eager.zero_grad()
        ye = step(eager, xe)
        assert torch.isfinite(y_static).all() and torch.isfinite(lin.weight.grad).all()
        if prev is not None:  # the replay computed from the new input, not a stale buffer
            assert not torch.equal(prev, y_static)
        prev = y_static.clone()
        # same kernels on the same data (cuBLASLt may pick a split-K reduction, so allow rounding)
        assert sqnr_db(ye.detach(), y_static) > 50, trial
        assert sqnr_db(eager.weight.grad, lin.weight.grad) > 50, trial
        if recipe == "delayed":  # the replayed state ops advance the state as eager steps do, bit for bit
            for name in ("fp8_amax_history", "fp8_scale", "fp8_steps", "fp8_grad_pending", "fp8_grad_slot"):
                assert torch.equal(getattr(lin, name), getattr(eager, name)), (trial, name)
            assert int(lin.fp8_steps.max()) == 4 + trial  # 3 warm-up steps, then one per replay (x, W roles)
