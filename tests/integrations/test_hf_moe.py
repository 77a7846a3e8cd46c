"""fp8mix.convert_model on Hugging Face mixture-of-experts models (transformers >= 5;
tiny configs, random init, no downloads): the stacked-3-D expert modules of Mixtral,
Qwen2-MoE, Qwen3-MoE and OLMoE become fp8mix's (fp8mix.nn.hf_experts), the router stays,
per-expert nn.Linear experts (SwitchTransformers) convert as Linears. References: the same
model unconverted, with Hugging Face's eager experts implementation (bit for bit) and its
default grouped_mm one (to rounding), and its gradients."""
from __future__ import annotations

import copy
import io
import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import fp8mix  # noqa: E402
from fp8mix.nn.hf_experts import HFExperts  # noqa: E402
from fp8mix.recipe import CurrentScaling, DelayedScaling  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 128
_ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "attn_implementation": "eager"}
_SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, **_ATTN}

# name -> (config class, causal-LM class, config kwargs, number of experts, top-k)
MODELS = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {**_SMALL, "intermediate_size": 96, "num_local_experts": 8, "num_experts_per_tok": 2}, 8, 2),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {**_SMALL, "intermediate_size": 96, "moe_intermediate_size": 48,
                   "shared_expert_intermediate_size": 64, "num_experts": 6, "num_experts_per_tok": 2}, 6, 2),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {**_SMALL, "head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 48, "num_experts": 4,
                   "num_experts_per_tok": 2, "norm_topk_prob": True}, 4, 2),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              {**_SMALL, "intermediate_size": 48, "num_experts": 8, "num_experts_per_tok": 2}, 8, 2),
}
NAMES = list(MODELS)


def _model(name, seed=0, impl="eager"):
    cfg_cls, lm_cls, kw, _, _ = MODELS[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**kw)
    model = getattr(transformers, lm_cls)(cfg)
    model.set_experts_implementation(impl)
    return model


def _ids(seed, b=3, t=20):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _experts(model):
    return {n: m for n, m in model.named_modules() if type(m).__name__.endswith("Experts")}


@pytest.mark.parametrize("name", NAMES)
def test_convert_model_converts_the_experts_and_keeps_the_router(name):
    plain = _model(name)
    model = copy.deepcopy(plain)
    experts = _experts(model)
    params = {n: id(p) for n, p in model.named_parameters()}
    classes = {n: type(m) for n, m in experts.items()}
    fp8mix.convert_model(model)
    assert len(experts) == 2
    for n, m in experts.items():
        assert n in model.fp8_conversion
        assert isinstance(m, HFExperts) and isinstance(m, classes[n])  # still the HF class for transformers
        assert m.fp8_gemms == 2 * MODELS[name][3]
        assert m.fp8_scale.shape == (3 * m.fp8_gemms,)
        router = model.get_submodule(n.rsplit(".", 1)[0] + ".gate")
        assert not isinstance(router, fp8mix.nn.FP8StateMixin)  # the router stays in high precision
    assert {n: id(p) for n, p in model.named_parameters()} == params  # the same Parameter objects
    assert {k for k in model.state_dict() if ".fp8_" not in k} == set(plain.state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", NAMES)
def test_outside_fp8_autocast_the_output_is_hugging_faces(name, dtype):
    plain = _model(name).to(dtype)
    model = fp8mix.convert_model(copy.deepcopy(plain))
    ids = _ids(1)
    with torch.no_grad():
        got = model(input_ids=ids).logits
        assert torch.equal(got, plain(input_ids=ids).logits)  # eager: the same rows, GEMMs and sum order
        plain.set_experts_implementation("grouped_mm")  # transformers' default sums the top-k in another order
        ref = plain(input_ids=ids).logits
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    torch.testing.assert_close(got, ref, **tol)


@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_experts_module_equals_eager_for_any_routing(top_k, dtype):
    """Module level, with routings the router would not give: experts left empty, one
    expert taking every token, a single token, no token."""
    plain = _model("mixtral").to(dtype)
    ref = plain.model.layers[0].mlp.experts
    mod = copy.deepcopy(ref)
    fp8mix.convert_model(mod)
    assert isinstance(mod, HFExperts)
    g = torch.Generator().manual_seed(top_k)
    for tokens, pick in ((40, 8), (40, top_k), (1, 8), (0, 8)):  # pick: how many experts get tokens
        h = torch.randn(tokens, 64, generator=g).to(dtype)
        idx = torch.stack([torch.randperm(pick, generator=g)[:top_k] for _ in range(tokens)]) if tokens \
            else torch.zeros(0, top_k, dtype=torch.int64)
        w = torch.rand(tokens, top_k, generator=g)
        with torch.no_grad():
            assert torch.equal(mod(h, idx, w), ref(h, idx, w)), (tokens, pick)
            assert torch.equal(mod(h, idx, w.to(dtype)), ref(h, idx, w.to(dtype))), (tokens, pick)


@pytest.mark.parametrize("config, experts", [("DeepseekV3Config", "deepseek_v3.modeling_deepseek_v3.DeepseekV3Experts"),
                                             ("Qwen3NextConfig", "qwen3_next.modeling_qwen3_next.Qwen3NextExperts"),
                                             ("GraniteMoeConfig", "granitemoe.modeling_granitemoe.GraniteMoeExperts")])
def test_other_families_experts_convert_and_equal_eager(config, experts):
    """Three more families' experts modules (of the ~50 with this layout in transformers 5),
    built alone from their configs."""
    import importlib
    cfg = getattr(transformers, config)(hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
    for k in ("num_experts", "num_local_experts", "n_routed_experts"):
        if hasattr(cfg, k):
            setattr(cfg, k, 6)
    cfg.num_experts_per_tok = 2
    cfg._experts_implementation = "eager"
    mod_name, cls_name = experts.rsplit(".", 1)
    torch.manual_seed(0)
    ref = getattr(importlib.import_module(f"transformers.models.{mod_name}"), cls_name)(cfg)
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.1)
    mod = fp8mix.convert_model(copy.deepcopy(ref))
    assert isinstance(mod, HFExperts) and mod.fp8_gemms == 12
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(30, 64, generator=g), torch.rand(30, 2, generator=g)
    idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(30)])
    with torch.no_grad():
        assert torch.equal(mod(h, idx, w), ref(h, idx, w))


def test_gradients_reach_every_expert_and_equal_eager():
    plain = _model("mixtral", seed=3)
    model = fp8mix.convert_model(copy.deepcopy(plain))
    ids = _ids(2, b=4, t=32)
    for m in (plain, model):
        m(input_ids=ids, labels=ids).loss.backward()
    ref = dict(plain.named_parameters())
    experts = 0
    for n, p in model.named_parameters():
        assert p.grad is not None, n
        torch.testing.assert_close(p.grad, ref[n].grad, rtol=1e-4, atol=1e-6, msg=n)
        if n.endswith(("gate_up_proj", "down_proj")):
            experts += 1
            per_expert = p.grad.flatten(1).abs().amax(dim=1)
            assert (per_expert > 0).all(), f"{n}: experts without gradient: {(per_expert == 0).nonzero().tolist()}"
    assert experts == 4
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n.endswith("mlp.gate.weight"))


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_checkpoints_move_between_converted_and_plain_models(name, tmp_path):
    model = fp8mix.convert_model(_model(name, seed=5))
    plain = _model(name, seed=6)  # other weights, overwritten by the load
    plain.load_state_dict(fp8mix.strip_fp8_state(model.state_dict()), strict=True)
    back = fp8mix.convert_model(_model(name, seed=7))
    back.load_state_dict(plain.state_dict(), strict=True)  # FP8 state buffers are optional on load
    a, b, c = model.state_dict(), plain.state_dict(), back.state_dict()
    assert a.keys() == c.keys()
    for k in b:
        assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k
    model.save_pretrained(tmp_path)  # Hugging Face's own format and loader
    loaded = type(plain).from_pretrained(tmp_path, attn_implementation="eager", experts_implementation="eager")
    sd = loaded.state_dict()
    assert sd.keys() == b.keys() and all(torch.equal(sd[k], b[k]) for k in b)
    ids = _ids(4)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_unconvert_model_restores_the_hugging_face_class():
    plain = _model("qwen3_moe", seed=8)
    model = fp8mix.convert_model(copy.deepcopy(plain))
    fp8mix.unconvert_model(model)
    for n, m in _experts(model).items():
        assert type(m) is type(plain.get_submodule(n)) and not hasattr(m, "fp8_scale")
    assert model.state_dict().keys() == plain.state_dict().keys()
    ids = _ids(5)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_a_converted_model_copies_pickles_and_moves_dtype():
    from fp8mix.nn import hf_experts
    model = fp8mix.convert_model(_model("mixtral", seed=9))
    ids = _ids(7)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        assert torch.equal(copy.deepcopy(model)(input_ids=ids).logits, ref)
        buf = io.BytesIO()
        torch.save(model, buf)
        hf_experts._CLASSES.clear()  # as in a fresh process: the converted class is made again on load
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        mod = loaded.model.layers[0].mlp.experts
        assert isinstance(mod, HFExperts) and isinstance(mod, type(_model("mixtral").model.layers[0].mlp.experts))
        assert torch.equal(loaded(input_ids=ids).logits, ref)
    loaded.to(torch.bfloat16)  # the FP8 state keeps its dtypes
    assert mod.gate_up_proj.dtype == torch.bfloat16 and mod.fp8_scale.dtype == torch.float32


def test_fsdp_fp8_all_gather_leaves_the_experts_weights_in_high_precision():
    model = fp8mix.convert_model(_model("mixtral"), fsdp_fp8_all_gather=True)
    skipped = model.fp8_conversion.fp8_all_gather_skipped
    assert sorted(skipped) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert "model.layers.0.self_attn.q_proj" in model.fp8_conversion.fp8_all_gather


def test_expert_ids_out_of_range_raise():
    mod = fp8mix.convert_model(copy.deepcopy(_model("mixtral").model.layers[0].mlp.experts))
    h, w = torch.randn(5, 64), torch.rand(5, 2)
    for bad in (8, -1):
        idx = torch.tensor([[0, 1]] * 4 + [[2, bad]])
        with pytest.raises(ValueError, match=r"expert ids outside \[0, 8\)"):
            mod(h, idx, w)
    with pytest.raises(ValueError, match="top_k_index and top_k_weights"):
        mod(h, torch.zeros(5, 2, dtype=torch.int64), torch.rand(5, 3))


def test_an_unsupported_expert_layout_stays_in_high_precision_with_the_reason():
    """GPT-OSS's experts: transposed (E, H, 2I) weights with biases, interleaved gate/up
    and its own clamped gate."""
    torch.manual_seed(0)
    cfg = transformers.GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                    num_local_experts=4, num_experts_per_tok=2, head_dim=16, **_ATTN)
    model = transformers.GptOssForCausalLM(cfg)
    with pytest.warns(UserWarning, match="GptOssExperts"):
        fp8mix.convert_model(model)
    (name, reason), = [(k, v) for k, v in model.fp8_conversion.skipped.items() if k.endswith("experts")]
    assert "is_transposed" in reason and "has_bias" in reason and "_apply_gate" in reason, reason
    assert not isinstance(model.get_submodule(name), fp8mix.nn.FP8StateMixin)


def test_per_expert_linear_experts_convert_as_linears():
    """SwitchTransformers keeps each expert as its own nn.Linear pair: convert_model's
    Linear conversion covers them; outside fp8_autocast the model is unchanged."""
    torch.manual_seed(0)
    cfg = transformers.SwitchTransformersConfig(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=96, num_layers=2,
                                                num_decoder_layers=2, num_heads=4, num_experts=4,
                                                encoder_sparse_step=1, decoder_sparse_step=1,
                                                decoder_start_token_id=0, pad_token_id=0)
    plain = transformers.SwitchTransformersForConditionalGeneration(cfg).eval()
    model = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # leaving the routers out is by intent: no warning
        fp8mix.convert_model(model)
    experts = [n for n, m in model.named_modules() if ".experts.expert_" in n and isinstance(m, fp8mix.Linear)]
    assert len(experts) == 4 * 2 * 4  # (wi, wo) x 4 experts x 4 sparse blocks
    routers = [n for n, m in model.named_modules() if n.endswith("router.classifier")]
    assert len(routers) == 4
    for n in routers:  # the routers' nn.Linear stays in high precision
        assert type(model.get_submodule(n)) is torch.nn.Linear
        assert model.fp8_conversion.skipped[n].startswith("the router of a mixture-of-experts block"), n
    ids = _ids(6, b=2, t=12)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, labels=ids).logits, plain(input_ids=ids, labels=ids).logits)


# ---- FP8 training (needs the FP8 grouped forward of fp8mix.nn._grouped) -----------------------------


def _fp8_grouped_missing():
    """Why the FP8 expert GEMMs cannot run yet (None: they can)."""
    mod = fp8mix.convert_model(copy.deepcopy(_model("mixtral").model.layers[0].mlp.experts))
    idx = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(i))[:2] for i in range(16)])
    try:
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
            mod(torch.randn(16, 64), idx, torch.rand(16, 2))
    except NotImplementedError as exc:
        return ("the FP8 grouped GEMM path is not on main yet: fp8mix.nn._grouped.grouped_linear_forward raises "
                f"NotImplementedError inside fp8_autocast ({exc})")
    return None


_MISSING = _fp8_grouped_missing()
needs_fp8_grouped = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


def _text_batches(steps, b=4, t=32, seed=0):
    """(steps, b, t + 1) byte windows of this Python's standard library sources (tokens < VOCAB)."""
    import json.decoder
    import os.path as osp
    data = b""
    for f in (osp.__file__, copy.__file__, json.decoder.__file__):
        with open(f, "rb") as fh:
            data += fh.read()
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long() % VOCAB
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - t - 1, (steps, b), generator=g)
    return tokens[starts[..., None] + torch.arange(t + 1)]


def _train(model, batches, recipe=None, opt=None, opt_state=None):
    """Losses of one AdamW step per batch (inside fp8_autocast when `recipe` is given)."""
    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
    model.train()
    losses = []
    for chunk in batches:
        ids, labels = chunk[:, :-1], chunk[:, 1:]
        with fp8mix.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    return losses, opt


@needs_fp8_grouped
@pytest.mark.parametrize("recipe", [DelayedScaling, CurrentScaling], ids=["delayed", "current"])
@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_a_tiny_moe_trains_in_fp8_as_in_float32(name, recipe):
    batches = _text_batches(30)
    ref = _train(_model(name, seed=11), batches)[0]  # float32, no fp8mix
    model = fp8mix.convert_model(_model(name, seed=11))
    got = _train(model, batches, recipe())[0]
    assert all(torch.isfinite(v) for v in got)
    first, last, ref_last = float(got[0]), float(torch.stack(got[-5:]).mean()), float(torch.stack(ref[-5:]).mean())
    assert last < 0.8 * first, [float(v) for v in got]
    assert abs(last - ref_last) < 0.05 * ref_last, ([float(v) for v in got], [float(v) for v in ref])
    from helpers import sqnr_db
    experts = [m for m in model.modules() if isinstance(m, HFExperts)]
    assert len(experts) == 2
    g = torch.Generator().manual_seed(6)
    h, w = torch.randn(32, 64, generator=g), torch.rand(32, 2, generator=g)
    idx = torch.stack([torch.randperm(MODELS[name][3], generator=g)[:2] for _ in range(32)])
    with torch.no_grad():
        hp = experts[0](h, idx, w)
        with fp8mix.fp8_autocast(fp8_recipe=recipe()):
            fp8 = experts[0](h, idx, w)
    assert not torch.equal(fp8, hp) and sqnr_db(hp, fp8) > 20  # the experts ran in FP8, with FP8's error
    if recipe is DelayedScaling:
        assert all(int(m.fp8_steps.min()) > 0 for m in experts)  # every expert's FP8 state recorded amaxes


@needs_fp8_grouped
def test_resuming_from_a_checkpoint_mid_run_gives_the_same_losses(tmp_path):
    import io
    batches, recipe = _text_batches(16, seed=3), DelayedScaling(amax_history_len=8)
    whole = _train(fp8mix.convert_model(_model("mixtral", seed=12)), batches, recipe)[0]
    model = fp8mix.convert_model(_model("mixtral", seed=12))
    first, opt = _train(model, batches[:8], recipe)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    fresh = fp8mix.convert_model(_model("mixtral", seed=99))  # other weights, a fresh FP8 state
    fresh.load_state_dict(ckpt["model"], strict=True)
    rest = _train(fresh, batches[8:], recipe, opt_state=ckpt["opt"])[0]
    for i, (a, b) in enumerate(zip(whole, first + rest)):
        assert torch.equal(a, b), f"step {i}: {float(a)} vs {float(b)}"


@needs_fp8_grouped
def test_each_expert_uses_its_own_fp8_gemms():
    """Expert g's gate_up is GEMM g and its down GEMM E + g of the module's FP8 state: after
    one training forward the weight roles (3 * gemm + 1) hold each expert's weight amax, the
    input roles (3 * gemm) its rows' amax; the output is the high-precision one to FP8 noise."""
    from helpers import sqnr_db
    ref = _model("mixtral").model.layers[0].mlp.experts
    mod = fp8mix.convert_model(copy.deepcopy(ref)).train()
    g = torch.Generator().manual_seed(4)
    h, w = torch.randn(64, 64, generator=g), torch.rand(64, 2, generator=g)
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(64)])
    with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
        out = mod(h.requires_grad_(), idx, w)
    with torch.no_grad():
        expect = ref(h, idx, w)
    assert sqnr_db(expect, out) > 20
    hist = mod.fp8_amax_history[0]
    for e in range(8):
        rows = h.detach()[(idx == e).any(dim=1)]
        assert float(hist[3 * e]) == float(rows.abs().max()), e
        assert float(hist[3 * e + 1]) == float(ref.gate_up_proj[e].detach().abs().max()), e
        assert float(hist[3 * (8 + e) + 1]) == float(ref.down_proj[e].detach().abs().max()), e


@needs_fp8_grouped
def test_gradient_checkpointing_gives_the_same_fp8_steps():
    batches, recipe = _text_batches(3, seed=5), DelayedScaling(amax_history_len=8)
    base = fp8mix.convert_model(_model("mixtral", seed=13))
    ckpt = copy.deepcopy(base)
    ckpt.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for a, b in zip(_train(base, batches, recipe)[0], _train(ckpt, batches, recipe)[0]):
        assert torch.equal(a, b)
    sa, sb = base.state_dict(), ckpt.state_dict()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@needs_fp8_grouped
def test_evaluation_in_fp8_leaves_the_experts_fp8_state_alone():
    model = fp8mix.convert_model(_model("qwen3_moe", seed=14))
    _train(model, _text_batches(2, seed=7), DelayedScaling())
    before = {k: v.clone() for k, v in model.state_dict().items() if ".fp8_" in k}
    model.eval()
    with torch.no_grad(), fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
        logits = model(input_ids=_ids(8)).logits
    assert torch.isfinite(logits).all()
    after = model.state_dict()
    assert any(".experts.fp8_" in k for k in before)
    for k, v in before.items():
        assert torch.equal(v, after[k]), k


@needs_fp8_grouped
def test_a_recipe_grouped_layers_lack_raises_naming_the_experts():
    model = fp8mix.convert_model(_model("mixtral", seed=15), module_filter_fn=lambda m, fqn: "experts" in fqn)
    with pytest.raises(NotImplementedError, match=r"FP8MixtralExperts.*stochastic rounding"):
        with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling(rounding="stochastic")):
            model(input_ids=_ids(9))


@needs_fp8_grouped
def test_block_scaling_runs_the_experts_one_fp8_gemm_each():
    """Recipes the grouped ops do not cover run each expert as its own FP8 GEMM step."""
    from fp8mix.recipe import BlockScaling
    model = fp8mix.convert_model(_model("mixtral", seed=15), module_filter_fn=lambda m, fqn: "experts" in fqn)
    ids = _ids(9)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        with fp8mix.fp8_autocast(fp8_recipe=BlockScaling()):
            got = model(input_ids=ids).logits
    assert not torch.equal(got, ref)  # (FP8 ran)
    assert (got - ref).norm() / ref.norm() < 0.1
