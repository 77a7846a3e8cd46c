"""Kill-and-resume tests of `python -m fp8mix demo` (--checkpoint-dir, --resume, --loss-log).

A run killed with SIGKILL between checkpoints and restarted with --resume must continue
bit-identically to an uninterrupted run: model, optimizer, FP8 state (with the pending
grad_output amaxes of fp8mix.Linear), RNG and batch order all come back. The per-step
losses are compared exactly (repr and float.hex in the --loss-log), as are the validation
curves in results.json. Checkpoint files must never be read half-written: temp files are
ignored, an unreadable newest checkpoint falls back to the previous one, and a checkpoint
written under another configuration is refused with a one-line error.

Everything runs at a tiny size on a ~28 KB corpus in tmp_path; each subprocess takes a
few seconds.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import write_corpus

from fp8mix.tools import cli
from fp8mix.tools.demo import checkpoint

# --eval-every 7 against --checkpoint-every 5: most checkpoints fall between validations, so
# they hold delayed scaling's pending grad_output amaxes (an eval forward would record them).
TINY = ["--layers", "1", "--d-model", "32", "--seq-len", "32", "--batch-size", "4", "--eval-every", "7",
        "--eval-batches", "2", "--no-progress"]
RUNS = "fp8-delayed,fp8-current,fp32"  # the hardest first: delayed scaling carries FP8 state between steps
STEPS = 120


def _cmd(corpus, out, *extra):
    return [sys.executable, "-m", "fp8mix", "demo", *TINY, "--data", str(corpus), "--out", str(out), *extra]


# One thread per demo: on a shared 2-core machine two OpenMP threads per process contend
# with everything else and run several times slower (and the poller needs a core too).
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=240)


def _log_lines(path) -> list[str]:
    """Complete lines of a loss log (a SIGKILL can at most cut the last one short)."""
    text = path.read_text() if path.exists() else ""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    return lines


def _curves(out):
    """Per run: steps, train and validation curves, FP8 cast counters (all exact)."""
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {r["run"]: (r["steps_done"], r["train_curve"], r["val_curve"], r["fp8"]) for r in runs}


def _kill_when(cmd, cwd, log, run, step, stdout_path, deadline_s=120.0) -> None:
    """Start `cmd`, SIGKILL it as soon as `log` has a line of `run` at step >= `step`."""
    with open(stdout_path, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=out, stderr=subprocess.STDOUT)
        t_end = time.monotonic() + deadline_s
        try:
            while True:
                lines = _log_lines(log)
                if any(ln.split(" ")[0] == run and int(ln.split(" ")[1]) >= step for ln in lines):
                    os.kill(proc.pid, signal.SIGKILL)
                    break
                if proc.poll() is not None:
                    pytest.fail(f"demo exited ({proc.returncode}) before {run} reached step {step}:\n"
                                + stdout_path.read_text()[-3000:])
                if time.monotonic() > t_end:
                    pytest.fail(f"{run} did not reach step {step} within {deadline_s} s")
                time.sleep(0.002)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_and_resume_is_bit_identical(tmp_path, corpus):
    ref_log, ck_log, ck = tmp_path / "ref.log", tmp_path / "ck.log", tmp_path / "ck"
    r = _run(_cmd(corpus, tmp_path / "out_ref", "--recipes", RUNS, "--steps", str(STEPS), "--loss-log",
                  str(ref_log)), tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ref = _log_lines(ref_log)
    assert len(ref) == 3 * STEPS
    name, step, rep, hexv = ref[0].split()
    assert (name, step) == ("fp8-delayed", "0") and float(rep) == float.fromhex(hexv)

    resumed = _cmd(corpus, tmp_path / "out_ck", "--recipes", RUNS, "--steps", str(STEPS), "--checkpoint-dir",
                   str(ck), "--checkpoint-every", "5", "--loss-log", str(ck_log), "--resume")
    # Kill each run once between checkpoints (at different phases of the 5-step period),
    # then resume: every invocation uses --resume, the first one on an empty folder.
    kills = [("fp8-delayed", 22), ("fp8-current", 48), ("fp32", 61)]
    for i, (run, step) in enumerate(kills):
        _kill_when(resumed, tmp_path, ck_log, run, step, tmp_path / f"kill{i}.txt")
        got = _log_lines(ck_log)
        assert got == ref[:len(got)], f"losses before the kill #{i} differ from the uninterrupted run"
        done = [s for s, _ in checkpoint.list_checkpoints(str(ck), run)]
        assert done and max(done) < STEPS, f"{run} was not killed between checkpoints: {done}"
        assert len(done) <= 3  # the last 2 kept (a third only between rename and pruning)
        if i:  # the previous invocation resumed the previous kill's run mid-way
            prev_run = kills[i - 1][0]
            m = re.search(rf"{prev_run}: resuming from .* \(step (\d+) of {STEPS}\)",
                          (tmp_path / f"kill{i}.txt").read_text())
            assert m and 0 < int(m[1]) < STEPS
            if prev_run == "fp8-delayed":  # resumed between validations: pending grad amaxes were saved
                assert int(m[1]) % 7

    r = _run(resumed, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "fp8-delayed: already complete" in r.stdout and "fp8-current: already complete" in r.stdout
    m = re.search(r"fp32: resuming from .* \(step (\d+) of (\d+)\)", r.stdout)
    assert m and 60 <= int(m[1]) < STEPS and int(m[2]) == STEPS, r.stdout
    assert _log_lines(ck_log) == ref  # every step's loss, bit for bit
    assert ck_log.read_bytes() == ref_log.read_bytes()
    assert _curves(tmp_path / "out_ck") == _curves(tmp_path / "out_ref")  # curves and FP8 counters, exactly
    assert not [n for n in os.listdir(ck) if ".tmp." in n]
    for run in RUNS.split(","):
        assert [s for s, _ in checkpoint.list_checkpoints(str(ck), run)] == [STEPS - 5, STEPS]


# ---- a finished checkpointed run, reused by the tests below ---------------------------------
SHORT = ["--recipes", "fp8-delayed", "--steps", "20", "--checkpoint-every", "5"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A folder with a corpus, a completed fp8-delayed run's checkpoints (steps 15, 20) in
    ck/ and its loss log full.log."""
    d = tmp_path_factory.mktemp("finished")
    corpus = write_corpus(d / "corpus.txt")
    r = _run(_cmd(corpus, d / "out", *SHORT, "--checkpoint-dir", str(d / "ck"), "--loss-log", str(d / "full.log")),
             d)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [s for s, _ in checkpoint.list_checkpoints(str(d / "ck"), "fp8-delayed")] == [15, 20]
    return d


def _copy(finished, tmp_path):
    shutil.copytree(finished / "ck", tmp_path / "ck")
    return tmp_path / "ck"


def _resume(finished, tmp_path, *extra):
    return _run(_cmd(finished / "corpus.txt", tmp_path / "out", *SHORT, "--checkpoint-dir", str(tmp_path / "ck"),
                     "--loss-log", str(tmp_path / "r.log"), "--resume", *extra), tmp_path)


def test_complete_run_is_not_retrained(finished, tmp_path):
    ck = _copy(finished, tmp_path)
    before = {n: os.stat(ck / n).st_mtime_ns for n in os.listdir(ck)}
    r = _resume(finished, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "fp8-delayed: already complete" in r.stdout and "resuming from" not in r.stdout
    assert {n: os.stat(ck / n).st_mtime_ns for n in os.listdir(ck)} == before  # nothing rewritten
    assert (tmp_path / "r.log").read_bytes() == (finished / "full.log").read_bytes()  # restored from the checkpoint
    assert _curves(tmp_path / "out") == _curves(finished / "out")


def test_torn_temp_file_is_ignored(finished, tmp_path):
    ck = _copy(finished, tmp_path)
    final = ck / checkpoint.checkpoint_name("fp8-delayed", 20)
    torn = ck / f".{final.name}.tmp.99999"  # a writer killed half-way through the last checkpoint
    torn.write_bytes(final.read_bytes()[: final.stat().st_size // 2])
    final.unlink()
    r = _resume(finished, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resuming from" in r.stdout and "(step 15 of 20)" in r.stdout
    assert "warning" not in r.stderr  # the temp file is not even looked at
    assert (tmp_path / "r.log").read_bytes() == (finished / "full.log").read_bytes()
    assert not torn.exists()  # stale temp files of the run are cleaned up
    assert torch.load(final, weights_only=True)["done"] is True


def test_unreadable_newest_checkpoint_falls_back(finished, tmp_path):
    ck = _copy(finished, tmp_path)
    final = ck / checkpoint.checkpoint_name("fp8-delayed", 20)
    final.write_bytes(final.read_bytes()[:1000])  # e.g. a disk that lost the tail
    r = _resume(finished, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"skipping unreadable checkpoint {final}" in r.stderr
    assert "(step 15 of 20)" in r.stdout
    assert (tmp_path / "r.log").read_bytes() == (finished / "full.log").read_bytes()
    assert (ck / (final.name + ".unreadable")).exists()  # set aside, not deleted
    assert [s for s, _ in checkpoint.list_checkpoints(str(ck), "fp8-delayed")] == [15, 20]


def test_different_config_is_refused(finished, tmp_path):
    _copy(finished, tmp_path)
    r = _resume(finished, tmp_path, "--lr", "1e-3")
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "different configuration" in err[0] and "lr 0.003 (checkpoint) vs 0.001 (now)" in err[0]
    # Another corpus is another configuration too.
    other = write_corpus(tmp_path / "other.txt")
    other.write_text(other.read_text().replace("line", "LINE"))
    r = _run(_cmd(other, tmp_path / "out", *SHORT, "--checkpoint-dir", str(tmp_path / "ck"), "--resume"), tmp_path)
    assert r.returncode == 2 and "corpus-sha256" in r.stderr


def test_existing_checkpoints_need_resume(finished, tmp_path):
    _copy(finished, tmp_path)
    r = _run(_cmd(finished / "corpus.txt", tmp_path / "out", *SHORT, "--checkpoint-dir", str(tmp_path / "ck")),
             tmp_path)
    assert r.returncode == 2 and "pass --resume" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--resume"], ["--checkpoint-every", "5"],
                                  ["--checkpoint-dir", "x", "--checkpoint-every", "0"]])
def test_bad_checkpoint_options(args, capsys):
    assert cli.main(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error" in err


def test_atomic_save_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "a.pt"
    checkpoint.atomic_save({"v": 1}, str(path))

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):  # the injected failure, not another
        checkpoint.atomic_save({"v": 2}, str(path))
    assert torch.load(path, weights_only=True) == {"v": 1}
    assert os.listdir(tmp_path) == ["a.pt"]  # no temp file left behind


def test_seeds_checkpoint_and_resume_per_seed(tmp_path, corpus):
    """With --seeds, every (variant, seed) run has its own checkpoints (<variant>-seed<S>)
    and a finished demo resumed retrains nothing and reports the same curves."""
    args = ["--recipes", "fp32,fp8-delayed", "--steps", "10", "--seeds", "2", "--checkpoint-every", "5",
            "--checkpoint-dir", str(tmp_path / "ck")]
    r = _run(_cmd(corpus, tmp_path / "out1", *args), tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ids = ["fp32-seed0", "fp8-delayed-seed0", "fp32-seed1", "fp8-delayed-seed1"]
    for run in ids:
        assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "ck"), run)] == [5, 10], run
    ck = torch.load(tmp_path / "ck" / checkpoint.checkpoint_name("fp32-seed1", 10), weights_only=True)
    assert ck["config"]["seed"] == 1 and ck["config"]["run"] == "fp32-seed1"
    r = _run(_cmd(corpus, tmp_path / "out2", *args, "--resume"), tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for run in ids:
        assert f"{run}: already complete" in r.stdout
    runs1 = json.loads((tmp_path / "out1" / "results.json").read_text())["runs"]
    runs2 = json.loads((tmp_path / "out2" / "results.json").read_text())["runs"]
    assert [(x["run_id"], x["seed"], x["train_curve"], x["val_curve"]) for x in runs1] == \
        [(x["run_id"], x["seed"], x["train_curve"], x["val_curve"]) for x in runs2]
