"""fp8mix with real Hugging Face transformers models (tiny configs, random init, no
downloads): LlamaForCausalLM and GPT2LMHeadModel (issue #12). References: the same model
without the fp8mix feature under test (no checkpointing, no generate() call, unconverted)."""
from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from helpers import assert_same_state, fp8_state  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.recipe import CurrentScaling, DelayedScaling  # noqa: E402


def _llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg)


def _gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg)


def _batch(seed, b=4, t=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (b, t), generator=g)


def _steps(model, recipe, steps=3, lr=1e-3, fixed_batch=False):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    out = []
    torch.manual_seed(1234)  # the same dropout masks for the runs compared
    for i in range(steps):
        ids = _batch(0 if fixed_batch else i)
        with fp8mix.fp8_autocast(fp8_recipe=recipe):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        out.append((loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()
                                            if p.grad is not None}))
        opt.step()
        opt.zero_grad()
    return out


@pytest.mark.parametrize("reentrant", [None, True, False], ids=["hf_default", "reentrant", "non_reentrant"])
def test_llama_gradient_checkpointing_equals_no_checkpointing(reentrant):
    base = fp8mix.convert_model(_llama(), module_filter_fn=lambda m, fqn: fqn != "lm_head")
    ckpt = copy.deepcopy(base)
    kw = None if reentrant is None else {"use_reentrant": reentrant}
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    ckpt.train()
    base.train()
    rec = DelayedScaling(amax_history_len=8)
    ref, got = _steps(base, rec), _steps(ckpt, rec)
    for i, ((l0, g0), (l1, g1)) in enumerate(zip(ref, got)):
        assert torch.equal(l0, l1), f"step {i}: loss {l0} vs {l1}"
        assert g0.keys() == g1.keys()
        for n in g0:
            assert torch.equal(g0[n], g1[n]), f"step {i}: gradient of {n} differs"
    assert_same_state(fp8_state(base), fp8_state(ckpt))


def test_generate_under_fp8_autocast_leaves_the_fp8_state_untouched():
    model = fp8mix.convert_model(_llama(1))
    _steps(model, DelayedScaling(amax_history_len=8), steps=2)
    before = fp8_state(model)
    model.eval()
    with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=8)):
        out = model.generate(_batch(9, b=2, t=6), max_new_tokens=5, do_sample=False)
    assert out.shape == (2, 11)
    assert_same_state(before, fp8_state(model))  # generate() changed none of it


def test_gpt2_conv1d_is_converted_and_trains():
    plain = _gpt2(2)
    model = copy.deepcopy(plain)
    keys = set(plain.state_dict())
    fp8mix.convert_model(model)
    convs = [n for n, m in model.named_modules() if isinstance(m, fp8mix.nn.Conv1D)]
    assert len(convs) == 8  # c_attn, c_proj, c_fc, mlp.c_proj per layer
    assert {k for k in model.state_dict() if "fp8_" not in k} == keys
    ids = _batch(3)
    model.eval()
    plain.eval()
    with torch.no_grad():  # outside fp8_autocast: Hugging Face's Conv1D, bit for bit
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)
    model.train()
    plain.train()
    losses = [float(v) for v, _ in _steps(model, CurrentScaling(), steps=12, lr=3e-3, fixed_batch=True)]
    ref = [float(v) for v, _ in _steps(plain, CurrentScaling(), steps=12, lr=3e-3, fixed_batch=True)]
    assert losses[-1] < 0.9 * losses[0], losses
    assert abs(losses[-1] - ref[-1]) < 0.05 * ref[-1], (losses, ref)


def test_save_pretrained_from_pretrained_convert_restores_fp8_state(tmp_path):
    model = fp8mix.convert_model(_llama(4))
    rec = DelayedScaling(amax_history_len=8)
    _steps(model, rec, steps=2)
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    fp8mix.convert_model(loaded)
    restored = fp8mix.load_fp8_state(loaded, tmp_path)
    assert len(restored) == sum(isinstance(m, fp8mix.Linear) for m in model.modules())
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ids = _batch(5)
    model.eval()
    loaded.eval()
    with torch.no_grad(), fp8mix.fp8_autocast(fp8_recipe=rec):
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path)  # a plain model loads the same file
    assert not any(isinstance(m, fp8mix.Linear) for m in plain.modules())
