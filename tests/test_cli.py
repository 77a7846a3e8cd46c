"""Tests of the command line: `python -m fp8mix demo` and `python -m fp8mix inspect`.

The demo runs end to end at a tiny size on a small corpus written into tmp_path;
inspect runs on a tiny model module put on PYTHONPATH. Bad arguments must give exit
code 2 and a single line on stderr, never a traceback.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from fp8mix.tools import cli

TINY = ["--steps", "12", "--layers", "1", "--d-model", "32", "--seq-len", "32", "--batch-size", "4",
        "--eval-every", "6", "--eval-batches", "2"]
LN256 = math.log(256.0)  # cross-entropy of uniform byte predictions: a GPT-2-initialised model starts here

TINY_MODULE = '''
import torch.nn as nn

def make():
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 48), nn.ReLU(), nn.Linear(48, 8))
'''


@pytest.fixture()
def tiny_module(tmp_path, monkeypatch):
    """tinymod.make on sys.path (this process) and PYTHONPATH (subprocesses)."""
    (tmp_path / "tinymod.py").write_text(TINY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _run(args, cwd, extra_path=None):
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "fp8mix", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


def test_help_lists_subcommands(tmp_path):
    r = _run(["--help"], tmp_path)
    assert r.returncode == 0
    assert "demo" in r.stdout and "inspect" in r.stdout


def test_demo_end_to_end(tmp_path, corpus):
    out = tmp_path / "out"
    r = _run(["demo", *TINY, "--data", str(corpus), "--out", str(out),
              "--recipes", "fp32,bf16,fp8-delayed,current,block"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    for name in ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block"):
        assert any(line.startswith(name + " ") for line in r.stdout.splitlines()), r.stdout
    assert "val loss" in r.stdout and "step ms" in r.stdout
    for f in ("loss_curves.png", "loss_curves.csv", "results.json"):
        assert (out / f).stat().st_size > 0
    report = json.loads((out / "results.json").read_text())
    runs = report["runs"]
    assert [x["run"] for x in runs] == ["fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block"]
    for x in runs:
        assert not x["diverged"] and len(x["train_curve"]) == 12 and x["val_curve"]
        # initial weights predict ~uniform bytes (logits ~ 0): the first loss is ln 256, and
        # 12 steps on this repetitive corpus bring the validation loss down by over a nat
        assert abs(x["train_curve"][0][1] - LN256) < 0.05
        assert x["final_val_loss"] < LN256 - 1.0, x["val_curve"]
    assert runs[2]["fp8"]["casts_checked"] > 0 and runs[0]["fp8"] is None
    # each step beside bf16 autocast's: the "x bf16" column is step ms / bf16's step ms
    assert "x bf16" in r.stdout
    bf16_ms = runs[1]["step_ms_median"]
    for x in runs:
        row = next(line for line in r.stdout.splitlines() if line.startswith(x["run"] + " ")).split()
        assert float(row[4]) == pytest.approx(x["step_ms_median"], abs=0.06)
        assert float(row[5]) == pytest.approx(x["step_ms_median"] / bf16_ms, abs=0.006)
    csv_lines = (out / "loss_curves.csv").read_text().splitlines()
    assert csv_lines[0] == "run,step,split,loss,seed" and len(csv_lines) > 5 * 12
    assert "machine:" in r.stdout and "ETA:" in r.stdout  # the header names the ISA; the ETA comes first
    assert r.stdout.index("ETA:") < r.stdout.index("train loss")


def test_demo_divergence_exits_1(tmp_path, corpus, capsys):
    # An absurd learning rate blows the weights up: the loss becomes non-finite.
    rc = cli.main(["demo", *TINY, "--lr", "1e30", "--recipes", "fp32", "--data", str(corpus),
                   "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 1
    assert "DIVERGED" in capsys.readouterr().out


def test_inspect_factory_json(tmp_path, tiny_module):
    js = tmp_path / "report.json"
    r = _run(["inspect", "tinymod:make", "--input-shape", "16,64", "--json", str(js)], tmp_path, tiny_module)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "recommendations:" in r.stdout and "keep in high precision" in r.stdout
    layers = json.loads(js.read_text())["layers"]
    assert [e["layer"] for e in layers] == ["0", "2", "4"]
    for e in layers:
        assert set(e["roles"]) == {"input", "weight", "grad_output"}
        for role, r in e["roles"].items():
            # Format.AUTO's rule, from the report's own numbers: E5M2 only for range (E4M3 loses
            # over 1% of the non-zero values and E5M2 under half as many), else the higher SQNR.
            e4, e5 = r["formats"]["E4M3"], r["formats"]["E5M2"]
            lost4, lost5 = e4["overflow_pct"] + e4["underflow_pct"], e5["overflow_pct"] + e5["underflow_pct"]
            rng = lost4 > 1.0 and lost5 < 0.5 * lost4
            expect = "E5M2" if rng or e5["sqnr_db"] > e4["sqnr_db"] else "E4M3"
            assert r["recommended"] == expect, (e["layer"], role, r)
        assert e["roles"]["input"]["formats"]["E4M3"]["sqnr_db"] > 20
        # these gradients are near-Gaussian and fit E4M3's range: AUTO's rule gives E4M3 (the
        # old advice forced E5M2 on every gradient)
        assert e["roles"]["grad_output"]["recommended"] == "E4M3"
    assert layers[0]["roles"]["input"]["amax_range"] is not None
    assert layers[2]["keep_high_precision"]  # 48 -> 8: fewer than 16 features


def test_inspect_saved_model_and_input_file(tmp_path, tiny_module, capsys):
    import tinymod

    torch.save(tinymod.make(), tmp_path / "model.pt")
    torch.save(torch.randn(4, 10, 64), tmp_path / "x.pt")
    js = tmp_path / "r.json"
    rc = cli.main(["inspect", str(tmp_path / "model.pt"), "--input-file", str(tmp_path / "x.pt"),
                   "--steps", "2", "--json", str(js)])
    assert rc == 0
    assert len(json.loads(js.read_text())["layers"]) == 3


BAD = [
    ["demo", "--recipes", "fp32,fp4"],
    ["demo", "--steps", "0"],
    ["demo", "--steps", "many"],
    ["demo", "--data", "/no/such/corpus"],
    ["demo", "--d-model", "30", "--heads", "4"],
    ["inspect", "tinymod:nope", "--input-shape", "4,64"],
    ["inspect", "no_such_module_xyz:make", "--input-shape", "4,64"],
    ["inspect", "/no/such/model.pt", "--input-shape", "4,64"],
    ["inspect", "tinymod:make", "--input-shape", "4,x"],
    ["inspect", "tinymod:make", "--input-shape", "4,63"],
    ["inspect", "tinymod:make"],
    ["inspect", "tinymod:make", "--input-file", "/no/such/x.pt"],
    ["bogus"],
    [],
]


@pytest.mark.parametrize("args", BAD, ids=lambda a: " ".join(a) or "no-args")
def test_bad_arguments_exit_2_one_line(args, tiny_module, capsys):
    try:
        rc = cli.main(args)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "error" in err and "Traceback" not in err


def test_bad_argument_subprocess_no_traceback(tmp_path):
    r = _run(["demo", "--recipes", "nope"], tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "unknown recipe 'nope'" in r.stderr
