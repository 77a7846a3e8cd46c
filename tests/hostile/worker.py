"""The hostile-case worker: ``python tests/hostile/worker.py NAME...`` runs the named
cases (all when none are named) and prints one JSON line per case (see harness.py)."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hostile import cases_gemm, cases_nn, cases_quantize, cases_recipe, cases_selftest, cases_stats, cases_tensor  # noqa: E402,F401
from hostile.harness import CASES, Valid  # noqa: E402


def _reset():
    """Undo what a case may leave behind: autocast frames, the ISA cap."""
    if "fp8mix" not in sys.modules:
        return
    import importlib
    importlib.import_module("fp8mix.context")._state.stack.clear()
    importlib.import_module("fp8mix.ops").set_max_isa("avx512bf16")


def run_case(name):
    fn, expect = CASES[name]
    result, exc = None, None
    try:
        result = fn()
    except AssertionError as e:  # a wrong result of a valid call
        if isinstance(expect, Valid):
            return False, f"wrong result: {e}"
        exc = e
    except Exception as e:  # noqa: BLE001 - any clean Python exception is judged below
        exc = e
    finally:
        _reset()
    return expect.judge(result, exc)


def _cap_address_space(headroom):
    """Cap the address space at what is mapped now (torch and its libraries) plus
    `headroom`, so that a huge allocation fails at once with a clean error instead of
    paging the machine to death.  Linux only; a no-op elsewhere."""
    import resource
    try:
        with open("/proc/self/status") as fh:
            vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return
    cap = vm + headroom
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft == resource.RLIM_INFINITY or soft > cap:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def main(argv):
    import faulthandler

    faulthandler.enable()  # a crash prints the Python stack to stderr
    names = argv or list(CASES)
    if not all(n.startswith("_selftest") for n in names):
        import torch
        torch.set_num_threads(2)
        import fp8mix  # noqa: F401
    _cap_address_space(3 << 30)

    for name in names:
        print(json.dumps({"start": name}), flush=True)
        ok, detail = run_case(name)
        print(json.dumps({"name": name, "ok": bool(ok), "detail": detail}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
