"""The Python half of the CUDA backend, on the CPU: the self-check's comparisons
(driven with deliberately wrong results), a dry run of the self-check's calls with the
CPU standing in for the device, and the torch._scaled_mm fallback against fp8mix's CPU
GEMM and float64.  The FP22-aware GEMM tolerance is checked against the C core's own
model of Hopper's accumulator (accumulate="fp22"): it must accept that and reject a
product with one scale 1% off.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import warnings

import pytest
import torch

import fp8mix
from fp8mix import ops
from fp8mix.cuda import compare, fallback, selfcheck
from fp8mix.cuda.compare import Case, SelfCheckError, verify

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


# ---- comparisons ----------------------------------------------------------------------

def test_bits_mismatch_names_kernel_index_and_both_values():
    want = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]).to(E4)
    got = want.clone()
    got.view(torch.uint8)[1, 2] ^= 1
    with pytest.raises(SelfCheckError) as e:
        verify([Case("cast[e4m3 test] q", got, want)])
    msg = str(e.value)
    assert "cast[e4m3 test] q" in msg and "(1, 2)" in msg
    assert f"CUDA {float(got.float()[1, 2])!r} (0x4d)" in msg and "CPU 6.0 (0x4c)" in msg  # values and bits


def test_nan_sign_and_payload_count_as_differences():
    want = torch.tensor([float("nan")]).view(torch.int32)
    want = (want | (1 << 31)).view(torch.float32)  # -NaN
    got = torch.tensor([float("nan")])
    with pytest.raises(SelfCheckError, match="index \\(0,\\)"):
        verify([Case("dequantize", got, want)])
    q_want = torch.tensor([0xFF], dtype=torch.uint8).view(E4)  # the sign-preserving NaN byte
    q_got = torch.tensor([0x7F], dtype=torch.uint8).view(E4)   # what a canonicalising GPU multiply gives
    with pytest.raises(SelfCheckError, match="0x7f.*0xff"):
        verify([Case("cast q", q_got, q_want)])
    assert verify([Case("cast q", q_want.clone(), q_want)]) == 1


def test_shape_or_dtype_mismatch_fails():
    with pytest.raises(SelfCheckError, match="shape/dtype"):
        verify([Case("amax", torch.zeros(3), torch.zeros(4))])
    with pytest.raises(SelfCheckError, match="shape/dtype"):
        verify([Case("amax", torch.zeros(3, dtype=torch.float16), torch.zeros(3))])
    with pytest.raises(ValueError, match="unknown comparison"):
        verify([Case("x", torch.zeros(1), torch.zeros(1), kind="approximately")])


def _gemm(m, n, k, seed, accumulate="fp32", scale_b=1.9):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 8).to(E4)
    b = (torch.randn(n, k, generator=g) * 8).to(E4).t()
    sa, sb = torch.tensor(0.37), torch.tensor(scale_b)
    out = ops.scaled_mm(a, b, sa, sb, out_dtype=torch.float32, accumulate=accumulate)
    bound = (a.double().abs() * 0.37) @ (b.double().abs() * 1.9)
    return out, bound


@pytest.mark.parametrize("mnk", [(128, 256, 512), (77, 48, 144), (64, 32, 4096)])
def test_gemm_tolerance_accepts_fp22_accumulation_and_rejects_a_wrong_scale(mnk):
    exact, bound = _gemm(*mnk, seed=1)
    fp22, _ = _gemm(*mnk, seed=1, accumulate="fp22")  # the C core's Hopper model, promoted every 128
    assert not torch.equal(fp22, exact)  # the model does differ from exact sums
    verify([Case("scaled_mm[fp22 model]", fp22, exact, "gemm", bound)])
    off, _ = _gemm(*mnk, seed=1, scale_b=1.9 * 1.01)  # one scale 1 % off
    with pytest.raises(SelfCheckError, match="relative Frobenius|out of tolerance"):
        verify([Case("scaled_mm[wrong scale]", off, exact, "gemm", bound)])


def test_gemm_tolerance_flags_one_bad_element_and_nan():
    exact, bound = _gemm(64, 48, 256, seed=2)
    bad = exact.clone()
    bad[5, 7] += 0.5 * float(bound[5, 7])  # a garbage element (e.g. a misread padding column)
    with pytest.raises(SelfCheckError, match=r"index \(5, 7\)"):
        verify([Case("scaled_mm[garbage]", bad, exact, "gemm", bound)])
    bad = exact.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(SelfCheckError, match=r"index \(0, 0\)"):
        verify([Case("scaled_mm[nan]", bad, exact, "gemm", bound)])
    with pytest.raises(ValueError, match="bound"):
        verify([Case("scaled_mm[no bound]", exact, exact, "gemm")])


def test_stats_comparison_is_bitwise_and_names_the_entry():
    """quant_stats on CUDA follows the CPU's summation order: one ulp anywhere is a failure."""
    x = torch.randn(37, 203)
    q, _, sinv, _ = ops.quantize_current(x, E4, granularity=2)
    want = ops.quant_stats(x, q, sinv, granularity=2)
    assert verify([Case("quant_stats", want.clone(), want, "stats")]) == 84
    for i, name in ((7, "signal"), (14, "sum2"), (2, "underflow"), (20 + 40, "hist[40]")):
        bad = want.clone()
        bad.view(torch.int64)[i] += 1  # one ulp (or a count off by a hair)
        with pytest.raises(SelfCheckError, match=rf"entry {i} \({re.escape(name)}"):
            verify([Case("quant_stats", bad, want, "stats")])


def test_gemm_tolerance_grows_with_output_rounding():
    want = torch.tensor([1024.0])
    bound = torch.tensor([0.0])
    assert float(compare.gemm_tolerance(want, bound, torch.bfloat16)) == pytest.approx(4.0)
    assert float(compare.gemm_tolerance(want, bound, torch.float32)) < 1e-3


# ---- the self-check's calls, dry-run with the CPU as the device -------------------------

@pytest.fixture(scope="module")
def cpu_cases():
    return selfcheck.collect_cases("cpu")


def test_selfcheck_dry_run_covers_every_kernel_and_passes(cpu_cases):
    names = " ".join(c.kernel for c in cpu_cases)
    for kernel in ("cast[", "inf_to_nan", "sr=True", "transpose=True", "gran=3", "quantize_current[", "amax[",
                   "compute_scale[", "dequantize[", "quant_stats[", "scaled_mm[tensor", "scaled_mm[row",
                   "scaled_mm[block", "delayed_cast[", "first_use=True", "fresh=True", "delayed_record[",
                   "rescale_only", "delayed_flush[", "head=9", "grad_cast[", "plan=fresh", "plan=none", "colsum",
                   "chain[", "cast[rng", "quantize[rng"):
        assert kernel in names, kernel
    assert {c.kind for c in cpu_cases} == {"bits", "gemm", "stats"}
    assert verify(cpu_cases) > 100_000


def test_selfcheck_inputs_hold_the_special_values(cpu_cases):
    x = selfcheck._x((64, 256), torch.float32, 1)
    assert torch.isnan(x).sum() == 2 and torch.isinf(x).sum() == 2 and (x == 0).sum() >= 2
    neg_nan = x.view(-1)[3].view(torch.int32)
    assert int(neg_nan) < 0  # a NaN with the sign bit set
    # inf_to_nan cases really turn infinities into NaN codes (the C core's answer)
    case = next(c for c in cpu_cases if "inf_to_nan" in c.kernel and "sat=True" in c.kernel)
    assert case.want.dtype == torch.float8_e4m3fn  # E4M3's NaN codes: 0x7F and 0xFF (0x7E, 0xFE: +-448)
    assert case.want.view(torch.uint8)[0, :2].tolist() == [0x7F, 0xFF]  # x = +inf, -inf there


@pytest.mark.parametrize("which", ["cast[", "quantize_current[", "dequantize[", "scaled_mm[block"])
def test_selfcheck_reports_a_corrupted_result(cpu_cases, which):
    cases = [Case(c.kernel, c.got.clone(), c.want, c.kind, c.bound) for c in cpu_cases]
    victim = next(c for c in cases if c.kernel.startswith(which))
    flat = victim.got.reshape(-1)
    if victim.kind == "gemm":
        flat[3] = flat[3] * 1.5 + 100.0
    else:
        flat.view(torch.uint8)[3 * victim.got.element_size()] ^= 0x80  # a sign bit
    with pytest.raises(SelfCheckError) as e:
        verify(cases)
    assert victim.kernel in str(e.value) and "FP8MIX_CUDA_SELFCHECK=0" in str(e.value)


def test_run_selfcheck_once_per_device_and_env_switch(monkeypatch):
    monkeypatch.setattr(selfcheck, "_done", {})
    calls = []
    real = selfcheck.collect_cases
    monkeypatch.setattr(selfcheck, "collect_cases", lambda d: calls.append(d) or real(d))
    rep = selfcheck.run_selfcheck("cpu")
    assert rep["device"] == "cpu" and rep["cases"] > 100 and rep["ms"] > 0
    assert selfcheck.run_selfcheck("cpu") is rep and len(calls) == 1
    monkeypatch.setenv("FP8MIX_CUDA_SELFCHECK", "0")
    monkeypatch.setattr(selfcheck, "_done", {})
    assert selfcheck.run_selfcheck("cpu") is None and len(calls) == 1


class _WrongAmaxOps:
    """fp8mix.ops with an amax whose first call (the "device" half of the first pair) is
    one ulp off."""

    def __init__(self):
        self.calls = 0

    def __getattr__(self, name):
        return getattr(ops, name)

    def amax(self, x, **kw):
        out = ops.amax(x, **kw)
        self.calls += 1
        return (out.view(torch.int32) + 1).view(torch.float32) if self.calls == 1 else out


def test_run_selfcheck_raises_on_a_wrong_kernel(monkeypatch):
    monkeypatch.setattr(selfcheck, "_done", {})
    wrong = _WrongAmaxOps()
    monkeypatch.setattr(selfcheck, "ops", wrong)
    with pytest.raises(SelfCheckError, match=r"amax\[gran=0 .*index"):
        selfcheck.run_selfcheck("cpu")
    assert wrong.calls == 8  # every amax of the self-check came from its op layer (4 pairs)
    assert "cpu" not in selfcheck._done


class _RefusingOps:
    """fp8mix.ops whose "device" GEMMs (each pair's second call) with row or block scales
    are refused by cuBLASLt: with the CUDA hooks installed, ops.scaled_mm hands them to
    the torch._scaled_mm fallback; without (ops.set_cuda_hooks(None)) it re-raises."""

    def __init__(self, hooked: bool):
        self.hooked, self.calls = hooked, 0

    def __getattr__(self, name):
        return getattr(ops, name)

    def scaled_mm(self, a, b, scale_a, scale_b, *, bias=None, out_dtype=torch.float32, **kw):
        self.calls += 1
        if self.calls % 2 == 1 or scale_a.numel() == 1:
            return ops.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, **kw)
        refusal = NotImplementedError(fallback.REFUSED_PREFIX + "scale_arch (device sm_89, cuBLASLt 120000)")
        if not self.hooked:
            raise refusal
        # what ops.scaled_mm does with the hooks installed: fp8mix.cuda's own hook (it notes the refusal)
        return fp8mix.cuda._Hooks().scaled_mm_refused(refusal, a, b, scale_a, scale_b, bias, out_dtype)


@pytest.mark.parametrize("hooked", [True, False], ids=["cuda_hooks", "no_hooks"])
def test_selfcheck_gemm_refused_goes_through_the_fallback_and_says_so(monkeypatch, hooked):
    monkeypatch.setattr(selfcheck, "ops", _RefusingOps(hooked))
    monkeypatch.setattr(selfcheck, "_BUILDERS", (selfcheck._gemm_cases,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fallback's once-per-kind notice
        cases = selfcheck.collect_cases("cpu")
    assert len(cases) == 5
    for c in cases:
        refused = not c.kernel.startswith("scaled_mm[tensor")
        assert c.kernel.endswith(" via the torch._scaled_mm fallback]") == refused, c.kernel
    assert verify(cases) > 0  # the fallback's products pass the GEMM tolerance
    monkeypatch.setattr(selfcheck, "ops", ops)
    assert not any("fallback" in c.kernel for c in selfcheck.collect_cases("cpu"))


def test_scaled_mm_noting_fallback_passes_other_errors_on(monkeypatch):
    a, b, sa, sb = _operands(8, 16, 32, "tensor", 0)
    assert not selfcheck.scaled_mm_noting_fallback(a, b, sa, sb)[1]

    class Failing(_RefusingOps):
        def scaled_mm(self, *args, **kw):
            raise NotImplementedError("fp8mix.scaled_mm: something else")

    monkeypatch.setattr(selfcheck, "ops", Failing(False))
    with pytest.raises(NotImplementedError, match="something else"):
        selfcheck.scaled_mm_noting_fallback(a, b, sa, sb)


class _FirstUseOps:
    """fp8mix.ops whose first cast starts the self-check, as ops' first-use hook does on a
    device not yet checked (a direct run_selfcheck / collect_cases call on a fresh device)."""

    def __init__(self):
        self.nested: list = []

    def __getattr__(self, name):
        return getattr(ops, name)

    def cast(self, x, *args, **kw):
        if not self.nested:
            self.nested.append(selfcheck.run_selfcheck(x.device))
        return ops.cast(x, *args, **kw)


@pytest.mark.parametrize("entry", ["run_selfcheck", "collect_cases"])
def test_first_use_hook_inside_a_direct_selfcheck_returns_at_once(monkeypatch, entry):
    """run_selfcheck holds a lock while it collects: the hook's nested call must return
    (None) instead of waiting for it, or running a second self-check inside the first."""
    fake = _FirstUseOps()
    monkeypatch.setattr(selfcheck, "ops", fake)
    monkeypatch.setattr(selfcheck, "_BUILDERS", (selfcheck._cast_cases,))
    monkeypatch.setattr(selfcheck, "_done", {})
    monkeypatch.setattr(selfcheck, "_lock", threading.Lock())  # a deadlock here leaves the real lock free
    result: list = []
    worker = threading.Thread(target=lambda: result.append(getattr(selfcheck, entry)("cpu")), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the nested run_selfcheck waited for the lock its own caller holds"
    assert fake.nested == [None] and len(result) == 1
    if entry == "run_selfcheck":
        assert result[0]["cases"] > 50 and selfcheck._done == {"cpu": result[0]}
    else:
        assert len(result[0]) > 50 and selfcheck._done == {}


# ---- the torch._scaled_mm fallback --------------------------------------------------------

def _operands(m, n, k, kind, seed, fmt_b=E4):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 8).to(E4)
    b = (torch.randn(n, k, generator=g) * 8).to(fmt_b).t()
    if kind == "tensor":
        return a, b, torch.tensor(0.37), torch.tensor(1.9)
    if kind == "row":
        return a, b, torch.rand(m, 1, generator=g) + 0.5, torch.tensor(1.3) if seed % 2 else torch.rand(1, n) + 0.5
    kb = -(-k // 128)
    return a, b, torch.rand(m, kb, generator=g) + 0.5, torch.rand(kb, -(-n // 128), generator=g) + 0.5


def _f64(a, b, sa, sb, kind, bias):
    ad, bd = compare.scaled_operands(a, b, sa, sb, kind)
    out = ad @ bd
    return out + bias.double() if bias is not None else out


@pytest.mark.parametrize("kind", ["tensor", "row", "block"])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [None, "out", torch.float32])
def test_fallback_matches_fp8mix_and_float64(kind, out, bias):
    for i, (m, n, k) in enumerate([(5, 40, 48), (77, 48, 144), (16, 20, 10), (3, 130, 272)]):
        a, b, sa, sb = _operands(m, n, k, kind, i)
        bt = out if bias == "out" else bias
        bv = None if bt is None else (torch.randn(n) * 10).to(bt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = fallback.scaled_mm_fallback(a, b, sa, sb, bv, out)
        mine = ops.scaled_mm(a, b, sa, sb, bias=bv, out_dtype=out)
        assert got.dtype == out and got.shape == (m, n) and got.is_contiguous()
        ref = _f64(a, b, sa, sb, kind, bv)
        tol = 1e-5 if out == torch.float32 else 8e-3
        assert ((got.double() - ref).norm() / ref.norm()).item() < tol
        assert ((got.double() - mine.double()).norm() / ref.norm()).item() < tol


def test_fallback_scale_kinds_and_errors():
    a, b, sa, sb = _operands(8, 32, 256, "block", 0)
    assert fallback.scale_kind(a, b, sa, sb) == "block"
    assert fallback.scale_kind(a, b, torch.rand(8, 1), torch.tensor(2.0)) == "row"
    assert fallback.scale_kind(a, b, torch.tensor(1.0), torch.ones(1, 1)) == "tensor"
    with pytest.raises(ValueError, match="fit no scale layout"):
        fallback.scaled_mm_fallback(a, b, torch.rand(8, 3), sb)
    with pytest.raises(fallback.FallbackUnavailable, match="E5M2 x E5M2"):
        fallback.scaled_mm_fallback(a.to(E5), b.to(E5), torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(ValueError, match="need a"):
        fallback.scaled_mm_fallback(a, b[:5], torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(TypeError, match="out_dtype"):
        fallback.scaled_mm_fallback(a, b, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.int32)


def test_fallback_warns_once_per_kind(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())
    a, b, sa, sb = _operands(4, 16, 32, "tensor", 0)
    with pytest.warns(RuntimeWarning, match="tensor-scaled product"):
        fallback.scaled_mm_fallback(a, b, sa, sb)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fallback.scaled_mm_fallback(a, b, sa, sb)  # no second warning


def test_is_refusal_recognises_only_the_refusal():
    assert fallback.is_refusal(NotImplementedError(fallback.REFUSED_PREFIX + ": no algorithm"))
    assert not fallback.is_refusal(NotImplementedError("something else"))
    assert not fallback.is_refusal(RuntimeError(fallback.REFUSED_PREFIX))


def test_failures_lists_every_broken_kernel(cpu_cases):
    cases = [Case(c.kernel, c.got.clone(), c.want, c.kind, c.bound) for c in cpu_cases[:40]]
    for i in (3, 17, 30):
        cases[i].got.reshape(-1).view(torch.uint8)[0] ^= 0x01
    msgs = compare.failures(cases)
    assert len(msgs) == 3 and all(cases[i].kernel in m for i, m in zip((3, 17, 30), msgs))
    assert compare.failures(cpu_cases) == []


# ---- the CUDA launchers' host rules and the statistics rules, compiled for the CPU ----------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_host_rules_against_the_c_core(tmp_path):
    """csrc/cuda/tests/host_rules.cpp: recipe_plan.h's checks give the C core's statuses,
    and stats_rules.cuh run in stats.cu's thread order equals fp8mix_quant_stats bit for bit
    (every granularity, format, dtype, bad scales, no finite value, > 262144 rows)."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    assert cxx, "a C++ compiler is needed (the C core's build needs one too)"
    make = subprocess.run(["make", "-s", "-C", ROOT, "core", "BUILD=build/core-ext"], capture_output=True, text=True)
    assert make.returncode == 0, make.stderr[-2000:]
    exe = str(tmp_path / "host_rules")
    cc = subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-Wall", "-Wextra",
                         f"-I{ROOT}/csrc/include", f"-I{ROOT}/csrc/core",
                         f"{ROOT}/csrc/cuda/tests/host_rules.cpp", f"{ROOT}/build/core-ext/libfp8mix_core.a",
                         "-lpthread", "-lm", "-o", exe], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr[-3000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "host_rules: ok" in run.stdout, run.stdout + run.stderr
    assert int(re.search(r"\((\d+) checks\)", run.stdout).group(1)) > 100_000


# ---- benchmarks/bench_gpu.py's launch row, on the CPU ---------------------------------------

def _bench_gpu(monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_gpu_under_test", os.path.join(ROOT, "benchmarks",
                                                                                        "bench_gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ROWS", [])
    return mod


def test_launch_classification_of_profiler_event_names(monkeypatch):
    """The names torch.profiler gives CUDA activity (kineto): memsets, copies, kernels."""
    bench = _bench_gpu(monkeypatch)
    names = ["Memset (Device)", "Memcpy DtoD (Device -> Device)", "Memcpy HtoD (Pageable -> Device)",
             "void fp8mix_cuda::state_cast_kernel<(fp8mix_dtype)1, false>(fp8mix_cuda::StateArgs)",
             "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off",
             "memsetKernel"]  # a kernel whose name merely contains 'memset' stays a kernel
    assert bench.classify_activity(names) == {"kernels": 3, "memsets": 1, "copies": 2}
    assert bench.classify_activity([]) == {"kernels": 0, "memsets": 0, "copies": 0}


def test_launch_rows_dry_run_count_dispatched_ops(monkeypatch):
    """--dry-run: one row per recipe, the dispatched ops of a Linear step (no GPU activity
    to count), verdict DRY; a non-dry run without CUDA activity must not pass."""
    bench = _bench_gpu(monkeypatch)
    monkeypatch.setattr(bench, "DRY", True)
    monkeypatch.setattr(bench, "DEV", "cpu")
    bench.bench_launches(32)
    assert [r[1].split()[1] for r in bench.ROWS] == ["delayed", "current", "block"]
    for r in bench.ROWS:
        n = int(r[2].split()[0])
        assert 3 <= n < 200 and r[-1] == "DRY", r  # a fwd+bwd runs at least its three GEMMs


def test_launch_rows_without_cuda_activity_fail(monkeypatch):
    """Not a dry run, but the profiler sees no GPU work (here: the CPU, as on a machine
    without CUPTI): the row says so and fails instead of passing on the op count."""
    bench = _bench_gpu(monkeypatch)
    monkeypatch.setattr(bench, "DEV", "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    assert bench._cuda_activity(lambda: torch.ones(8).add_(1)) is None
    bench.bench_launches(32)
    assert len(bench.ROWS) == 3
    assert all("no CUDA activity seen" in r[1] and r[-1] == "FAIL" for r in bench.ROWS), bench.ROWS
