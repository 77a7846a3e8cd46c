"""Every script in examples/ runs as a user would run it (``python examples/<script>.py``, a
subprocess) for a few steps at tiny sizes, and learns: its final loss is below its first
(or below the uniform ln 256 = 5.545 of an untrained byte model). The scripts start
together, one torch thread each, so their imports (Lightning's and transformers' take most
of the time) overlap on a 2-core machine; each test waits for its own."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX = os.path.join(ROOT, "examples")
UNIFORM = 5.545  # ln 256: the loss of a byte model that learned nothing

SCRIPTS = {
    "clip_scaler": ["train_clip_scaler.py", "--steps", "130"],
    "pretrain_llama": ["pretrain_llama.py", "--steps", "12", "--hidden", "64", "--layers", "1", "--seq-len", "32",
                       "--batch-size", "8", "--eval-every", "6", "--eval-batches", "2", "--checkpoint"],
    "lightning": ["train_lightning.py", "--epochs", "2", "--train-windows", "512", "--width", "64", "--depth", "1"],
    "accelerate": ["train_accelerate.py", "--steps", "30", "--width", "64", "--depth", "1",
                   "--mixed-precision", "bf16"],
    "hf_trainer": ["train_hf_trainer.py", "--steps", "12", "--save-steps", "6", "--hidden", "64", "--layers", "1",
                   "--seq-len", "32", "--batch-size", "8"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start every example at once; {name: Popen}."""
    out = tmp_path_factory.mktemp("examples")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    procs = {}
    for name, (script, *args) in SCRIPTS.items():
        extra = ["--out", str(out / name)] if name == "hf_trainer" else []
        procs[name] = subprocess.Popen([sys.executable, os.path.join(EX, script), *args, *extra], cwd=str(out),
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()


def _output(runs, name: str) -> str:
    try:
        text, _ = runs[name].communicate(timeout=600)
    except subprocess.TimeoutExpired:
        runs[name].kill()
        pytest.fail(f"examples/{SCRIPTS[name][0]} did not finish in 600 s")
    assert runs[name].returncode == 0, text[-3000:]
    return text


def _number(pattern: str, text: str) -> list:
    m = re.search(pattern, text)
    assert m, f"no line matching {pattern!r} in:\n{text[-2000:]}"
    return [float(g) for g in m.groups()]


def test_train_clip_scaler_skips_the_broken_step_and_trains(runs):
    text = _output(runs, "clip_scaler")
    assert re.search(r"step  120 .* skipped", text), text[-2000:]
    (final,) = _number(r"final loss \(fp32 eval\) ([0-9.]+)", text)
    (first,) = _number(r"step    0  loss ([0-9.]+)", text)
    assert final < 0.5 * first


def test_pretrain_llama_keeps_lm_head_and_learns(runs):
    text = _output(runs, "pretrain_llama")
    assert "kept in high precision: {'lm_head': 'module_filter_fn returned False'}" in text
    assert "FP8 layers: 7;" in text  # q, k, v, o, gate, up, down of the one decoder layer
    first, last, val = _number(r"train loss ([0-9.]+) -> ([0-9.]+), val loss ([0-9.]+)", text)
    assert last < first - 0.3 and val < UNIFORM


def test_train_lightning_learns(runs):
    text = _output(runs, "lightning")
    assert "kept in high precision: ['model.out']" in text and "FP8 layers: 3;" in text
    train, val = _number(r"train loss ([0-9.]+), val loss ([0-9.]+)", text)
    assert train < UNIFORM - 1 and val < UNIFORM - 1


def test_train_accelerate_learns(runs):
    text = _output(runs, "accelerate")
    first, last, val = _number(r"train loss ([0-9.]+) -> ([0-9.]+), val loss ([0-9.]+)", text)
    assert last < first - 1 and val < UNIFORM - 1


def test_train_hf_trainer_learns(runs):
    text = _output(runs, "hf_trainer")
    assert "kept in high precision: ['lm_head']" in text
    (val,) = _number(r"val loss ([0-9.]+)", text)
    assert val < UNIFORM - 0.3
    assert re.search(r"done: 12 steps", text)
