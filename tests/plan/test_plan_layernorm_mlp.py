"""search_plan on models with Transformer Engine's modules: LayerNormMLP (two GEMMs behind a
norm, fused casts) and TransformerLayer (LayerNormLinear, Linear and LayerNormMLP inside).
The planner measures them (it crashed on LayerNormMLP: no _hp_forward), and on a SwiGLU MLP
whose activation output has outlier channels it turns Smooth-SwiGLU's smoothing on, which
makes the planned model's output closer to float64 than the same plan without it."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix
from fp8mix.plan import Plan


class LNMLPNet(nn.Module):
    """64 -> Linear -> LayerNormMLP(swiglu, 64 -> 128) residual -> head 10. `k` grows the
    SwiGLU output's channels `channels` as trained LLMs' do (Fishman et al.: gate and up
    aligned, so a = silu(g) u grows with their product): their fc1 gate and up rows times
    sqrt(k) each, so a's channels are up to about k times the others while fc1's weight
    spreads by sqrt(k) only; fc2's columns for them divided by k (they meet small weights)."""

    def __init__(self, k: float = 1.0, channels=(0, 1, 2, 3), seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc_in = nn.Linear(64, 64)
        self.mlp = fp8mix.LayerNormMLP(64, 128, activation="swiglu", init_method=nn.init.xavier_normal_,
                                       output_layer_init_method=nn.init.xavier_normal_)
        self.head = nn.Linear(64, 10)
        with torch.no_grad():
            f = self.mlp.ffn_hidden_size
            for c in channels:  # a = silu(h[:, :F]) * h[:, F:]
                for row in (c, f + c):
                    self.mlp.fc1_weight[row] *= k ** 0.5
                    self.mlp.fc1_bias[row] *= k ** 0.5
                self.mlp.fc2_weight[:, c] /= k

    def forward(self, x):
        h = torch.relu(self.fc_in(x))
        return self.head(h + self.mlp(h))


class TLNet(nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.block = fp8mix.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0)
        self.head = nn.Linear(64, 10)

    def forward(self, x):  # x [s, b, 64]
        return self.head(self.block(x, self_attn_mask_type="causal"))


def _batches(n, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, 64, generator=g), torch.randint(0, 10, shape, generator=g)) for _ in range(n)]


def _loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, 10), y.reshape(-1))


def _convert(model):
    return fp8mix.convert_model(model)  # the nn.Linear layers too (search_plan converts only models without any)


def _sqnr_db(ref, out):
    ref, out = ref.double(), out.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum()))


@pytest.fixture(scope="module")
def clean_plan():
    model = _convert(LNMLPNet())
    return model, fp8mix.search_plan(model, _batches(3, (64,)), _loss, metric="sqnr")


def test_search_plan_runs_on_a_layernorm_mlp_model(clean_plan):
    model, plan = clean_plan
    assert isinstance(plan, Plan)
    assert [lp.name for lp in plan.layers] == ["fc_in", "mlp", "head"]
    lp = plan.layer("mlp")
    # its FLOPs: both GEMMs, 64 tokens a batch: 6 * 64 * (64 * 256 + 128 * 64)
    assert lp.flops == 6.0 * 64 * (64 * 256 + 128 * 64)
    # its own output SQNR under each candidate was measured (finite, FP8-sized), and its grads
    for label in plan.candidates:
        assert 15.0 < lp.output_sqnr_db[label] < 60.0, (label, lp.output_sqnr_db)
        assert 5.0 < lp.grad_sqnr_db[label] < 60.0, (label, lp.grad_sqnr_db)
    assert lp.decision == "fp8" and not lp.smooth and lp.outlier_channels == 0
    # the search restored the model: outside fp8_autocast it computes as before, policy unset
    assert "fp8_enabled" not in model.mlp.__dict__ and model.mlp.fp8_smooth is False
    x = _batches(1, (64,), seed=5)[0][0]
    assert torch.equal(model(x), _convert(LNMLPNet())(x))


def test_outlier_channels_in_the_swiglu_output_turn_smoothing_on():
    k = 2.0 ** 16
    batches = _batches(3, (64,))
    model = _convert(LNMLPNet(k=k))
    plan = fp8mix.search_plan(model, batches, _loss, metric="sqnr")
    lp = plan.layer("mlp")
    assert lp.outlier_channels == 4 and lp.channel_spread > 1e4
    assert lp.decision == "fp8" and lp.smooth, plan.table()
    assert "smooth fixes it" in lp.reason
    assert plan.layer("fc_in").smooth is False and plan.layer("head").smooth is False

    # the planned model against float64, with and without the plan's smoothing
    x = _batches(1, (64,), seed=9)[0][0]
    ref = copy.deepcopy(LNMLPNet(k=k)).double()(x.double()).detach()
    planned = plan.apply(_convert(LNMLPNet(k=k))).eval()
    assert planned.mlp.fp8_smooth is True and planned.mlp.smooth_swiglu is True
    unsmoothed = plan.apply(_convert(LNMLPNet(k=k))).eval()
    unsmoothed.mlp.fp8_smooth = False
    with torch.no_grad(), fp8mix.fp8_autocast():
        with_smooth, without = planned(x), unsmoothed(x)
    s_with, s_without = _sqnr_db(ref, with_smooth), _sqnr_db(ref, without)
    assert s_with > s_without + 3.0, (s_with, s_without)
    # ... and the plan survives JSON
    again = Plan.from_json(plan.to_json())
    assert again.layer("mlp").smooth is True


def test_a_layernorm_mlp_built_smoothed_follows_the_plan():
    model = _convert(LNMLPNet())
    model.mlp.smooth_swiglu = True  # the constructor's choice, before a plan
    assert model.mlp.fp8_smooth is True
    plan = fp8mix.search_plan(model, _batches(3, (64,)), _loss, metric="sqnr")
    assert model.mlp.fp8_smooth is True  # the search restored it
    assert plan.layer("mlp").smooth is False  # no outliers: the plan does not smooth
    plan.apply(model)
    assert model.mlp.fp8_smooth is False


def test_search_plan_runs_on_a_transformer_layer():
    model = _convert(TLNet())
    plan = fp8mix.search_plan(model, _batches(3, (16, 2)), _loss)
    names = [lp.name for lp in plan.layers]
    assert names == ["block.self_attention.layernorm_qkv", "block.self_attention.proj", "block.layernorm_mlp",
                     "head"]
    for n in names[:3]:
        lp = plan.layer(n)
        assert lp.flops > 0 and all(15.0 < v < 60.0 for k, v in lp.output_sqnr_db.items() if k != "plan"), lp
    assert plan.layer("block.layernorm_mlp").flops == 6.0 * 32 * (64 * 128 + 128 * 64)
    # the plan applies and runs
    plan.apply(model)
    with torch.no_grad(), fp8mix.fp8_autocast():
        out = model(_batches(1, (16, 2))[0][0])
    assert out.shape == (16, 2, 10) and torch.isfinite(out).all()


def test_fused_modules_are_not_given_recipes_their_casts_lack():
    from fp8mix.plan.layers import fixes_for, runs_recipe
    from fp8mix.plan.outliers import FIX_ORDER
    from fp8mix.recipe import BlockScaling, CurrentScaling, MXFP8BlockScaling, RowwiseScaling
    assert fixes_for(fp8mix.LayerNormMLP(64, 128), FIX_ORDER) == ("smooth", "block")
    assert fixes_for(fp8mix.LayerNormLinear(64, 128), FIX_ORDER) == ("block",)
    assert fixes_for(fp8mix.Linear(64, 128), FIX_ORDER) == ("smooth", "row", "block", "mx")
    # what runs_recipe says is what the module does: the ones it refuses raise
    m, x = fp8mix.LayerNormMLP(64, 128), torch.randn(4, 64)
    for recipe in (CurrentScaling(), BlockScaling(), RowwiseScaling(), MXFP8BlockScaling()):
        if runs_recipe(m, recipe):
            with fp8mix.fp8_autocast(fp8_recipe=recipe):
                assert torch.isfinite(m(x)).all()
        else:
            with pytest.raises(NotImplementedError, match="fused"), fp8mix.fp8_autocast(fp8_recipe=recipe):
                m(x)
    # a search whose only candidate the fused module cannot run leaves it in high precision, with the reason
    model = _convert(LNMLPNet())
    plan = fp8mix.search_plan(model, _batches(3, (64,)), _loss, metric="sqnr", candidates=[RowwiseScaling()])
    lp = plan.layer("mlp")
    assert lp.decision == "keep" and "no candidate recipe runs on LayerNormMLP" in lp.reason
    assert plan.layer("fc_in").decision == "fp8" and plan.layer("fc_in").candidate == "rowwise HYBRID"
