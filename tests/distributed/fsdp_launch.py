"""Shared by the FSDP2 tests of this folder: one launch of 2 gloo worker processes per test
file (the file run as a script), the workers' results read back by the tests, and a
counter of what torch.distributed's collectives move.

    launch(script, out_dir)   runs `script rank port out_dir *args` on 2 processes (world=4:
                              four); returns each rank's saved results (a dict per
                              scenario), or fails the test with the workers' output (a
                              timeout included: never a hang)
    init_worker(rank, port)   the worker's process group: gloo, its timeout bounded to 60 s
    Collectives               counts bytes and calls of the all-gathers and all-reduces
                              FSDP2 and fp8mix make, by wrapping torch.distributed's functions
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
import traceback

import pytest
import torch

WORLD = 2
GLOO_TIMEOUT_S = 60  # every collective of a worker gives up after this (a rank out of step fails, not hangs)
LAUNCH_TIMEOUT_S = 300  # the whole launch (imports, every scenario), on a loaded 2-core machine

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(_TESTS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, out_dir, timeout_s: int = LAUNCH_TIMEOUT_S, world: int = WORLD, args: tuple = ()) -> list:
    """Run `script` as `world` worker processes and return their results (rank order);
    `args` follow the rank, port and out_dir on each worker's command line."""
    port = _free_port()
    path = os.pathsep.join([_ROOT, _TESTS, os.path.dirname(os.path.abspath(__file__)),
                            os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    argv = [str(port), str(out_dir), *map(str, args)]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script), str(r), *argv], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    deadline = time.time() + timeout_s
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1, deadline - time.time()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            logs.append(p.communicate()[0])
            pytest.fail(f"workers timed out after {timeout_s}s:\n" + "\n".join(log[-3000:] for log in logs))
    res = []
    for r in range(world):
        f = os.path.join(str(out_dir), f"rank{r}.pt")
        if not os.path.exists(f):
            pytest.fail(f"rank {r} saved no results (exit {procs[r].returncode}):\n{logs[r][-4000:]}")
        res.append(torch.load(f, weights_only=False))
    return res


def get(runs: list, name: str) -> list:
    """Scenario `name`'s results on every rank, or the test fails with the worker's error."""
    for r, res in enumerate(runs):
        if name not in res:
            pytest.fail(f"{name}: not run on rank {r} (an earlier scenario failed)")
        if "error" in res[name]:
            pytest.fail(f"{name} failed on rank {r}: {res[name]['error']}")
    return [res[name] for res in runs]


def init_worker(rank: int, port: int, world: int = WORLD) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))


def run_scenarios(rank: int, out_dir: str, scenarios: list) -> None:
    """Run (name, fn) in order, saving {name: fn() or {"error": ...}}; stop at the first
    error (a collective may be out of step after it)."""
    import torch.distributed as dist
    results: dict = {}
    for name, fn in scenarios:
        t0 = time.time()
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001  -- reported per scenario by the tests
            results[name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"}
            break
        results[name]["seconds"] = time.time() - t0
        dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


class Collectives:
    """Counts what the wrapped torch.distributed collectives move while active: bytes of
    all-gather outputs (what the wire carries to each rank, its own shard included), and
    the all-reduce calls with their element counts. FSDP2 calls all_gather_single (torch
    >= 2.13) or all_gather_into_tensor (earlier): both are wrapped (the former calls
    neither through torch.distributed's attribute, so nothing counts twice)."""

    _GATHERS = ("all_gather_single", "all_gather_into_tensor")

    def __init__(self):
        self.gather_bytes = 0
        self.gathers = 0
        self.reduce_numels: list = []
        self._saved: dict = {}

    def __enter__(self):
        import torch.distributed as dist
        for name in self._GATHERS + ("all_reduce",):
            if hasattr(dist, name):
                self._saved[name] = getattr(dist, name)
                setattr(dist, name, self._wrap(name, self._saved[name]))
        return self

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            if name == "all_reduce":
                self.reduce_numels.append(int(args[0].numel()))
            else:
                out = args[0]
                self.gather_bytes += out.numel() * out.element_size()
                self.gathers += 1
            return fn(*args, **kwargs)
        return counted

    def __exit__(self, *exc):
        import torch.distributed as dist
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved = {}
        return False
