"""First-use self-check of the CUDA kernels against the C core (the CPU oracle).

``run_selfcheck(device)`` runs once per device and process: every kernel on a small
deterministic input (special values included), on the device and on the CPU, then
compares (fp8mix.cuda.compare): every cast mode (E4M3 / E5M2, saturating or not,
round-to-nearest with both encoders and stochastic rounding, the four granularities,
with and without the transpose, float32 / bfloat16 / float16 inputs, inf_to_nan),
amax, compute_scale, quantize_current, dequantize, quant_stats (all 84 entries), the
delayed-scaling update kernel, the per-tensor recipes' ops with their state
(fp8mix.cuda.recipe_cases: delayed_cast, delayed_record, delayed_flush, grad_cast, a
short training chain, tensor-held stochastic-rounding streams), and scaled_mm per
tensor / row / 128-block to within summation order
(through the torch._scaled_mm fallback when cuBLASLt refuses a kind on this device).
A mismatch raises SelfCheckError naming the kernel and the first differing element.
It costs about 0.1-0.2 s, mostly the CPU half (measured: collect_cases("cpu"), both halves on
the CPU, 0.19 s on one Xeon thread); all device results come back in one copy;
FP8MIX_CUDA_SELFCHECK=0 skips it.

``collect_cases(device)`` is the device half; called with the CPU it runs the same
calls on the CPU twice, which is how CPU tests dry-run it.

Every kernel is called through fp8mix.ops' typed wrappers, looked up in this module's
``ops`` attribute at call time (tests swap it for a fake op layer; recipe_cases has its
own). Their first-use hook normally starts ``run_selfcheck`` with the device already
marked checked, so the self-check's own calls do not re-enter it; when ``run_selfcheck``
or ``collect_cases`` is called directly, the hook fires on the first device call inside
this thread's collection and returns at once (``_collecting``). A GEMM cuBLASLt refuses
goes through the torch._scaled_mm fallback, as every ops.scaled_mm call does, and its
case is named so (``scaled_mm_noting_fallback``).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from .. import ops
from . import _capi, recipe_cases
from .compare import Case, SelfCheckError, gemm_bound, random_scales, verify
from .fallback import is_refusal, refusals, scaled_mm_fallback

__all__ = ["run_selfcheck", "collect_cases", "SelfCheckError", "selfcheck_enabled", "scaled_mm_noting_fallback"]

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
_HP = (torch.float32, torch.bfloat16, torch.float16)
_SHAPES = ((64, 256), (37, 203))  # vector paths / scalar paths and partial tiles
_done: dict[str, dict] = {}
_lock = threading.Lock()
_collecting = threading.local()  # .on: this thread is inside collect_cases (the first-use hook must not recurse)


def selfcheck_enabled() -> bool:
    """False when FP8MIX_CUDA_SELFCHECK=0 (or 'false', 'off', 'no')."""
    return os.environ.get("FP8MIX_CUDA_SELFCHECK", "1").strip().lower() not in ("0", "false", "off", "no")


def _x(shape, dtype, seed) -> torch.Tensor:
    """Wide-range values with the special ones in front (NaNs of both signs, infs, zeros,
    subnormal-range and overflowing magnitudes)."""
    g = torch.Generator().manual_seed(seed)
    # magnitudes 2^-27 .. 2^26 from exponent bits (integer ops: cheap even on a loaded machine)
    mag = (torch.randint(100, 154, shape, generator=g, dtype=torch.int32) << 23).view(torch.float32)
    x = torch.randn(shape, generator=g) * mag
    f = x.view(-1)
    specials = [float("inf"), -float("inf"), float("nan"), -float("nan"), 0.0, -0.0, 1e-30, -470.0, 6e4, -7e4]
    f[:len(specials)] = torch.tensor(specials)
    return x.to(dtype)


def _scales(rows: int, cols: int, gran: int, seed: int) -> torch.Tensor:
    n = {0: 1, 1: rows, 2: rows * -(-cols // 128), 3: -(-rows // 128) * -(-cols // 128)}[gran]
    g = torch.Generator().manual_seed(seed)
    return torch.tensor(1.7) if gran == 0 else torch.rand(n, generator=g) * 4 + 0.05


def _hw_settings(dev: torch.device) -> list[bool | None]:
    """The encoder switch values to try: both on CUDA, none (the CPU has one) elsewhere."""
    return [True, False] if dev.type == "cuda" else [None]


def _with_hw(dev: torch.device, hw: bool | None, fn):
    if hw is None:
        return fn()
    old = ops.cuda_hw_convert()
    ops.cuda_hw_convert(hw)
    try:
        return fn()
    finally:
        ops.cuda_hw_convert(old)


def _cast_cases(dev: torch.device, out: list) -> None:
    i = 0
    for fmt in (E4, E5):
        for sat in (True, False):
            for gran in range(4):
                for tr in (False, True):
                    for sr in (False, True):
                        dt, shape = _HP[i % 3], _SHAPES[i % 2]
                        i += 1
                        x, s = _x(shape, dt, i), _scales(shape[0], shape[1], gran, i)
                        kw: dict[str, Any] = dict(granularity=gran, saturate=sat, stochastic=sr,
                                                  seed=0x1234_5678_9ABC + i, offset=4 * i + (i % 4), want_q=True,
                                                  transpose=tr)
                        want = ops.cast(x, s, fmt, **kw)
                        for hw in _hw_settings(dev) if (sat and not sr) else [None]:
                            got = _with_hw(dev, hw, lambda: ops.cast(x.to(dev), s.to(dev), fmt, **kw))
                            name = (f"cast[{fmt} sat={sat} sr={sr} gran={gran} transpose={tr} {dt} {shape}"
                                    f"{'' if hw is None else ' hw_convert=' + str(hw)}]")
                            out += [(name + " q", got[0], want[0]), (name + " amax", got[2], want[2])]
                            if tr:
                                out.append((name + " qt", got[1], want[1]))


def _inf_to_nan_cases(dev: torch.device, out: list) -> None:
    x = _x((16, 64), torch.float32, 99)
    s = torch.tensor(3.0)
    for fmt in (E4, E5):
        for sat in (True, False):
            for sr in (False, True):
                def cast(xx, ss, fmt=fmt, sat=sat, sr=sr):
                    return _capi.cast_raw(xx, ss, fmt, saturate=sat, stochastic=sr, seed=7, offset=3, inf_to_nan=True)

                want = cast(x, s)
                for hw in _hw_settings(dev) if (sat and not sr) else [None]:
                    got = _with_hw(dev, hw, lambda: cast(x.to(dev), s.to(dev)))
                    out.append((f"cast[inf_to_nan {fmt} sat={sat} sr={sr} hw_convert={hw}] q", got, want))


def _quantize_cases(dev: torch.device, out: list) -> None:
    i = 0
    for fmt in (E4, E5):
        for gran in range(4):
            for tr in (False, True):
                dt, shape = _HP[i % 3], _SHAPES[(i // 2) % 2]
                i += 1
                x = _x(shape, dt, 50 + i)
                kw: dict[str, Any] = dict(granularity=gran, margin=i % 3, power_2_scale=bool(i % 2),
                                          amax_epsilon=1e-3 * (i % 2), saturate=True, stochastic=i % 4 == 0, seed=77,
                                          offset=8, want_q=True, transpose=tr)
                want = ops.quantize_current(x, fmt, **kw)
                got = ops.quantize_current(x.to(dev), fmt, **kw)
                name = f"quantize_current[{fmt} gran={gran} transpose={tr} {dt} {shape}]"
                out += [(name + " q", got[0], want[0]), (name + " scale_inv", got[2], want[2]),
                        (name + " amax", got[3], want[3])]
                if tr:
                    out.append((name + " qt", got[1], want[1]))


def _amax_scale_dequant_cases(dev: torch.device, out: list) -> None:
    for gran in range(4):
        x = _x(_SHAPES[gran % 2], _HP[gran % 3], 70 + gran)
        out.append((f"amax[gran={gran} {x.dtype}]", ops.amax(x.to(dev), granularity=gran),
                    ops.amax(x, granularity=gran)))
    a = torch.tensor([0.0, -0.0, 1e-45, 1e-38, 0.5, 448.0, 3e38, float("inf"), float("nan"), 7.0])
    for fmt, margin, pow2, eps in ((E4, 0, False, 0.0), (E5, 3, True, 1e-4)):
        kw: dict[str, Any] = dict(margin=margin, power_2_scale=pow2, amax_epsilon=eps)
        want, got = ops.compute_scale(a, fmt, **kw), ops.compute_scale(a.to(dev), fmt, **kw)
        out += [(f"compute_scale[{fmt} margin={margin} pow2={pow2}] scale", got[0], want[0]),
                (f"compute_scale[{fmt} margin={margin} pow2={pow2}] scale_inv", got[1], want[1])]
    g8 = torch.Generator().manual_seed(11)
    for gran in range(4):
        for fmt, odt in ((E4, _HP[gran % 3]), (E5, _HP[(gran + 1) % 3])):
            shape = _SHAPES[gran % 2]
            q = torch.randint(0, 256, shape, generator=g8, dtype=torch.uint8).view(fmt)
            s = _scales(shape[0], shape[1], gran, 80 + gran)
            out.append((f"dequantize[{fmt} gran={gran} -> {odt}]",
                        ops.dequantize(q.to(dev), s.to(dev), granularity=gran, out_dtype=odt),
                        ops.dequantize(q, s, granularity=gran, out_dtype=odt)))


def _stats_cases(dev: torch.device, out: list) -> None:
    """quant_stats' 84 entries, bit for bit (a bad scale counted with bad_scale_as_one)."""
    for i, (fmt, gran, sat, dt) in enumerate(((E4, 2, False, torch.bfloat16), (E5, 0, True, torch.float32),
                                              (E4, 1, True, torch.float16), (E5, 3, False, torch.bfloat16))):
        x = _x(_SHAPES[i % 2], dt, 90 + gran)
        q, _, sinv, _ = ops.quantize_current(x, fmt, granularity=gran, saturate=sat)
        bad = i == 3
        if bad:
            sinv.view(-1)[0] = 0.0
        want = ops.quant_stats(x, q, sinv, granularity=gran, bad_scale_as_one=bad)
        got = ops.quant_stats(x.to(dev), q.to(dev), sinv.to(dev), granularity=gran, bad_scale_as_one=bad)
        out.append((f"quant_stats[{fmt} gran={gran} saturate={sat} {dt} bad_scale={bad}]", got, want, "stats"))


def _recipe_cases(dev: torch.device, out: list) -> None:
    """The per-tensor recipes' ops (fp8mix.cuda.recipe_cases): state and outputs bit for bit."""
    rc = recipe_cases
    for i, spec in enumerate(rc.SPECS):
        rc.delayed_cast_case(dev, out, spec=spec, dtype=_HP[i], shape=_SHAPES[i % 2], first_use=i == 1, fresh=i == 2,
                             transpose=i != 2, record=i != 2, sr=i == 0, seed=i)
        rc.record_case(dev, out, spec=spec, first_use=i == 0, seed=i)
        rc.flush_case(dev, out, spec=spec, filled=((0, 3), (1, 2), ())[i], head=(3, 9, 0)[i], reserve=i != 2,
                      seed=i)
    for i, plan in enumerate(("delayed", "fresh", "none")):
        rc.grad_cast_case(dev, out, plan=plan, dtype=_HP[i], shape=_SHAPES[i % 2], slot=(1, 3, None)[i],
                          slot_value=(-1.0, 1e9, 0.0)[i], colsum=i != 2, transpose=i != 1, margin=i, pow2=i == 1,
                          eps=1e-3 * (i == 2), sr=i == 1, seed=i)
    rc.chain_case(dev, out, sr=True, dtype=torch.bfloat16)
    for i, op in enumerate(("cast", "quantize") * 2):
        rc.rng_cast_case(dev, out, op=op, gran=i, transpose=i % 2 == 0, dtype=_HP[i % 3], seed=i)


def _rederive(h, am, scale, steps, fmax, margin, pow2, algo, interval):
    """The delayed-scaling update in plain torch + the C core's compute_scale."""
    h = torch.roll(h, 1, 0)
    h[0] = am
    steps = steps + 1
    a = h.amax() if algo == "max" else h[0]
    s, _ = ops.compute_scale(a.reshape(1), E4 if fmax == 448.0 else E5, margin=margin, power_2_scale=pow2)
    ok = bool(torch.isfinite(a) and a > 0) and steps % interval == 0
    return h, (s[0] if ok else scale), steps


def _delayed_cases(dev: torch.device, out: list) -> None:
    if dev.type != "cuda" or not ops.has_kernels("delayed_scale_update", dev):
        return  # a CUDA-only op (the CPU has no oracle op to run twice)
    lens = [1, 5, 300, 16]  # 300: the roll runs in chunks of 256
    amax = torch.tensor([0.0, float("nan"), 3.5, float("inf")])
    hist = [(torch.rand(L, generator=torch.Generator().manual_seed(L)) * 10) for L in lens]
    scale = torch.tensor([1.5, 0.25, 2.0, 3.0])
    steps = torch.tensor([0, 1, 2, 3])
    fmax = [448.0, 57344.0, 448.0, 57344.0]
    for algo, interval in (("max", 1), ("most_recent", 2)):
        hs = [h.to(dev) for h in hist]
        sc, si, st, am = scale.to(dev), torch.empty(4, device=dev), steps.to(dev), amax.to(dev)
        ops.delayed_scale_update(hs, list(am.split(1)), [sc[i] for i in range(4)], fp8_max=fmax,
                                 scale_inv=[si[i] for i in range(4)], steps=[st[i] for i in range(4)], margin=1,
                                 power_2_scale=False, algo=algo, interval=interval)
        for i in range(4):
            h, s, n = _rederive(hist[i].clone(), amax[i], scale[i], int(steps[i]), fmax[i], 1, False, algo, interval)
            name = f"delayed_scale_update[{algo} interval={interval} entry {i} len {lens[i]}]"
            out += [(name + " history", hs[i], h), (name + " scale", sc[i], s.reshape(())),
                    (name + " scale_inv", si[i], torch.reciprocal(s.reshape(()))),
                    (name + " steps", st[i], torch.tensor(n))]


def scaled_mm_noting_fallback(a, b, scale_a, scale_b, bias=None, out_dtype=torch.float32, **kw):
    """``ops.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, **kw)`` and
    the refusal's message when cuBLASLt refused it and the product came from the
    torch._scaled_mm fallback (which ops.scaled_mm runs through the CUDA hooks, ignoring kw;
    the hook notes it in fallback.refusals): (out, reason or None). With no hooks installed
    (ops.set_cuda_hooks(None)) ops.scaled_mm re-raises the refusal, and the fallback runs
    here; any other error propagates."""
    refusals.last = None
    try:
        out = ops.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, **kw)
    except NotImplementedError as e:
        if not is_refusal(e):
            raise
        return scaled_mm_fallback(a, b, scale_a, scale_b, bias, out_dtype), str(e)
    reason, refusals.last = refusals.last, None
    return out, reason


def _gemm_operands(m, n, k, kind, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 8).to(E4)
    b = (torch.randn(n, k, generator=g) * 8).to(E5 if seed % 2 else E4).t()  # column-major (K, N)
    return (a, b) + random_scales(kind, m, n, k, g)


def _gemm_cases(dev: torch.device, out: list) -> None:
    plans = (((37, 48, 160), "tensor", torch.bfloat16, torch.bfloat16),
             ((64, 40, 144), "tensor", torch.float32, None),
             ((37, 48, 160), "row", torch.float32, torch.float32),
             ((64, 40, 144), "row", torch.bfloat16, None),
             ((37, 48, 272), "block", torch.bfloat16, torch.float32))
    for i, ((m, n, k), kind, odt, bdt) in enumerate(plans):
        a, b, sa, sb = _gemm_operands(m, n, k, kind, 20 + i)
        bias = None if bdt is None else (torch.randn(n, generator=torch.Generator().manual_seed(i)) * 10).to(bdt)
        want = ops.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=odt)
        got, refused = scaled_mm_noting_fallback(a.to(dev), b.to(dev), sa.to(dev), sb.to(dev),
                                                 None if bias is None else bias.to(dev), odt)
        how = " via the torch._scaled_mm fallback" if refused else ""
        name = f"scaled_mm[{kind} {m}x{n}x{k} {a.dtype} x {b.dtype} -> {odt} bias={bdt}{how}]"
        out.append((name, got, want, "gemm", gemm_bound(a, b, sa, sb, kind, bias)))


def _fetch(pending: list) -> list[Case]:
    """All device results to the CPU in one copy (one sync), then Cases."""
    gots = [p[1].detach().contiguous() for p in pending]
    flat = [g.reshape(-1).view(torch.uint8) for g in gots]
    host = torch.cat(flat).cpu() if flat else torch.empty(0, dtype=torch.uint8)
    cases, at = [], 0
    for p, g in zip(pending, gots):
        nb = g.numel() * g.element_size()
        got = host[at:at + nb].clone().view(g.dtype).reshape(g.shape)  # clone: aligned for the view
        at += nb
        kind = p[3] if len(p) > 3 else "bits"
        cases.append(Case(p[0], got, p[2], kind, p[4] if len(p) > 4 else None))
    return cases


_BUILDERS = (_cast_cases, _inf_to_nan_cases, _quantize_cases, _amax_scale_dequant_cases, _stats_cases,
             _delayed_cases, _recipe_cases, _gemm_cases)


def collect_cases(device) -> list[Case]:
    """Run every kernel on `device` and on the CPU; the device half of the self-check."""
    dev = torch.device(device)
    pending: list = []
    outer, _collecting.on = getattr(_collecting, "on", False), True
    try:
        for build in _BUILDERS:
            build(dev, pending)
    finally:
        _collecting.on = outer
    return _fetch(pending)


def run_selfcheck(device=None) -> dict | None:
    """Check the CUDA kernels of `device` (default: the current CUDA device) against the
    C core, once per device and process.  Returns a report ({"device", "cases",
    "elements", "ms"}; None when FP8MIX_CUDA_SELFCHECK=0, or when reached from this
    thread's own collect_cases through the first-use hook) or raises SelfCheckError."""
    if not selfcheck_enabled():
        return None
    if getattr(_collecting, "on", False):
        return None  # the first-use hook, fired by this thread's own collect_cases (a direct call of it)
    dev = torch.device(device if device is not None else "cuda")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = str(dev)
    with _lock:
        if key in _done:
            return _done[key]
        t0 = time.perf_counter()
        cases = collect_cases(dev)
        n = verify(cases)
        report = {"device": key, "cases": len(cases), "elements": n, "ms": (time.perf_counter() - t0) * 1e3}
        _done[key] = report
        return report
