"""``python -m fp8mix demo --seeds N``: every variant trained for N seeds from the same
initial weights and batches per seed, and the gap to float32 reported as mean +- 95%
interval of the paired differences, checked here with float64 math and a printed t table.
"""
from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from tiny_demo import TINY

from fp8mix.tools import cli
from fp8mix.tools.demo import main

T975 = {1: 12.706, 2: 4.303, 3: 3.182}  # Student t, 97.5% quantile, by degrees of freedom


def test_same_seed_same_init_and_batches_for_every_variant(tmp_path, corpus, monkeypatch):
    seen = []
    real = main.train_one

    def spy(name, base, cfg, data, *args, **kw):
        seen.append((name, cfg.seed, {k: v.clone() for k, v in base.state_dict().items()}, data[2].clone(),
                     data[3].clone()))
        return real(name, base, cfg, data, *args, **kw)

    monkeypatch.setattr(main, "train_one", spy)
    rc = cli.main(["demo", *TINY, "--steps", "4", "--recipes", "fp32,fp8-delayed", "--seeds", "2", "--seed", "7",
                   "--data", str(corpus), "--out", str(tmp_path / "o")])
    assert rc == 0
    assert [(n, s) for n, s, *_ in seen] == [("fp32", 7), ("fp8-delayed", 7), ("fp32", 8), ("fp8-delayed", 8)]

    def same(a, b):
        return all(torch.equal(a[2][k], b[2][k]) for k in a[2]) and torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])
    assert same(seen[0], seen[1]) and same(seen[2], seen[3])
    assert not torch.equal(seen[0][2]["tok.weight"], seen[2][2]["tok.weight"])
    assert not torch.equal(seen[0][3], seen[2][3])


def test_gaps_over_seeds_match_float64_math(tmp_path, corpus, capsys):
    out = tmp_path / "o"
    rc = cli.main(["demo", *TINY, "--recipes", "fp32,fp8-delayed,fp8-current", "--seeds", "3",
                   "--data", str(corpus), "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["seeds"] == [0, 1, 2] and len(doc["runs"]) == 9
    assert [(r["run"], r["seed"]) for r in doc["runs"][:3]] == [("fp32", 0), ("fp8-delayed", 0), ("fp8-current", 0)]
    loss = {(r["run"], r["seed"]): r["final_val_loss"] for r in doc["runs"]}
    for v in ("fp8-delayed", "fp8-current"):
        d = [100.0 * (loss[v, s] - loss["fp32", s]) / loss["fp32", s] for s in range(3)]
        mean, sd = sum(d) / 3, statistics.stdev(d)
        half = T975[2] * sd / math.sqrt(3)
        g = doc["gaps"][v]
        assert g["n"] == 3 and g["diffs"] == pytest.approx(d, rel=1e-12)
        assert g["mean"] == pytest.approx(mean, rel=1e-12) and g["sd"] == pytest.approx(sd, rel=1e-9)
        assert abs(g["half95"] - half) <= 2e-4 * half  # the table's 3 decimals
        inside = mean - half <= 0 <= mean + half
        assert g["verdict"].startswith("within noise at this size" if inside else ("worse by" if mean > 0 else
                                                                                   "better by"))
        assert g["verdict"] in text and g["seeds_for_target"] >= 2
    assert "seeds for 0.25%" in text and "means over 3 seeds" in text
    assert (out / "val_gap.png").stat().st_size > 0 and (out / "loss_curves.png").stat().st_size > 0
    rows = (out / "loss_curves.csv").read_text().splitlines()
    assert rows[0] == "run,step,split,loss,seed" and {r.rsplit(",", 1)[1] for r in rows[1:]} == {"0", "1", "2"}


def test_bad_seeds_is_a_usage_error(capsys):
    assert cli.main(["demo", "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert "--seeds must be >= 1, got 0" in err and len(err.strip().splitlines()) == 1
