"""What the benchmark scripts share: the machine they ran on (CPU, ISA of fp8mix and
of torch's own kernels, load), capping every library to AVX2 for a fair comparison
on a wider CPU, interleaved timing, and PASS/FAIL formatting."""
from __future__ import annotations

import os
import platform
import select
import statistics
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

# Environment that caps fp8mix and torch's kernels (ATen, MKL, oneDNN) to AVX2.
AVX2_ENV = {
    "FP8MIX_MAX_ISA": "avx2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


CHILD_STARTUP_S = 120.0  # a child's imports (torch, fp8mix, torchao) on a loaded machine, not counted


def seconds_in_child(module: str, func: str, args: Sequence, limit_s: float) -> Tuple[Optional[float], str]:
    """Run module.func(*args) (a module-level function of a script in benchmarks/, plain
    arguments) once in a fresh Python process: (its wall seconds, "") when it finished within
    limit_s, (None, "> N s") when it did not (the process is killed), (None, the error's last
    line) when it raised.  A variant that takes minutes per call (torchao's CPU _scaled_mm on
    some builds: issue #30) cannot hang a benchmark: a C call cannot be interrupted in-process.
    The child's imports get CHILD_STARTUP_S of their own, timed apart."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, time; sys.path.insert(0, {here!r}); import {module} as m; print('READY', flush=True); "
            f"t0 = time.perf_counter(); m.{func}(*{tuple(args)!r}); print('SECONDS', time.perf_counter() - t0)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], CHILD_STARTUP_S)  # the imports, then the clock starts
    first = p.stdout.readline() if ready and p.stdout else ""
    try:
        out, err = p.communicate(timeout=limit_s + 5.0 if first.startswith("READY") else 1.0)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return None, f"> {limit_s:g} s" if first.startswith("READY") else "the child did not start"
    for line in out.splitlines():
        if line.startswith("SECONDS"):
            t = float(line.split()[1])
            return (t, "") if t <= limit_s else (None, f"> {limit_s:g} s")
    last = (err.strip().splitlines() or ["no output"])[-1]
    return None, last[:100]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cap_to_avx2_and_reexec() -> None:
    """Re-execute this script with AVX2_ENV set (the libraries read it at load time);
    a no-op when it is already in effect."""
    if all(os.environ.get(k) == v for k, v in AVX2_ENV.items()):
        return
    env = dict(os.environ, **AVX2_ENV)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


_PROBE = (
    "import torch\n"
    "a = torch.randn(64, 64)\n"
    "torch.mm(a, a); torch.mm(a.bfloat16(), a.bfloat16())\n"
    "print('ATEN', torch.backends.cpu.get_cpu_capability())\n"
)


def torch_isa() -> str:
    """The ISA torch's own kernels run at, read from the libraries themselves (ATen's
    capability, MKL_VERBOSE and ONEDNN_VERBOSE in a child process with this
    environment), so that a cap that did not take effect is visible."""
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                             timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({type(e).__name__})"
    aten = mkl = dnnl = "?"
    for line in out.splitlines():
        if line.startswith("ATEN "):
            aten = line.split()[1]
        elif line.startswith("MKL_VERBOSE") and "Intel(R)" in line and mkl == "?":
            mkl = ("AMX" if "AMX" in line else "AVX-512" if "AVX-512" in line else
                   "AVX2" if "AVX2" in line else "other")
        elif line.startswith("onednn_verbose") and ",isa:" in line:
            dnnl = line.split(",isa:", 1)[1].strip()
    return f"ATen {aten}, MKL {mkl}, oneDNN {dnnl}"


def load_average() -> str:
    """The 1/5/15-minute load averages and the CPU count."""
    if not hasattr(os, "getloadavg"):
        return "n/a"
    a = os.getloadavg()
    return f"{a[0]:.2f} {a[1]:.2f} {a[2]:.2f} on {os.cpu_count()} CPUs"


def gemm_kernel_class() -> str:
    """What fp8mix's native CPU GEMM multiplies with on this machine, which decides the speed
    targets: 'amx' (AMX tiles), 'bf16' (AVX512-BF16 vdpbf16ps, chosen only where it runs faster
    than float32 FMA: two products per lane) or 'fma' (float32 FMA: an exact FP8 GEMM can be
    at most as fast as a float32 GEMM; so on AVX2 CPUs, and on AVX-512 BF16 cores whose
    vdpbf16ps runs at half the FMA rate, as on the Sapphire Rapids class Xeons seen here)."""
    import fp8mix

    name = fp8mix.gemm_kernel("native")
    return "amx" if "amx" in name else "bf16" if name.startswith("bf16") else "fma"


def header_lines(fp8mix_isa: str) -> List[str]:
    """Markdown bullet lines describing the machine and the ISAs in effect."""
    import datetime

    import torch

    import fp8mix

    capped = all(os.environ.get(k) == v for k, v in AVX2_ENV.items())
    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- cpu: {cpu_model()} ({os.cpu_count()} logical CPUs); load average at start: {load_average()}",
        f"- fp8mix ISA: {fp8mix_isa}; GEMM kernel {fp8mix.gemm_kernel('native')} (native order), "
        f"{fp8mix.gemm_kernel('canonical')} (canonical); torch {torch.__version__} kernels: {torch_isa()}"
        + ("; capped to AVX2 (FP8MIX_MAX_ISA, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS)"
           if capped else ""),
        f"- python {platform.python_version()}",
    ]


def bench_interleaved(fns: Sequence[Callable[[], object]], budget_s: float = 0.6, min_reps: int = 3,
                      max_reps: int = 40, warmup: int = 1) -> List[Tuple[float, float]]:
    """Time several callables in alternation (rep i runs each once, in turn), so that load
    from elsewhere on the machine hits them alike; rep i starts at callable i mod n, so each
    follows each of the others as often (what ran just before -- another library's threads
    winding down, the caches it left -- is not always the same one's).  `warmup` untimed
    rounds, then reps fitted to the budget.  Returns [(median, min) seconds] in the order of
    fns."""
    for _ in range(max(warmup, 1)):
        for fn in fns:
            fn()
    t0 = time.perf_counter()
    for fn in fns:
        fn()
    est = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max_reps, max(min_reps, budget_s / est)))
    times: List[List[float]] = [[] for _ in fns]
    for r in range(reps):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            t = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t)
    return [(statistics.median(ts), min(ts)) for ts in times]


def verdict(ok: bool) -> str:
    """PASS / FAIL for a table cell."""
    return "PASS" if ok else "FAIL"


def table_main(doc: str, argv, *, columns: Sequence[str], shapes: Callable[[bool], list],
               row: Callable[..., Tuple[str, bool]], budgets: Tuple[float, float] = (1.0, 3.0),
               extra: str = "") -> int:
    """main() of a benchmark that prints one table row per shape: ``--quick`` / ``--threads``,
    the machine's header (plus `extra` lines), the table of ``row(*shape, budget=, wide=) ->
    (line, ok)`` (budget: budgets[0] with --quick, else budgets[1]; wide: fp8mix's GEMM kernel
    does more than one product per float32 FMA slot here, gemm_kernel_class), the overall
    verdict; returns the exit status (0: PASS)."""
    import argparse

    import torch

    import fp8mix
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes, shorter timing")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    isa = fp8mix.cpu_isa()
    print("\n".join(header_lines(isa)) + f"\n- threads: {args.threads}\n{extra}")
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    ok = True
    for shape in shapes(args.quick):
        line, good = row(*shape, budget=budgets[0] if args.quick else budgets[1], wide=gemm_kernel_class() != "fma")
        print(line, flush=True)
        ok &= good
    print(f"\noverall: {verdict(ok)}")
    return 0 if ok else 1
