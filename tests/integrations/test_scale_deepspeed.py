"""fp8mix.integrations.accelerate.prepare with DeepSpeed ZeRO-2 through Accelerate
(DeepSpeedPlugin, zero_optimization.stage=2), 2 CPU processes on gloo (DeepSpeed's CPU
accelerator, DS_ACCELERATOR=cpu): the tiny Llama (tests/integrations/scale_common.py)
trains 8 steps in FP8 with ``accelerator.save_state`` after 4; fresh processes
``load_state`` and continue bit for bit (losses, weights, FP8 state); the FP8 run stays
within NEAR_PLAIN_RTOL of the same loop through ``accelerator.prepare`` alone. Skipped
where deepspeed does not import (it is not in requirements-dev.txt).

This file is also the worker: ``python test_scale_deepspeed.py rank port out_dir phase ckpt_dir``.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from scale_common import assert_near_plain, assert_resumed, get, launch_phases, worker  # noqa: E402


def ds_config() -> dict:
    """ZeRO-2 in float32 (fp8mix does the FP8 part): gradients all-reduced in buckets (gloo has
    no reduce-scatter), optimizer state and gradients partitioned over the 2 ranks."""
    from scale_common import LOCAL_BATCH
    return {"train_micro_batch_size_per_gpu": LOCAL_BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 2, "reduce_scatter": False, "overlap_comm": False,
                                  "contiguous_gradients": False},
            "fp16": {"enabled": False}, "bf16": {"enabled": False}, "zero_allow_untested_optimizer": True,
            "steps_per_print": 10 ** 6}


# --------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------
def _train(rank: int, *, fp8: bool, ckpt: str, resume: bool = False) -> dict:
    import datetime

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
    from scale_common import accelerate_run

    AcceleratorState._reset_state(True)  # a second DeepSpeed Accelerator in the process (the plain run)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config()),
                              kwargs_handlers=[InitProcessGroupKwargs(backend="gloo",
                                                                      timeout=datetime.timedelta(seconds=60))])

    def check(model):
        assert type(model).__name__ == "DeepSpeedEngine" and model.zero_optimization_stage() == 2, type(model)

    model, losses = accelerate_run(accelerator, rank, fp8=fp8, ckpt=ckpt, resume=resume, check=check)
    state = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    return {"losses": losses, "state": state}


def _zero3_refused() -> dict:
    """ZeRO-3 partitions the weights fp8mix casts: prepare refuses it before anything changes."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin
    from scale_common import tiny_llama

    from fp8mix.integrations.accelerate import prepare
    AcceleratorState._reset_state(True)
    cfg = ds_config()
    cfg["zero_optimization"] = {"stage": 3}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=cfg))
    model = tiny_llama()
    try:
        prepare(accelerator, model, torch.optim.AdamW(model.parameters()))
    except NotImplementedError as e:
        return {"message": str(e), "linear": type(model.model.layers[0].mlp.up_proj).__module__}
    return {"message": None}


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch_phases(__file__, tmp_path_factory, "deepspeed")


def test_resumes_bit_for_bit(runs):
    assert_resumed(runs, "DeepSpeed ZeRO-2")


def test_fp8_trains_near_the_plain_run(runs):
    assert_near_plain(runs, "DeepSpeed ZeRO-2")


def test_zero3_is_refused(runs):
    full, _ = runs
    for res in get(full, "zero3"):
        assert res["message"] is not None and "ZeRO stage 3" in res["message"], res["message"]
        assert res["linear"] == "torch.nn.modules.linear"  # refused before converting


if __name__ == "__main__":
    worker(sys.argv[1:], _train, extra=(("zero3", _zero3_refused),), ACCELERATE_USE_DEEPSPEED="true")
