"""fp8mix.GroupedLinear (Transformer Engine's GroupedLinear: mixture-of-experts experts as
one module, one C call per cast and GEMM over all experts).

References: torch's own nn.Linear / F.linear (initialisation, the high-precision path);
fp8mix.Linear per expert (every forward output, dx, dW, db and the FP8 state bit for bit:
the grouped ops' contract); and an independent float64 model of current scaling built on
torch's float8 casts (scale 448 / amax per expert, products summed in float64).
"""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import fp8mix
from fp8mix import recipe as R

pytestmark = pytest.mark.usefixtures("one_thread")

G, K, N = 4, 48, 40
SPLITS = ([5, 17, 0, 9], [1, 10, 12, 8], [0, 0, 31, 2])  # empty experts, sizes no multiple of 16
RECIPES = [R.DelayedScaling(), R.Float8CurrentScaling()]


def _pair(bias: bool = True, dtype=torch.float32):
    torch.manual_seed(0)
    gl = fp8mix.GroupedLinear(G, K, N, bias=bias, params_dtype=dtype)
    lins = []
    for g in range(G):
        lin = fp8mix.Linear(K, N, bias=bias, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(getattr(gl, f"weight{g}"))
            if bias:
                lin.bias.copy_(getattr(gl, f"bias{g}"))
        lins.append(lin)
    return gl, lins


def test_initialisation_and_keys_match_nn_linear_per_expert():
    torch.manual_seed(3)
    gl = fp8mix.GroupedLinear(G, K, N)
    torch.manual_seed(3)
    ref = [torch.nn.Linear(K, N) for _ in range(G)]
    for g in range(G):
        assert torch.equal(getattr(gl, f"weight{g}"), ref[g].weight)
        assert torch.equal(getattr(gl, f"bias{g}"), ref[g].bias)
    keys = [k for k in gl.state_dict() if not k.startswith("fp8_")]
    assert keys == list(itertools.chain.from_iterable((f"weight{g}", f"bias{g}") for g in range(G)))
    assert gl.fp8_scale.shape == (3 * G,)  # TE's num_gemms x 3 scaling factors


def test_high_precision_path_is_f_linear_per_expert():
    gl, _ = _pair()
    x = torch.randn(31, K)
    y = gl(x, SPLITS[0])
    parts = torch.split(x, SPLITS[0])
    ref = torch.cat([F.linear(p, getattr(gl, f"weight{g}"), getattr(gl, f"bias{g}")) for g, p in enumerate(parts)])
    assert torch.equal(y, ref)
    y3 = gl(x.reshape(1, 31, K), torch.tensor(SPLITS[0]))  # (..., K) inputs and a tensor of splits
    assert torch.equal(y3.reshape(31, N), ref)


@pytest.mark.parametrize("rec", RECIPES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_bit_for_bit_fp8mix_linear_per_expert(rec, bias):
    gl, lins = _pair(bias=bias)
    for step, splits in enumerate(SPLITS):
        x = torch.randn(sum(splits), K) * (step + 1)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            y = gl(x1, splits)
            yr = torch.cat([lin(p) for lin, p in zip(lins, torch.split(x2, splits))])
        dy = torch.randn_like(y)
        y.backward(dy)
        yr.backward(dy)
        assert torch.equal(y, yr), step
        assert torch.equal(x1.grad, x2.grad), step
        for g in range(G):
            assert torch.equal(getattr(gl, f"weight{g}").grad, lins[g].weight.grad), (step, g)
            if bias:
                assert torch.equal(getattr(gl, f"bias{g}").grad, lins[g].bias.grad), (step, g)
        gl.zero_grad()
        for lin in lins:
            lin.zero_grad()
    if rec.delayed():  # experts with rows in every step: the same state as their own Linear
        expert = 3  # (rows at every step above)
        sl = slice(3 * expert, 3 * expert + 3)
        assert torch.equal(gl.fp8_scale[sl], lins[expert].fp8_scale)
        assert torch.equal(gl.fp8_steps[sl], lins[expert].fp8_steps)
        assert torch.equal(gl.fp8_amax_history[:, sl], lins[expert].fp8_amax_history)
        # expert 2 had no rows at step 0: its input was not recorded then, its weight was
        assert int(gl.fp8_steps[6]) == 2 and int(gl.fp8_steps[7]) == 3


def _e4m3(t: torch.Tensor) -> torch.Tensor:  # torch's own cast (saturated first: torch's does not saturate)
    return t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float64)


def test_current_scaling_matches_a_float64_model_on_torch_casts():
    gl, _ = _pair()
    splits = SPLITS[1]
    mags = torch.tensor([0.01, 1.0, 30.0, 3.0]).repeat_interleave(torch.tensor(splits))
    x = torch.randn(sum(splits), K) * mags[:, None]
    with fp8mix.fp8_autocast(fp8_recipe=R.Float8CurrentScaling()):
        y = gl(x, splits)
    r0 = 0
    for g, m in enumerate(splits):
        xg = x[r0:r0 + m].double()
        w = getattr(gl, f"weight{g}").detach().double()
        sx, sw = float(torch.tensor(448.0) / xg.abs().max().float()), float(torch.tensor(448.0) / w.abs().max().float())
        ref = (_e4m3((xg * sx).float()) @ _e4m3((w * sw).float()).t()) / (sx * sw) + getattr(gl, f"bias{g}").double()
        mag = (_e4m3((xg * sx).float()).abs() @ _e4m3((w * sw).float()).abs().t()) / (sx * sw)
        err = (y[r0:r0 + m].double() - ref).abs()
        assert bool((err <= K * 2.0 ** -23 * (mag + ref.abs()) + 1e-30).all()), g
        r0 += m


def test_non_finite_input_poisons_only_its_rows():
    gl, _ = _pair()
    splits = SPLITS[1]
    x = torch.randn(sum(splits), K)
    with fp8mix.fp8_autocast(fp8_recipe=R.Float8CurrentScaling()):
        clean = gl(x, splits)
        x2 = x.clone()
        x2[3, 5] = float("inf")  # expert 1's rows are 1..10
        y = gl(x2, splits)
    assert bool(torch.isnan(y[3]).all())
    others = [r for r in range(sum(splits)) if not 1 <= r < 11]
    assert torch.equal(y[others], clean[others])  # per-expert scales: the other experts do not see it


def test_eval_and_no_grad_leave_the_state_alone():
    gl, _ = _pair()
    with fp8mix.fp8_autocast():
        gl(torch.randn(31, K, requires_grad=True), SPLITS[0]).sum().backward()
    before = {k: v.clone() for k, v in gl.state_dict().items() if k.startswith("fp8_")}
    with fp8mix.fp8_autocast():
        with torch.no_grad():
            gl(torch.randn(31, K), SPLITS[0])
        gl.eval()
        gl(torch.randn(31, K), SPLITS[0])
    for k, v in gl.state_dict().items():
        if k.startswith("fp8_"):
            assert torch.equal(v, before[k]), k


def _train(gl, opt, steps, seed):
    losses = []
    gen = torch.Generator().manual_seed(seed)
    for s in range(steps):
        splits = SPLITS[s % 3]
        x = torch.randn(sum(splits), K, generator=gen)
        with fp8mix.fp8_autocast():
            loss = gl(x, splits).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_state_dict_resume_is_exact():
    gl, _ = _pair()
    opt = torch.optim.AdamW(gl.parameters(), lr=1e-2)
    _train(gl, opt, 3, seed=1)
    saved = {k: v.clone() for k, v in gl.state_dict().items()}
    opt_saved = copy.deepcopy(opt.state_dict())
    straight = _train(gl, opt, 3, seed=2)
    fresh = fp8mix.GroupedLinear(G, K, N)
    fresh.load_state_dict(saved)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    opt2.load_state_dict(opt_saved)
    assert _train(fresh, opt2, 3, seed=2) == straight
    for k, v in gl.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k


@pytest.mark.parametrize("rec", RECIPES, ids=lambda r: type(r).__name__)
def test_activation_checkpointing_repeats_the_forward(rec):
    a, _ = _pair()
    b, _ = _pair()
    for step, splits in enumerate(SPLITS):
        x = torch.randn(sum(splits), K)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            ya = a(xa, splits)
            yb = checkpoint(lambda t: b(t, splits), xb, use_reentrant=False)
        ya.square().sum().backward()
        yb.square().sum().backward()
        assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad), step
        for g in range(G):
            assert torch.equal(getattr(a, f"weight{g}").grad, getattr(b, f"weight{g}").grad), (step, g)
    for k, v in a.state_dict().items():
        if k.startswith("fp8_") and k != "fp8_rng":  # (the rounding keys differ per module by design)
            assert torch.equal(v, b.state_dict()[k]), k  # the recompute recorded nothing twice


def test_is_first_microbatch_reuses_the_fp8_weights():
    gl, _ = _pair()
    x = torch.randn(31, K)
    with fp8mix.fp8_autocast():
        y1 = gl(x, SPLITS[0], is_first_microbatch=True)
        w_steps = gl.fp8_steps[1::3].clone()
        with torch.no_grad():
            for w in gl.weights():
                w.mul_(2.0)  # a stale FP8 copy is what False asks for
        y2 = gl(x, SPLITS[0], is_first_microbatch=False)
    assert torch.equal(gl.fp8_steps[1::3], w_steps)  # no weight re-cast, no record
    assert torch.equal(y1, y2)


def test_return_bias_and_bf16():
    torch.manual_seed(0)
    gl = fp8mix.GroupedLinear(G, K, N, return_bias=True, params_dtype=torch.bfloat16)
    x = torch.randn(31, K, dtype=torch.bfloat16)
    with fp8mix.fp8_autocast():
        y, biases = gl(x, SPLITS[0])
    assert y.dtype == torch.bfloat16 and len(biases) == G and biases[0] is gl.bias0
    gl.return_bias = False
    with fp8mix.fp8_autocast():
        yb = gl(x, SPLITS[0])
    off = torch.cat([b.expand(m, N) for b, m in zip(biases, SPLITS[0])])
    assert torch.allclose(yb.float(), (y.float() + off.float()), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("splits, exc, words", [
    ([5, 17, 0], ValueError, "num_gemms=4"),
    ([5, 17, 0, 8], ValueError, "sums to 30"),
    ([5, 17, -1, 10], ValueError, "non-negative"),
    ([5.0, 17, 0, 9], TypeError, "ints"),
    (torch.tensor([5.0, 17, 0, 9]), TypeError, "integer tensor"),
    ("abcd", TypeError, "ints"),
])
def test_bad_splits(splits, exc, words):
    gl, _ = _pair()
    for ctx in (None, fp8mix.fp8_autocast()):
        with pytest.raises(exc, match=words):
            if ctx is None:
                gl(torch.randn(31, K), splits)
            else:
                with ctx:
                    gl(torch.randn(31, K), splits)


def test_bad_arguments_and_recipes():
    with pytest.raises(ValueError, match="num_gemms"):
        fp8mix.GroupedLinear(0, K, N)
    with pytest.raises(ValueError, match="in_features"):
        fp8mix.GroupedLinear(2, True, N)
    with pytest.raises(NotImplementedError, match="fuse_wgrad_accumulation"):
        fp8mix.GroupedLinear(2, K, N, fuse_wgrad_accumulation=True)
    gl, _ = _pair()
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 48\)"):
        gl(torch.randn(31, K + 1), SPLITS[0])
    for rec in (R.DelayedScaling(fp8_format=fp8mix.Format.AUTO), R.Float8CurrentScaling(rounding="stochastic")):
        with fp8mix.fp8_autocast(fp8_recipe=rec), pytest.raises(NotImplementedError, match="grouped GEMMs"):
            gl(torch.randn(31, K), SPLITS[0])
    with fp8mix.fp8_autocast(fp8_recipe=R.BlockScaling(), monitor=fp8mix.Monitor(every=1)), \
            pytest.raises(NotImplementedError, match="Monitor"):
        gl(torch.randn(31, K), SPLITS[0])


OTHER = [R.BlockScaling(), R.MXFP8BlockScaling(), R.RowwiseScaling(),
         R.NVFP4BlockScaling(disable_stochastic_rounding=True, disable_rht=True, keep_last_layers_hp=0)]


@pytest.mark.parametrize("rec", OTHER, ids=lambda r: type(r).__name__)
def test_other_recipes_run_per_expert_bit_for_bit_fp8mix_linear(rec):
    """Block, MX, rowwise and NVFP4: one fp8mix GEMM step per expert (a loop), each with the
    expert's own FP8 state: outputs and gradients equal one fp8mix.Linear per expert."""
    gl, lins = _pair()
    k = 64  # (MX and NVFP4 need features that are multiples of their blocks: a wider layer)
    torch.manual_seed(1)
    gl = fp8mix.GroupedLinear(G, k, k)
    lins = [fp8mix.Linear(k, k) for _ in range(G)]
    for g, lin in enumerate(lins):
        with torch.no_grad():
            lin.weight.copy_(getattr(gl, f"weight{g}"))
            lin.bias.copy_(getattr(gl, f"bias{g}"))
    for step, splits in enumerate(SPLITS):
        x = torch.randn(sum(splits), k)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=rec):
            y = gl(x1, splits)
            yr = torch.cat([lin(p) for lin, p in zip(lins, torch.split(x2, splits))])
        y.square().sum().backward()
        yr.square().sum().backward()
        assert torch.equal(y, yr) and torch.equal(x1.grad, x2.grad), step
        for g in range(G):
            assert torch.equal(getattr(gl, f"weight{g}").grad, lins[g].weight.grad), (step, g)
        assert not torch.equal(y, torch.cat([torch.nn.functional.linear(p, getattr(gl, f"weight{g}"),
                                                                        getattr(gl, f"bias{g}"))
                                             for g, p in enumerate(torch.split(x, splits))]))  # (it is FP8)


def test_other_recipes_under_activation_checkpointing():
    a = fp8mix.GroupedLinear(G, 64, 64)
    b = fp8mix.GroupedLinear(G, 64, 64)
    b.load_state_dict(a.state_dict())
    for splits in SPLITS:
        x = torch.randn(sum(splits), 64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=R.BlockScaling()):
            ya = a(xa, splits)
            yb = checkpoint(lambda t: b(t, splits), xb, use_reentrant=False)
        ya.square().sum().backward()
        yb.square().sum().backward()
        assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
        for g in range(G):
            assert torch.equal(getattr(a, f"weight{g}").grad, getattr(b, f"weight{g}").grad)


def test_weights_apart_and_a_stacked_3d_parameter_give_the_same_bits():
    """The casts read the experts' weights as one block when they lie side by side; weights
    moved apart (here: one replaced) are stacked instead, and a stacked 3-D parameter (as
    Hugging Face MoE blocks hold experts) goes through the functional form."""
    from fp8mix.nn._grouped import grouped_linear_forward

    gl, _ = _pair(bias=False)
    x = torch.randn(31, K)
    w3 = torch.nn.Parameter(torch.stack([w.detach().clone() for w in gl.weights()]))
    with fp8mix.fp8_autocast(fp8_recipe=R.Float8CurrentScaling()):
        y_block = gl(x, SPLITS[0])
        gl.weight1 = torch.nn.Parameter(gl.weight1.detach().clone())  # no longer beside weight0
        y_apart = gl(x, SPLITS[0])
        y_3d = grouped_linear_forward(gl, x, w3, None, SPLITS[0])
    assert torch.equal(y_block, y_apart) and torch.equal(y_block, y_3d)
    y_3d.square().sum().backward()
    y_apart.square().sum().backward()
    for g in range(G):
        assert torch.equal(w3.grad[g], getattr(gl, f"weight{g}").grad), g


def test_convert_model_leaves_grouped_linear_weights_out_of_the_fp8_all_gather():
    model = torch.nn.Sequential(fp8mix.GroupedLinear(G, K, N), torch.nn.Linear(N, 32))
    model.forward = lambda x: x  # (never run: only the conversion report is read)
    fp8mix.convert_model(model, fsdp_fp8_all_gather=True)
    report = model.fp8_conversion
    assert "expert weights" in report.fp8_all_gather_skipped["0"]
    assert "1" in report.fp8_all_gather
