"""fp8mix.integrations.accelerate.prepare with the real Hugging Face Accelerate (pinned in
requirements-dev.txt) on CPU, mixed_precision "no" and "bf16": the optimizer made before
stays valid (same Parameters), a small model trains and ends near the same loop without
fp8mix, save_state / load_state resume bit for bit, evaluation leaves the FP8 state
untouched, and the error cases (mixed_precision="fp8", an already prepared model, bad
arguments) fail clearly."""
from __future__ import annotations

import copy

import pytest
import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState  # noqa: E402
from helpers import assert_same_state, fp8_state  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.integrations.accelerate import prepare  # noqa: E402
from fp8mix.recipe import DelayedScaling  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    AcceleratorState._reset_state(True)  # Accelerate keeps one process-wide state; each test makes its own
    yield
    AcceleratorState._reset_state(True)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 16))


def _batch(step):
    g = torch.Generator().manual_seed(100 + step % 8)
    x = torch.randn(32, 32, generator=g)
    return x, torch.tanh(x[:, :16] * 1.5 + x[:, 16:] * 0.5)


def _train(model, opt, accelerator, steps, start=0, save=None):
    losses = []
    for step in range(start, steps):
        x, y = _batch(step)
        loss = F.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
        if save is not None and step + 1 == save[0]:
            accelerator.save_state(save[1])
    return losses


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_trains_with_the_same_parameters_close_to_plain_accelerate(mixed_precision):
    ref = _mlp()
    ref_acc = accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    ref, ref_opt = ref_acc.prepare(ref, ref_opt)
    ref_losses = _train(ref, ref_opt, ref_acc, 24)
    AcceleratorState._reset_state(True)

    model = _mlp()
    params = list(model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # made before the conversion
    acc = accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    dtypes = set()
    model[4].register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    model, opt = prepare(acc, model, opt, recipe=DelayedScaling(amax_history_len=16))
    assert [p is q for p, q in zip(model.parameters(), params)] == [True] * len(params)
    assert [type(m) for m in model if isinstance(m, nn.Linear)] == [fp8mix.Linear] * 3
    losses = _train(model, opt, acc, 24)
    assert dtypes == {torch.bfloat16 if mixed_precision == "bf16" else torch.float32}
    assert model[0].fp8_steps[0] == 24
    first, last = torch.stack(losses[:8]).mean(), torch.stack(losses[-8:]).mean()
    ref_last = torch.stack(ref_losses[-8:]).mean()
    assert last < 0.6 * first, (first, last)
    assert not torch.equal(last, ref_last) and abs(last - ref_last) < 0.1 * ref_last, (last, ref_last)


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_save_state_load_state_resume_bit_identically(tmp_path, mixed_precision):
    recipe = DelayedScaling(amax_history_len=4)
    acc = accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = prepare(acc, model, opt, recipe=recipe)
    full = _train(model, opt, acc, 12, save=(5, tmp_path / "ckpt"))
    saved = safetensors.torch.load_file(tmp_path / "ckpt" / "model.safetensors")
    assert {k for k in saved if "fp8_" in k} == {k for k in model.state_dict() if "fp8_" in k}
    AcceleratorState._reset_state(True)

    acc2 = accelerate.Accelerator(mixed_precision=mixed_precision, cpu=True)
    model2 = _mlp(seed=7)  # other initial weights: everything must come from the checkpoint
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    model2, opt2 = prepare(acc2, model2, opt2, recipe=recipe)
    acc2.load_state(tmp_path / "ckpt")
    resumed = _train(model2, opt2, acc2, 12, start=5)
    for i, (a, b) in enumerate(zip(full[5:], resumed)):
        assert torch.equal(a, b), f"step {5 + i}: loss {a} vs {b}"
    a, b = model.state_dict(), model2.state_dict()
    assert a.keys() == b.keys() and any("fp8_amax_history" in k for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_evaluation_leaves_the_fp8_state_untouched():
    acc = accelerate.Accelerator(cpu=True)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = prepare(acc, model, opt)
    _train(model, opt, acc, 3)
    before = fp8_state(model)
    x, _ = _batch(50)
    model.eval()
    with torch.no_grad():
        out = model(x)
    model.train()
    with torch.no_grad():  # no_grad alone is read-only too
        model(x)
    after = fp8_state(model)
    assert_same_state(before, after)
    plain = _mlp(seed=3).eval()
    plain.load_state_dict(fp8mix.strip_fp8_state(model.state_dict()))
    with torch.no_grad():
        ref = plain(x)
    err = float((out - ref).norm() / ref.norm())
    assert 0 < err < 0.1, err  # evaluation ran in FP8 (the wrapped forward), close to float32


def test_deepcopy_of_a_prepared_model_runs_its_own_layers():
    acc = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    model = prepare(acc, _mlp())
    twin = copy.deepcopy(model)
    x, y = _batch(0)
    F.mse_loss(twin(x), y).backward()
    assert twin[0].fp8_steps[0] == 1 and model[0].fp8_steps[0] == 0  # the copy's forward is the copy's
    plain = acc.unwrap_model(twin, keep_fp32_wrapper=False)
    F.mse_loss(plain(x), y).backward()
    assert twin[0].fp8_steps[0] == 2 and model[0].fp8_steps[0] == 0


def test_unwrap_model_without_the_autocast_wrapper_keeps_fp8():
    acc = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    model = acc.unwrap_model(prepare(acc, _mlp()), keep_fp32_wrapper=False)  # Accelerate's bf16 autocast removed
    x, y = _batch(0)
    out = model(x)
    F.mse_loss(out, y).backward()
    assert out.dtype == torch.float32  # no autocast left ...
    assert model[0].fp8_steps[0] == 1  # ... but the forward still ran in FP8


def test_mixed_precision_fp8_is_refused():
    acc = accelerate.Accelerator(mixed_precision="fp8", cpu=True)
    model = _mlp()
    with pytest.raises(ValueError, match="mixed_precision='fp8'"):
        prepare(acc, model, torch.optim.AdamW(model.parameters()))
    assert type(model[0]) is nn.Linear  # refused before anything changed


def test_an_already_prepared_model_and_bad_arguments_are_refused():
    acc = accelerate.Accelerator(cpu=True)
    with pytest.raises(TypeError, match="Accelerator"):
        prepare(object(), _mlp())
    with pytest.raises(TypeError, match="nn.Module"):
        prepare(acc, "model")
    with pytest.raises(TypeError, match="recipe"):
        prepare(acc, _mlp(), recipe="delayed")
    with pytest.raises(TypeError, match="module_filter_fn"):
        prepare(acc, _mlp(), module_filter_fn=1)
    with pytest.raises(TypeError, match="monitor"):
        prepare(acc, _mlp(), monitor=object())
    done = acc.prepare(_mlp())
    with pytest.raises(ValueError, match="already prepared"):
        prepare(acc, done)
