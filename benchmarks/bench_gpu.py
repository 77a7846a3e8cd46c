"""GPU benchmark of the fp8mix CUDA backend: one PASS/FAIL table.

  cast (+amax), cast+transpose (+amax): GB/s (bytes read + written) against a
      device-to-device copy measured in the same run                    target >= 0.85
      (as information: SR, quantize_current, amax, and the recipes' delayed_cast and
      grad_cast with / without the bias gradient's column sums)
  scaled_mm at 4096^3 and 8192^3, per-tensor / row-wise / 128-block scales: TFLOP/s
      against torch._scaled_mm with the same scales (when this torch has that kind)
      and bf16 torch.mm                                                    target >= 0.95
  fp8mix.Linear fwd+bwd at 4096 and 8192 (M = N = K): speed-up over bf16 nn.Linear
      (target >= 1.3 at 8192) and over torchao's Float8Linear when importable
  launches per Linear fwd+bwd step: the GPU's kernels + memsets + copies (torch.profiler's
      CUDA activity; dispatched non-view ops as the reference)
      targets <= 10 delayed / current, <= 12 block
Rows already measured by benchmarks/gpu_check.sh (build, self-check, tests, training
runs) are read from --rows (JSON lines) and printed in the same table.

Timing: CUDA events around `iters` back-to-back calls after warm-up; the median of
`reps` runs.  --dry-run runs every part on the CPU with tiny shapes (wall-clock timer,
verdict DRY) so that the script's own code is exercised without a GPU.
Usage: python benchmarks/bench_gpu.py [--quick] [--dry-run] [--rows FILE] [--json FILE] [--table-only]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fp8mix
from fp8mix import ops
from fp8mix.cuda.selfcheck import scaled_mm_noting_fallback

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
ROWS: list[tuple] = []
DEV = "cuda"
DRY = False


def timed(fn, iters=20, reps=5, warmup=3) -> float:
    """Median seconds per call of fn()."""
    for _ in range(warmup):
        fn()
    if DRY:
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            out.append((time.perf_counter() - t) / iters)
        return statistics.median(out)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / iters)
    return statistics.median(out)


def verdict(ok: bool | None) -> str:
    if ok is None:
        return ""
    return "DRY" if DRY else ("PASS" if ok else "FAIL")


def row(kind, what, value, unit, ref_name="", ref_value=None, target=None, fmt="9.1f"):
    """One measured line; ratio = value / ref_value, PASS when ratio >= target."""
    ratio = value / ref_value if ref_value else None
    ok = None if target is None or ratio is None else ratio >= target
    ROWS.append((kind, what, f"{value:{fmt}} {unit}", f"{ref_name} {ref_value:{fmt}}" if ref_value else ref_name,
                 "" if ratio is None else f"{ratio:6.3f}", "" if target is None else f">= {target}", verdict(ok)))


def error_row(kind, what, e: BaseException):
    ROWS.append((kind, what, f"error: {type(e).__name__}: {e}"[:150], "", "", "", "DRY" if DRY else "FAIL"))


# ---- casts ----------------------------------------------------------------------------

def bench_casts(n, quick):
    src = torch.empty(n * n, dtype=torch.float32, device=DEV)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    copy_bw = 2 * src.numel() * 4 / t / 1e9
    ROWS.append(("copy", f"d2d copy {src.numel() * 4 >> 20} MiB", f"{copy_bw:9.1f} GB/s", "", "", "", ""))
    for dt in (torch.bfloat16, torch.float32):
        x = torch.randn(n, n, device=DEV).to(dt)
        esz, ne = x.element_size(), x.numel()
        s = torch.tensor(2.0, device=DEV)
        t = timed(lambda: ops.cast(x, s, E4))
        row("cast", f"cast+amax {dt} {n}x{n}", ne * (esz + 1) / t / 1e9, "GB/s", "copy", copy_bw, 0.85)
        t = timed(lambda: ops.cast(x, s, E4, transpose=True))
        row("cast", f"cast+T+amax {dt} {n}x{n}", ne * (esz + 2) / t / 1e9, "GB/s", "copy", copy_bw, 0.85)
        if quick:
            continue
        t = timed(lambda: ops.cast(x, s, E4, stochastic=True, seed=1))
        row("cast", f"  cast SR {dt}", ne * (esz + 1) / t / 1e9, "GB/s", "copy", copy_bw)
        for g, name in ((0, "tensor"), (2, "1x128"), (3, "128x128")):
            t = timed(lambda: ops.quantize_current(x, E4, granularity=g))
            reads = 2 if g in (0, 3) else 1
            row("cast", f"  quantize_current {name} {dt}", ne * (reads * esz + 1) / t / 1e9, "GB/s", "copy",
                copy_bw)
        t = timed(lambda: ops.amax(x))
        row("cast", f"  amax {dt}", ne * esz / t / 1e9, "GB/s", "copy", copy_bw)
        bench_recipe_casts(x, copy_bw)


def bench_recipe_casts(x, copy_bw):
    """The per-tensor recipes' casts in a steady state (no first use): delayed_cast with
    the transpose and its record, grad_cast with the pending max, with and without the
    bias gradient's column sums (which read x once more, one thread per column)."""
    esz, ne, dt = x.element_size(), x.numel(), x.dtype
    hist, scale = torch.zeros(16, 3, device=DEV), torch.full((3,), 2.0, device=DEV)
    steps = torch.ones(3, dtype=torch.int64, device=DEV)
    spec = ops.DelayedSpec(history_len=16)
    t = timed(lambda: ops.delayed_cast(x, hist, scale, steps, role=0, fp8_dtype=E4, spec=spec, record=True,
                                       transpose=True))
    row("cast", f"  delayed_cast+T+record {dt}", ne * (esz + 2) / t / 1e9, "GB/s", "copy", copy_bw)
    plan = torch.tensor([2.0, 0.0], device=DEV)
    pending, slot = torch.full((4,), -1.0, device=DEV), torch.zeros((), dtype=torch.int64, device=DEV)
    for colsum in (False, True):
        t = timed(lambda: ops.grad_cast(x, E5, plan=plan, pending=pending, slot=slot, transpose=True, colsum=colsum))
        row("cast", f"  grad_cast+T{'+colsum' if colsum else ''} {dt}", ne * ((2 if colsum else 1) * esz + 2) / t / 1e9,
            "GB/s", "copy", copy_bw)


# ---- scaled_mm ----------------------------------------------------------------------------

def _scales(kind, m, n, k):
    if kind == "tensor":
        return torch.tensor(1.0, device=DEV), torch.tensor(1.0, device=DEV)
    if kind == "row":
        return torch.rand(m, 1, device=DEV) + 0.5, torch.rand(1, n, device=DEV) + 0.5
    kb = -(-k // 128)
    return torch.rand(m, kb, device=DEV) + 0.5, torch.rand(kb, -(-n // 128), device=DEV) + 0.5


def _torch_ref(kind, a, b, sa, sb):
    """torch._scaled_mm with the same kind of scales, or None when this torch lacks it."""
    cands = [(sa, sb)]
    if kind == "block":  # torch's block-wise layouts: (M, K/128) outer-dim-major scale_a
        cands.append((sa.t().contiguous().t(), sb.t().contiguous().t()))
    for xa, xb in cands:
        try:
            fn = lambda: torch._scaled_mm(a, b, scale_a=xa, scale_b=xb, out_dtype=torch.bfloat16)  # noqa: E731
            fn()
            return fn
        except (RuntimeError, ValueError, NotImplementedError):
            continue
    return None


def bench_gemm(shapes):
    for m, n, k in shapes:
        a = torch.randn(m, k, device=DEV).to(E4)
        b = torch.randn(n, k, device=DEV).to(E4).t()
        fl = 2.0 * m * n * k
        ab, bb = (torch.randn(m, k, device=DEV, dtype=torch.bfloat16),
                  torch.randn(k, n, device=DEV, dtype=torch.bfloat16))
        t_bf = timed(lambda: torch.mm(ab, bb), iters=10)
        ROWS.append(("gemm", f"bf16 torch.mm {m}x{n}x{k}", f"{fl / t_bf / 1e12:9.1f} TFLOP/s", "", "", "", ""))
        for kind in ("tensor", "row", "block"):
            sa, sb = _scales(kind, m, n, k)
            what = f"scaled_mm {m}x{n}x{k} {kind}"
            try:  # a refusal is an error row, not the timing of ops.scaled_mm's torch._scaled_mm fallback
                if scaled_mm_noting_fallback(a, b, sa, sb, None, torch.bfloat16)[1]:
                    raise NotImplementedError("fp8mix.scaled_mm: refused by cuBLASLt on this device")
                t = timed(lambda: ops.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), iters=10)
            except Exception as e:  # noqa: BLE001 - report and go on
                error_row("gemm", what, e)
                continue
            ref = _torch_ref(kind, a, b, sa, sb)
            if ref is None:
                row("gemm", what + " (no torch ref)", fl / t / 1e12, "TFLOP/s", "bf16 mm", fl / t_bf / 1e12)
            else:
                t_ref = timed(ref, iters=10)
                row("gemm", what, fl / t / 1e12, "TFLOP/s", "_scaled_mm", fl / t_ref / 1e12, 0.95)


# ---- fp8mix.Linear --------------------------------------------------------------------

def _torchao_linear(lin):
    try:
        import copy

        from torchao.float8 import convert_to_float8_training
    except Exception:  # noqa: BLE001 - torchao missing or broken: no comparison
        return None
    mod = torch.nn.Sequential(copy.deepcopy(lin))
    convert_to_float8_training(mod)
    return mod


def bench_linear(sizes, target_size):
    rec = fp8mix.recipe.DelayedScaling(amax_history_len=16)
    for n in sizes:
        lin = torch.nn.Linear(n, n, device=DEV, dtype=torch.bfloat16)
        f8 = fp8mix.Linear.from_linear(lin)
        x = torch.randn(n, n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)

        def step_fp8():
            with fp8mix.fp8_autocast(enabled=True, fp8_recipe=rec):
                y = f8(x)
            y.backward(dy)

        t_bf = timed(lambda: lin(x).backward(dy), iters=5)
        try:
            t_f8 = timed(step_fp8, iters=5)
        except Exception as e:  # noqa: BLE001
            error_row("linear", f"fp8mix.Linear fwd+bwd {n}^3", e)
            continue
        ROWS.append(("linear", f"nn.Linear bf16 fwd+bwd {n}^3", f"{t_bf * 1e3:9.3f} ms", "", "", "", ""))
        # speed-ups: reference time / fp8mix time
        row("linear", f"fp8mix.Linear fwd+bwd {n}^3 ({t_f8 * 1e3:.3f} ms)", t_bf / t_f8, "x", "vs bf16", 1.0,
            1.3 if n == target_size else None, fmt="9.3f")
        ao = _torchao_linear(lin)
        if ao is None:
            ROWS.append(("linear", f"  torchao Float8Linear {n}^3", "not importable", "", "", "", ""))
            continue
        try:
            t_ao = timed(lambda: ao(x).backward(dy), iters=5)
            row("linear", f"  vs torchao Float8Linear {n}^3 ({t_ao * 1e3:.3f} ms)", t_ao / t_f8, "x",
                "torchao", 1.0, fmt="9.3f")
        except Exception as e:  # noqa: BLE001
            error_row("linear", f"  torchao Float8Linear {n}^3", e)


# ---- launches per layer step ---------------------------------------------------------------

class OpCounter(TorchDispatchMode):
    """Counts dispatched ops that are not views (each one is a kernel launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not getattr(func, "is_view", False) and func.__name__ not in ("detach.default", "lift_fresh.default"):
            name = str(func.overloadpacket.__name__)
            self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def classify_activity(names) -> dict[str, int]:
    """Stream work by kind from the names of torch.profiler's CUDA activity events:
    memsets ("Memset (Device)"), copies ("Memcpy DtoD (Device -> Device)", ...), and
    kernels (every other name: a kernel's own)."""
    out = {"kernels": 0, "memsets": 0, "copies": 0}
    for n in names:
        low = n.strip().lower()  # kineto's activity names, not kernels that merely start with "memset"
        out["memsets" if low.startswith("memset (") else "copies" if low.startswith("memcpy ") else "kernels"] += 1
    return out


def _cuda_activity(fn) -> dict[str, int] | None:
    """What one call of fn runs on the GPU (classify_activity of torch.profiler's CUDA
    activity), or None where the profiler sees no CUDA activity (no CUPTI)."""
    from torch.profiler import ProfilerActivity, profile
    try:
        for _ in range(2):  # the first profile initialises CUPTI (its own events are not fn's)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - no CUPTI / no CUDA activity kind: no count (the row says so)
        print(f"torch.profiler failed: {e}")
        return None
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return classify_activity(names) if names else None


def bench_launches(n):
    """Launches (kernels + memsets + copies on the GPU, from the profiler) of one
    fp8mix.Linear fwd+bwd; the dispatched non-view ops as the reference (and as the
    count of the CPU dry run, which has no GPU activity)."""
    recipes = {"delayed": (fp8mix.recipe.DelayedScaling(), 10), "current": (fp8mix.recipe.CurrentScaling(), 10),
               "block": (fp8mix.recipe.BlockScaling(), 12)}
    for name, (rec, target) in recipes.items():
        lin = fp8mix.Linear(n, n, device=DEV, dtype=torch.bfloat16)
        x = torch.randn(n, n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.ones(n, n, device=DEV, dtype=torch.bfloat16)  # made once: not the step's launch

        def step():
            lin.zero_grad(set_to_none=True)  # as a training step does: no gradient accumulation
            x.grad = None
            with fp8mix.fp8_autocast(enabled=True, fp8_recipe=rec):
                y = lin(x)
            y.backward(dy)

        for _ in range(3):  # steady state (delayed scaling's history filled, caches warm)
            step()
        cnt = OpCounter()
        with cnt:
            step()
        ops_n = sum(cnt.ops.values())
        top = ", ".join(f"{k} {v}" for k, v in sorted(cnt.ops.items(), key=lambda kv: -kv[1])[:6])
        act = None if DRY else _cuda_activity(step)
        if act is None:  # the dry run, or no CUPTI: only the dispatched ops are known
            what = f"Linear {name} fwd+bwd dispatched ops ({'dry run' if DRY else 'no CUDA activity seen'}) [{top}]"
            ROWS.append(("launch", what[:110], f"{ops_n:9d} ops", "", "", f"<= {target}",
                         verdict(ops_n <= target) if DRY else "FAIL"))
            continue
        total = sum(act.values())
        print(f"launches, Linear {name} fwd+bwd: {act} (dispatched ops: {ops_n}: {top})")
        ROWS.append(("launch", f"Linear {name} fwd+bwd GPU launches ({act['kernels']} kernels, {act['memsets']} "
                     f"memsets, {act['copies']} copies)", f"{total:9d}", f"dispatched ops {ops_n}", "",
                     f"<= {target}", verdict(total <= target)))


# ---- the table -------------------------------------------------------------------------------

def print_table(rows) -> None:
    head = ("kind", "what", "value", "reference", "ratio", "target", "")
    w = [max(len(str(r[i])) for r in list(rows) + [head]) for i in range(len(head))]
    for r in [head] + list(rows):
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())


def load_rows(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    out.append(tuple(r.get(k, "") for k in ("kind", "what", "value", "reference", "ratio", "target",
                                                            "verdict")))
    except FileNotFoundError:
        pass
    return out


def main() -> int:
    global DEV, DRY
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer cast modes and GEMM kinds")
    ap.add_argument("--dry-run", action="store_true", help="run every part on the CPU with tiny shapes")
    ap.add_argument("--rows", help="JSON-lines file of rows measured earlier (gpu_check.sh), shown first")
    ap.add_argument("--json", help="write the table's rows here as JSON")
    ap.add_argument("--table-only", action="store_true", help="print the --rows table, measure nothing")
    args = ap.parse_args()
    if args.table_only:
        rows = load_rows(args.rows) if args.rows else []
        print_table(rows)
        return 1 if any(r[-1] == "FAIL" for r in rows) else 0
    DRY = args.dry_run
    if DRY:
        DEV = "cpu"
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("bench_gpu.py: no GPU (torch.cuda.is_available() is False); use --dry-run to exercise it on the CPU")
        return 3
    else:
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  CUDA {torch.version.cuda}")
    parts = [(bench_casts, (64 if DRY else 8192, args.quick)),
             (bench_gemm, ([(64, 64, 256)] if DRY else [(4096, 4096, 4096), (8192, 8192, 8192)],)),
             (bench_linear, ([64] if DRY else [4096, 8192], 64 if DRY else 8192)),
             (bench_launches, (64 if DRY else 1024,))]
    for part, pargs in parts:
        try:
            part(*pargs)
        except Exception as e:  # noqa: BLE001 - one failing part must not hide the others
            error_row(part.__name__, "error", e)
    rows = load_rows(args.rows) + ROWS if args.rows else ROWS
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(("kind", "what", "value", "reference", "ratio", "target", "verdict"), r))
                       for r in rows], f, indent=1)
    return 1 if any(r[-1] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
