"""Tensor and sequence parallel in FP8 through DTensor: 2 CPU processes on gloo (4 for 2D).

One launch of 2 worker processes (this file run as a script) runs every 2-way scenario;
one launch of 4 runs the 2D one. The reference is the same model built from the same seed
and trained in the pytest process itself, without torch.distributed (one thread, like the
workers), on the same batches:

  mlp_{delayed,current}   MLP 64 -> 128 -> 64 (fp8mix.convert_model of nn.Linear layers),
                          torch's ColwiseParallel (fc1) then RowwiseParallel (fc2)
  attn_{delayed,current}  attention block, 4 heads: q/k/v Float8ColwiseParallel, out
                          Float8RowwiseParallel (fp8mix.distributed's torchao names); each
                          rank computes its 2 heads
  sp_delayed              LayerNorm + MLP with sequence parallel: SequenceParallel on the
                          norm, PrepareFloat8ModuleInput (Shard(1) -> Replicate: the
                          all-gather), fc2 reduce-scatters to Shard(1)
  hp                      outside fp8_autocast: against torch's TP of the nn.Linear model
  accum                   2 micro-batches per step (is_first_microbatch True / False)
  te_{tp,sp}              fp8mix.Linear built with Transformer Engine's arguments
                          (tp_group, tp_size, parallel_mode, sequence_parallel) on [s, b, h]
  te_ln_{tp,sp}           the same with a LayerNormLinear (column) as the first layer
  dcp                     the mlp_delayed model after its steps, saved with
                          torch.distributed.checkpoint (model and AdamW state); the test
                          loads it on one process and continues
  bad_input               a TP size that does not divide the features (three ways), a
                          style given a torch nn.Linear, a LayerNormLinear given a DTensor
                          weight, recipes (or FP8 on/off) that differ across the ranks
  fsdp_tp (4 processes)   2D: FSDP2 over "dp" x TP over "tp", the batch split over dp

The loss is linear in the output, sum(y * r) with a fixed r, so its gradient dy does not
depend on y: a rounding difference in y cannot reach the gradients. What the tests check:
  * every FP8 scale and amax history is bit-identical to the reference (delayed scaling:
    the state buffers after each run; the amaxes of the sharded weight, of fc2's sharded
    input and of fc1's sharded grad-output are all-reduced (MAX) over the TP group, and the
    MAX of shards is the whole tensor's amax exactly).
  * every weight and bias gradient, and every parameter after the AdamW steps, is
    bit-identical: each rank's FP8 bytes are the reference's bytes of its shard (same
    scales) and every element of dW and of fc2's input gradient is one K-reduction of the
    same products in the same order as in the unsharded GEMM. (Under current scaling this
    also shows the scales agree: a scale differing by any amount changes the FP8 bytes.)
  * the output and the block's input gradient: rtol 1e-5, atol 1e-6. These two are sums
    over ranks of FP32 partial GEMMs (the row-parallel output's all-reduce, the
    column-parallel input gradient's all-reduce), added in another order than one GEMM's
    K loop: ~1e-7 relative per element (float32's epsilon times a few terms). A wrong
    scale or a missing all-reduce shows as 1e-2 and up (an FP8 step is 2^-3 relative).
  * 2D FSDP2 x TP: the losses per step match one process at rtol 1e-5: each dp rank's
    loss is the mean over its half of the batch and FSDP2 averages the gradients, so the
    sum order changes further (the reduce-scatter's average of two halves).
  * DCP: the TP 2 checkpoint loaded on one process continues bit-identically to the
    reference trained for all the steps: the parameters, AdamW state and FP8 state it saved
    are the reference's bits (as above), and the continuation runs on one process.
  * bad input: clear errors naming the module and the sizes / the settings, on every rank,
    before any mismatched collective (the gloo timeout is 60 s: a hang fails the launch).
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix

D, H, HEADS = 64, 128, 4
B, S = 2, 8
STEPS = 3
MORE = 2  # steps the DCP test continues on one process
RTOL, ATOL = 1e-5, 1e-6

dist_ok = torch.distributed.is_available() and torch.distributed.is_gloo_available()
pytestmark = [pytest.mark.skipif(not dist_ok, reason="torch.distributed with gloo not available"),
              pytest.mark.usefixtures("one_thread")]


# --------------------------------------------------------------------------------------
# shared by the workers and the single-process reference
# --------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x, is_first_microbatch=None):
        kw = {} if is_first_microbatch is None else {"is_first_microbatch": is_first_microbatch}
        return self.fc2(F.gelu(self.fc1(x, **kw)), **kw)


class NormMLP(nn.Module):
    """LayerNorm + MLP. The norm has no affine parameters: under sequence parallel their
    gradients are sums over the tokens split across the ranks (torch's sum, in another
    order: ~1e-7), which would make every later step differ from the reference by rounding
    and hide what fp8mix's layers do bit for bit."""

    def __init__(self):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(D, elementwise_affine=False), MLP()

    def forward(self, x):
        return self.mlp(self.norm(x))


class Attention(nn.Module):
    """Causal self-attention; the head count follows q's output width (local heads under TP)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        hd = D // HEADS
        q, k, v = (t.view(b, s, -1, hd).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, -1))


class TEMLP(nn.Module):
    """The MLP from fp8mix.Linear with Transformer Engine's arguments (no TP args: whole)."""

    first = fp8mix.Linear

    def __init__(self, **tp):
        super().__init__()
        col = dict(tp, parallel_mode="column") if tp else {}
        row = dict(tp, parallel_mode="row") if tp else {}
        self.fc1, self.fc2 = self.first(D, H, **col), fp8mix.Linear(H, D, **row)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TELNMLP(TEMLP):
    """LayerNormLinear (column) then fp8mix.Linear (row), with TE's arguments (none: whole)."""

    first = fp8mix.LayerNormLinear

    def __init__(self, **tp):
        super().__init__(**tp)
        with torch.no_grad():  # a norm away from identity (TE initialises it at gamma 1, beta 0)
            g = torch.Generator().manual_seed(7)
            for p, mean in ((self.fc1.layer_norm_weight, 1.0), (self.fc1.layer_norm_bias, 0.0)):
                local = p.to_local() if hasattr(p, "to_local") else p  # (replicated under TP: the whole)
                local.copy_(torch.randn(D, generator=g) * 0.5 + mean)


class NormThenLinears(nn.Module):
    """TELNMLP's math without TP and without the fused norm cast: torch's LayerNorm, then
    fp8mix.Linear layers holding the same parameters (what the TP forward computes)."""

    def __init__(self, whole: TELNMLP):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(D), fp8mix.Linear(D, H), fp8mix.Linear(H, D)
        with torch.no_grad():
            self.norm.weight.copy_(whole.fc1.layer_norm_weight)
            self.norm.bias.copy_(whole.fc1.layer_norm_bias)
            for a, b in ((self.fc1, whole.fc1), (self.fc2, whole.fc2)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


def build(kind: str, **tp) -> nn.Module:
    torch.manual_seed(0)
    if kind == "te":
        return TEMLP(**tp)
    if kind == "te_ln":
        return TELNMLP(**tp)
    model = {"attn": Attention, "sp": NormMLP, "mlp": MLP}[kind]()
    return fp8mix.convert_model(model)


def recipe(kind: str, reduce_amax: bool = False):
    """reduce_amax=False (no all-reduce over fp8_autocast's group, the world of 2 here): the
    scales agree across the TP ranks through the TP group's all-reduce alone. The 2D test
    reduces over the data-parallel ranks too (reduce_amax=True, the default)."""
    if kind == "delayed":
        return fp8mix.recipe.DelayedScaling(amax_history_len=4, reduce_amax=reduce_amax)
    return fp8mix.recipe.CurrentScaling(reduce_amax=reduce_amax)


def batch(step: int, layout: str = "bsd"):
    g = torch.Generator().manual_seed(100 + step)
    x, r = torch.randn(B, S, D, generator=g) * 2, torch.randn(B, S, D, generator=g)
    return (x, r) if layout == "bsd" else (x.transpose(0, 1).contiguous(), r.transpose(0, 1).contiguous())


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def fp8_state(model) -> dict:
    from fp8mix.nn.fp8_state import fp8_modules
    out = {}
    for name, m in model.named_modules():
        if m in fp8_modules(model):
            out[name] = {"scale": m.fp8_scale.clone(), "history": m.fp8_amax_history[:8].clone(),
                         "steps": m.fp8_steps.clone(), "pending": m.fp8_grad_pending.clone()}
    return out


def train(model, kind: str, steps: int, *, first: int = 0, opt=None, shard=None, gather=None, layout="bsd",
          fp8: bool = True, micro: int = 1):
    """`steps` AdamW steps from batch `first` on; per step the (whole) output, the input's
    gradient and every parameter's gradient; then the parameters and the FP8 state.
    shard(t): the rank's part of a whole batch tensor; gather(t): the whole from parts.
    fp8=False: outside fp8_autocast. micro=2: two micro-batches per step, accumulating the
    gradients, the FP8 weight cast on the first and kept for the second
    (is_first_microbatch True / False); the last micro-batch's y and dx are kept."""
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-2)
    shard, gather = shard or (lambda t: t), gather or (lambda t: t)
    res: dict = {"y": [], "dx": [], "grads": [], "loss": []}
    for s in range(first, first + steps):
        for k in range(micro):
            x, r = batch(micro * s + k, layout)
            xl = shard(x).requires_grad_()
            with fp8mix.fp8_autocast(enabled=fp8, fp8_recipe=recipe(kind)):
                y = model(xl) if micro == 1 else model(xl, is_first_microbatch=(k == 0))
            loss = (y * shard(r)).sum()
            loss.backward()
        res["y"].append(gather(y.detach()))
        res["dx"].append(gather(xl.grad))
        res["grads"].append({n: _full(p.grad).clone() for n, p in model.named_parameters()})
        res["loss"].append(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
    res["params"] = {n: _full(p.detach()).clone() for n, p in model.named_parameters()}
    res["fp8"] = fp8_state(model)
    return res


# --------------------------------------------------------------------------------------
# the workers
# --------------------------------------------------------------------------------------
def _seq_parts(dim: int):
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()

    def shard(t):
        return t.chunk(world, dim=dim)[rank].contiguous()

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=dim)
    return shard, gather


def _plan(kind: str) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    from fp8mix.distributed import Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    if kind == "mlp":
        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    if kind == "attn":
        return {"q": Float8ColwiseParallel(), "k": Float8ColwiseParallel(), "v": Float8ColwiseParallel(),
                "out": Float8RowwiseParallel()}
    return {"norm": SequenceParallel(),
            "mlp": PrepareFloat8ModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
            "mlp.fc1": Float8ColwiseParallel(), "mlp.fc2": Float8RowwiseParallel(output_layouts=Shard(1))}


def _run_tp(model_kind: str, kind: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("cpu", (2,))
    model = build(model_kind)
    parallelize_module(model, mesh, _plan(model_kind))
    shard, gather = _seq_parts(1) if model_kind == "sp" else (None, None)
    res = train(model, kind, STEPS, shard=shard, gather=gather)
    res["weight_local_shape"] = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()
                                 if n.endswith("weight")}
    return res


def _run_hp():
    """Outside fp8_autocast: fp8mix's TP layers against torch's TP of the nn.Linear model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("cpu", (2,))
    ours, plain = build("mlp"), MLP()
    plain.load_state_dict({k: v for k, v in ours.state_dict().items() if not k.split(".")[-1].startswith("fp8_")})
    for m in (ours, plain):
        parallelize_module(m, mesh, _plan("mlp"))
    return {"fp8mix": train(ours, "current", STEPS, fp8=False), "torch": train(plain, "current", STEPS, fp8=False)}


def _run_accum():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    model = build("mlp")
    parallelize_module(model, init_device_mesh("cpu", (2,)), _plan("mlp"))
    return train(model, "delayed", STEPS, micro=2)


def _run_te(sp: bool, kind: str = "te"):
    import torch.distributed as dist
    model = build(kind, tp_group=dist.group.WORLD, tp_size=2, sequence_parallel=sp)
    shard, gather = _seq_parts(0) if sp else (None, None)
    res = train(model, "delayed", STEPS, shard=shard, gather=gather, layout="sbd")
    res["weight_local_shape"] = {n: tuple(p.to_local().shape) for n, p in model.named_parameters() if p.dim() == 2}
    return res


def _run_dcp(out_dir: str):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("cpu", (2,))
    model = build("mlp")
    parallelize_module(model, mesh, _plan("mlp"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, "delayed", STEPS, opt=opt)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{out_dir}/ckpt")
    return {"dir": f"{out_dir}/ckpt", "keys": sorted(msd)}


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _run_bad_input(rank: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from fp8mix.distributed import Float8ColwiseParallel, Float8RowwiseParallel
    mesh = init_device_mesh("cpu", (2,))
    out = {}
    odd = fp8mix.convert_model(nn.Sequential(nn.Linear(D, 33)))
    parallelize_module(odd, mesh, {"0": ColwiseParallel()})
    x = torch.randn(4, D)

    def run_odd():
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe("current")):
            odd(x)
    out["divide_forward"] = _error(run_odd)
    out["divide_style"] = _error(lambda: parallelize_module(fp8mix.convert_model(nn.Sequential(nn.Linear(33, D))),
                                                            mesh, {"0": Float8RowwiseParallel()}))
    out["divide_te"] = _error(lambda: fp8mix.Linear(D, 33, tp_group=dist.group.WORLD, parallel_mode="column"))
    out["not_fp8"] = _error(lambda: parallelize_module(nn.Sequential(nn.Linear(D, D)), mesh,
                                                       {"0": Float8ColwiseParallel()}))
    from torch.distributed.tensor import Shard, distribute_tensor
    lnl = fp8mix.LayerNormLinear(D, D)  # a fused module with a DTensor weight: refused, not mis-run
    lnl.weight = nn.Parameter(distribute_tensor(lnl.weight.detach(), mesh, [Shard(0)]))

    def run_lnl():
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe("current")):
            lnl(x)
    out["fused_module"] = _error(run_lnl)
    model = build("mlp")
    parallelize_module(model, mesh, _plan("mlp"))

    def step(rec, enabled=True):
        with fp8mix.fp8_autocast(enabled=enabled, fp8_recipe=rec):
            model(batch(0)[0]).sum().backward()
    out["nvfp4"] = _error(lambda: step(fp8mix.recipe.NVFP4BlockScaling()))
    out["rowwise"] = _error(lambda: step(fp8mix.recipe.RowwiseScaling()))
    out["block"] = _error(lambda: step(fp8mix.recipe.BlockScaling()))
    out["recipes"] = _error(lambda: step(recipe("delayed" if rank == 0 else "current")))
    out["enabled"] = _error(lambda: step(recipe("current"), enabled=(rank == 0)))
    step(recipe("current"))  # the same settings again: runs (nothing left out of step)
    out["after"] = "ran"
    return out


def _run_fsdp_tp(rank: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = build("mlp")
    parallelize_module(model, mesh["tp"], _plan("mlp"))
    fully_shard(model.fc1, mesh=mesh["dp"])
    fully_shard(model.fc2, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    dp = mesh["dp"].get_local_rank()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for s in range(STEPS):
        x, r = batch(s)
        xl, rl = x.chunk(2)[dp], r.chunk(2)[dp]
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe("delayed", reduce_amax=True)):
            y = model(xl)
        loss = (y * rl).sum() / y.numel()  # the mean over this rank's half; FSDP2 averages the gradients
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total / 4)  # (the 2 tp ranks of a dp rank hold the same loss)
    return {"losses": torch.stack(losses), "dp": dp, "fp8": fp8_state(model)}


def _worker(rank, port, out_dir, world):
    from fsdp_launch import init_worker, run_scenarios
    init_worker(rank, port, world)
    if world == 4:
        run_scenarios(rank, out_dir, [("fsdp_tp", lambda: _run_fsdp_tp(rank))])
        return
    scenarios = [(f"{m}_{k}", lambda m=m, k=k: _run_tp(m, k)) for m in ("mlp", "attn") for k in ("delayed", "current")]
    scenarios += [("hp", _run_hp), ("accum", _run_accum)]
    scenarios += [("sp_delayed", lambda: _run_tp("sp", "delayed")), ("te_tp", lambda: _run_te(False)),
                  ("te_sp", lambda: _run_te(True)), ("te_ln_tp", lambda: _run_te(False, "te_ln")),
                  ("te_ln_sp", lambda: _run_te(True, "te_ln")), ("dcp", lambda: _run_dcp(out_dir)),
                  ("bad_input", lambda: _run_bad_input(rank))]
    run_scenarios(rank, out_dir, scenarios)


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from fsdp_launch import launch
    return launch(__file__, tmp_path_factory.mktemp("tp"), args=(2,))


def _get(runs, name):
    from fsdp_launch import get
    return get(runs, name)


def _reference(model_kind: str, kind: str, steps: int = STEPS):
    torch.set_num_threads(1)
    layout = "sbd" if model_kind == "te" else "bsd"
    return train(build(model_kind), kind, steps, layout=layout)


def _assert_equal_to_reference(r: dict, ref: dict):
    for s in range(STEPS):
        torch.testing.assert_close(r["y"][s], ref["y"][s], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(r["dx"][s], ref["dx"][s], rtol=RTOL, atol=ATOL)
        assert r["grads"][s].keys() == ref["grads"][s].keys()
        for n, g in ref["grads"][s].items():
            assert torch.equal(r["grads"][s][n], g), (s, n, (r["grads"][s][n] - g).abs().max())
    for n, p in ref["params"].items():
        assert torch.equal(r["params"][n], p), n
    assert r["fp8"].keys() == ref["fp8"].keys()
    for name, st in ref["fp8"].items():
        for k, v in st.items():
            assert torch.equal(r["fp8"][name][k], v), (name, k, r["fp8"][name][k], v)


@pytest.mark.parametrize("kind", ["delayed", "current"])
@pytest.mark.parametrize("model_kind", ["mlp", "attn"])
def test_two_way_tp_equals_one_process(runs, model_kind, kind):
    ref = _reference(model_kind, kind)
    torch.manual_seed(0)
    hp = {"attn": Attention, "mlp": MLP}[model_kind]()  # the same weights, no FP8: the reference's FP8 shows
    x, _ = batch(0)
    assert (hp(x) - ref["y"][0]).abs().max() > 1e-2 * ref["y"][0].abs().max()
    for r in _get(runs, f"{model_kind}_{kind}"):
        _assert_equal_to_reference(r, ref)
        assert all(int(st["steps"].max()) > 0 for st in r["fp8"].values()) == (kind == "delayed")
    shapes = _get(runs, f"{model_kind}_{kind}")[0]["weight_local_shape"]
    assert shapes == ({"fc1.weight": (H // 2, D), "fc2.weight": (D, H // 2)} if model_kind == "mlp" else
                      {"q.weight": (D // 2, D), "k.weight": (D // 2, D), "v.weight": (D // 2, D),
                       "out.weight": (D, D // 2)})


def test_delayed_scaling_state_is_the_one_process_state(runs):
    """After STEPS steps the amax histories hold STEPS records of the input and weight
    and STEPS - 1 of the grad-output (the last backward's amax waits, pending, for the next
    forward), all the reference's; so do the pending amaxes."""
    ref = _reference("mlp", "delayed")
    for r in _get(runs, "mlp_delayed"):
        for name in ("fc1", "fc2"):
            assert torch.equal(r["fp8"][name]["history"], ref["fp8"][name]["history"])
            assert torch.equal(r["fp8"][name]["pending"], ref["fp8"][name]["pending"])
            assert r["fp8"][name]["steps"].tolist() == [STEPS, STEPS, STEPS - 1]
            assert int((r["fp8"][name]["history"][:STEPS] > 0).sum()) == 3 * STEPS - 1
            assert float(r["fp8"][name]["pending"].max()) > 0


def test_outside_fp8_autocast_tp_is_torchs_tp_of_nn_linear(runs):
    for r in _get(runs, "hp"):
        ours, plain = r["fp8mix"], r["torch"]
        for s in range(STEPS):
            assert torch.equal(ours["y"][s], plain["y"][s]) and torch.equal(ours["dx"][s], plain["dx"][s])
            for n, g in plain["grads"][s].items():
                assert torch.equal(ours["grads"][s][n], g), n
        assert all(int(st["steps"].max()) == 0 for st in ours["fp8"].values())  # nothing recorded


def test_gradient_accumulation_keeps_the_fp8_weight_as_one_process(runs):
    """is_first_microbatch=True casts the weight shard (its amax all-reduced) and keeps it,
    False reuses it: 2 micro-batches per step equal the reference doing the same."""
    torch.set_num_threads(1)
    ref = train(build("mlp"), "delayed", STEPS, micro=2)
    for r in _get(runs, "accum"):
        _assert_equal_to_reference(r, ref)
        # the weight's amax is recorded once per step (on the first micro-batch), the input's twice
        assert r["fp8"]["fc1"]["steps"].tolist()[:2] == [2 * STEPS, STEPS]


def test_sequence_parallel_equals_one_process(runs):
    ref = _reference("sp", "delayed")
    for r in _get(runs, "sp_delayed"):
        _assert_equal_to_reference(r, ref)


@pytest.mark.parametrize("name", ["te_tp", "te_sp"])
def test_te_tp_arguments_equal_one_process(runs, name):
    ref = _reference("te", "delayed")
    for r in _get(runs, name):
        _assert_equal_to_reference(r, ref)
        assert r["weight_local_shape"] == {"fc1.weight": (H // 2, D), "fc2.weight": (D, H // 2)}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # (what loading on one process is)
@pytest.mark.parametrize("name", ["te_ln_tp", "te_ln_sp"])
def test_te_layernorm_linear_column_parallel_equals_one_process(runs, name):
    """LayerNormLinear(parallel_mode="column") + Linear(parallel_mode="row") against the
    same parameters run without TP as torch's LayerNorm then fp8mix.Linear layers. Step 0:
    the GEMM weights' gradients bit-identical (the norm's output is computed row by row,
    the same on every rank); the norm's parameter gradients, the output and the input
    gradient within rtol 1e-5 (the norm's input gradient is the sum over ranks of their
    partial dgrads, all-reduced before the norm's backward). The later steps start from
    norm parameters that differ by that rounding, so an FP8 rounding of a few elements may
    flip: the output within rtol 1e-3 there (one flip moves an element by an FP8 step,
    2^-3 relative, averaged into each output over 128 products)."""
    torch.set_num_threads(1)
    ref = train(NormThenLinears(build("te_ln")), "delayed", STEPS, layout="sbd")
    rename = {"fc1.layer_norm_weight": "norm.weight", "fc1.layer_norm_bias": "norm.bias"}
    for r in _get(runs, name):
        g, gref = r["grads"][0], ref["grads"][0]
        for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
            assert torch.equal(g[n], gref[n]), n
        for n, m in rename.items():
            torch.testing.assert_close(g[n], gref[m], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(r["y"][0], ref["y"][0], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(r["dx"][0], ref["dx"][0], rtol=RTOL, atol=ATOL)
        for s in range(1, STEPS):
            torch.testing.assert_close(r["y"][s], ref["y"][s], rtol=1e-3, atol=1e-3)
        assert r["weight_local_shape"] == {"fc1.weight": (H // 2, D), "fc2.weight": (D, H // 2)}
        assert r["fp8"]["fc1"]["steps"].tolist() == [STEPS, STEPS, STEPS - 1]


def test_dcp_checkpoint_of_tp2_continues_on_one_process(runs):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    info = _get(runs, "dcp")[0]
    assert "fc1.fp8_amax_history" in info["keys"] and "fc2.fp8_version" in info["keys"]
    model = build("mlp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=info["dir"])
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    ref_model = build("mlp")
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    train(ref_model, "delayed", STEPS, opt=ref_opt)
    for n, p in ref_model.named_parameters():  # what was saved: the reference's bits
        assert torch.equal(dict(model.named_parameters())[n], p), n
    cont = train(model, "delayed", MORE, first=STEPS, opt=opt)
    ref = train(ref_model, "delayed", MORE, first=STEPS, opt=ref_opt)
    for s in range(MORE):
        assert torch.equal(cont["y"][s], ref["y"][s]) and torch.equal(cont["loss"][s], ref["loss"][s])
    for n, p in ref["params"].items():
        assert torch.equal(cont["params"][n], p), n
    for name, st in ref["fp8"].items():
        for k, v in st.items():
            assert torch.equal(cont["fp8"][name][k], v), (name, k)


def test_bad_input_is_a_clear_error_on_every_rank(runs):
    for rank, r in enumerate(_get(runs, "bad_input")):
        for key in ("divide_forward", "divide_style", "divide_te"):
            assert r[key].startswith("ValueError") and "tensor-parallel size 2 does not divide" in r[key], r[key]
        assert "out_features (33)" in r["divide_forward"] and "in_features (33)" in r["divide_style"]
        assert "fp8mix.Linear" in r["divide_te"] and "out_features (33)" in r["divide_te"]
        assert "expects an fp8mix.Linear" in r["not_fp8"] and "torch.nn.modules.linear.Linear" in r["not_fp8"]
        assert r["fused_module"].startswith("NotImplementedError: fp8mix.LayerNormLinear: a DTensor weight its "
                                            "tensor-parallel arguments did not make"), r

        for key in ("recipes", "enabled"):
            assert r[key].startswith("ValueError") and "fp8mix.Linear" in r[key], r[key]
            assert "different FP8 settings" in r[key] and f"ranks [{1 - rank}] differ" in r[key], r[key]
        assert "DelayedScaling" in r["recipes"] if rank == 0 else "CurrentScaling" in r["recipes"]
        assert r["nvfp4"].startswith("NotImplementedError: fp8mix.Linear: NVFP4BlockScaling under tensor"), r
        for key, name in (("rowwise", "RowwiseScaling"), ("block", "BlockScaling")):
            assert r[key].startswith(f"NotImplementedError: fp8mix.Linear: {name} under tensor parallelism"), r[key]
        assert r["after"] == "ran"


def test_fsdp2_times_tp_on_four_processes_matches_one_process(tmp_path):
    from fsdp_launch import get, launch
    runs = launch(__file__, tmp_path, world=4, args=(4,))
    res = get(runs, "fsdp_tp")
    torch.set_num_threads(1)
    model = build("mlp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref = []
    for s in range(STEPS):
        x, r = batch(s)
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=recipe("delayed", reduce_amax=True)):
            y = model(x)
        loss = (y * r).sum() / y.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref.append(loss.detach())
    assert sorted(r["dp"] for r in res) == [0, 0, 1, 1]
    for r in res:
        torch.testing.assert_close(r["losses"], torch.stack(ref), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(r["losses"], res[0]["losses"], rtol=0, atol=0)  # every rank the same


def test_styles_refuse_what_they_cannot_run():
    """Without a process group: PrepareFloat8ModuleInput's torchao arguments."""
    from fp8mix.distributed import PrepareFloat8ModuleInput
    with pytest.raises(NotImplementedError, match="float8_e4m3fn"):
        PrepareFloat8ModuleInput(float8_dtype=torch.float8_e5m2)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
