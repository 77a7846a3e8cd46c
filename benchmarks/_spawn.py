"""Shared by the distributed benchmarks: spawn the worker processes of one run (this
machine, gloo, no torchrun) and read back what rank 0 wrote.

    run_workers(script, a, names, world)   runs ``script --name value ... --worker RANK PORT
                                            OUT`` (the `names` of the parsed arguments `a`)
                                            on `world` processes, a.threads torch threads
                                            each; returns rank 0's JSON (None when a worker
                                            failed)
    add_run_args(ap, ...)                   --steps, --warmup, --threads, --quick, --worker
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(script: str, a: argparse.Namespace, names: tuple, world: int,
                timeout_s: int = 1800) -> Optional[dict]:
    args = [v for n in names for v in (f"--{n}", str(getattr(a, n)))]
    threads = a.threads
    name = os.path.splitext(os.path.basename(script))[0]
    out = f"/tmp/{name}_{os.getpid()}.json"
    port = free_port()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), *args, "--worker", str(r), str(port), out],
                              env=env) for r in range(world)]
    if any(p.wait(timeout=timeout_s) for p in procs):
        print("a worker failed", file=sys.stderr)
        return None
    with open(out) as f:
        res = json.load(f)
    os.remove(out)
    return res


def add_run_args(ap, *, steps: int, warmup: int, quick_help: str) -> None:
    """The arguments every distributed benchmark takes: --steps, --warmup, --threads,
    --quick, and the hidden --worker RANK PORT OUT its spawned processes get."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "OUT"), help=argparse.SUPPRESS)
