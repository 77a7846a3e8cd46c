"""The launch and host-sync budget of one fp8mix.Linear training step (issue #16).

Every op a steady-state forward + backward dispatches (view-like ops excluded) is a kernel
launch on a GPU; counted here on the CPU with a TorchDispatchMode, so the budget cannot
regress unnoticed. Targets: <= 10 ops for delayed and current scaling, <= 12 for block
scaling (three GEMMs, the casts, the delayed-scaling state update). And no host sync
(``aten._local_scalar_dense``, i.e. .item()/bool()/tolist()) in the step for any recipe, also
with FP8GradScaler's feedback collecting and an unsampled Monitor attached.
"""
from __future__ import annotations

import pytest
import torch
from helpers import RECIPES as DEFAULT_RECIPES
from helpers import OpNames

import fp8mix
from fp8mix.recipe import DelayedScaling

VIEWS = {"view", "t", "reshape", "select", "slice", "_unsafe_view", "as_strided", "expand", "unsqueeze", "squeeze",
         "transpose", "detach", "alias", "permute", "_reshape_alias", "view_as"}
BUDGET = {"delayed": 10, "current": 10, "block": 12, "delayed_sr": 10}
RECIPES = dict(DEFAULT_RECIPES, delayed_sr=lambda: DelayedScaling(rounding="stochastic"))


def _step_ops(recipe_name, *, feedback=False, monitor=None):
    torch.manual_seed(0)
    lin = fp8mix.Linear(256, 256)
    rec = RECIPES[recipe_name]()
    x = torch.randn(64, 256, requires_grad=True)
    for _ in range(2):  # past the first use of every role: the steady state
        with fp8mix.fp8_autocast(fp8_recipe=rec, monitor=monitor):
            lin(x).sum().backward()
    x.grad = lin.weight.grad = lin.bias.grad = None  # so autograd assigns the new gradients (no add)
    stats = fp8mix.grad_stats.GradStats()
    if feedback:
        stats.activate()
    dy = torch.randn(64, 256)
    try:
        with OpNames() as c:
            with fp8mix.fp8_autocast(fp8_recipe=rec, monitor=monitor):
                y = lin(x)
            y.backward(dy)
    finally:
        stats.deactivate()
    if feedback:
        assert stats.pop()["numel"] == dy.numel()  # the feedback really counted this step's cast
    return [o for o in c.names if o not in VIEWS]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_ops_per_layer_step_within_budget(recipe):
    ops = _step_ops(recipe)
    assert len(ops) <= BUDGET[recipe], f"{recipe}: {len(ops)} ops > {BUDGET[recipe]}: {ops}"
    assert ops.count("scaled_mm") == 3


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_no_host_sync_with_feedback_and_an_unsampled_monitor(recipe):
    mon = fp8mix.Monitor(every=1000)
    mon.step()  # step 1 of 1000: not sampling
    assert not mon.sampling
    ops = _step_ops(recipe, feedback=True, monitor=mon)
    syncs = [o for o in ops if o in ("_local_scalar_dense", "item", "_to_copy", "copy_")]
    assert not syncs, f"{recipe}: host syncs / copies in the step: {ops}"
