"""The demo's time budget (fp8mix.tools.demo.budget): timed steps, ETA, a slow bfloat16
skipped in the default set and kept (with a note) when --recipes asks for it."""
from __future__ import annotations

import argparse
import json

import pytest
import torch
from tiny_demo import TINY

from fp8mix.tools import cli
from fp8mix.tools.demo import budget, data, main, model, train

CFG = argparse.Namespace(eval_batches=8, eval_every=50)


def test_slow_bf16_is_skipped_from_the_default_set():
    step = {"fp32": [0.1, 0.3, 0.1], "bf16": [4.5], "fp8-delayed": [0.2, 0.2, 0.25]}
    left = {"fp32": 400, "bf16": 400, "fp8-delayed": 400}
    plan = budget.plan_runs(["fp32", "bf16", "fp8-delayed"], step, left, CFG, explicit=False, torch_isa="AVX2")
    assert plan.runs == ["fp32", "fp8-delayed"] and list(plan.skipped) == ["bf16"]
    assert "took 45x" in plan.skipped["bf16"] and "AVX2" in plan.skipped["bf16"]
    assert any("--recipes fp32,bf16,fp8-delayed" in n for n in plan.notes)
    share = 1.0 + 8 / (3.0 * 50)  # validation: 8 forward batches (~1/3 step each) every 50 steps
    # ETA from the median step, the bf16 ratio from the fastest (4.5 / 0.1 = 45x)
    assert plan.eta_s == pytest.approx({"fp32": 400 * 0.1 * share, "fp8-delayed": 400 * 0.2 * share})
    assert plan.total_s == pytest.approx(400 * 0.3 * share)


def test_slow_bf16_ratio_uses_the_fastest_steps():
    """One fp32 step slowed by another process must not hide a slow bf16 (medians 1.0 vs 2.0
    would say 2x; the fastest steps 0.3 vs 2.0 say 6.7x)."""
    samples = {"fp32": [1.0, 0.3, 1.2], "bf16": [2.0]}
    plan = budget.plan_runs(["fp32", "bf16"], samples, {"fp32": 10, "bf16": 10}, CFG, explicit=False, torch_isa="X")
    assert plan.runs == ["fp32"] and "took 7x" in plan.skipped["bf16"]
    assert plan.step_s == {"fp32": 1.0, "bf16": 2.0}


def test_slow_bf16_runs_when_asked_for_and_fast_bf16_always_runs():
    step = {"fp32": [0.1], "bf16": [4.5]}
    plan = budget.plan_runs(["fp32", "bf16"], step, {"fp32": 10, "bf16": 10}, CFG, explicit=True, torch_isa="AVX2")
    assert plan.runs == ["fp32", "bf16"] and not plan.skipped
    assert plan.notes and "runs because --recipes asked for it" in plan.notes[0]
    fast = {"fp32": [0.1], "bf16": [0.1 * budget.SLOW_BF16]}  # at the threshold: not slow
    plan = budget.plan_runs(["fp32", "bf16"], fast, {"fp32": 10, "bf16": 10}, CFG, explicit=False, torch_isa="X")
    assert plan.runs == ["fp32", "bf16"] and not plan.notes


def test_format_duration():
    assert budget.format_duration(45) == "45 s"
    assert budget.format_duration(192) == "3.2 min"
    assert budget.format_duration(5400) == "1.5 h"


def _tiny_setup():
    cfg = argparse.Namespace(steps=12, lr=3e-3, warmup=1, seq_len=32, eval_every=6, seed=0, eval_batches=2)
    corpus = torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    tr, va = data.split_corpus(corpus, 32)
    starts = data.draw_starts(tr, va, steps=12, batch_size=4, eval_batches=2, seq_len=32, seed=0)
    torch.manual_seed(0)
    return cfg, tr, va, starts, model.GPT(1, 32, 1, 32)


@pytest.mark.parametrize("name", ["fp32", "fp8-delayed"])
def test_probe_leaves_the_runs_unchanged(name):
    """A probe before a run changes neither torch's RNG state nor the run's losses."""
    cfg, tr, va, (ts, vs), base = _tiny_setup()
    ref = train.train_one(name, base, cfg, (tr, va, ts, vs), torch.device("cpu"), False)
    rng = torch.get_rng_state()
    t = budget.probe([name, "bf16"], base, cfg, tr, ts, torch.device("cpu"))
    assert set(t) == {name, "bf16"} and all(1 <= len(v) <= budget.PROBE_STEPS and min(v) > 0 for v in t.values())
    assert torch.equal(torch.get_rng_state(), rng)
    again = train.train_one(name, base, cfg, (tr, va, ts, vs), torch.device("cpu"), False)
    assert again["train_curve"] == ref["train_curve"] and again["val_curve"] == ref["val_curve"]


def _fake_probe(times):
    def probe(names, *args):
        return {n: [times[n]] for n in names}
    return probe


def test_demo_skips_a_slow_bf16_and_says_so(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setattr(main, "probe", _fake_probe({"fp32": 0.01, "bf16": 0.4, "fp8-delayed": 0.02}))
    rc = cli.main(["demo", *TINY, "--data", str(corpus), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "bf16: skipped - a bfloat16 step took 40x a float32 one here" in out
    assert "Run it anyway with --recipes fp32,bf16,fp8-delayed" in out
    assert out.index("ETA: ~") < out.index("train loss")
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [r["run"] for r in doc["runs"]] == ["fp32", "fp8-delayed"]
    assert list(doc["plan"]["skipped"]) == ["bf16"]
    assert doc["machine"]["fp8mix_isa"] and doc["machine"]["torch_cpu_capability"]


def test_demo_runs_a_slow_bf16_that_was_asked_for(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setattr(main, "probe", _fake_probe({"fp32": 0.01, "bf16": 0.4}))
    rc = cli.main(["demo", *TINY, "--recipes", "fp32,bf16", "--data", str(corpus), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert rc == 0 and "it runs because --recipes asked for it" in out
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert [r["run"] for r in doc["runs"]] == ["fp32", "bf16"]


def test_fit_steps_arithmetic():
    # 400 steps in ~600 s against a 300 s budget: half, rounded down to a multiple of eval_every
    assert budget.MIN_FIT_STEPS == 200
    assert budget.fit_steps(400, 400.0, 300.0, 50) == 300
    assert budget.fit_steps(400, 360.0, 300.0, 50) == 300  # 333 -> 300
    assert budget.fit_steps(400, 350.0, 300.0, 7) == 336  # int(342.9) = 342 -> 336 = 48 * 7
    assert budget.fit_steps(400, 299.0, 300.0, 50) == 400  # fits: unchanged
    assert budget.fit_steps(400, 1e6, 300.0, 50) == budget.MIN_FIT_STEPS  # never below the floor
    assert budget.fit_steps(160, 1e6, 300.0, 50) == 160  # nor above what was asked


def _demo_argv(tmp_path, corpus, *extra):
    tiny = [a for i, a in enumerate(TINY) if a != "--steps" and (i == 0 or TINY[i - 1] != "--steps")]
    return ["demo", *tiny, "--recipes", "fp32,fp8-delayed", "--data", str(corpus), "--out", str(tmp_path / "o"),
            *extra]


def test_default_demo_is_shortened_to_the_budget(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setattr(main, "probe", _fake_probe({"fp32": 50.0, "fp8-delayed": 50.0}))
    monkeypatch.setattr(budget, "MIN_FIT_STEPS", 12)  # the floor, so that the test trains 12 steps, not 100
    assert cli.main(_demo_argv(tmp_path, corpus)) == 0
    out = capsys.readouterr().out
    assert "over the default demo's 5 minutes: training 12 steps per run instead (--steps 400 trains them all)" \
        in out
    assert "- over 5 minutes" in out  # even the floor exceeds it at 50 s a step: the ETA says so
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert doc["config"]["steps"] == 12 and doc["config"]["warmup"] == 1
    assert all(len(r["train_curve"]) == 12 for r in doc["runs"])


def test_explicit_steps_are_never_shortened(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setattr(main, "probe", _fake_probe({"fp32": 5.0, "fp8-delayed": 5.0}))
    assert cli.main(_demo_argv(tmp_path, corpus, "--steps", "12")) == 0
    assert "steps per run instead" not in capsys.readouterr().out
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert doc["config"]["steps"] == 12


@pytest.mark.parametrize("extra,may_fit", [([], True), (["--steps", "400"], False), (["--seeds", "2"], False),
                                           (["--checkpoint-dir", "ck"], False)])
def test_only_the_default_demo_may_be_shortened(tmp_path, extra, may_fit):
    """Several seeds are a study the user asked for, and checkpointed runs must keep their
    configuration to resume: neither is shortened."""
    args = cli.build_parser().parse_args(["demo", "--out", str(tmp_path / "o"), *extra])
    _, choices, _ = main._prepare(args)
    assert choices.may_fit is may_fit and args.steps == 400 and args.warmup == 20


def test_auto_threads_uses_one_thread_only_on_a_machine_busier_than_its_cores():
    from fp8mix.tools.demo.main import auto_threads

    assert auto_threads(load=0.3, cpus=2, current=2) == (2, "")
    assert auto_threads(load=1.9, cpus=2, current=2) == (2, "")
    n, note = auto_threads(load=2.0, cpus=2, current=2)
    assert n == 1 and "load 2.0 on 2 CPUs" in note and "--threads 2" in note
    assert auto_threads(load=9.0, cpus=2, current=1) == (1, "")  # already one thread: nothing to say


def test_threads_option_sets_torchs_thread_count_and_rejects_zero():
    import types

    import torch

    from fp8mix.tools._common import UsageError
    from fp8mix.tools.demo.main import _choose_threads

    before = torch.get_num_threads()
    try:
        choices = types.SimpleNamespace(may_fit=True)
        assert _choose_threads(types.SimpleNamespace(threads=1), choices, torch.device("cpu")) == ""
        assert torch.get_num_threads() == 1
        with pytest.raises(UsageError, match="--threads must be >= 1"):
            _choose_threads(types.SimpleNamespace(threads=0), choices, torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
