"""`python -m fp8mix plan` (fp8mix.tools.plan): prints the table, writes the JSON that
fp8mix.Plan.load reads, refuses bad options with exit code 2 and one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import fp8mix
from fp8mix.tools import plan as plan_cli

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_prints_the_table_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = plan_cli.main(["plan_models:planted_mlp", "--input-shape", "64,64", "--batches", "3", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "fc2.lin" in text and "keep" in text and "FP8 share of GEMM FLOPs" in text and f"wrote {out}" in text
    plan = fp8mix.Plan.load(out)
    assert "fc2.lin" in plan.keep and plan.fp8 == ["fc1", "fc3"]
    assert json.load(open(out))["format"] == "fp8mix.plan"


def test_a_loss_function_and_candidates(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = plan_cli.main(["plan_models:planted_mlp", "--input-shape", "64,64", "--batches", "2", "--out", str(out),
                        "--loss", "plan_models:mse_loss", "--candidates", "current", "--metric", "sqnr"])
    assert rc == 0 and "--loss plan_models:mse_loss" in capsys.readouterr().out
    plan = fp8mix.Plan.load(out)
    assert list(plan.candidates) == ["current"] and plan.metric == "sqnr"


@pytest.mark.parametrize("extra, msg", [
    (["--candidates", "fast"], "--candidates"),
    (["--batches", "0"], "--batches"),
    (["--budget", "2"], "--budget"),
    (["--loss", "nowhere:fn"], "--loss"),
    (["--out", "/no/such/dir/p.json"], "--out"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, capsys, extra, msg):
    argv = ["plan_models:planted_mlp", "--input-shape", "64,64", "--out", str(tmp_path / "p.json")] + extra
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


def test_the_module_entry_point_runs(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "fp8mix.tools.plan", "plan_models:planted_mlp", "--input-shape", "64,64",
                        "--batches", "2", "--metric", "sqnr", "--out", str(out)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "fc2.lin" in r.stdout and out.exists()
