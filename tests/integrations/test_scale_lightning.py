"""fp8mix.integrations.lightning.FP8Precision under Lightning's sharded strategies, 2 gloo
CPU processes: FSDPStrategy (torch's FSDP1, every LlamaDecoderLayer wrapped, sharded
checkpoints) and ModelParallelStrategy (FSDP2: fully_shard in configure_model, FP8
all-gather, DCP checkpoints). A tiny transformers Llama (tests/integrations/scale_common.py)
trains 8 steps in FP8 with a checkpoint after epoch 1 (4 steps); fresh processes resume from
it and continue bit for bit (losses, weights, FP8 state); the FP8 run stays within
NEAR_PLAIN_RTOL of the same Trainer run without the plugin.

This file is also the worker: ``python test_scale_lightning.py rank port out_dir phase ckpt_dir``
(phase "full": the FP8 runs with their checkpoints, then the plain runs; "resume": the FP8
runs resumed), launched by tests/distributed/fsdp_launch.py.

Lightning 2.6.6 and FSDPStrategy on a CPU: its connector refuses accelerator="cpu" (a
check on the strategy's exact type: Lightning-AI/pytorch-lightning#21812), so the worker
uses a subclass that changes nothing else; and it wraps with ``device_id=None``, which
torch 2.13's FSDP1 refuses without an accelerator, so configure_model converts and wraps
(device_id=cpu) as the strategy would after the plugin's convert_module, and the strategy
leaves the wrapped model as it is. Sharded checkpoints, because full ones crash on CPU in
Lightning 2.6 (Lightning-AI/pytorch-lightning#21804). On GPUs none of this is needed.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")

from scale_common import assert_near_plain, assert_resumed, get, launch_phases  # noqa: E402

STACKS = ("fsdp1", "fsdp2")


# --------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------
def _lightning_module(stack: str, fp8: bool, convert: bool = True):
    import lightning.pytorch as L
    from scale_common import LR, LossLog, fp8_filter, tiny_llama

    import fp8mix

    class Lit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_llama()
            self.losses = LossLog(self.model)

        def configure_model(self):
            if getattr(self, "_sharded", False):
                return
            self._sharded = True
            if stack == "fsdp1":
                self._wrap_fsdp1()
                return
            from torch.distributed.fsdp import fully_shard
            if fp8 and convert:  # fully_shard shards the Parameters it finds: convert before it
                fp8mix.convert_model(self.model, module_filter_fn=fp8_filter, fsdp_fp8_all_gather=True)
            mesh = self.device_mesh["data_parallel"]
            for layer in self.model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.model, mesh=mesh)

        def _wrap_fsdp1(self):
            """What FSDPStrategy(auto_wrap_policy={LlamaDecoderLayer}) does after the plugin's
            convert_module, done here because Lightning 2.6.6 wraps with device_id=None,
            which torch's FSDP1 refuses on a CPU; the strategy leaves a wrapped model as it is."""
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            if fp8:  # as the plugin would (it then leaves the converted model alone)
                fp8mix.convert_model(self.model, module_filter_fn=fp8_filter)
            kw = dict(device_id=torch.device("cpu"), use_orig_params=True)
            layers = self.model.model.layers
            for i in range(len(layers)):
                layers[i] = FSDP(layers[i], **kw)
            self.model = FSDP(self.model, **kw)

        def training_step(self, batch, idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=LR)

    return Lit()


def _strategy(stack: str):
    import datetime

    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    timeout = datetime.timedelta(seconds=60)
    if stack == "fsdp2":
        return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, timeout=timeout)

    class CPUFSDPStrategy(FSDPStrategy):
        """FSDPStrategy as it is (the connector refuses the exact class on CPU)."""

    return CPUFSDPStrategy(state_dict_type="sharded", timeout=timeout)


def _plugin(stack: str):
    from scale_common import fp8_filter

    from fp8mix.integrations.lightning import FP8FSDPPrecision, FP8Precision
    from fp8mix.recipe import DelayedScaling
    cls = FP8FSDPPrecision if stack == "fsdp1" else FP8Precision  # (FSDPStrategy takes FSDPPrecision plugins only)
    return cls(recipe=DelayedScaling(amax_history_len=4), module_filter_fn=fp8_filter)


def _fit(stack: str, *, fp8: bool, root: str, resume: bool = False) -> dict:
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from scale_common import LOCAL_BATCH, SAVE_AT, STEPS, Counting, full_state

    lit = _lightning_module(stack, fp8)
    ckpt = ModelCheckpoint(dirpath=root, filename="epoch{epoch}", save_top_k=-1, every_n_epochs=1,
                           auto_insert_metric_name=False)
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=_strategy(stack),
                        plugins=[_plugin(stack)] if fp8 else [],
                        max_epochs=STEPS // SAVE_AT, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[ckpt] if fp8 and not resume else [], enable_checkpointing=fp8 and not resume)
    loader = torch.utils.data.DataLoader(Counting(n=SAVE_AT * LOCAL_BATCH * 2), batch_size=LOCAL_BATCH)
    trainer.fit(lit, loader, ckpt_path=os.path.join(root, "epoch0.ckpt") if resume else None)
    assert trainer.global_step == STEPS, trainer.global_step
    return {"losses": list(lit.losses), "state": full_state(trainer.strategy.model)}


def _sharded_unconverted() -> dict:
    """ModelParallelStrategy with a configure_model that shards without converting: the
    plugin refuses it at setup, on every rank alike (no collective left waiting)."""
    import lightning.pytorch as L
    from scale_common import LOCAL_BATCH, Counting
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=_strategy("fsdp2"),
                        plugins=[_plugin("fsdp2")], max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    try:
        trainer.fit(_lightning_module("fsdp2", True, convert=False),
                    torch.utils.data.DataLoader(Counting(n=16), batch_size=LOCAL_BATCH))
    except ValueError as e:
        return {"message": str(e)}
    return {"message": None}


def _worker(rank: int, port: int, out_dir: str, phase: str, ckpt_dir: str) -> None:
    from scale_common import init_worker, run_scenarios
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0")
    init_worker(rank, port)
    scenarios = []
    for stack in STACKS:
        root = os.path.join(ckpt_dir, stack)
        if phase == "full":
            scenarios.append((f"{stack}_fp8", lambda s=stack, r=root: _fit(s, fp8=True, root=r)))
            scenarios.append((f"{stack}_plain", lambda s=stack, r=root: _fit(s, fp8=False, root=r + "_plain")))
        else:
            scenarios.append((f"{stack}_fp8", lambda s=stack, r=root: _fit(s, fp8=True, root=r, resume=True)))
    if phase == "full":
        scenarios.append(("sharded_unconverted", _sharded_unconverted))
    run_scenarios(rank, out_dir, scenarios)


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch_phases(__file__, tmp_path_factory, "lightning")


@pytest.mark.parametrize("stack", STACKS)
def test_resumes_bit_for_bit(runs, stack):
    assert_resumed(runs, f"Lightning {stack}", key=f"{stack}_fp8")


@pytest.mark.parametrize("stack", STACKS)
def test_fp8_trains_near_the_plain_run(runs, stack):
    assert_near_plain(runs, f"Lightning {stack}", fp8=f"{stack}_fp8", plain=f"{stack}_plain")


def test_a_model_sharded_before_conversion_is_refused(runs):
    full, _ = runs
    for res in get(full, "sharded_unconverted"):
        assert res["message"] is not None and "convert_model" in res["message"] and "configure_model" in \
            res["message"], res["message"]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
