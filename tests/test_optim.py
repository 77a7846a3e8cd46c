"""Tests of fp8mix.optim.AdamW: torch.optim.AdamW's update with low-precision states.

Covers: exactness against torch.optim.AdamW (fp32 states), the error of FP8 first and
second moments against float32 ones fed the same gradients, COAT's dynamic range
expansion against plain E4M3, convergence on a small fixed-seed regression, checkpoint
round trips, master weights for bfloat16 parameters, memory accounting, bad arguments.
"""
from __future__ import annotations

import functools
import io
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fp8mix.optim import AdamW, bytes_per_param

E4M3_HALF_ULP_OF_MAX = 16.0 / 448.0  # largest round-to-nearest error of a block, relative to its max


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


def _mlp(seed: int = 0, d_in: int = 16, hidden: int = 64, d_out: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, d_out))


def _train(model: nn.Module, opt, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, model[0].in_features, generator=g)
        loss = model(x).square().mean() + model(x).sin().sum() * 1e-3
        opt.zero_grad()
        loss.backward()
        opt.step()


def _same_grads(params_a, params_b, g):
    for pa, pb, gi in zip(params_a, params_b, g):
        pa.grad = gi.clone()
        pb.grad = gi.clone()


# ---- exactness -----------------------------------------------------------------------
def test_fp32_states_match_torch_adamw():
    """fp32/fp32 is torch.optim.AdamW: same parameters after 50 steps with two groups
    (different lr and weight decay), same moments."""
    ref_model, model = _mlp(), _mlp()

    def groups(m):
        return [{"params": [p for p in m.parameters() if p.dim() == 2], "weight_decay": 0.1},
                {"params": [p for p in m.parameters() if p.dim() == 1], "weight_decay": 0.0, "lr": 3e-3}]
    ref = torch.optim.AdamW(groups(ref_model), lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    opt = AdamW(groups(model), lr=1e-3, betas=(0.9, 0.95), eps=1e-6, exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32")
    _train(ref_model, ref, 50)
    _train(model, opt, 50)
    moved = 0.0
    for pr, p, p0 in zip(ref_model.parameters(), model.parameters(), _mlp().parameters()):
        torch.testing.assert_close(p, pr, rtol=1e-6, atol=1e-7)
        m, v = opt.moments(p)
        torch.testing.assert_close(m, ref.state[pr]["exp_avg"], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(v, ref.state[pr]["exp_avg_sq"], rtol=1e-6, atol=1e-12)
        assert float(opt.state[p]["step"]) == 50.0
        moved = max(moved, float((p - p0).detach().abs().max()))
    assert moved > 1e-2  # the comparison is not between two untouched models


# ---- FP8 first moment ------------------------------------------------------------------
def test_e4m3_first_moment_tracks_float32():
    """The dequantized E4M3 exp_avg against torch's float32 exp_avg, fed the same gradients
    (m depends only on the gradients, so both see the same stream) for 200 steps; gradient
    scales span 3 decades inside each block and 6 between blocks.

    One round-to-nearest cast errs by at most half an ulp of the block's top binade,
    16/448 = 3.6% of the block max, uniformly distributed: RMS ~0.4% of block max. m is
    re-cast every step and the errors pile up like the EMA itself, e_t = beta1*e_{t-1} + d_t:
    RMS grows by sqrt(1/(1-beta1**2)) = 2.3x (measured 0.93%), the worst case by
    1/(1-beta1) = 10x (36%; the measured max over 8192 elements x 150 steps is 18.5%,
    99.9th percentile 8.8%). The errors are unbiased (mean ~1e-5 of block max)."""
    torch.manual_seed(0)
    n, beta1 = 64 * 128, 0.9
    mag = torch.exp(torch.empty(n).uniform_(-3.5, 3.5))  # 3 decades of gradient scale in every block,
    mag *= torch.logspace(-6, 0, n // 128).repeat_interleave(128)  # and 6 between blocks (per-tensor scaling fails)
    mean = torch.randn(n)
    a, b = torch.zeros(n, requires_grad=True), torch.zeros(n, requires_grad=True)
    ref, opt = torch.optim.AdamW([a], lr=1e-3), AdamW([b], lr=1e-3, exp_avg_dtype="e4m3")
    errs = []
    for t in range(200):
        g = mag * (mean * (1 + 0.5 * math.sin(t / 20.0)) + torch.randn(n))
        _same_grads([a], [b], [g])
        ref.step()
        opt.step()
        assert opt.state[b]["exp_avg"].dtype == torch.float8_e4m3fn
        if t >= 50:
            m_ref = ref.state[a]["exp_avg"].view(-1, 128)
            m = opt.moments(b)[0].view(-1, 128)
            errs.append((m - m_ref) / m_ref.abs().amax(dim=1, keepdim=True))
    e = torch.stack(errs)
    rms = float(e.square().mean().sqrt())
    assert rms < 0.015, rms
    assert float(e.abs().max()) < E4M3_HALF_ULP_OF_MAX / (1 - beta1)
    assert abs(float(e.mean())) < 1e-3


@pytest.mark.parametrize("fmt", ["e4m3", "e4m3_expand", "e5m2"])
def test_fp8_second_moment_decays_with_its_block_scale(fmt):
    """With zero gradients v decays as beta2**t: a per-block scale carries a uniform decay
    exactly, where a fixed grid would not (bfloat16 cannot represent v*0.999 != v near 1)."""
    torch.manual_seed(0)
    p = torch.zeros(4, 128, requires_grad=True)
    opt = AdamW([p], lr=0.0, weight_decay=0.0, exp_avg_sq_dtype=fmt)
    p.grad = torch.exp(torch.empty(4, 128).uniform_(-4, 0))
    opt.step()
    v1 = opt.moments(p)[1]
    p.grad = torch.zeros(4, 128)
    for _ in range(100):
        opt.step()
    ratio = opt.moments(p)[1] / v1
    torch.testing.assert_close(ratio, torch.full_like(ratio, 0.999 ** 100), rtol=1e-4, atol=0)


# ---- FP8 second moment: dynamic range expansion ---------------------------------------
def test_e4m3_expand_beats_plain_e4m3_on_wide_range():
    """v spanning 1e-12..1e-2 in every block: plain per-block E4M3 flushes everything below
    amax * 2**-9 / 448 (~5e-8 here) to 0; the expansion keeps every value with relative
    error <= (1 + 2**-4)**(1/k) - 1 (k ~ 0.45 for 10 decades: <= 14.6%)."""
    torch.manual_seed(0)
    n = 64 * 128
    v_target = torch.exp(torch.empty(n).uniform_(math.log(1e-12), math.log(1e-2)))
    grad = (v_target / 0.001).sqrt()  # after one step v = (1 - beta2) * g**2
    ps = [torch.zeros(n, requires_grad=True) for _ in range(3)]
    ref = torch.optim.AdamW([ps[0]])
    plain = AdamW([ps[1]], exp_avg_sq_dtype="e4m3")
    expand = AdamW([ps[2]], exp_avg_sq_dtype="e4m3_expand")
    for p, o in zip(ps, (ref, plain, expand)):
        p.grad = grad.clone()
        o.step()
    v = ref.state[ps[0]]["exp_avg_sq"]
    v_plain, v_exp = plain.moments(ps[1])[1], expand.moments(ps[2])[1]
    rel_plain, rel_exp = (v_plain - v).abs() / v, (v_exp - v).abs() / v

    assert int((v_plain == 0).sum()) > n // 3  # measured 3485 of 8192
    assert int((v_exp == 0).sum()) == 0
    assert float(rel_exp.mean()) < 0.5 * float(rel_plain.mean())  # measured 0.049 vs 0.458
    k = expand.state[ps[2]]["exp_avg_sq_k"]
    bound = (1 + 2.0 ** -4) ** (1 / k) - 1 + 1e-5
    assert bool((rel_exp.view(-1, 128) <= bound).all())
    assert float(rel_exp.max()) < 0.15


def test_e4m3_expand_exact_cases():
    """All-zero blocks, a block of equal values (R = 1, k = 1) and a tail block padded with
    zeros decode exactly; zeros stay zeros."""
    p = torch.zeros(128 + 130, requires_grad=True)
    opt = AdamW([p], lr=0.0, exp_avg_sq_dtype="e4m3_expand")
    g = torch.zeros(258)
    g[128:256] = 2.0 ** -5  # block 1: all equal; block 0 all zero; block 2: 2 values + 126 pad
    g[256], g[257] = 2.0 ** -3, 2.0 ** -10
    p.grad = g
    opt.step()
    v = opt.moments(p)[1]
    torch.testing.assert_close(v, 0.001 * g * g, rtol=2 ** -4, atol=0)
    assert bool((v[:128] == 0).all())
    torch.testing.assert_close(v[128:256], 0.001 * g[128:256] ** 2, rtol=1e-6, atol=0)
    assert opt.state[p]["exp_avg_sq"].shape == (3, 128)


# ---- convergence -------------------------------------------------------------------------
def _regression(seed: int = 0):
    """A teacher tanh network plus noise (floor 0.01); 4096 samples for a 16-32-1 student,
    so the final loss sits near the floor and does not depend on memorising noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, 16, generator=g)
    w1, w2 = torch.randn(16, 8, generator=g) / 4, torch.randn(8, 1, generator=g) / 3
    y = torch.tanh(x @ w1) @ w2 + 0.1 * torch.randn(4096, 1, generator=g)
    torch.manual_seed(seed)
    return x, y, nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def _fit(make_opt, steps: int = 300, lr: float = 3e-2) -> float:
    x, y, model = _regression()
    opt = make_opt(model.parameters())
    for s in range(steps):  # full batch, cosine decay to 0: the runs end at a minimum
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * s / steps))
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(F.mse_loss(model(x), y))


@functools.lru_cache(maxsize=None)
def _torch_adamw_loss() -> float:
    return _fit(lambda ps: torch.optim.AdamW(ps))


@pytest.mark.parametrize("exp_avg_dtype,exp_avg_sq_dtype", [("e4m3", "bf16"), ("e4m3", "e4m3_expand")])
def test_converges_like_torch_adamw(exp_avg_dtype, exp_avg_sq_dtype):
    """Final loss within 1% of torch.optim.AdamW's. Measured on seeds 0-3: e4m3/bf16
    +0.52..+0.75%, e4m3/e4m3_expand +0.22..+0.50% (bf16/bf16 +0.32..+0.37%; a 1e-3
    perturbation of the initial weights moves torch's own loss by 0.02%): low-precision
    states cost a little, systematically, but not more than 1%."""
    ref = _torch_adamw_loss()
    loss = _fit(lambda ps: AdamW(ps, exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype))
    assert ref < 0.0105  # near the noise floor: the problem itself was solved
    assert abs(loss - ref) / ref < 0.01, (loss, ref)


# ---- checkpoints --------------------------------------------------------------------------
def _mixed_model(seed: int = 0) -> nn.Module:
    m = _mlp(seed, hidden=48)  # 48*48: not a multiple of 128, so the FP8 tails are padded
    m[2].to(torch.bfloat16)  # a bfloat16 layer: master weights in the state
    return m


def _train_mixed(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 16, generator=g)
        h = F.gelu(model[0](x))
        h = F.gelu(model[2](h.bfloat16()).float())
        loss = model[4](h).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("dtypes", [("e4m3", "e4m3_expand"), ("e5m2", "bf16"), ("bf16", "e4m3")])
def test_state_dict_resume_is_bit_identical(dtypes):
    """Save model + optimizer after 5 steps (torch.save), load both into fresh objects,
    train 5 more: parameters equal, bit for bit, those of an uninterrupted run; and the
    loaded state keeps its dtypes (the base class would cast them to the parameter's)."""
    kw = dict(lr=1e-2, exp_avg_dtype=dtypes[0], exp_avg_sq_dtype=dtypes[1], block_size=64)
    model = _mixed_model()
    opt = AdamW(model.parameters(), **kw)
    _train_mixed(model, opt, 5, seed=1)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)

    _train_mixed(model, opt, 5, seed=2)  # uninterrupted

    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    model2 = _mixed_model(seed=7)  # different weights until loaded
    model2.load_state_dict(ck["model"])
    opt2 = AdamW(model2.parameters(), **kw)
    opt2.load_state_dict(ck["opt"])
    for p, p2 in zip(model.parameters(), model2.parameters()):
        for name, t in opt.state[p].items():
            assert opt2.state[p2][name].dtype == t.dtype, name
    bf = model2[2].weight
    assert opt2.state[bf]["master_param"].dtype == torch.float32
    assert not torch.equal(opt2.state[bf]["master_param"], opt2.state[bf]["master_param"].bfloat16().float())
    _train_mixed(model2, opt2, 5, seed=2)

    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, p2)
    for p, p2 in zip(model.parameters(), model2.parameters()):
        for name, t in opt.state[p].items():
            assert torch.equal(opt2.state[p2][name].float(), t.float()), name


def test_loaded_state_must_match_group_dtypes():
    model = _mlp()
    opt = AdamW(model.parameters(), exp_avg_dtype="e4m3")
    _train(model, opt, 1)
    opt.param_groups[0]["exp_avg_dtype"] = "bf16"  # the bytes are E4M3: reading them as bf16 is wrong
    with pytest.raises(RuntimeError, match="exp_avg_dtype='bf16'"):
        _train(model, opt, 1)


# ---- master weights ------------------------------------------------------------------------
def test_bf16_params_keep_float32_master_weights():
    """Steps of ~1e-4 on a bfloat16 weight near 1 are below half its ulp (2**-8): without a
    master copy the weight never moves; with one it moves, and equals the master rounded."""
    torch.manual_seed(0)
    init = (1 + 0.1 * torch.rand(256)).bfloat16()
    runs = {}
    for mw in (None, False):
        p = nn.Parameter(init.clone())
        opt = AdamW([p], lr=1e-4, weight_decay=0.0, exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32",
                    master_weights=mw)
        for _ in range(100):
            p.grad = torch.ones(256, dtype=torch.bfloat16)
            opt.step()
        runs[mw] = (p, opt)
    p, opt = runs[None]
    master = opt.state[p]["master_param"]
    assert master.dtype == torch.float32 and p.dtype == torch.bfloat16
    assert torch.equal(p, master.bfloat16())
    torch.testing.assert_close(master, init.float() - 100 * 1e-4, rtol=0, atol=1e-5)  # Adam step ~= lr
    assert bool((p != init).any())
    p_nomaster, opt_nomaster = runs[False]
    assert "master_param" not in opt_nomaster.state[p_nomaster]
    assert torch.equal(p_nomaster, init)


def test_float32_params_have_no_master_copy():
    model = _mlp()
    opt = AdamW(model.parameters(), master_weights=True)
    _train(model, opt, 1)
    assert all("master_param" not in st for st in opt.state.values())


# ---- memory --------------------------------------------------------------------------------
@pytest.mark.parametrize("m_fmt,v_fmt,per_elem", [
    ("fp32", "fp32", 8.0), ("bf16", "bf16", 4.0), ("e4m3", "bf16", 3 + 4 / 128),
    ("e4m3", "e4m3", 2 + 8 / 128), ("e5m2", "e4m3_expand", 2 + 12 / 128),
])
def test_state_bytes(m_fmt, v_fmt, per_elem):
    p = nn.Parameter(torch.randn(256, 128))
    q = nn.Parameter(torch.randn(64, 128).bfloat16())  # + 4 bytes/param of master weights
    opt = AdamW([p, q], exp_avg_dtype=m_fmt, exp_avg_sq_dtype=v_fmt)
    assert opt.state_bytes() == 0 and bytes_per_param(opt) == 0.0
    p.grad, q.grad = torch.randn_like(p), torch.randn_like(q)
    opt.step()
    n = p.numel() + q.numel()
    expect = per_elem * n + 4 * q.numel() + 2 * 4  # + the two float32 step counters
    assert opt.state_bytes() == expect
    assert bytes_per_param(opt) == pytest.approx(expect / n)


def test_bytes_per_param_of_torch_adamw():
    p = nn.Parameter(torch.randn(1000))
    opt = torch.optim.AdamW([p])
    p.grad = torch.randn_like(p)
    opt.step()
    assert bytes_per_param(opt) == pytest.approx(8.004)


# ---- odd sizes -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,block_size", [((1,), 128), ((3, 5), 4), ((130,), 128), ((7, 33), 1), ((2, 3, 64), 32)])
def test_shapes_and_block_sizes(shape, block_size):
    """Any shape and block size: the moments decode to the parameter's shape, within one
    cast's error of float32 after one step; the padded tail decodes to 0."""
    torch.manual_seed(0)
    p, r = nn.Parameter(torch.randn(shape)), nn.Parameter(torch.randn(shape))
    r.data.copy_(p.data)
    opt = AdamW([p], exp_avg_dtype="e4m3", exp_avg_sq_dtype="e4m3_expand", block_size=block_size)
    ref = torch.optim.AdamW([r])
    g = torch.randn(shape)
    _same_grads([p], [r], [g])
    opt.step()
    ref.step()
    m, v = opt.moments(p)
    assert m.shape == p.shape and v.shape == p.shape
    torch.testing.assert_close(m, ref.state[r]["exp_avg"], rtol=2 ** -4, atol=0)
    torch.testing.assert_close(v, ref.state[r]["exp_avg_sq"], rtol=2 ** -3, atol=0)
    nb = -(-p.numel() // block_size)
    assert opt.state[p]["exp_avg"].shape == (nb, block_size)
    assert opt.state[p]["exp_avg_scale_inv"].shape == (nb, 1)
    assert bool((opt.state[p]["exp_avg"].float().view(-1)[p.numel():] == 0).all())
    torch.testing.assert_close(p, r, rtol=0, atol=1e-5)  # first step: m/sqrt(v) = sign(g) up to eps


# ---- bad arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(lr=-1e-3), ValueError, "Invalid learning rate: -0.001"),
    (dict(lr=torch.tensor(1e-3)), TypeError, "lr must be a float"),
    (dict(betas=(1.0, 0.999)), ValueError, "Invalid beta parameter at index 0: 1.0"),
    (dict(betas=(0.9, -0.1)), ValueError, "Invalid beta parameter at index 1: -0.1"),
    (dict(betas=(0.9,)), TypeError, "betas must be a pair"),
    (dict(eps=0.0), ValueError, "Invalid epsilon value: 0.0"),
    (dict(eps=-1e-8), ValueError, "Invalid epsilon value"),
    (dict(weight_decay=-0.1), ValueError, "Invalid weight_decay value: -0.1"),
    (dict(exp_avg_dtype="e4m3_expand"), ValueError, "exp_avg_dtype must be one of"),
    (dict(exp_avg_dtype="fp16"), ValueError, "exp_avg_dtype must be one of"),
    (dict(exp_avg_sq_dtype="int8"), ValueError, "exp_avg_sq_dtype must be one of"),
    (dict(exp_avg_sq_dtype=torch.bfloat16), ValueError, "exp_avg_sq_dtype must be one of"),
    (dict(block_size=0), ValueError, "block_size must be a positive int"),
    (dict(block_size=64.0), ValueError, "block_size must be a positive int"),
    (dict(block_size=True), ValueError, "block_size must be a positive int"),
    (dict(master_weights="yes"), ValueError, "master_weights must be"),
])
def test_bad_arguments_raise(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        AdamW([nn.Parameter(torch.zeros(3))], **kwargs)


def test_bad_group_option_raises_and_is_not_added():
    opt = AdamW([nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="exp_avg_sq_dtype must be one of"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(3))], "exp_avg_sq_dtype": "e3m4"})
    assert len(opt.param_groups) == 1


def test_defaults_are_e4m3_bf16():
    g = AdamW([nn.Parameter(torch.zeros(3))]).param_groups[0]
    got = (g["exp_avg_dtype"], g["exp_avg_sq_dtype"], g["block_size"], g["master_weights"])
    assert got == ("e4m3", "bf16", 128, None)
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8, 1e-2)


def test_dtype_names_are_case_insensitive():
    opt = AdamW([nn.Parameter(torch.zeros(3))], exp_avg_dtype="E4M3", exp_avg_sq_dtype="BF16")
    assert (opt.param_groups[0]["exp_avg_dtype"], opt.param_groups[0]["exp_avg_sq_dtype"]) == ("e4m3", "bf16")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float64, torch.int32])
def test_unsupported_param_dtypes_raise(dtype):
    with pytest.raises(TypeError, match="complex|float32, bfloat16 or float16"):
        AdamW([nn.Parameter(torch.zeros(3, dtype=dtype), requires_grad=dtype.is_floating_point or dtype.is_complex)])


def test_sparse_gradients_raise():
    emb = nn.Embedding(10, 4, sparse=True)
    opt = AdamW(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="does not support sparse gradients, please consider SparseAdam"):
        opt.step()


def test_moments_of_unknown_param_raise():
    p = nn.Parameter(torch.zeros(3))
    with pytest.raises(KeyError, match="no state"):
        AdamW([p]).moments(p)


def test_fp8_casts_go_through_fp8mix_quantize(monkeypatch):
    """The FP8 state bytes are fp8mix.quantize's (the C kernels), not a torch cast."""
    import fp8mix.optim as optim_mod
    calls = []
    real = optim_mod.quantize

    def spy(*a, **k):
        calls.append(k.get("granularity", "tensor"))
        return real(*a, **k)

    monkeypatch.setattr(optim_mod, "quantize", spy)
    p = nn.Parameter(torch.randn(300))
    opt = AdamW([p], exp_avg_dtype="e4m3", exp_avg_sq_dtype="e4m3_expand")
    p.grad = torch.randn(300)
    opt.step()
    assert calls == ["row", "tensor"]
