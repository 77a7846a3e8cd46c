"""fp8mix.integrations.transformers.FP8TrainerCallback with the Hugging Face Trainer under
FSDP2 (``fsdp=True``, ``fsdp_config={"version": 2, ...}``, sharded checkpoints),
2 gloo CPU processes: the tiny Llama (tests/integrations/scale_common.py) trains 8 steps
in FP8 with a save_strategy checkpoint after 4; fresh processes
``train(resume_from_checkpoint=...)`` and continue bit for bit (losses, weights, FP8
state); the FP8 run stays within NEAR_PLAIN_RTOL of the Trainer without the callback.

On a CPU, Accelerate 1.15 drops the Trainer's FSDP plugin and the Trainer would run DDP
without a word; scale_common.accelerate_fsdp_on_cpu records FSDP in the (shared)
Accelerate state before the Trainer makes its Accelerator, and the test checks that the
Trainer did shard (``trainer.is_fsdp_enabled``, an FSDP2 model).

This file is also the worker: ``python test_scale_hf_trainer.py rank port out_dir phase ckpt_dir``.
"""
from __future__ import annotations

import os
import sys
import warnings

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from scale_common import assert_near_plain, assert_resumed, launch_phases, worker  # noqa: E402

FSDP_CONFIG = {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
               "state_dict_type": "SHARDED_STATE_DICT"}


# --------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------
def _train(rank: int, *, fp8: bool, ckpt: str, resume: bool = False) -> dict:
    """The Trainer's output_dir is `ckpt`."""
    import transformers
    from accelerate.utils import FullyShardedDataParallelPlugin
    from scale_common import (
        LOCAL_BATCH,
        LR,
        SAVE_AT,
        STEPS,
        Counting,
        LossLog,
        accelerate_fsdp_on_cpu,
        fp8_filter,
        full_state,
        tiny_llama,
    )

    from fp8mix.integrations.transformers import FP8TrainerCallback
    from fp8mix.recipe import DelayedScaling

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = transformers.TrainingArguments(
            output_dir=ckpt, max_steps=STEPS, per_device_train_batch_size=LOCAL_BATCH, learning_rate=LR,
            lr_scheduler_type="constant", save_strategy="steps" if fp8 else "no", save_steps=SAVE_AT, report_to=[],
            use_cpu=True, seed=0, disable_tqdm=True, logging_steps=SAVE_AT, dataloader_num_workers=0,
            fsdp=True, fsdp_config=dict(FSDP_CONFIG), save_only_model=False)
    accelerate_fsdp_on_cpu(FullyShardedDataParallelPlugin(**args.fsdp_plugin_args))
    model = tiny_llama()
    losses = LossLog(model)
    callbacks = [FP8TrainerCallback(recipe=DelayedScaling(amax_history_len=4), module_filter_fn=fp8_filter)] \
        if fp8 else []
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Counting(), callbacks=callbacks)
    assert trainer.is_fsdp_enabled
    trainer.train(resume_from_checkpoint=os.path.join(ckpt, f"checkpoint-{SAVE_AT}") if resume else None)
    assert type(trainer.model).__name__.startswith("FSDP"), type(trainer.model)
    assert trainer.state.global_step == STEPS
    return {"losses": list(losses), "state": full_state(trainer.model)}


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch_phases(__file__, tmp_path_factory, "trainer")


def test_resumes_bit_for_bit(runs):
    assert_resumed(runs, "HF Trainer FSDP2")


def test_fp8_trains_near_the_plain_run(runs):
    assert_near_plain(runs, "HF Trainer FSDP2")


if __name__ == "__main__":
    worker(sys.argv[1:], _train)
