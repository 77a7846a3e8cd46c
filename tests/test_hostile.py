"""Hostile inputs to every public fp8mix op and module must end in a clean Python
exception that says what is wrong (or, for valid but unusual input, in the right
answer) — never in a signal, an abort, a hang or silently wrong data.

The cases live in tests/hostile/cases_*.py, one file per module of fp8mix (each a table
of call + expectation), run by tests/hostile/worker.py. They
run in a subprocess, all in one batch for speed; when the worker dies (a signal,
an abort, a timeout) the case it had started is rerun alone to confirm it is the
culprit, and the batch continues with the remaining cases in a fresh worker.
Each case is then one parametrized test here.

Every case must pass: a new failure fails its test, naming the case and what happened.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from hostile import worker as hw

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile", "worker.py")
BATCH_TIMEOUT = 180  # seconds for a whole batch (the full table takes a few seconds)
SINGLE_TIMEOUT = 60



def _describe(rc, timed_out):
    if timed_out:
        return "timed out (hang)"
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def _run(names, timeout, env=None):
    """One worker over `names`: ({name: (ok, detail)}, started names, rc, stderr, timed_out)."""
    proc = subprocess.Popen([sys.executable, WORKER, *names], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    results, started = {}, []
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "start" in d:
            started.append(d["start"])
        elif "name" in d:
            results[d["name"]] = (d["ok"], d["detail"])
    return results, started, proc.returncode, err, timed_out


def run_cases(names, env=None):
    """All `names`, surviving worker deaths; returns {name: (ok, detail)}."""
    results = {}
    pending = list(names)
    while pending:
        res, started, rc, err, timed_out = _run(pending, BATCH_TIMEOUT, env)
        results.update(res)
        pending = [n for n in pending if n not in results]
        if not pending:
            break
        inflight = started[-1] if started and started[-1] not in results else None
        if inflight is None:  # died before or between cases: nothing to pin it on
            for n in pending:
                results[n] = (False, f"worker {_describe(rc, timed_out)} before running it; stderr: {err[-2000:]}")
            break
        # confirm the culprit alone, then go on with the rest in a fresh worker
        res1, _, rc1, err1, to1 = _run([inflight], SINGLE_TIMEOUT, env)
        if inflight in res1:
            ok, detail = res1[inflight]
            results[inflight] = (False, f"the batch worker {_describe(rc, timed_out)} in this case, which alone "
                                        f"gives ok={ok} ({detail}): memory corrupted by an earlier case? "
                                        f"stderr: {err[-2000:]}")
        else:
            results[inflight] = (False, f"worker {_describe(rc1, to1)}; stderr: {err1[-2000:]}")
        pending = [n for n in pending if n not in results]
    return results


@pytest.fixture(scope="module")
def outcomes():
    return run_cases(sorted(hw.CASES))


@pytest.mark.parametrize("name", sorted(hw.CASES))
def test_hostile(name, outcomes):
    ok, detail = outcomes[name]
    assert ok, f"{name}: {detail}"


def test_worker_death_is_pinned_on_the_case():
    """The harness itself: a case that aborts the interpreter or hangs is reported as that case's
    failure, and the cases around it still run."""
    env = dict(os.environ, FP8MIX_HOSTILE_SELFTEST="1")
    names = ["_selftest_ok", "_selftest_abort", "_selftest_ok2", "_selftest_segv", "_selftest_ok3"]
    res = run_cases(names, env)
    assert res["_selftest_ok"][0] and res["_selftest_ok2"][0] and res["_selftest_ok3"][0], res
    assert not res["_selftest_abort"][0] and "SIGABRT" in res["_selftest_abort"][1], res["_selftest_abort"]
    assert not res["_selftest_segv"][0] and "SIGSEGV" in res["_selftest_segv"][1], res["_selftest_segv"]
