"""fp8mix.integrations.transformers.FP8TrainerCallback with the real Hugging Face Trainer
(transformers pinned in requirements-dev.txt) on CPU, on a tiny LlamaForCausalLM built from
a config (no downloads): it trains near the Trainer without the callback, with
gradient_checkpointing=True bit-identical to without, a run resumed from a save_strategy
checkpoint equals the uninterrupted run bit for bit, evaluation leaves the FP8 state
untouched, bf16=True and an optimizer passed in work, and the error cases fail clearly."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from helpers import assert_same_state, fp8_state  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.integrations.transformers import FP8TrainerCallback  # noqa: E402
from fp8mix.recipe import DelayedScaling  # noqa: E402

VOCAB = 64


def _llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


class Counting(torch.utils.data.Dataset):
    """Sequences start, start+k, start+2k, ... (mod VOCAB): learnable in a few steps."""

    def __init__(self, n=32, t=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        k = torch.randint(1, 3, (n, 1), generator=g)
        self.ids = (start + k * torch.arange(t)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _record_losses(model) -> list:
    """The exact loss of every training forward (the Trainer logs rounded means)."""
    out: list = []
    model.register_forward_hook(lambda m, i, o: out.append(o.loss.detach().clone())
                                if m.training and torch.is_grad_enabled() else None)
    return out


def _args(out, **kw):
    opts = dict(output_dir=str(out), max_steps=8, per_device_train_batch_size=4, learning_rate=1e-2,
                save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True, logging_steps=4,
                dataloader_num_workers=0)
    opts.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing: the deprecated alias the issue names
        return transformers.TrainingArguments(**opts)


def _callback():
    return FP8TrainerCallback(recipe=DelayedScaling(amax_history_len=4),
                              module_filter_fn=lambda m, fqn: fqn != "lm_head")


def _train(out, seed=0, fp8=True, resume=None, **kw):
    model = _llama(seed)
    losses = _record_losses(model)
    trainer = transformers.Trainer(model=model, args=_args(out, **kw), train_dataset=Counting(),
                                   callbacks=[_callback()] if fp8 else [])
    trainer.train(resume_from_checkpoint=resume)
    return model, losses, trainer


def _without_rng_keys(sd: dict) -> dict:
    """A state dict without the stochastic-rounding keys (fp8_rng[0]), which each conversion in a
    process draws afresh (a checkpoint restores them); the stream offsets (fp8_rng[1]) stay."""
    return {k: v[1:] if k.endswith("fp8_rng") else v for k, v in sd.items()}


def test_trains_with_gradient_checkpointing_and_resumes_bit_identically(tmp_path):
    full, losses, _ = _train(tmp_path / "a", gradient_checkpointing=True, save_strategy="steps", save_steps=4)
    assert full.is_gradient_checkpointing
    assert type(full.lm_head) is torch.nn.Linear and type(full.model.layers[0].mlp.up_proj) is fp8mix.Linear
    assert full.model.layers[0].self_attn.q_proj.fp8_steps[0] == 8
    assert losses[-1] < losses[0] - 0.4, losses  # from ln(64) ~ 4.16 at init

    nogc, nogc_losses, _ = _train(tmp_path / "b")  # torch.utils.checkpoint changes nothing
    assert len(nogc_losses) == 8 and all(torch.equal(a, b) for a, b in zip(losses, nogc_losses))
    assert_same_state(_without_rng_keys(full.state_dict()), _without_rng_keys(nogc.state_dict()))

    ref, ref_losses, _ = _train(tmp_path / "c", fp8=False)  # the Trainer without fp8mix
    assert not torch.equal(losses[-1], ref_losses[-1]) and abs(losses[-1] - ref_losses[-1]) < 0.05 * ref_losses[-1]

    resumed, res_losses, _ = _train(tmp_path / "d", seed=5, gradient_checkpointing=True,
                                    resume=str(tmp_path / "a" / "checkpoint-4"))
    assert len(res_losses) == 4
    for i, (a, b) in enumerate(zip(losses[4:], res_losses)):
        assert torch.equal(a, b), f"step {4 + i}: loss {a} vs {b}"
    assert_same_state(full.state_dict(), resumed.state_dict())  # weights and FP8 state


def test_evaluate_is_fp8_and_leaves_the_fp8_state_untouched(tmp_path):
    model, _, trainer = _train(tmp_path, max_steps=2, bf16=True)
    before = fp8_state(model)
    metrics = trainer.evaluate(Counting(n=8, seed=1))
    assert_same_state(before, fp8_state(model))
    plain = _llama(seed=3)
    plain.load_state_dict(fp8mix.strip_fp8_state(model.state_dict()))
    ref = transformers.Trainer(model=plain, args=_args(tmp_path / "ref", bf16=True)).evaluate(Counting(n=8, seed=1))
    assert metrics["eval_loss"] != ref["eval_loss"]  # evaluation ran in FP8 ...
    assert abs(metrics["eval_loss"] - ref["eval_loss"]) < 0.02 * ref["eval_loss"]  # ... close to high precision


def test_bf16_and_an_optimizer_made_before_the_trainer(tmp_path):
    model = _llama()
    dtypes: set = set()
    model.lm_head.register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    w0 = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path, max_steps=2, bf16=True),
                                   train_dataset=Counting(), callbacks=[_callback()], optimizers=(opt, None))
    trainer.train()
    assert dtypes == {torch.bfloat16}  # the high-precision lm_head ran under the Trainer's bf16 autocast
    layer = model.model.layers[0].mlp.up_proj
    assert type(layer) is fp8mix.Linear and layer.weight.dtype == torch.float32
    assert any(p is layer.weight for g in opt.param_groups for p in g["params"])
    assert not torch.equal(layer.weight, w0)  # the optimizer made before the conversion trained it


def test_model_init_is_converted_and_its_resume_refused(tmp_path):
    trainer = transformers.Trainer(model_init=lambda: _llama(), args=_args(tmp_path, max_steps=4, save_strategy="steps",
                                                                             save_steps=2),
                                   train_dataset=Counting(), callbacks=[_callback()])
    trainer.train()
    assert type(trainer.model.model.layers[0].mlp.up_proj) is fp8mix.Linear
    assert trainer.model.model.layers[0].mlp.up_proj.fp8_steps[0] == 4
    with pytest.raises(RuntimeError, match="model_init"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_mixed_precision_fp8_and_bad_arguments_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    model = _llama()
    with pytest.raises(ValueError, match="fp8"):
        transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=Counting(), callbacks=[_callback()])
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    with pytest.raises(TypeError, match="recipe"):
        FP8TrainerCallback(recipe="delayed")
    with pytest.raises(TypeError, match="module_filter_fn"):
        FP8TrainerCallback(module_filter_fn="lm_head")
    with pytest.raises(TypeError, match="monitor"):
        FP8TrainerCallback(monitor=1)
