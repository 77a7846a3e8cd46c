"""fp8mix.integrations.lightning.FP8Precision with the real PyTorch Lightning (pinned in
requirements-dev.txt) on CPU: a small LightningModule trains (and ends near the same
model trained by Lightning without the plugin), a run resumed from a mid-run checkpoint
equals the uninterrupted run bit for bit, evaluation leaves the FP8 state untouched,
checkpoints load into the plain module, loss scaling skips a broken step, bad arguments
fail clearly."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

L = pytest.importorskip("lightning.pytorch")

from helpers import assert_same_state, fp8_state  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.integrations.lightning import FP8Precision  # noqa: E402
from fp8mix.recipe import CurrentScaling, DelayedScaling  # noqa: E402

BATCHES = 6  # per epoch


class Net(L.LightningModule):
    """A 3-layer MLP regression; no dropout, so two runs differ only by what is tested."""

    def __init__(self, lr: float = 1e-2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 16))
        self.lr = lr
        self.losses: list = []
        self.out_dtypes: set = set()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, idx):
        x, y = batch
        out = self(x)
        self.out_dtypes.add(out.dtype)
        loss = F.mse_loss(out.float(), y)
        self.losses.append(loss.detach().clone())
        return loss

    def validation_step(self, batch, idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x).float(), y))

    def test_step(self, batch, idx):
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x).float(), y))

    def predict_step(self, batch, idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _data(n=BATCHES * 32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = torch.tanh(x[:, :16] * 1.5 + x[:, 16:] * 0.5)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)  # not shuffled


def _net(seed=0, **kw) -> Net:
    torch.manual_seed(seed)
    return Net(**kw)


def _trainer(plugin=None, **kw):
    opts = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0)
    opts.update(kw)
    return L.Trainer(plugins=[] if plugin is None else [plugin], **opts)


def test_trains_in_fp8_close_to_lightning_without_the_plugin():
    ref, model = _net(), _net()
    _trainer(max_epochs=4).fit(ref, _data())
    _trainer(FP8Precision(recipe=DelayedScaling(amax_history_len=16)), max_epochs=4).fit(model, _data())
    assert all(type(m) is fp8mix.Linear for m in model.net if isinstance(m, nn.Linear))
    assert model.net[0].fp8_steps[0] == 4 * BATCHES  # one record per training forward
    first, last = torch.stack(model.losses[:BATCHES]).mean(), torch.stack(model.losses[-BATCHES:]).mean()
    assert last < 0.6 * first, (first, last)
    ref_last = torch.stack(ref.losses[-BATCHES:]).mean()
    assert not torch.equal(last, ref_last)  # FP8 really ran ...
    assert abs(last - ref_last) < 0.1 * ref_last, (last, ref_last)  # ... and trains as float32 does


def test_resume_from_mid_run_checkpoint_is_bit_identical(tmp_path):
    ckpt = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    full = _net()
    _trainer(FP8Precision(recipe=DelayedScaling(amax_history_len=4)), max_epochs=4, callbacks=[ckpt],
             enable_checkpointing=True).fit(full, _data(), _data(seed=1))
    resumed = _net(seed=5)  # other initial weights: everything must come from the checkpoint
    _trainer(FP8Precision(recipe=DelayedScaling(amax_history_len=4)), max_epochs=4).fit(
        resumed, _data(), _data(seed=1), ckpt_path=str(tmp_path / "epoch=1.ckpt"))
    assert len(resumed.losses) == 2 * BATCHES
    for i, (a, b) in enumerate(zip(full.losses[2 * BATCHES:], resumed.losses)):
        assert torch.equal(a, b), f"step {2 * BATCHES + i}: loss {a} vs {b}"
    assert_same_state(full.state_dict(), resumed.state_dict())  # weights and FP8 state
    assert resumed.net[0].fp8_steps[0] == 4 * BATCHES


def test_checkpoint_state_dict_loads_into_the_plain_module(tmp_path):
    model = _net()
    trainer = _trainer(FP8Precision(), max_epochs=1)
    trainer.fit(model, _data())
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    assert not [k for k in ckpt["state_dict"] if "fp8_" in k]
    assert_same_state(ckpt["FP8Precision"]["fp8_state"], fp8_state(model))
    plain = Net.load_from_checkpoint(path)  # strict=True: the plain module loads it as it is
    assert all(type(m) is nn.Linear for m in plain.net if isinstance(m, nn.Linear))
    assert torch.equal(plain.net[0].weight, model.net[0].weight)


def test_validate_test_predict_leave_the_fp8_state_untouched():
    model = _net()
    trainer = _trainer(FP8Precision(), max_epochs=1)
    trainer.fit(model, _data(), _data(seed=1))  # validation ran after the epoch
    assert model.net[0].fp8_steps[0] == BATCHES
    before = fp8_state(model)
    trainer.validate(model, _data(seed=2), verbose=False)
    trainer.test(model, _data(seed=3), verbose=False)
    fp8_pred = torch.cat(trainer.predict(model, _data(seed=4)))
    assert_same_state(before, fp8_state(model))
    hp = _trainer(FP8Precision(fp8_evaluation=False))
    hp_pred = torch.cat(hp.predict(model, _data(seed=4)))
    plain = _net(seed=9).eval()
    plain.load_state_dict(fp8mix.strip_fp8_state(model.state_dict()))
    with torch.no_grad():
        ref = plain(_data(seed=4).dataset.tensors[0])
    assert torch.equal(hp_pred, ref)  # fp8_evaluation=False: nn.Linear, bit for bit
    err = float((fp8_pred - ref).norm() / ref.norm())
    assert 0 < err < 0.1, err  # FP8, close to it
    assert_same_state(before, fp8_state(model))


def test_bf16_autocast_filter_and_a_second_fit():
    model = _net()
    plugin = FP8Precision(recipe=CurrentScaling(), module_filter_fn=lambda m, fqn: fqn != "net.4",
                          dtype=torch.bfloat16)
    trainer = _trainer(plugin, max_epochs=2)
    trainer.fit(model, _data())
    assert type(model.net[4]) is nn.Linear and type(model.net[0]) is fp8mix.Linear
    assert model.out_dtypes == {torch.bfloat16}  # the high-precision last layer ran under bf16 autocast
    assert model.net[0].weight.dtype == torch.float32
    assert torch.stack(model.losses[-BATCHES:]).mean() < 0.7 * torch.stack(model.losses[:BATCHES]).mean()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a converted module is not converted again (that warns)
        plugin.convert_module(model)
    assert type(model.net[4]) is nn.Linear


def test_scaler_skips_an_inf_step_and_is_checkpointed(tmp_path):
    class Broken(Net):
        def training_step(self, batch, idx):
            loss = super().training_step(batch, idx)
            return loss * float("inf") if self.global_step == 3 else loss

    class Weights(L.Callback):
        def __init__(self):
            self.after = []

        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            self.after.append(module.net[0].weight.detach().clone())

    torch.manual_seed(0)
    model, seen = Broken(), Weights()
    scaler = fp8mix.FP8GradScaler(init_scale=2.0 ** 8, growth_interval=1000)
    trainer = _trainer(FP8Precision(scaler=scaler), max_steps=5, callbacks=[seen])
    trainer.fit(model, _data())
    w = seen.after
    assert len(w) == 5 and not torch.equal(w[1], w[2]) and not torch.equal(w[3], w[4])
    assert torch.equal(w[2], w[3])  # step 3 (inf loss) skipped: the weights did not move
    assert scaler.get_scale() == 2.0 ** 7  # and the scale backed off
    path = tmp_path / "s.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=False)["FP8Precision"]["scaler"]["scale"] == 2.0 ** 7


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"dtype": torch.float16}, ValueError, "dtype"),
    ({"recipe": "delayed"}, TypeError, "recipe"),
    ({"module_filter_fn": 3}, TypeError, "module_filter_fn"),
    ({"scaler": torch.amp.GradScaler("cpu")}, TypeError, "FP8GradScaler"),
    ({"fp8_evaluation": 1}, TypeError, "fp8_evaluation"),
    ({"monitor": object()}, TypeError, "monitor"),
])
def test_bad_arguments_raise_clearly(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        FP8Precision(**kwargs)


def test_the_plugin_and_a_precision_flag_together_are_refused_by_lightning():
    with pytest.raises(ValueError, match="precision"):
        L.Trainer(accelerator="cpu", precision="bf16-mixed", plugins=[FP8Precision()], logger=False)


def test_the_fsdp_plugin_is_an_fsdp_precision_and_an_fp8_precision():
    """FSDPStrategy accepts only FSDPPrecision plugins: FP8FSDPPrecision is one, behaves as
    FP8Precision (its recipe, filter and checks), gives FSDP a float32 config and has no
    scaler (trained under FSDPStrategy in tests/integrations/test_scale_lightning.py)."""
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from lightning.pytorch.strategies import FSDPStrategy

    from fp8mix.integrations.lightning import FP8FSDPPrecision
    plugin = FP8FSDPPrecision(recipe=CurrentScaling(), module_filter_fn=lambda m, fqn: "2" not in fqn)
    assert isinstance(plugin, FSDPPrecision) and isinstance(plugin, FP8Precision)
    strategy = FSDPStrategy()
    strategy.precision_plugin = plugin  # (a plain FP8Precision raises TypeError here)
    with pytest.raises(TypeError, match="FSDPPrecision"):
        strategy.precision_plugin = FP8Precision()
    cfg = plugin.mixed_precision_config
    assert (cfg.param_dtype, cfg.reduce_dtype, cfg.buffer_dtype) == (torch.float32,) * 3
    assert plugin.scaler is None and plugin.recipe == CurrentScaling()
    net = _net()
    plugin.convert_module(net)
    assert type(net.net[0]) is fp8mix.Linear and type(net.net[2]) is torch.nn.Linear
    with pytest.raises(TypeError, match="scaler"):
        FP8FSDPPrecision(scaler=fp8mix.FP8GradScaler())  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="dtype"):
        FP8FSDPPrecision(dtype=torch.float16)
