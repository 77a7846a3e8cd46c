"""FP8 primary weights (fp8mix.fp8_model_init): modules that hold their GEMM weights as FP8
bytes + one scale, trained through float32 masters in the optimizer (FP8MasterWeights),
alone and under FSDP2 on 2 CPU processes (gloo).

Single process (references nobody here wrote: torch's nn.Linear and AdamW, the same
fp8mix layer holding the dequantised weight as a plain float32 Parameter):
  * memory: the module's parameters take <= 0.55x the bytes of the bf16 module (1 byte per
    weight element + 4 for the scale; biases and norms stay in bf16);
  * forward and backward through the FP8 weight: outside fp8_autocast exactly torch's
    nn.Linear on the dequantised weight; inside, exactly fp8mix's Linear holding the
    dequantised weight in float32 (whose cast gives back the same FP8 bytes: the values
    are FP8 values times one scale), and within FP8's rounding of x and dy of torch's
    nn.Linear (normwise 0.1: E4M3 rounds x by up to 2^-4 relative, E5M2 dy by 2^-3; a
    wrong scale or layout is off by 1 or more);
  * training: FP8MasterWeights(torch AdamW) on FP8 weights gives, bit for bit, the losses
    and weights of torch AdamW on the float32 model under CurrentScaling (each step's FP8
    weight is the float32 weight's cast, by the same rule, so the GEMMs see the same bytes);
  * checkpoints: state_dict -> torch.save -> torch.load(weights_only) -> load_state_dict is
    exact; a high-precision checkpoint loads cast by the rule; a model built without
    fp8_model_init refuses an FP8 checkpoint (strict) and loads dequantize_fp8_weights' copy;
  * bad input raises clearly (in-place updates, recipes the weights cannot serve, meta).
Two processes (one launch), FSDP2 fully_shard per layer and at the root, the global batch
split over the ranks:
  * the FP8 bytes are what is all-gathered: <= 0.55x of the bf16 model's all-gather bytes;
  * losses equal one process's (no sharding, the concatenated batch) within rtol 1e-4, the
    tolerance tests/test_distributed.py justifies for DDP and FSDP2 (float32 summation order
    of the gradient average; the amaxes all-reduced, so the scales are the same);
  * the masters' write-back gives every shard of a weight one scale (one all-reduce);
  * state_dict round trip and torch.distributed.checkpoint save on 2 ranks / load on 2
    ranks into a model built from another seed are exact, and the same checkpoint loads
    into one process (2 -> 1) with the same values.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix
from fp8mix.nn.fp8_weight import FP8Weight, parameter_bytes
from fp8mix.optim import FP8MasterWeights
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

WORLD = 2
STEPS = 4
B_LOCAL = 16
DIMS = (64, 256, 256, 33)

dist_ok = torch.distributed.is_available() and torch.distributed.is_gloo_available()


def make_model(seed=0, fp8=True, dtype=None, keep_hp=False):
    """keep_hp: the masters start from the float32 initial values (preserve_high_precision_init_val;
    one process only: fully_shard does not keep them), else from the dequantised FP8 weights."""
    torch.manual_seed(seed)
    d = DIMS
    with fp8mix.fp8_model_init(enabled=fp8, preserve_high_precision_init_val=keep_hp):
        return nn.Sequential(fp8mix.Linear(d[0], d[1], dtype=dtype), nn.ReLU(), fp8mix.Linear(d[1], d[2], dtype=dtype),
                             nn.GELU(), fp8mix.Linear(d[2], d[3], dtype=dtype))


def global_batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(WORLD * B_LOCAL, DIMS[0], generator=gen)
    x[:B_LOCAL] *= 3.0
    teach = torch.Generator().manual_seed(7)
    a = torch.randn(DIMS[0], DIMS[-1], generator=teach) / DIMS[0] ** 0.5
    return x, torch.tanh(x @ a) + 0.1 * torch.randn(WORLD * B_LOCAL, DIMS[-1], generator=gen)


def train_step(model, opt, step, rank=None):
    x, t = global_batch(step)
    if rank is not None:
        x, t = x[rank * B_LOCAL:(rank + 1) * B_LOCAL], t[rank * B_LOCAL:(rank + 1) * B_LOCAL]
    with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
        loss = F.mse_loss(model(x).float(), t)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def storage_bytes(module) -> int:
    """Bytes under the parameters, counted from torch's own view of them: the storages of a
    wrapper subclass's inner tensors (__tensor_flatten__), else the parameter's storage."""
    total = 0
    for p in module.parameters():
        t = p._local_tensor if hasattr(p, "_local_tensor") else p
        inner = [getattr(t, n) for n in t.__tensor_flatten__()[0]] if hasattr(t, "__tensor_flatten__") else [t]
        total += sum(i.untyped_storage().nbytes() for i in inner)
    return total


# --------------------------------------------------------------------------------------
# one process
# --------------------------------------------------------------------------------------
def test_weight_memory_at_most_055_of_bf16():
    def build():
        bf = torch.bfloat16
        return nn.Sequential(fp8mix.Linear(512, 1024, dtype=bf), fp8mix.LayerNormMLP(1024, 2048, params_dtype=bf))

    with fp8mix.fp8_model_init():
        fp8 = build()
    bf16 = build()
    assert isinstance(fp8[1].fc2_weight, FP8Weight) and fp8[1].layer_norm_weight.dtype == torch.bfloat16
    ratio = storage_bytes(fp8) / storage_bytes(bf16)
    assert ratio <= 0.55, ratio
    assert parameter_bytes(fp8) == storage_bytes(fp8) and parameter_bytes(bf16) == storage_bytes(bf16)
    assert 0.5 < ratio  # 1 byte per weight element (+ scales, bf16 biases and norms)


def _modules():
    from fp8mix.nn import Conv1D
    return [("Linear", lambda: fp8mix.Linear(64, 48)), ("Conv1D", lambda: Conv1D(48, 64)),
            ("LayerNormLinear", lambda: fp8mix.LayerNormLinear(64, 48)),
            ("LayerNormMLP", lambda: fp8mix.LayerNormMLP(64, 96)),
            ("TransformerLayer", lambda: fp8mix.TransformerLayer(64, 128, 4, hidden_dropout=0.0,
                                                                  attention_dropout=0.0))]


@pytest.mark.parametrize("name,build", _modules(), ids=[n for n, _ in _modules()])
def test_every_module_type_holds_fp8_weights_and_computes_as_dequantised(name, build):
    """Built under fp8_model_init: FP8 GEMM weights; forward and backward equal the module
    built as usual holding the dequantised values."""
    torch.manual_seed(3)
    with fp8mix.fp8_model_init():
        m = build()
    fp8_names = [n for n, p in m.named_parameters() if isinstance(p, FP8Weight)]
    assert fp8_names and all(n.endswith("weight") and not n.endswith("layer_norm_weight") for n in fp8_names), fp8_names
    torch.manual_seed(3)
    ref = build()
    with torch.no_grad():
        for (n, p), q in zip(m.named_parameters(), ref.parameters()):
            q.copy_(p.dequantize() if isinstance(p, FP8Weight) else p)
    x = torch.randn(2, 8, 64) if name == "TransformerLayer" else torch.randn(16, 64)
    outs = []
    for mod in (m, ref):
        xi = x.clone().requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
            y = mod(xi)
        y.float().square().sum().backward()
        outs.append((y.detach(), xi.grad, [p.grad for p in mod.parameters()]))
    (y, dx, dps), (y_r, dx_r, dps_r) = outs
    assert torch.equal(y, y_r) and torch.equal(dx, dx_r)
    for n, a, b in zip([n for n, _ in m.named_parameters()], dps, dps_r):
        assert torch.equal(a, b), n


def test_backward_through_fp8_weight_against_torch_linear():
    torch.manual_seed(5)
    with fp8mix.fp8_model_init():
        m = fp8mix.Linear(128, 96)
    w = m.weight
    ref = nn.Linear(128, 96)
    with torch.no_grad():
        ref.weight.copy_(w.dequantize())
        ref.bias.copy_(m.bias)
    # the dequantised values cast back to the same FP8 bytes (FP8 values times one scale)
    q = fp8mix.quantize(ref.weight.detach(), "e4m3")
    assert torch.equal(q.data.view(torch.uint8), w._data.view(torch.uint8))
    x = torch.randn(40, 128)

    def run(mod, fp8):
        xi = x.clone().requires_grad_()
        with fp8mix.fp8_autocast(enabled=fp8, fp8_recipe=CurrentScaling()):
            y = mod(xi)
        (y * torch.linspace(-1, 1, 96)).sum().backward()
        out = (y.detach(), xi.grad, mod.weight.grad.clone(), mod.bias.grad.clone())
        mod.zero_grad()
        return out

    exact = run(ref, False)
    for a, b in zip(run(m, False), exact):  # outside fp8_autocast: nn.Linear on the dequantised weight
        assert torch.equal(a, b)
    for a, b in zip(run(m, True), exact):  # FP8 GEMMs: x (E4M3) and dy (E5M2) rounded
        assert ((a - b).norm() / b.norm()).item() < 0.1
    assert type(m.weight.grad) is torch.Tensor or m.weight.grad is None


def test_master_weights_train_like_float32_bit_for_bit():
    fp8, plain = make_model(keep_hp=True), make_model(fp8=False)
    for a, b in zip(fp8.parameters(), plain.parameters()):  # preserve_high_precision_init_val: the init
        ref = a.get_high_precision_init_val() if isinstance(a, FP8Weight) else a
        assert torch.equal(ref, b)
    opt = FP8MasterWeights(fp8.parameters(), torch.optim.AdamW, lr=1e-2)
    ref_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    for s in range(STEPS):
        assert torch.equal(train_step(fp8, opt, s), train_step(plain, ref_opt, s)), s
    masters = opt.masters()
    assert len(masters) == 3
    for (p, m), q in zip(masters, [plain[0].weight, plain[2].weight, plain[4].weight]):
        assert torch.equal(m, q)  # the master is the float32 weight
        assert torch.equal(p._data.view(torch.uint8), fp8mix.quantize(q.detach(), "e4m3").data.view(torch.uint8))


def test_master_weights_with_scheduler_scaler_and_clipping_as_float32():
    """param_groups hold the model's parameters: an LR scheduler, a gradient scaler
    (unscale_ reads the FP8 weights' gradients) and clipping act as for torch's AdamW on the
    float32 model, bit for bit."""
    runs = []
    for fp8 in (True, False):
        model = make_model(keep_hp=True, fp8=fp8)
        opt = (FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2) if fp8 else
               torch.optim.AdamW(model.parameters(), lr=1e-2))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        scaler = fp8mix.FP8GradScaler(init_scale=2.0 ** 8, fp8_feedback=False)
        losses = []
        for s in range(STEPS):
            x, t = global_batch(s)
            with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
                loss = F.mse_loss(model(x), t)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
            sched.step()
            losses.append(loss.item())
        runs.append((losses, opt.param_groups[0]["lr"]))
    assert runs[0] == runs[1], runs


def test_master_weights_resume_exactly(tmp_path):
    def run(steps, resume_from=None):
        model = make_model()
        opt = FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2)
        start = 0
        if resume_from is not None:
            ck = torch.load(resume_from, weights_only=True)
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            start = ck["step"]
        losses = [train_step(model, opt, s).item() for s in range(start, steps)]
        return model, opt, losses

    model, opt, first = run(2)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 2}, tmp_path / "ck.pt")
    _, _, rest = run(4, tmp_path / "ck.pt")
    straight, _, all4 = run(4)
    assert first + rest == all4


def test_state_dict_round_trip_is_exact(tmp_path):
    a, b = make_model(0), make_model(1)
    sd = a.state_dict()
    assert "0.weight" not in sd
    assert sd["0.weight_fp8"].dtype == torch.float8_e4m3fn and sd["0.weight_scale_inv"].dtype == torch.float32
    torch.save(sd, tmp_path / "m.pt")
    b.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        if isinstance(p, FP8Weight):
            assert torch.equal(p._data.view(torch.uint8), q._data.view(torch.uint8)) and \
                torch.equal(p._scale_inv, q._scale_inv), n
        else:
            assert torch.equal(p, q), n


def test_high_precision_checkpoint_loads_cast_by_the_rule():
    plain, fp8 = make_model(2, fp8=False), make_model(0)
    fp8.load_state_dict(plain.state_dict())
    for p, q in zip(fp8.parameters(), plain.parameters()):
        if isinstance(p, FP8Weight):
            assert torch.equal(p._data.view(torch.uint8), fp8mix.quantize(q.detach(), "e4m3").data.view(torch.uint8))


def test_model_without_fp8_weights_refuses_then_loads_the_dequantised_copy():
    sd = make_model(0).state_dict()
    plain = make_model(1, fp8=False)
    before = [p.clone() for p in plain.parameters()]
    with pytest.raises(RuntimeError, match=r'(?s)Missing key\(s\).*"0.weight".*Unexpected key\(s\).*"0.weight_fp8"'):
        plain.load_state_dict(sd)  # torch's strict load, before copying anything of the weight
    assert all(torch.equal(a, b) for a, b in zip(before, plain.parameters()) if a.dim() == 2)
    deq = fp8mix.dequantize_fp8_weights(sd)
    assert "0.weight_scale_inv" not in deq and "0.weight_fp8" not in deq and deq["0.weight"].dtype == torch.float32
    plain.load_state_dict(deq)
    for p, q in zip(make_model(0).parameters(), plain.parameters()):
        assert torch.equal(p.dequantize() if isinstance(p, FP8Weight) else p, q)
    torch_plain = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 33))
    torch_plain.load_state_dict(fp8mix.strip_fp8_state(deq))  # plain torch too
    ag = fp8mix.convert_model(make_model(1, fp8=False), fsdp_fp8_all_gather=True)
    with pytest.raises(ValueError, match="dequantize_fp8_weights"):  # a module with the hooks says what to do
        ag.load_state_dict(sd)


def test_bad_input_raises_clearly():
    with fp8mix.fp8_model_init():
        m = fp8mix.Linear(64, 32)
    with pytest.raises(TypeError, match="FP8MasterWeights"), torch.no_grad():
        m.weight.add_(1.0)
    opt = torch.optim.AdamW(m.parameters())
    with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
        m(torch.randn(4, 64)).sum().backward()
    with pytest.raises(TypeError, match="in place"):  # torch's optimizer on FP8 bytes
        opt.step()
    with pytest.raises(TypeError, match="FP8MasterWeights"):
        fp8mix.optim.AdamW(m.parameters())
    with pytest.raises(ValueError, match="DelayedScaling cannot serve"):
        fp8mix.fp8_model_init(recipe=DelayedScaling())
    with pytest.raises(ValueError, match="BlockScaling cannot serve"):
        fp8mix.convert_model(nn.Sequential(nn.Linear(64, 64)), fsdp_fp8_all_gather=True, recipe=BlockScaling())
    m.fp8_recipe = CurrentScaling(margin=1)  # another rule than the weight was made with
    with pytest.raises(ValueError, match="margin 0"), fp8mix.fp8_autocast():
        m(torch.randn(4, 64))
    m.fp8_recipe = DelayedScaling()
    with pytest.raises(ValueError, match="Linear .*DelayedScaling cannot serve"), fp8mix.fp8_autocast():
        m(torch.randn(4, 64))
    with pytest.raises(NotImplementedError, match="meta"), fp8mix.fp8_model_init():
        fp8mix.Linear(64, 32, device="meta")
    tied = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    tied[1].weight = tied[0].weight
    with pytest.raises(ValueError, match="shared"):
        fp8mix.convert_model(tied, fsdp_fp8_all_gather=True)
    from torchao.float8 import Float8LinearConfig
    with pytest.raises(ValueError, match="contradicts"):
        fp8mix.convert_model(nn.Sequential(nn.Linear(64, 64)), config=Float8LinearConfig(
            enable_fsdp_float8_all_gather=True), fsdp_fp8_all_gather=False)


def test_context_nesting_and_compat_names():
    import threading
    other = []
    with fp8mix.fp8_model_init():
        with fp8mix.fp8_model_init(enabled=False):
            plain = fp8mix.Linear(32, 32)
        fp8 = fp8mix.Linear(32, 32)
        t = threading.Thread(target=lambda: other.append(fp8mix.Linear(32, 32)))  # another thread: not inside
        t.start()
        t.join()
    after = fp8mix.Linear(32, 32)
    assert not isinstance(plain.weight, FP8Weight) and isinstance(fp8.weight, FP8Weight)
    assert not isinstance(after.weight, FP8Weight) and not isinstance(other[0].weight, FP8Weight)
    assert fp8mix.compat.fp8_model_init is fp8mix.fp8_model_init
    with fp8mix.compat.quantized_model_init(recipe=CurrentScaling(fp8_format=fp8mix.Format.E5M2)):
        e5 = fp8mix.Linear(32, 32)
    assert e5.weight._data.dtype == torch.float8_e5m2 and e5.fp8_recipe.fp8_format is fp8mix.Format.E5M2


# --------------------------------------------------------------------------------------
# two processes (this file as a script)
# --------------------------------------------------------------------------------------
def _shard(model, mp=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kw = {} if mp is None else {"mp_policy": MixedPrecisionPolicy(param_dtype=mp)}
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    return model


def _locals(model) -> dict:
    out = {}
    for k, p in model.named_parameters():
        t = p._local_tensor
        out[k] = (t._data.view(torch.uint8).clone(), t._scale_inv.clone()) if isinstance(t, FP8Weight) else t.clone()
    return out


def _same(a: dict, b: dict) -> bool:
    return all(all(torch.equal(x, y) for x, y in zip(v, b[k])) if isinstance(v, tuple) else torch.equal(v, b[k])
               for k, v in a.items())


def _run_fsdp(rank, out_dir, state):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from fsdp_launch import Collectives
    model = _shard(make_model())
    opt = FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2)
    losses = []
    with Collectives() as c:
        for s in range(STEPS):
            losses.append(train_step(model, opt, s, rank))
    t = torch.stack(losses)
    dist.all_reduce(t)
    scales = [p._local_tensor._scale_inv.clone() for n, p in model.named_parameters() if n.endswith("weight")]
    dcp.save(model.state_dict(), checkpoint_id=f"{out_dir}/dcp")
    state["model"] = model
    return {"losses": (t / WORLD).tolist(), "bytes_per_step": c.gather_bytes / STEPS, "scales": scales,
            "local_types": sorted({type(p._local_tensor).__name__ for n, p in model.named_parameters()
                                   if n.endswith("weight")}),
            "full": {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()},
            "masters": [m.full_tensor().clone() for _, m in opt.masters()]}


def _run_bf16(rank):
    from fsdp_launch import Collectives
    model = _shard(make_model(fp8=False), mp=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Collectives() as c:
        for s in range(STEPS):
            train_step(model, opt, s, rank)
    return {"bytes_per_step": c.gather_bytes / STEPS}


def _run_checkpoints(rank, out_dir, state):
    import torch.distributed.checkpoint as dcp
    trained = state["model"]
    again = _shard(make_model(seed=11))  # another seed: a load that did nothing would show
    fresh = _locals(again)
    sd = again.state_dict()
    dcp.load(sd, checkpoint_id=f"{out_dir}/dcp")
    again.load_state_dict(sd)
    third = _shard(make_model(seed=12))
    third.load_state_dict(trained.state_dict())
    return {"dcp_equal": _same(_locals(trained), _locals(again)), "seed_differs": not _same(fresh, _locals(trained)),
            "sd_equal": _same(_locals(trained), _locals(third))}


def _run_from_one(rank, out_dir):
    """The checkpoint one process saved (the fixture, before the launch), loaded on 2 ranks, then trained."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    model = _shard(make_model(seed=22))
    sd = model.state_dict()
    dcp.load(sd, checkpoint_id=f"{out_dir}/dcp1")
    model.load_state_dict(sd)
    loaded = {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()}
    opt = FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2)
    t = torch.stack([train_step(model, opt, s, rank) for s in range(STEPS)])
    dist.all_reduce(t)
    return {"loaded": loaded, "losses": (t / WORLD).tolist()}


def _worker(rank, port, out_dir):
    from fsdp_launch import init_worker, run_scenarios
    init_worker(rank, port)
    state: dict = {}
    run_scenarios(rank, out_dir, [("fsdp", lambda: _run_fsdp(rank, out_dir, state)), ("bf16", lambda: _run_bf16(rank)),
                                  ("checkpoints", lambda: _run_checkpoints(rank, out_dir, state)),
                                  ("from_one", lambda: _run_from_one(rank, out_dir))])


def _one_process_checkpoint(path) -> dict:
    """A model with FP8 weights trained 2 steps in this process, saved by DCP (one rank)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    model = make_model(seed=21)
    opt = FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2)
    for s in range(2):
        train_step(model, opt, s)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.save(model.state_dict(), checkpoint_id=str(path))
    return {k: (p.dequantize() if isinstance(p, FP8Weight) else p.detach()).clone()
            for k, p in model.named_parameters()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not dist_ok:
        pytest.skip("torch.distributed with gloo not available")
    from fsdp_launch import launch
    out = tmp_path_factory.mktemp("fsdp_w")
    saved_by_one = _one_process_checkpoint(out / "dcp1")
    return out, launch(__file__, out), saved_by_one


def _get(runs, name):
    from fsdp_launch import get
    return get(runs[1], name)


def test_fsdp_all_gathers_the_fp8_bytes(runs):
    (f, _), (b, _) = _get(runs, "fsdp"), _get(runs, "bf16")
    assert f["local_types"] == ["FP8Weight"]
    ratio = f["bytes_per_step"] / b["bytes_per_step"]
    assert 0.45 < ratio <= 0.55, (f["bytes_per_step"], b["bytes_per_step"], ratio)


def test_fsdp_losses_match_one_process(runs):
    (f, g) = _get(runs, "fsdp")
    model = make_model()
    opt = FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2)
    single = [train_step(model, opt, s).item() for s in range(STEPS)]
    rel = [abs(a - b) / abs(b) for a, b in zip(f["losses"], single)]
    assert max(rel) <= 1e-4, f"FSDP2 {f['losses']}\none process {single}\nrel {rel}"
    for (p, m), full in zip(opt.masters(), f["masters"]):
        torch.testing.assert_close(full, m, rtol=1e-2, atol=1e-3)
    for a, b in zip(f["scales"], g["scales"]):  # every shard of a weight: one scale
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # (DCP in one process says so)
def test_fsdp_checkpoints_round_trip_and_reshard_to_one_process(runs):
    import torch.distributed.checkpoint as dcp
    for r in _get(runs, "checkpoints"):
        assert r["seed_differs"] and r["dcp_equal"] and r["sd_equal"], r
    (f, _) = _get(runs, "fsdp")
    one = make_model(seed=13)
    sd = one.state_dict()
    dcp.load(sd, checkpoint_id=str(runs[0] / "dcp"))  # saved on 2 ranks, loaded on 1
    one.load_state_dict(sd)
    for k, p in one.named_parameters():
        v = p.dequantize() if isinstance(p, FP8Weight) else p.detach()
        assert torch.equal(v, f["full"][k]), k
    # the state_dict helpers FSDP2 users load with, and a model without FP8 weights refusing
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    two = make_model(seed=14)
    set_model_state_dict(two, get_model_state_dict(one))
    assert all(torch.equal(a._data.view(torch.uint8), b._data.view(torch.uint8))
               for a, b in zip(one.parameters(), two.parameters()) if isinstance(a, FP8Weight))
    plain = make_model(seed=15, fp8=False)
    from torch.distributed.checkpoint.api import CheckpointException  # (a BaseException)
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: 0.weight"):
        dcp.load(plain.state_dict(), checkpoint_id=str(runs[0] / "dcp"))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_one_process_checkpoint_reshards_to_two_ranks(runs):
    """DCP 1 -> 2: what one process saved loads on 2 FSDP2 ranks exactly, and training goes on
    as it does in one process from the same checkpoint (within the FSDP tolerance above)."""
    import torch.distributed.checkpoint as dcp
    saved = runs[2]
    for r in _get(runs, "from_one"):
        for k, v in saved.items():
            assert torch.equal(r["loaded"][k], v), k
    one = make_model(seed=23)
    sd = one.state_dict()
    dcp.load(sd, checkpoint_id=str(runs[0] / "dcp1"))
    one.load_state_dict(sd)
    opt = FP8MasterWeights(one.parameters(), torch.optim.AdamW, lr=1e-2)
    single = [train_step(one, opt, s).item() for s in range(STEPS)]
    (f, _) = _get(runs, "from_one")
    rel = [abs(a - b) / abs(b) for a, b in zip(f["losses"], single)]
    assert max(rel) <= 1e-4, (f["losses"], single)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
