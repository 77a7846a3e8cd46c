"""Porting Transformer Engine scripts: TE's quickstart (examples/te_quickstart.py, written
from TE's docs/examples/quickstart.ipynb) runs with only its imports changed to
``import fp8mix as te`` and ``from fp8mix.recipe import ...``, and computes what the
plain-PyTorch layer computes; the seed text's spellings convert_module_to_fp8 and
FP8GlobalState.fp8_autocast work as aliases; TE's gradient-accumulation convention
(is_first_microbatch) on the fused modules."""
from __future__ import annotations

import copy
import importlib.util
import pathlib
import re

import pytest
import torch
import torch.nn as nn
from helpers import sqnr_db

import fp8mix

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "te_quickstart.py"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


def _load_example():
    spec = importlib.util.spec_from_file_location("te_quickstart", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_only_the_imports_name_fp8mix():
    code = [ln for ln in EXAMPLE.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    body = "\n".join(code)
    body = body.split('"""', 2)[2]  # after the module docstring
    lines = [ln for ln in body.splitlines() if "fp8mix" in ln]
    assert lines == ["import fp8mix as te", "from fp8mix.recipe import DelayedScaling, Format"]
    assert re.search(r"\bte\.(TransformerLayer|LayerNormLinear|LayerNormMLP|LayerNorm|Linear|fp8_autocast)\(", body)


def test_the_quickstart_runs_and_its_versions_agree():
    q = _load_example()
    res = q.main(["--hidden", "64", "--seq", "16", "--batch", "2", "--ffn", "128", "--heads", "4", "--iters", "1"])
    out = res["outputs"]
    for name in ("te_basic", "fused", "te_layer"):  # every TE version computes the plain layer's function
        torch.testing.assert_close(out[name], out["basic"], rtol=1e-5, atol=1e-5)
    assert torch.equal(out["fused"], out["basic"])  # LayerNormLinear / LayerNormMLP: exactly torch's ops
    x, fp8 = res["input"], out["te_layer_fp8"]
    assert sqnr_db(out["basic"] - x, fp8 - x) >= 20  # what the layer adds to its input, in FP8
    assert not torch.equal(fp8, out["te_layer"])
    assert set(res["ms"]) == {"basic", "te_basic", "fused", "te_layer", "te_layer_fp8"}


def test_seed_text_aliases():
    """The seed's pseudo-code: a recipe, convert_module_to_fp8(model, recipe), then
    ``with FP8GlobalState.fp8_autocast(enabled=True, fp8_recipe=recipe)``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    ref = copy.deepcopy(model)
    fp8_recipe = fp8mix.recipe.DelayedScaling(margin=0, interval=1, fp8_format=fp8mix.Format.E4M3,
                                              amax_history_len=16, amax_compute_algo="max")
    model = fp8mix.convert_module_to_fp8(model, fp8_recipe)
    assert isinstance(model[0], fp8mix.Linear) and isinstance(model[2], fp8mix.Linear)
    assert fp8mix.FP8GlobalState.fp8_autocast is fp8mix.fp8_autocast
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, target = torch.randn(64, 32), torch.randn(64, 16)
    with fp8mix.FP8GlobalState.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
        assert fp8mix.FP8GlobalState.is_fp8_enabled() and fp8mix.FP8GlobalState.get_fp8_recipe() is fp8_recipe
        out = model(x)
    assert sqnr_db(ref(x), out) >= 25
    losses = []
    for _ in range(20):
        with fp8mix.FP8GlobalState.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
            loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0]
    with pytest.raises(TypeError, match="namespace"):
        fp8mix.FP8GlobalState()
    with pytest.raises(TypeError, match="recipe must be an fp8mix.recipe"):
        fp8mix.convert_module_to_fp8(nn.Linear(32, 32), "delayed")


def test_te_gradient_accumulation_on_fused_modules():
    """TE's is_first_microbatch: cast and keep the FP8 weights on the first micro-batch,
    reuse them on the others; gradients as casting every time."""
    torch.manual_seed(3)
    a = fp8mix.LayerNormMLP(64, 128, activation="swiglu")
    b = copy.deepcopy(a)
    xs = [torch.randn(8, 64) for _ in range(3)]
    for i, x in enumerate(xs):
        with fp8mix.fp8_autocast(fp8_recipe=fp8mix.recipe.CurrentScaling()):
            ya, yb = a(x, is_first_microbatch=i == 0), b(x)
        assert torch.equal(ya, yb)
        ya.sum().backward()
        yb.sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
