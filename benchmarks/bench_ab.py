"""Benchmark: the C core's GEMM of a git revision against this working tree's, in one process.

    python benchmarks/bench_ab.py                      # HEAD~1 against the working tree
    python benchmarks/bench_ab.py --base d31243d --sizes 512 1024 2048 --threads 1,2
    python benchmarks/bench_ab.py --base v1 --base v2  # several revisions, the first is the base

On a shared machine a GEMM's speed moves by 20-30% within seconds (another tenant's load),
more than most changes to the kernels; two runs of a benchmark minutes apart cannot tell
a 3% change from noise. Here every revision's C core is built into a shared library
(`make core` in a `git worktree` of the revision, linked whole), and ab_gemm.c loads them all
into one process and calls each revision's fp8mix_gemm in turn, round after round, with
per-tensor and with MX scales (powers of two) on the same E4M3 operands: the ratio of two
builds is taken per round, where both met the same machine, and its median and quartiles
are printed. "mx / tensor" is MX speed over per-tensor speed of the same build and rounds
(issue #30 item 4's target: >= 0.9x). No PASS/FAIL against torch: bench_gemm.py does that.

Needs git, make, a C compiler and the revision's sources (its Makefile's `core` target).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_model, load_average  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(cmd, **kw) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench_ab: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def core_library(tree: str, build: str, out: str) -> str:
    """`make core` of the source tree `tree` into `build`, linked whole into the shared library `out`."""
    _run(["make", "-s", "-C", tree, "core", f"BUILD={build}"])
    cc = shutil.which("gcc") or shutil.which("cc") or "cc"
    _run([cc, "-shared", "-o", out, "-Wl,--whole-archive", os.path.join(build, "libfp8mix_core.a"),
          "-Wl,--no-whole-archive", "-lpthread", "-lm"])
    return out


def revision_library(rev: str, tmp: str) -> str:
    """The C core of git revision `rev` (a worktree of it under tmp, removed afterwards)."""
    tree = os.path.join(tmp, f"tree-{rev.replace('/', '_')}")
    _run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", tree, rev])
    try:
        return core_library(tree, os.path.join(tmp, f"build-{rev.replace('/', '_')}"),
                            os.path.join(tmp, f"core-{rev.replace('/', '_')}.so"))
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], capture_output=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", action="append", help="git revision(s) to compare (default HEAD~1)")
    p.add_argument("--sizes", nargs="+", default=["512", "1024", "2048"], help="N (square) or MxKxN")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--seconds", type=float, default=6.0, help="timed seconds per shape and thread count (about)")
    p.add_argument("--layout", choices=["fwd", "dgrad", "wgrad"], default="fwd",
                   help="operand layouts: fwd (B as N x K), dgrad (B as K x N), wgrad (A K-major too)")
    a = p.parse_args(argv)
    revs = a.base or ["HEAD~1"]
    with tempfile.TemporaryDirectory() as tmp:
        libs = [revision_library(r, tmp) for r in revs]
        libs.append(core_library(ROOT, os.path.join(tmp, "build-tree"), os.path.join(tmp, "core-tree.so")))
        names = revs + ["working tree"]
        exe = os.path.join(tmp, "ab_gemm")
        cc = shutil.which("gcc") or shutil.which("cc") or "cc"
        _run([cc, "-std=c11", "-O2", f"-I{ROOT}/csrc/include", os.path.join(HERE, "ab_gemm.c"), "-o", exe, "-ldl"])
        import fp8mix  # the ISA and kernel of the working tree's build, for the header

        print("# fp8mix_gemm: builds compared call by call in one process\n")
        print(f"- cpu: {cpu_model()} ({os.cpu_count()} logical CPUs); load average at start: {load_average()}")
        print(f"- fp8mix ISA: {fp8mix.cpu_isa()}; GEMM kernel {fp8mix.gemm_kernel('canonical')} (canonical order)")
        print(f"- builds: {', '.join(names)}; the first is the base of the ratios")
        lay = {"fwd": "B as N x K", "dgrad": "B as K x N", "wgrad": "A stored K-major, B as K x N"}[a.layout]
        print(f"- E4M3 x E4M3 -> float32, {a.layout}: {lay}; medians over rounds, [quartiles] of the per-round "
              "ratios\n")
        print("| threads | shape | build | tensor GFLOP/s | x base [q1, q3] | MX GFLOP/s | MX x base "
              "| MX / tensor [q1, q3] |")
        print("|---:|---|---|---:|---|---:|---:|---|")
        for nt in (int(t) for t in a.threads.split(",")):
            for s in a.sizes:
                M, K, N = (int(v) for v in s.split("x")) if "x" in s else (int(s),) * 3
                # rounds: about --seconds at 150 GFLOP/s per thread, both scale kinds, every build
                per = 2 * 2.0 * M * N * K / (150e9 * nt) * len(libs)
                rounds = max(5, min(1000, int(a.seconds / per)))
                out = subprocess.run([exe, str(M), str(K), str(N), str(nt), str(rounds), a.layout, *libs],
                                     capture_output=True, text=True, check=True).stdout.split("\n")
                for name, line in zip(names, [ln for ln in out if ln.startswith("ab ")]):
                    f = line.split()[2:]
                    print(f"| {nt} | {M}x{K}x{N} | {name} | {f[0]} | {f[2]}x [{f[3]}, {f[4]}] | {f[1]} | {f[5]}x "
                          f"| {f[6]}x [{f[7]}, {f[8]}] |", flush=True)
        print(f"\n- load average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
