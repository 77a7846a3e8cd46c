"""FSDP2 FP8 all-gather (convert_model(fsdp_fp8_all_gather=True)): 2 CPU processes on gloo.

One launch of 2 worker processes (this file run as a script) runs every scenario on the
same 3-layer model (torch nn.Linear layers converted by fp8mix.convert_model, one with 33
output rows: an uneven shard, padded by FSDP2), fully_shard per layer and at the root,
AdamW, the global batch split over the ranks, CurrentScaling (the rule the weight follows
under FP8 all-gather: current per-tensor scaling of the whole weight):

  bf16      FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16): the bytes baseline
  fp32      FSDP2 all-gathering float32 weights, fp8mix casting them (plain FSDP2)
  fp8       FP8 all-gather, each layer's scale from its own amax all-reduce
  fp8_pre   FP8 all-gather with precompute_fp8_scales_for_fsdp after every step
  fp8_bf16  FP8 all-gather with the bf16 MixedPrecisionPolicy (bias gathered in bf16)
  torchao   torchao's Float8LinearConfig(enable_fsdp_float8_all_gather=True) as config
  te_layers two fp8mix.TransformerLayers (every GEMM weight FP8-gathered) against plain FSDP2
  bad input convert_model after fully_shard; a layer asked to run with a recipe its FP8
            weight cannot serve (DelayedScaling): clear errors on every rank, no hang

What the tests check, and why these tolerances:
  * bytes: what FSDP2's all-gathers move per step (counted by wrapping torch.distributed's
    all-gather in the workers) with FP8 all-gather <= 0.55x the bf16 baseline's. Weights
    move 1 byte per element instead of 2; the biases (float32: 4 bytes, or bf16 with the
    bf16 policy) and the padding of the uneven shard make up the rest (~0.51x / ~0.50x).
  * fp8 vs fp32, exact: the shard is cast with the whole weight's scale (its amax
    MAX all-reduced), which is the scale the unsharded cast computes, and the cast is
    elementwise, so the gathered bytes are the bytes fp8mix casts the gathered float32
    weight to: same GEMM operands, same gradients, same updates. Losses and parameters are
    bit-identical, and so are fp8 and fp8_pre (the precomputed scale is the same value).
  * fp8 vs one process (no sharding, the concatenated batch, torch's AdamW): rtol 1e-4 on
    the losses, as tests/test_distributed.py states for DDP and FSDP2: with all-reduced
    amaxes every rank casts with the single process's scales; what differs is float32
    summation order (wgrad summed per half, then averaged by the reduce-scatter; the loss a
    mean of means), ~1e-7 relative, which can flip the FP8 rounding of a few weight
    elements at later steps (~1e-5 in the loss). A real bug (a stale or unsynchronised
    scale, a shard cast with its own amax, a wrong gradient) shows as 1e-2 and up.
  * no second cast: during an fp8 step, fp8mix casts only the weight shards (in
    fsdp_pre_all_gather), never a whole weight: the GEMMs take the gathered bytes.
  * precompute: one all-reduce (of 3 amaxes) for the 3 layers, and the next step makes 3
    fewer all-reduces than without it.
"""
from __future__ import annotations

import sys

import pytest
import torch

WORLD = 2
STEPS = 4
B_LOCAL = 16
DIMS = (64, 256, 256, 33)  # 33 output rows: shards of 17 and 16 rows (FSDP2 pads the second)

dist_ok = torch.distributed.is_available() and torch.distributed.is_gloo_available()
pytestmark = pytest.mark.skipif(not dist_ok, reason="torch.distributed with gloo not available")


# --------------------------------------------------------------------------------------
# shared by the workers and the single-process reference
# --------------------------------------------------------------------------------------
def make_model(**convert_kw):
    import torch.nn as nn

    import fp8mix
    torch.manual_seed(0)
    d = DIMS
    m = nn.Sequential(nn.Linear(d[0], d[1]), nn.ReLU(), nn.Linear(d[1], d[2]), nn.GELU(), nn.Linear(d[2], d[3]))
    return fp8mix.convert_model(m, **convert_kw)


def recipe():
    from fp8mix.recipe import CurrentScaling
    return CurrentScaling()


def global_batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WORLD * B_LOCAL, DIMS[0], generator=gen)
    x[:B_LOCAL] *= 3.0  # rank 0's half has the larger amax: the all-reduces matter
    teach = torch.Generator().manual_seed(7)
    a = torch.randn(DIMS[0], DIMS[-1], generator=teach) / DIMS[0] ** 0.5
    return x, torch.tanh(x @ a) + 0.1 * torch.randn(WORLD * B_LOCAL, DIMS[-1], generator=gen)


def train_step(model, opt, step, rank=None):
    import torch.nn.functional as F

    import fp8mix
    x, t = global_batch(step)
    if rank is not None:
        x, t = x[rank * B_LOCAL:(rank + 1) * B_LOCAL], t[rank * B_LOCAL:(rank + 1) * B_LOCAL]
    with fp8mix.fp8_autocast(fp8_recipe=recipe()):
        loss = F.mse_loss(model(x).float(), t)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


# --------------------------------------------------------------------------------------
# worker (this file as a script)
# --------------------------------------------------------------------------------------
def _shard(model, mp=None):
    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {} if mp is None else {"mp_policy": MixedPrecisionPolicy(param_dtype=mp)}
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    return model


def _global_losses(losses):
    import torch.distributed as dist
    t = torch.stack(losses)
    dist.all_reduce(t)
    return (t / WORLD).tolist()


def _full_params(model):
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.named_parameters()}


def _train(rank, model, *, precompute=False, watch=None):
    """STEPS steps; bytes per step, and what `watch(step)` returns for each step."""
    from fsdp_launch import Collectives

    from fp8mix.distributed import precompute_fp8_scales_for_fsdp
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, reduces, pre = [], [], []
    with Collectives() as c:
        for step in range(STEPS):
            n = len(c.reduce_numels)
            losses.append(train_step(model, opt, step, rank))
            reduces.append(len(c.reduce_numels) - n)
            if precompute:
                n = len(c.reduce_numels)
                precompute_fp8_scales_for_fsdp(model)
                pre.append(c.reduce_numels[n:])
    return {"losses": _global_losses(losses), "params": _full_params(model), "bytes_per_step": c.gather_bytes / STEPS,
            "gathers": c.gathers, "reduces_per_step": reduces, "precompute_reduces": pre}


def _run_bf16(rank):
    return _train(rank, _shard(make_model(), mp=torch.bfloat16))


def _run_fp32(rank):
    return _train(rank, _shard(make_model()))


def _run_fp8(rank):
    import fp8mix.ops as ops
    model = _shard(make_model(fsdp_fp8_all_gather=True))
    seen = {}
    def note(mod, args):  # what the layers' forwards get as their weight
        seen[mod._fp8_name] = type(mod.weight).__name__

    for m in model:
        if hasattr(m, "_fp8_name"):
            m.register_forward_pre_hook(note)
    cast_shapes = []  # every tensor fp8mix casts during the first step
    wrapped = {}
    for name in ("cast", "quantize_current"):
        fn = getattr(ops, name)
        wrapped[name] = fn

        def rec(x, *a, _fn=fn, **k):
            cast_shapes.append(tuple(x.shape))
            return _fn(x, *a, **k)
        setattr(ops, name, rec)
    try:
        out = _train(rank, model)
    finally:
        for name, fn in wrapped.items():
            setattr(ops, name, fn)
    out["weight_types"] = seen
    out["local_types"] = sorted({type(p._local_tensor).__name__ for n, p in model.named_parameters()
                                 if n.endswith("weight")})
    out["cast_shapes"] = sorted(set(cast_shapes))
    return out


def _run_fp8_pre(rank):
    return _train(rank, _shard(make_model(fsdp_fp8_all_gather=True)), precompute=True)


def _run_fp8_bf16(rank):
    return _train(rank, _shard(make_model(fsdp_fp8_all_gather=True), mp=torch.bfloat16))


def _run_torchao(rank):
    from torchao.float8 import Float8LinearConfig
    model = _shard(make_model(config=Float8LinearConfig(enable_fsdp_float8_all_gather=True)))
    out = _train(rank, model)
    out["recipe"] = repr(model[0].fp8_recipe)
    out["local_types"] = sorted({type(p._local_tensor).__name__ for n, p in model.named_parameters()
                                 if n.endswith("weight")})
    return out


def _te_model(all_gather):
    import fp8mix
    torch.manual_seed(1)
    m = torch.nn.Sequential(*[fp8mix.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0)
                              for _ in range(2)])
    return fp8mix.convert_model(m, fsdp_fp8_all_gather=all_gather) if all_gather else m


def _run_te_layers(rank):
    """Transformer Engine's module family (LayerNormLinear, Linear, LayerNormMLP's two GEMM
    weights) under FP8 all-gather: the same exactness as the Linear layers."""
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    import fp8mix
    out = {}
    for name, ag in (("plain", False), ("fp8", True)):
        model = _te_model(ag)
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for step in range(2):
            x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(10 * step + rank))
            with fp8mix.fp8_autocast(fp8_recipe=recipe()):
                loss = F.mse_loss(model(x), torch.zeros_like(x))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[name] = losses
        out[name + "_gathered"] = sorted(n for n, p in model.named_parameters()
                                         if type(p._local_tensor).__name__ == "FP8AllGatherWeight")
    return out


def _run_bad_input(rank):
    import fp8mix
    from fp8mix.recipe import DelayedScaling
    out = {}
    model = _shard(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)))
    try:
        fp8mix.convert_model(model)
    except ValueError as e:
        out["after_shard"] = str(e)
    model = _shard(make_model(fsdp_fp8_all_gather=True))
    model[2].fp8_recipe = DelayedScaling()
    try:
        train_step(model, torch.optim.AdamW(model.parameters()), 0, rank)
    except ValueError as e:
        out["bad_recipe"] = str(e)
    return out


def _worker(rank, port, out_dir):
    from fsdp_launch import init_worker, run_scenarios
    init_worker(rank, port)
    run_scenarios(rank, out_dir, [(n, lambda f=f: f(rank)) for n, f in (
        ("bf16", _run_bf16), ("fp32", _run_fp32), ("fp8", _run_fp8), ("fp8_pre", _run_fp8_pre),
        ("fp8_bf16", _run_fp8_bf16), ("torchao", _run_torchao), ("te_layers", _run_te_layers),
        ("bad_input", _run_bad_input))])


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from fsdp_launch import launch
    return launch(__file__, tmp_path_factory.mktemp("fsdp_ag"))


def _get(runs, name):
    from fsdp_launch import get
    return get(runs, name)


@pytest.mark.parametrize("name", ["fp8", "fp8_bf16"])
def test_all_gather_bytes_at_most_055_of_bf16(runs, name):
    (b, _), (f, _) = _get(runs, "bf16"), _get(runs, name)
    ratio = f["bytes_per_step"] / b["bytes_per_step"]
    assert ratio <= 0.55, f"{name}: {f['bytes_per_step']:.0f} B/step vs bf16 {b['bytes_per_step']:.0f}: {ratio:.3f}"
    assert f["gathers"] == b["gathers"]  # the same all-gathers, each moving fewer bytes
    assert 0.45 < ratio  # the weights moved at all (1 byte each), and not twice


def test_fp8_all_gather_equals_plain_fsdp_exactly(runs):
    (f, _), (p, _), (q, _) = _get(runs, "fp8"), _get(runs, "fp32"), _get(runs, "fp8_pre")
    assert f["losses"] == p["losses"] == q["losses"], (f["losses"], p["losses"], q["losses"])
    for k, v in p["params"].items():
        assert torch.equal(f["params"][k], v), k
        assert torch.equal(q["params"][k], v), k


def test_fp8_all_gather_matches_one_process(runs):
    import fp8mix
    (f, _) = _get(runs, "fp8")
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    single = [train_step(model, opt, s).item() for s in range(STEPS)]
    rel = [abs(a - b) / abs(b) for a, b in zip(f["losses"], single)]
    assert max(rel) <= 1e-4, f"FSDP2 FP8 all-gather {f['losses']}\none process {single}\nrel {rel}"
    for k, v in model.named_parameters():
        torch.testing.assert_close(f["params"][k], v.detach(), rtol=1e-2, atol=1e-3, msg=lambda m: f"{k}: {m}")
    assert isinstance(model[0], fp8mix.Linear)


def test_gemms_use_the_gathered_fp8_weight(runs):
    f0, f1 = _get(runs, "fp8")
    assert f0["local_types"] == ["FP8AllGatherWeight"]
    assert set(f0["weight_types"].values()) == {"FP8Weight"}, f0["weight_types"]
    whole = {(DIMS[1], DIMS[0]), (DIMS[2], DIMS[1]), (DIMS[3], DIMS[2])}
    for r, f in enumerate((f0, f1)):
        assert not whole & set(f["cast_shapes"]), f"rank {r} cast a whole weight: {f['cast_shapes']}"
    rows = lambda n, r: -(-n // WORLD) if r == 0 else n - -(-n // WORLD)  # noqa: E731
    assert (rows(DIMS[1], 0), DIMS[0]) in f0["cast_shapes"] and (rows(DIMS[3], 1), DIMS[2]) in f1["cast_shapes"]


def test_precompute_is_one_all_reduce_and_saves_the_per_layer_ones(runs):
    (f, _), (q, _) = _get(runs, "fp8"), _get(runs, "fp8_pre")
    assert q["precompute_reduces"] == [[3]] * STEPS  # one all-reduce of the 3 layers' amaxes
    # after a precompute, a step makes one all-reduce less per layer than a step without it
    assert [a - b for a, b in zip(f["reduces_per_step"][1:], q["reduces_per_step"][1:])] == [3] * (STEPS - 1)


def test_torchao_config_enables_fp8_all_gather(runs):
    (t, _), (f, _) = _get(runs, "torchao"), _get(runs, "fp8")
    assert t["local_types"] == ["FP8AllGatherWeight"]
    assert "CurrentScaling" in t["recipe"]
    if t["recipe"] == repr(recipe()):  # torchao's defaults map to fp8mix's CurrentScaling()
        assert t["losses"] == f["losses"]


def test_transformer_layers_gather_every_gemm_weight_in_fp8(runs):
    for r in _get(runs, "te_layers"):
        assert r["fp8"] == r["plain"], r
        assert r["plain_gathered"] == [] and len(r["fp8_gathered"]) == 8, r["fp8_gathered"]  # 4 GEMMs per layer
        assert any(n.endswith("fc2_weight") for n in r["fp8_gathered"])


def test_bad_input_is_a_clear_error_on_every_rank(runs):
    for r in _get(runs, "bad_input"):
        assert "already sharded by fully_shard" in r["after_shard"] and "'0'" in r["after_shard"], r
        assert "DelayedScaling cannot serve it" in r["bad_recipe"] and "'2'" in r["bad_recipe"], r


def test_unsharded_model_with_fp8_all_gather_trains_as_plain():
    """Before fully_shard (or never sharded), the FP8AllGatherWeight casts itself by the same
    rule: training is bit-identical to the plain conversion under CurrentScaling."""
    from fp8mix.nn.fp8_weight import FP8AllGatherWeight
    a, b = make_model(fsdp_fp8_all_gather=True), make_model()
    assert isinstance(a[0].weight, FP8AllGatherWeight) and a.fp8_conversion.fp8_all_gather == ["0", "2", "4"]
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    for s in range(3):
        assert torch.equal(train_step(a, oa, s), train_step(b, ob, s))
    sd = a.state_dict()  # a plain checkpoint: the high-precision weights
    assert type(sd["0.weight"]) is torch.Tensor and torch.equal(sd["0.weight"], b.state_dict()["0.weight"])


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
