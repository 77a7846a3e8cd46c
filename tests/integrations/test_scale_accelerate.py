"""fp8mix.integrations.accelerate.prepare with Accelerate's FSDP2 plugin
(FullyShardedDataParallelPlugin(fsdp_version=2), LlamaDecoderLayer auto-wrap, sharded
state dicts), 2 gloo CPU processes: the tiny Llama (tests/integrations/scale_common.py)
trains 8 steps in FP8 with ``accelerator.save_state`` after 4; fresh processes
``load_state`` and continue bit for bit (losses, weights, FP8 state); the FP8 run stays
within NEAR_PLAIN_RTOL of the same loop through ``accelerator.prepare`` alone.

Accelerate 1.15 turns FSDP on only for GPU-like devices: on a CPU its state stays
MULTI_CPU and the plugin is dropped (scale_common.accelerate_fsdp_on_cpu says where, and
sets the two fields it would have set); everything after that -- prepare's fully_shard,
the optimizer's parameter swap, save_state / load_state through DCP -- is Accelerate's own.

This file is also the worker: ``python test_scale_accelerate.py rank port out_dir phase ckpt_dir``.
"""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from scale_common import assert_near_plain, assert_resumed, launch_phases, worker  # noqa: E402


# --------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------
def _train(rank: int, *, fp8: bool, ckpt: str, resume: bool = False) -> dict:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from scale_common import accelerate_fsdp_on_cpu, accelerate_run, full_state

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                            state_dict_type="SHARDED_STATE_DICT", reshard_after_forward=True)
    accelerator = accelerate_fsdp_on_cpu(plugin)

    def check(model):
        assert accelerator.is_fsdp2 and type(model).__name__.startswith("FSDP"), type(model)

    model, losses = accelerate_run(accelerator, rank, fp8=fp8, ckpt=ckpt, resume=resume, check=check)
    return {"losses": losses, "state": full_state(model)}  # (no end_training: it ends the process group)


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch_phases(__file__, tmp_path_factory, "accelerate")


def test_resumes_bit_for_bit(runs):
    assert_resumed(runs, "Accelerate FSDP2")


def test_fp8_trains_near_the_plain_run(runs):
    assert_near_plain(runs, "Accelerate FSDP2")


if __name__ == "__main__":
    worker(sys.argv[1:], _train)
