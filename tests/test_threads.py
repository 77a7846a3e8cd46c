"""fp8mix's C loops run on PyTorch's intra-op threads (csrc/torch/module.cpp hands the C
core torch's pool through fp8mix_set_thread_pool): with torch at 2 threads, a large GEMM
and a large cast start no thread of their own, and the work is shared by more than one of
torch's threads.  A second pool would compete with torch's OpenMP threads, which spin
after each of torch's loops (benchmarks/bench_gemm.py --threads 2 measured an fp8mix GEMM
after a torch matmul at 0.50-0.74x torch's speed that way).

Each check runs in a fresh interpreter: thread counts and per-thread CPU times are read
from /proc, which earlier tests in this process (gloo, data loaders) would disturb."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
                                reason="reads /proc/self/task; needs 2 CPUs")

_CHILD = textwrap.dedent("""
    import json, os, torch
    from fp8mix import ops

    def threads():
        return sorted(int(t) for t in os.listdir("/proc/self/task"))

    def cpu_ticks():
        out = {}
        for t in threads():
            with open(f"/proc/self/task/{t}/stat") as f:
                out[t] = int(f.read().rsplit(")", 1)[1].split()[11])  # utime, clock ticks
        return out

    torch.set_num_threads(2)
    x = torch.randn(2048, 2048)
    torch.mm(x, x)  # torch's OpenMP threads exist from here on
    before_threads = threads()
    a = (x * 8).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    t0 = cpu_ticks()
    for _ in range(3):
        y = ops.scaled_mm(a, a.t(), one, one)
        q, _, amax = ops.cast(y, torch.tensor(1e-3), torch.float8_e4m3fn)
    t1 = cpu_ticks()
    busy = sorted((t1[t] - t0.get(t, 0) for t in t1), reverse=True)
    print(json.dumps({"before": before_threads, "after": threads(), "busy": busy}))
""")


def _openmp_build_expected() -> bool:
    """setup.py's condition for compiling the extension with -fopenmp (GCC, OpenMP torch)."""
    if not torch.backends.openmp.is_available():
        return False
    try:
        out = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "clang" not in out.lower()


def test_extension_hands_the_c_core_torchs_threads():
    """Where setup.py builds with -fopenmp (or torch's backend is its own pool) the extension
    gives the C core torch's threads; elsewhere the C core keeps its pool (then the two
    tests below do not apply)."""
    import fp8mix._C as C

    if _openmp_build_expected():
        assert C.torch_threads == 1


def _child():
    import fp8mix._C as C

    if not C.torch_threads:
        pytest.skip("this build runs the C core on its own pool (no OpenMP in the extension)")
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_loops_start_no_threads_of_their_own():
    r = _child()
    assert r["after"] == r["before"], ("fp8mix started threads beside torch's: "
                                       f"{len(r['before'])} -> {len(r['after'])}")


def test_loops_are_shared_by_torchs_threads():
    # three 2048^3 GEMMs: about 0.3 s of work at 2 threads, 30 clock ticks
    busy = _child()["busy"]
    total = sum(busy)
    assert total >= 10, busy
    assert busy[1] >= 0.2 * total, f"one thread did the work: CPU ticks per thread {busy}"
