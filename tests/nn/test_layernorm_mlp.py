"""fp8mix.LayerNormMLP (norm -> fc1 -> activation -> fc2, two FP8 GEMMs, fused norm and
activation casts) and the fused activation cast op (torch.ops.fp8mix.act_cast /
act_delayed_cast, csrc/core/act.c).

What is checked:
  * the op, for every activation (Transformer Engine's definitions, from TE's test
    reference: gelu/geglu tanh form, qgelu a*sigmoid(1.702a), srelu relu^2, gated a | b
    halves): values against float64 torch, bytes equal to quantize_current / cast of the
    produced values (stochastic rounding included), the same bits on every ISA, strided
    and bfloat16 inputs, opcheck, bad arguments;
  * the module: TE's names, parameters and keys; exactly torch's ops outside
    fp8_autocast; inside, every recipe and activation: forward >= 22 dB and gradients
    >= 15 dB against float64 (Linear's bounds, 25 and 18 dB, less 3 dB for the second
    GEMM in series; relu/reglu gradients >= 12 dB: their step derivative flips where the
    forward's FP8 error flips the sign of h), and never worse than the unfused
    composition fp8mix.LayerNorm -> fp8mix.Linear -> act -> fp8mix.Linear by more than
    0.25 dB; one FP8 state of 6 roles; checkpointing bit-identical; evaluation leaves the
    state; state_dict round trip; what backward saves.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import sqnr_db
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import fp8mix
from fp8mix import ops
from fp8mix.formats import Granularity
from fp8mix.nn.activations import ACTIVATIONS, act_hp
from fp8mix.ops import Act, DelayedSpec
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
RECIPES = {"delayed": lambda: DelayedScaling(amax_history_len=4), "current": CurrentScaling, "block": BlockScaling}
ALL_ACTS = sorted(ACTIVATIONS)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


def te_act64(name: str, h: torch.Tensor) -> torch.Tensor:
    """TE's definitions in float64, written here from TE's test reference."""
    base = {"gelu": lambda a: F.gelu(a, approximate="tanh"), "relu": F.relu, "silu": F.silu,
            "qgelu": lambda a: a * torch.sigmoid(1.702 * a), "srelu": lambda a: (a > 0) * a * a}
    gated = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu", "qgeglu": "qgelu", "sreglu": "srelu"}
    h = h.double()
    if name in gated:
        a, b = h.chunk(2, dim=-1)
        return base[gated[name]](a) * b
    return base[name](h)


# --------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_ACTS)
def test_act_values_against_float64(name):
    torch.manual_seed(1)
    h = torch.randn(37, 400) * 3
    act = ACTIVATIONS[name]
    _, _, _, _, hp = ops.act_cast(h, act=act, fp8_dtype=E4, hp_dtype=torch.float32)
    ref = te_act64(name, h)
    assert hp.shape == ref.shape
    torch.testing.assert_close(hp.double(), ref, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(act_hp(act, h).double(), ref, rtol=2e-6, atol=1e-6)  # the high-precision path


@pytest.mark.parametrize("name", ["gelu", "swiglu", "srelu", "qgeglu"])
@pytest.mark.parametrize("gran", [Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK, Granularity.BLOCK2D])
def test_act_bytes_are_the_cast_of_the_values(name, gran):
    torch.manual_seed(2)
    h = torch.randn(130, 520)[:, :516]  # strided rows
    act = ACTIVATIONS[name]
    rng = torch.tensor([99, 12], dtype=torch.int64)
    q, qt, sinv, am, hp = ops.act_cast(h, act=act, fp8_dtype=E5, granularity=gran, transpose=True, inf_to_nan=True,
                                       rng=rng, rng_skip=4, hp_dtype=torch.float32)
    rq, rqt, rsinv, ram = ops.quantize_current(hp, E5, granularity=gran, transpose=True, inf_to_nan=True, rng=rng,
                                               rng_skip=4)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(qt.view(torch.uint8), rqt.view(torch.uint8))
    assert torch.equal(sinv, rsinv) and torch.equal(am, ram)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_act_same_bits_on_every_isa(isa):
    torch.manual_seed(3)
    h = (torch.randn(70, 300) * 4).bfloat16()
    h[3, :10] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 90.0, -90.0, 1e-30, -1e-30, 44.0])
    for name in ALL_ACTS:
        ops.set_max_isa("scalar")
        ref = ops.act_cast(h, act=ACTIVATIONS[name], fp8_dtype=E4, granularity=Granularity.BLOCK,
                           hp_dtype=torch.float32)
        ops.set_max_isa(isa)
        got = ops.act_cast(h, act=ACTIVATIONS[name], fp8_dtype=E4, granularity=Granularity.BLOCK,
                           hp_dtype=torch.float32)
        for a, b in zip(ref, got):
            a, b = (t.view(torch.uint8) if t.dtype == E4 else t.view(torch.int32) for t in (a, b))
            assert torch.equal(a, b), name


def test_act_delayed_follows_delayed_cast():
    torch.manual_seed(4)
    spec = DelayedSpec(history_len=4)
    sa = (torch.zeros(4, 6), torch.ones(6), torch.zeros(6, dtype=torch.int64))
    sb = tuple(t.clone() for t in sa)
    for step in range(3):
        h = torch.randn(20, 128) * (1 + step)
        q, _, sc, am, hp = ops.act_delayed_cast(h, *sa, act=Act.SWIGLU, role=3, fp8_dtype=E4, spec=spec, record=True,
                                                hp_dtype=torch.float32)
        rq, _, rsc, ram = ops.delayed_cast(hp, *sb, role=3, fp8_dtype=E4, spec=spec, record=True)
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(sc, rsc)
        assert all(torch.equal(a, b) for a, b in zip(sa, sb))
    assert sa[2].tolist() == [0, 0, 0, 3, 0, 0]


def test_act_opcheck_and_bad_arguments():
    R = torch.ops.fp8mix
    h = torch.randn(2, 5, 256)
    torch.library.opcheck(R.act_cast, (h, int(Act.GEGLU), E4, 2), dict(hp_dtype=torch.bfloat16))
    torch.library.opcheck(R.act_cast, (h.bfloat16(), int(Act.GELU), E5, 0), dict(transpose=True))
    state = (torch.zeros(4, 6), torch.ones(6), torch.zeros(6, dtype=torch.int64))
    torch.library.opcheck(R.act_delayed_cast, (h, int(Act.SWIGLU), *state, 4, 4, E4), {})
    with pytest.raises(ValueError, match="even last dimension"):
        ops.act_cast(torch.randn(4, 7), act=Act.SWIGLU, fp8_dtype=E4)
    with pytest.raises(ValueError, match="unknown activation kind"):
        R.act_cast(h, 10, E4, 0)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        ops.act_cast(h.double(), act=Act.GELU, fp8_dtype=E4)


# --------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------
def make(hidden=96, ffn=160, activation="gelu", normalization="LayerNorm", seed=0, **kw):
    torch.manual_seed(seed)
    m = fp8mix.LayerNormMLP(hidden, ffn, activation=activation, normalization=normalization, **kw)
    with torch.no_grad():  # weights of unit-variance outputs, a norm that is not the identity
        m.layer_norm_weight.add_(torch.randn(hidden) * 0.3)
        if m.layer_norm_bias is not None:
            m.layer_norm_bias.normal_(0, 0.2)
        m.fc1_weight.normal_(0, 1 / math.sqrt(hidden))
        m.fc2_weight.normal_(0, 1 / math.sqrt(ffn))
        for b in (m.fc1_bias, m.fc2_bias):
            if b is not None:
                b.normal_(0, 0.1)
    return m


def reference(m, x, dtype=torch.float64):
    p = {n: t.detach().to(dtype).requires_grad_() for n, t in m.named_parameters()}
    xr = x.detach().to(dtype).requires_grad_()
    gamma = (1 + p["layer_norm_weight"]) if m.zero_centered_gamma else p["layer_norm_weight"]
    if m.normalization == "LayerNorm":
        ln = F.layer_norm(xr, (m.hidden_size,), gamma, p["layer_norm_bias"], m.eps)
    else:
        ln = F.rms_norm(xr, (m.hidden_size,), gamma, m.eps)
    h = F.linear(ln, p["fc1_weight"], p.get("fc1_bias"))
    return F.linear(act_hp(m._act, h), p["fc2_weight"], p.get("fc2_bias")), xr, p


class Unfused(nn.Module):
    """The composition the fused module replaces, sharing its parameters."""

    def __init__(self, m):
        super().__init__()
        self.act = m._act
        cls = fp8mix.LayerNorm if m.normalization == "LayerNorm" else fp8mix.RMSNorm
        self.ln = cls(m.hidden_size, eps=m.eps)
        self.fc1 = fp8mix.Linear(m.hidden_size, m.fc1_weight.shape[0], bias=m.fc1_bias is not None)
        self.fc2 = fp8mix.Linear(m.ffn_hidden_size, m.hidden_size, bias=m.fc2_bias is not None)
        self.ln.weight = m.layer_norm_weight
        if m.layer_norm_bias is not None:
            self.ln.bias = m.layer_norm_bias
        self.fc1.weight, self.fc1.bias = m.fc1_weight, m.fc1_bias
        self.fc2.weight, self.fc2.bias = m.fc2_weight, m.fc2_bias

    def forward(self, x):
        return self.fc2(act_hp(self.act, self.fc1(self.ln(x))))


def test_te_names_parameters_keys_and_options():
    m = fp8mix.LayerNormMLP(64, 128, activation="swiglu", params_dtype=torch.bfloat16)
    keys = [k for k in m.state_dict() if not k.startswith("fp8_")]
    assert keys == ["layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]
    assert m.fc1_weight.shape == (256, 64) and m.fc2_weight.shape == (64, 128)  # gated: fc1 gives both halves
    assert m.fp8_amax_history.shape[1] == 6 and m.fp8_role_name(4) == "fc2.weight"
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    r = fp8mix.LayerNormMLP(64, 128, normalization="RMSNorm", bias=False)
    assert [n for n, _ in r.named_parameters()] == ["layer_norm_weight", "fc1_weight", "fc2_weight"]
    c = fp8mix.LayerNormMLP(64, 128, init_method=lambda w: nn.init.constant_(w, 0.25),
                            output_layer_init_method=lambda w: nn.init.constant_(w, -0.5))
    assert torch.equal(c.fc1_weight, torch.full((128, 64), 0.25)) and torch.equal(c.fc2_weight,
                                                                                  torch.full((64, 128), -0.5))
    with pytest.raises(ValueError, match="activation must be one of"):
        fp8mix.LayerNormMLP(64, 128, activation="tanh")
    with pytest.raises(NotImplementedError, match="set_parallel_mode"):
        fp8mix.LayerNormMLP(64, 128, set_parallel_mode=True)
    fp8mix.LayerNormMLP(64, 128, seq_length=16, micro_batch_size=2, get_rng_state_tracker=None)


@pytest.mark.parametrize("activation", ["gelu", "swiglu", "srelu"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_high_precision_is_torch_ops_bit_for_bit(activation, normalization, dtype):
    m = make(64, 96, activation, normalization).to(dtype)
    x0 = torch.randn(3, 9, 64, dtype=dtype)
    ref, xr, p = reference(m, x0, dtype=dtype)
    ref.backward(torch.ones_like(ref))
    x = x0.clone().requires_grad_()
    y = m(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(y, ref) and torch.equal(x.grad, xr.grad)
    assert all(torch.equal(t.grad, p[n].grad) for n, t in m.named_parameters())


def _run(mod, x0, g, recipe):
    x = x0.clone().requires_grad_()
    mod.zero_grad()
    with fp8mix.fp8_autocast(fp8_recipe=recipe):
        y = mod(x)
    y.backward(g)
    return y, x.grad


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("activation", ALL_ACTS)
@pytest.mark.parametrize("shape", [(96, 160, (3, 40)), (129, 256, (70,))], ids=["96x160", "129x256"])
def test_accuracy_vs_float64_and_vs_the_unfused_composition(recipe, activation, shape):
    H, FF, lead = shape
    m = make(H, FF, activation, seed=H + FF)
    x0, g = torch.randn(*lead, H) * 2 + 0.5, torch.randn(*lead, H)
    ref, xr, p = reference(m, x0)
    ref.backward(g.double())
    got = {}
    for name, mod in (("fused", m), ("unfused", Unfused(m))):
        y, dx = _run(mod, x0, g, RECIPES[recipe]())
        d = {"forward": sqnr_db(ref, y), "dx": sqnr_db(xr.grad, dx)}
        d.update({n: sqnr_db(p[n].grad, t.grad) for n, t in m.named_parameters()})
        got[name] = d
    f, u = got["fused"], got["unfused"]
    grad_floor = 12 if activation in ("relu", "reglu") else 15
    assert f["forward"] >= 22 and f["forward"] < 60, f
    assert all(v >= grad_floor for k, v in f.items() if k != "forward"), f
    assert all(f[k] >= u[k] - 0.25 for k in f), (f, u)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_return_layernorm_output_and_bias(recipe):
    m = make(64, 96, "geglu", return_layernorm_output=True, return_bias=True)
    x0 = torch.randn(30, 64)
    ref, xr, p = reference(m, x0)
    ref = ref - p["fc2_bias"]
    with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        out, bias, ln = m(x0)
    assert bias is m.fc2_bias
    torch.testing.assert_close(ln.double(), F.layer_norm(x0.double(), (64,), p["layer_norm_weight"],
                                                          p["layer_norm_bias"], m.eps), rtol=0, atol=1e-5)
    assert sqnr_db(ref, out) >= 22


def test_one_state_for_two_gemms_and_the_weight_property():
    m = make(64, 96)
    with fp8mix.fp8_autocast():
        for _ in range(2):
            m(torch.randn(8, 64)).sum().backward()
    assert m.fp8_steps.tolist() == [2, 2, 1, 2, 2, 1]  # the second backward's amaxes pending
    assert m.weight is m.fc1_weight  # between forwards: fc1's (the property follows the running GEMM)
    assert set(m.fp8_format_report()) == {f"fc{i}.{r}" for i in (1, 2) for r in ("input", "weight", "grad_output")}


def _steps(m, recipe, mode=None, n=3):
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        x = (torch.randn(40, m.hidden_size, generator=gen) * (1 + i)).requires_grad_()
        with fp8mix.fp8_autocast(fp8_recipe=recipe):
            y = m(x) if mode is None else (fp8mix.checkpoint(m, x) if mode == "fp8mix" else
                                           torch_checkpoint(m, x, use_reentrant=mode == "reentrant"))
            y.square().mean().backward()
        out.append((y.detach(), x.grad.clone(), [q.grad.clone() for q in m.parameters()]))
        opt.step()
        opt.zero_grad()
    return out, {k: v.clone() for k, v in m.state_dict().items() if k.startswith("fp8_")}


CKPT_CASES = [(r, m) for r in ("delayed", "current", "block", "delayed_sr")
              for m in ("non_reentrant", "reentrant", "fp8mix")]


@pytest.mark.parametrize("recipe,mode", CKPT_CASES)
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_activation_checkpointing_is_bit_identical(recipe, mode, activation):
    rec = (lambda: DelayedScaling(amax_history_len=4, rounding="stochastic")) if recipe == "delayed_sr" \
        else RECIPES[recipe]
    base = make(160, 144, activation)
    ref, ref_state = _steps(copy.deepcopy(base), rec())
    got, got_state = _steps(copy.deepcopy(base), rec(), mode=mode)
    for (y0, x0, g0), (y1, x1, g1) in zip(ref, got):
        assert torch.equal(y0, y1) and torch.equal(x0, x1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert all(torch.equal(ref_state[k], got_state[k]) for k in ref_state)


@pytest.mark.parametrize("recipe", ["delayed", "block"])
def test_state_dict_round_trip_and_evaluation(recipe):
    a = make(96, 160, "swiglu")
    _steps(a, RECIPES[recipe](), n=2)
    b = fp8mix.LayerNormMLP(96, 160, activation="swiglu")
    b.load_state_dict(a.state_dict(), strict=True)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    x = torch.randn(16, 96)
    with fp8mix.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        with torch.no_grad():
            ya, yb = a(x), b(x)
        with torch.inference_mode():
            yi = a(x)
    assert torch.equal(ya, yb) and torch.equal(ya, yi)
    assert all(torch.equal(v, before[k]) for k, v in a.state_dict().items())  # evaluation left the state
    ra, _ = _steps(a, RECIPES[recipe](), n=2)
    rb, _ = _steps(b, RECIPES[recipe](), n=2)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(ra, rb))


def test_gated_backward_saves_no_activation_output():
    """The fused module keeps h (the activation's input) and the FP8 activation output;
    the unfused composition also keeps a high-precision act(a) of the output's size."""
    m = make(128, 256, "swiglu")
    x = torch.randn(64, 128, requires_grad=True)

    def saved_hp_of_output_size(mod):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            with fp8mix.fp8_autocast():
                mod(x)
        return [t for t in saved if t.is_floating_point() and t.element_size() > 1 and tuple(t.shape) == (64, 256)]

    assert saved_hp_of_output_size(m) == []
    assert len(saved_hp_of_output_size(Unfused(m))) >= 1
