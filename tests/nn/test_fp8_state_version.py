"""The FP8 state's version (fp8mix.nn.fp8_state.FP8_STATE_VERSION, the fp8_version buffer):
saved with the state, through state_dict() and torch.distributed.checkpoint; a checkpoint
without it (every fp8mix before it: version 1) loads with its state intact; one written by a
newer fp8mix is refused with a ValueError naming the module and both versions, in
load_state_dict and in a DCP load alike."""
from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

import fp8mix
from fp8mix.nn.fp8_state import FP8_STATE_KEYS, FP8_STATE_VERSION


def _trained() -> fp8mix.Linear:
    torch.manual_seed(0)
    lin = fp8mix.Linear(32, 16)
    for _ in range(3):
        with fp8mix.fp8_autocast(fp8_recipe=fp8mix.recipe.DelayedScaling(amax_history_len=4)):
            lin(torch.randn(8, 32)).sum().backward()
    return lin


def test_version_is_a_saved_buffer():
    lin = fp8mix.Linear(32, 16)
    sd = lin.state_dict()
    assert "fp8_version" in FP8_STATE_KEYS and FP8_STATE_VERSION >= 2
    assert sd["fp8_version"].dtype == torch.int64 and int(sd["fp8_version"]) == FP8_STATE_VERSION
    lin.reset_fp8_state()
    assert int(lin.fp8_version) == FP8_STATE_VERSION
    lin.half()  # a dtype move keeps it an integer
    assert lin.fp8_version.dtype == torch.int64


def test_a_version_1_checkpoint_loads_with_its_state():
    src = _trained()
    sd = src.state_dict()
    del sd["fp8_version"]  # what every fp8mix before the version buffer wrote
    dst = fp8mix.Linear(32, 16)
    dst.load_state_dict(sd, strict=True)
    for k in ("fp8_amax_history", "fp8_scale", "fp8_steps", "fp8_grad_pending", "fp8_rng"):
        assert torch.equal(getattr(dst, k), getattr(src, k)), k
    assert int(src.fp8_steps[0]) == 3 and int(dst.fp8_version) == FP8_STATE_VERSION


@pytest.mark.parametrize("bad", [FP8_STATE_VERSION + 1, 0, 99])
def test_a_newer_or_invalid_version_is_refused(bad):
    sd = _trained().state_dict()
    sd["fp8_version"] = torch.tensor(bad)
    dst = fp8mix.Linear(32, 16)
    before = {k: getattr(dst, k).clone() for k in ("fp8_scale", "fp8_steps")}
    with pytest.raises(ValueError, match=rf"fp8mix.Linear: .*fp8_version\) is version {bad}; this fp8mix reads "
                                         rf"versions 1 to {FP8_STATE_VERSION}"):
        dst.load_state_dict(sd)
    for k, v in before.items():  # nothing was half-loaded
        assert torch.equal(getattr(dst, k), v), k


def test_a_nested_module_names_its_prefix_and_a_non_integer_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), fp8mix.Linear(8, 8))
    sd = model.state_dict()
    sd["1.fp8_version"] = torch.tensor(FP8_STATE_VERSION + 1)
    with pytest.raises(ValueError, match=r"\(1\.fp8_version\)"):
        model.load_state_dict(sd)
    sd["1.fp8_version"] = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="not one integer"):
        model.load_state_dict(sd)


def test_dcp_round_trip_keeps_the_state_and_refuses_a_newer_version(tmp_path):
    src = _trained()
    dcp.save({"model": src.state_dict()}, checkpoint_id=str(tmp_path / "ok"))
    dst = fp8mix.Linear(32, 16)
    sd = {"model": dst.state_dict()}
    dcp.load(sd, checkpoint_id=str(tmp_path / "ok"))
    dst.load_state_dict(sd["model"])
    for k in FP8_STATE_KEYS:
        assert torch.equal(getattr(dst, k), getattr(src, k)), k
    assert torch.equal(dst.weight, src.weight)
    with torch.no_grad():
        src.fp8_version.fill_(FP8_STATE_VERSION + 1)  # as a newer fp8mix would have saved it
    dcp.save({"model": src.state_dict()}, checkpoint_id=str(tmp_path / "new"))
    fresh = fp8mix.Linear(32, 16)
    sd = {"model": fresh.state_dict()}
    dcp.load(sd, checkpoint_id=str(tmp_path / "new"))  # DCP reads the bytes in place...
    with pytest.raises(ValueError, match=f"is version {FP8_STATE_VERSION + 1}"):
        fresh.load_state_dict(sd["model"])  # ...and the module refuses them
