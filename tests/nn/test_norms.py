"""fp8mix.LayerNorm / RMSNorm (Transformer Engine's signatures) and the fused norm cast op
(torch.ops.fp8mix.norm_cast / norm_delayed_cast, csrc/core/norm.c) that LayerNormLinear
and LayerNormMLP write their FP8 input with.

What is checked:
  * the modules: TE's constructor names; exactly torch.nn.LayerNorm / torch's RMSNorm
    (outputs and gradients bit for bit, inside fp8_autocast too); zero_centered_gamma
    against the formula with 1 + gamma; the TE options fp8mix does not implement raise;
    a TE checkpoint's ``_extra_state`` loads with a warning;
  * the op: row statistics against float64 and against aten's native_layer_norm, the
    normalized values against float64 and F.layer_norm / F.rms_norm, the FP8 bytes equal
    to quantize_current / cast of those values at every granularity (stochastic rounding
    included), the same bits on every ISA and thread count, given statistics reused,
    delayed scaling with the state's transitions of delayed_cast, torch.library.opcheck
    of both ops, bad arguments as Python exceptions.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8mix
from fp8mix import ops
from fp8mix.formats import Granularity
from fp8mix.ops import DelayedSpec, NormKind

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
GRANS = [Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK, Granularity.BLOCK2D]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


# --------------------------------------------------------------------------------------
# the modules
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [fp8mix.LayerNorm, fp8mix.RMSNorm])
def test_te_signature(cls):
    names = list(inspect.signature(cls.__init__).parameters)[1:]
    assert names[:6] == ["hidden_size", "eps", "sequence_parallel", "params_dtype", "zero_centered_gamma", "device"]
    m = cls(32, params_dtype=torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16 and m.weight.shape == (32,)
    with pytest.raises(NotImplementedError, match="sequence parallelism"):
        cls(32, sequence_parallel=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sequence_paralel'"):
        cls(32, sequence_paralel=False)
    with pytest.raises(ValueError, match="disagree"):
        cls(32, params_dtype=torch.bfloat16, dtype=torch.float32)
    cls(32, sequence_parallel=False, get_rng_state_tracker=lambda: None)  # accepted


@pytest.mark.filterwarnings("ignore:fp8mix.fp8_autocast. no fp8mix module ran")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inside", [False, True])
def test_layernorm_is_torch_layernorm(dtype, inside):
    torch.manual_seed(0)
    ref = nn.LayerNorm(48, eps=1e-6, dtype=dtype)
    ours = fp8mix.LayerNorm(48, eps=1e-6, params_dtype=dtype)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x0 = torch.randn(3, 7, 48, dtype=dtype)
    outs = []
    for m in (ref, ours):
        x = x0.clone().requires_grad_()
        with fp8mix.fp8_autocast(enabled=inside):
            y = m(x)
        y.backward(torch.ones_like(y) * 0.5 + x0)
        outs.append((y, x.grad, m.weight.grad, m.bias.grad))
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_rmsnorm_is_the_formula_and_torch():
    torch.manual_seed(1)
    ours = fp8mix.RMSNorm(40, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 40, dtype=torch.float64).float()
    y = ours(x)
    x64 = x.double()
    ref64 = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * ours.weight.double()
    torch.testing.assert_close(y.double(), ref64, rtol=1e-6, atol=1e-6)
    tref = nn.RMSNorm(40, eps=1e-5)
    tref.load_state_dict(ours.state_dict())
    assert torch.equal(tref(x), y)
    assert list(ours.state_dict()) == ["weight"]


@pytest.mark.parametrize("cls", [fp8mix.LayerNorm, fp8mix.RMSNorm])
def test_zero_centered_gamma(cls):
    torch.manual_seed(2)
    m = cls(24, zero_centered_gamma=True)
    assert torch.equal(m.weight, torch.zeros(24))  # starts at 0: the scale is 1 + gamma
    with torch.no_grad():
        m.weight.normal_(0, 0.1)
    x = torch.randn(6, 24)
    plain = cls(24)
    with torch.no_grad():
        plain.weight.copy_(1 + m.weight)
        if cls is fp8mix.LayerNorm:
            plain.bias.copy_(m.bias)
    assert torch.equal(m(x), plain(x))


def test_te_extra_state_loads_with_a_warning():
    m = fp8mix.LayerNorm(16)
    sd = {"weight": torch.full((16,), 2.0), "bias": torch.zeros(16), "_extra_state": torch.zeros(3)}
    with pytest.warns(UserWarning, match="_extra_state.*not carried over"):
        res = m.load_state_dict(sd, strict=True)
    assert not res.unexpected_keys and torch.equal(m.weight, torch.full((16,), 2.0))


# --------------------------------------------------------------------------------------
# the fused op
# --------------------------------------------------------------------------------------
def _norm(x, g, b, kind, **kw):
    return ops.norm_cast(x, g, b, kind=kind, eps=1e-5, zero_centered_gamma=kw.pop("zc", False), **kw)


def _ref64(x, g, b, kind, zc=False):
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True) if kind == NormKind.LAYER else torch.zeros_like(x64[..., :1])
    rstd = 1.0 / torch.sqrt((x64 - mean).pow(2).mean(-1, keepdim=True) + float(torch.tensor(1e-5)))
    gg = (1 + g.double()) if zc else g.double()
    return (x64 - mean) * rstd * gg + (0 if b is None else b.double()), mean.squeeze(-1), rstd.squeeze(-1)


@pytest.mark.parametrize("kind", [NormKind.LAYER, NormKind.RMS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_statistics_and_values_against_float64_and_torch(kind, dtype):
    torch.manual_seed(3)
    x = (torch.randn(2, 33, 260) * 3 + 1.5).to(dtype)
    g, b = torch.randn(260), (torch.randn(260) if kind == NormKind.LAYER else None)
    q, qt, sinv, am, mean, rstd, hp = _norm(x, g, b, kind, fp8_dtype=E4, hp_dtype=torch.float32)
    ref, mean64, rstd64 = _ref64(x, g, b, kind)
    assert hp.shape == x.shape and q.shape == x.shape and rstd.shape == (66,)
    torch.testing.assert_close(rstd.double(), rstd64.reshape(-1), rtol=3e-7, atol=0)
    torch.testing.assert_close(hp.double(), ref, rtol=0, atol=2e-6 * float(ref.abs().max()))
    if kind == NormKind.LAYER:
        torch.testing.assert_close(mean.double(), mean64.reshape(-1), rtol=0, atol=1e-6)
        y, tm, tr = torch.native_layer_norm(x.float(), [260], g, b, 1e-5)
        torch.testing.assert_close(mean, tm.reshape(-1), rtol=0, atol=1e-6)
        torch.testing.assert_close(rstd, tr.reshape(-1), rtol=1e-6, atol=0)
        torch.testing.assert_close(hp, F.layer_norm(x.float(), (260,), g, b, 1e-5), rtol=0, atol=1e-5)
    else:
        assert mean.numel() == 0
        torch.testing.assert_close(hp, F.rms_norm(x.float(), (260,), g, 1e-5), rtol=0, atol=1e-5)


@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_bytes_are_the_cast_of_the_normalized_values(gran, stochastic):
    """One pass of the fused kernel gives the bytes quantize_current (current scaling) and
    cast (given scales) give on the same float32 values, the same random words included."""
    torch.manual_seed(4)
    x, g, b = torch.randn(150, 300) * 2, torch.randn(300), torch.randn(300)
    rng = torch.tensor([777, 40], dtype=torch.int64) if stochastic else None
    sr = dict(rng=rng, rng_skip=8) if stochastic else {}
    q, qt, sinv, am, _, _, hp = _norm(x, g, b, NormKind.LAYER, fp8_dtype=E5, granularity=gran, transpose=True,
                                      inf_to_nan=True, hp_dtype=torch.float32, **sr)
    rq, rqt, rsinv, ram = ops.quantize_current(hp, E5, granularity=gran, transpose=True, inf_to_nan=True, **sr)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(qt.view(torch.uint8),
                                                                                 rqt.view(torch.uint8))
    assert torch.equal(sinv, rsinv) and torch.equal(am, ram)
    scale = torch.rand(sinv.shape) + 0.5
    q2, _, sinv2, am2, _, _, _ = _norm(x, g, b, NormKind.LAYER, fp8_dtype=E5, granularity=gran, scale=scale,
                                       inf_to_nan=True, **sr)
    rq2, _, _ = ops.cast(hp, scale, E5, granularity=gran, inf_to_nan=True, **sr)
    assert torch.equal(q2.view(torch.uint8), rq2.view(torch.uint8))
    assert torch.equal(sinv2, 1.0 / scale) and torch.equal(am2, ops.amax(hp, granularity=gran))


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("threads", [1, 3])
def test_same_bits_on_every_isa_and_thread_count(isa, threads):
    torch.manual_seed(5)
    x, g = torch.randn(270, 530, dtype=torch.bfloat16), torch.randn(530)
    kw = dict(fp8_dtype=E4, granularity=Granularity.BLOCK2D, hp_dtype=torch.bfloat16)
    ops.set_max_isa("scalar")
    torch.set_num_threads(1)
    ref = _norm(x, g, None, NormKind.RMS, **kw)
    ops.set_max_isa(isa)
    torch.set_num_threads(threads)
    got = _norm(x, g, None, NormKind.RMS, **kw)
    for a, b in zip(ref, got):
        assert torch.equal(a.view(torch.uint8) if a.dtype in (E4, E5) else a,
                           b.view(torch.uint8) if b.dtype in (E4, E5) else b)


def test_given_statistics_are_reused():
    torch.manual_seed(6)
    x, g, b = torch.randn(40, 200), torch.randn(200), torch.randn(200)
    q, _, _, _, mean, rstd, _ = _norm(x, g, b, NormKind.LAYER, fp8_dtype=E4)
    q2, _, _, _, m2, r2, _ = _norm(x, g, b, NormKind.LAYER, fp8_dtype=E4, mean=mean, rstd=rstd)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and m2.numel() == 0 and r2.numel() == 0
    q3, *_ = _norm(x, g, b, NormKind.LAYER, fp8_dtype=E4, mean=mean, rstd=rstd * 2)  # really read, not recomputed
    assert not torch.equal(q.view(torch.uint8), q3.view(torch.uint8))


def _state():
    return torch.zeros(8, 3), torch.ones(3), torch.zeros(3, dtype=torch.int64)


def test_delayed_follows_delayed_cast_of_the_values():
    torch.manual_seed(7)
    spec = DelayedSpec(history_len=4, margin=1)
    sa, sb = _state(), _state()
    for step in range(3):
        x, g, b = torch.randn(30, 140) * (1 + step), torch.randn(140), torch.randn(140)
        q, _, scales, am, _, _, hp = ops.norm_delayed_cast(
            x, g, b, *sa, kind=NormKind.LAYER, eps=1e-5, zero_centered_gamma=False, role=0, fp8_dtype=E4, spec=spec,
            record=True, inf_to_nan=True, hp_dtype=torch.float32)
        rq, _, rscales, ram = ops.delayed_cast(hp, *sb, role=0, fp8_dtype=E4, spec=spec, record=True,
                                               inf_to_nan=True)
        assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), step
        assert torch.equal(scales, rscales) and torch.equal(am, ram)
        for a, b_ in zip(sa, sb):
            assert torch.equal(a, b_), step
    assert sa[2].tolist() == [3, 0, 0]


def test_opcheck():
    x, g, b = torch.randn(2, 5, 300), torch.randn(300), torch.randn(300)
    R = torch.ops.fp8mix
    torch.library.opcheck(R.norm_cast, (x, g, b, 0, 1e-5, False, E4, 2), dict(hp_dtype=torch.bfloat16))
    torch.library.opcheck(R.norm_cast, (x.bfloat16(), g, None, 1, 1e-5, True, E5, 0), dict(transpose=True))
    _, _, _, _, mean, rstd, _ = _norm(x, g, b, NormKind.LAYER, fp8_dtype=E4)
    torch.library.opcheck(R.norm_cast, (x, g, b, 0, 1e-5, False, E4, 3), dict(mean=mean, rstd=rstd))
    torch.library.opcheck(R.norm_delayed_cast, (x, g, b, 0, 1e-5, False, *_state(), 1, 4, E4),
                          dict(transpose=True))


def test_bad_arguments_raise():
    x, g = torch.randn(4, 64), torch.randn(64)
    with pytest.raises(ValueError, match="gamma has 63 entries"):
        _norm(x, g[:63], None, NormKind.LAYER, fp8_dtype=E4)
    with pytest.raises(ValueError, match="kind must be 0"):
        ops.norm_cast(x, g, None, kind=5, eps=1e-5, zero_centered_gamma=False, fp8_dtype=E4)
    with pytest.raises(ValueError, match="eps"):
        ops.norm_cast(x, g, None, kind=NormKind.LAYER, eps=-1.0, zero_centered_gamma=False, fp8_dtype=E4)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        _norm(x.double(), g, None, NormKind.LAYER, fp8_dtype=E4)
    with pytest.raises(ValueError, match="rstd has 3 entries"):
        _norm(x, g, None, NormKind.RMS, fp8_dtype=E4, rstd=torch.ones(3))
    with pytest.raises(ValueError, match="need mean"):
        _norm(x, g, None, NormKind.LAYER, fp8_dtype=E4, rstd=torch.ones(4))
    with pytest.raises(ValueError, match="scale must be finite"):
        _norm(x, g, None, NormKind.LAYER, fp8_dtype=E4, scale=torch.tensor([0.0]))
    with pytest.raises(ValueError, match="transpose needs want_q"):
        _norm(x, g, None, NormKind.LAYER, fp8_dtype=E4, want_q=False, transpose=True)


def test_non_finite_rows_are_nan_and_others_untouched():
    x = torch.randn(3, 64)
    x[1, 5] = float("inf")
    q, _, _, _, _, rstd, _ = _norm(x, None, None, NormKind.LAYER, fp8_dtype=E4, granularity=Granularity.ROW,
                                   inf_to_nan=True)
    deq = q.float()
    assert torch.isnan(deq[1]).all() and torch.isfinite(deq[[0, 2]]).all() and torch.isnan(rstd[1])
