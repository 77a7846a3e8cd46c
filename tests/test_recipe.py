"""Tests of the scaling recipes (fp8mix.recipe) as fp8mix.Linear applies them.

DelayedScaling is checked against a plain-torch re-derivation, step by step, over
inputs, weights and gradients whose magnitudes jump around (incl. all-zero tensors and
infinities): the amax history (L, 3) rolling once per use of a role (forward: input;
weight: every forward that casts it; backward: grad_output), the scale each cast uses, the
scale recomputed from the history with "max" / "most_recent" / a callable, every
`interval` uses, with `margin` and `power_2_scale`, amax 0 or inf keeping the previous
scale, and the first use of a role scaling from the tensor itself. The layer's outputs
and gradients are compared with an FP8 emulation (torch's own float8 casts, float64
GEMMs) that uses the re-derived scales, so a wrong scale shows up in the numbers as
well as in the buffers.

CurrentScaling and BlockScaling: the same emulation with per-tensor and per-tile current
scales (amax_epsilon, margin, power_2_scale, formats), and the point of block scales
(one outlier row does not flush the other rows to zero). Bad recipe fields raise.
"""
from __future__ import annotations

import inspect
import math

import pytest
import torch

import fp8mix
from fp8mix import Format, fp8_autocast
from fp8mix.recipe import RECIPES, BlockScaling, CurrentScaling, DelayedScaling

FLT_MAX = torch.finfo(torch.float32).max
FLT_MIN = torch.finfo(torch.float32).tiny
FMAX = {Format.E4M3: 448.0, Format.E5M2: 57344.0}
DT = {Format.E4M3: torch.float8_e4m3fn, Format.E5M2: torch.float8_e5m2}
ROLES = ("input", "weight", "grad_output")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny problems: one thread is fastest


# --------------------------------------------------------------------------------------
# plain-torch reference
# --------------------------------------------------------------------------------------
def role_fmt(fmt: Format, role: int) -> Format:
    if fmt is Format.HYBRID:
        return Format.E5M2 if role == 2 else Format.E4M3
    return fmt


def ref_scale(amax: float, fmt: Format, margin=0, pow2=False, eps=0.0) -> float:
    """scale = fp8_max / max(amax, eps) / 2**margin in float32; 1 for 0/NaN/inf amax."""
    a = torch.tensor(max(amax, eps) if not math.isnan(amax) else amax, dtype=torch.float32)
    if not (float(a) > 0) or math.isinf(float(a)):
        return 1.0
    s = torch.tensor(FMAX[fmt], dtype=torch.float32) / a
    s = s * torch.tensor(2.0 ** -margin, dtype=torch.float32)
    s = float(s)
    if math.isinf(s):
        s = 2.0 ** 127 if pow2 else FLT_MAX
    elif s < FLT_MIN:
        s = FLT_MIN
    if pow2:
        _, e = math.frexp(s)
        s = 2.0 ** (e - 1)
    return s


def amax_of(t: torch.Tensor) -> float:
    return float(t.detach().float().abs().amax())


class RefDelayed:
    """Delayed scaling of one layer, per the issue: each use of a role rolls its history."""

    def __init__(self, recipe: DelayedScaling):
        self.r = recipe
        self.L = recipe.amax_history_len
        self.h = torch.zeros(self.L, 3, dtype=torch.float32)
        self.scale = [1.0, 1.0, 1.0]
        self.steps = [0, 0, 0]

    def use(self, role: int, amax: float) -> float:
        """A cast of `role` whose tensor has `amax`; returns the scale that cast uses."""
        used = self.scale_for(role, amax)
        self.record(role, amax)
        return used

    def scale_for(self, role: int, amax: float) -> float:
        """The scale a cast of `role` uses now: its own amax's on the role's first use."""
        r, fmt = self.r, role_fmt(self.r.fp8_format, role)
        return ref_scale(amax, fmt, r.margin, r.power_2_scale) if self.steps[role] == 0 else self.scale[role]

    def record(self, role: int, amax: float) -> None:
        r, fmt = self.r, role_fmt(self.r.fp8_format, role)
        if self.steps[role] == 0:
            self.scale[role] = ref_scale(amax, fmt, r.margin, r.power_2_scale)
        col = self.h[:, role].clone()
        self.h[1:, role] = col[:-1]
        self.h[0, role] = amax if math.isfinite(amax) else 0.0  # non-finite: recorded as 0
        self.steps[role] += 1
        if self.steps[role] % r.interval == 0:
            col = self.h[:, role].clone()
            if r.amax_compute_algo == "max":
                a = float(col.amax())
            elif r.amax_compute_algo == "most_recent":
                a = float(col[0])
            else:
                a = float(torch.as_tensor(r.amax_compute_algo(col), dtype=torch.float32))
            if math.isfinite(a) and a > 0:
                self.scale[role] = ref_scale(a, fmt, r.margin, r.power_2_scale)


def q_dq(t: torch.Tensor, scale: float, fmt: Format) -> torch.Tensor:
    """FP8 cast with `scale` (saturating, RNE) and decode with the float32 scale_inv, in float64."""
    s = torch.tensor(scale, dtype=torch.float32)
    q = (t.detach().float() * s).clamp(-FMAX[fmt], FMAX[fmt]).to(DT[fmt])
    return q.double() * float(torch.reciprocal(s))


def close(out: torch.Tensor, ref: torch.Tensor, rel=2e-5) -> bool:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm()) <= rel * float(ref.norm()) + 1e-30


# --------------------------------------------------------------------------------------
# DelayedScaling re-derivation
# --------------------------------------------------------------------------------------
INF = float("inf")
# (weight multiplier or None, input magnitude, grad magnitude); INF = one element is inf
SCHEDULE = [
    (None, 1e-3, 1e-4),   # first use of every role: scales from the tensors themselves
    (None, 1.0, 1.0),
    (0.5, 10.0, 1e3),
    (None, 0.0, 1.0),     # all-zero input
    (3.0, 0.1, 0.0),      # all-zero grad
    (None, INF, 1e-2),    # an inf in the input
    (None, 5.0, 1.0),
    (0.25, 1e-2, INF),    # an inf in the grad
    (None, 2.0, 0.5),
    (2.0, 1.0, 1.0),
    (None, 100.0, 10.0),
    (None, 1.0, 1.0),
    (0.0, 1.0, 1.0),      # all-zero weight
    (None, 1.0, 1.0),
]


def _mag_tensor(shape, mag, gen):
    t = torch.randn(shape, generator=gen)
    if mag == INF:
        t[0, 0] = INF
        return t
    return t * mag


DELAYED_VARIANTS = {
    "max_L4": dict(amax_history_len=4),
    "most_recent_L4": dict(amax_history_len=4, amax_compute_algo="most_recent"),
    "callable_L3": dict(amax_history_len=3, amax_compute_algo=lambda h: h[:2].amax()),
    "interval3": dict(amax_history_len=4, interval=3),
    "margin2": dict(amax_history_len=4, margin=2),
    "pow2": dict(amax_history_len=4, power_2_scale=True),
    "e4m3_only": dict(amax_history_len=4, fp8_format=Format.E4M3),
    "e5m2_only": dict(amax_history_len=2, fp8_format="E5M2"),
    "mixed": dict(amax_history_len=5, interval=2, margin=1, power_2_scale=True, amax_compute_algo="most_recent"),
    "default_L1024": dict(),
}


def _state(layer):
    sd = layer.state_dict()
    L = layer.fp8_amax_history.shape[0]
    return sd["fp8_amax_history"], sd["fp8_scale"], sd["fp8_steps"], sd["fp8_grad_pending"], L


@pytest.mark.parametrize("variant", list(DELAYED_VARIANTS))
def test_delayed_scaling_matches_rederivation(variant):
    """Each training step: the forward first records the previous backward's grad_output
    amax, then casts x and W with their delayed scales and records their amaxes; the
    backward casts dy with the grad scale of its forward and leaves its amax pending."""
    recipe = DelayedScaling(**DELAYED_VARIANTS[variant])
    ref = RefDelayed(recipe)
    torch.manual_seed(0)
    M, K, N = 16, 48, 40
    layer = fp8mix.Linear(K, N)
    gen = torch.Generator().manual_seed(1)
    pending = None
    for step, (wmul, xmag, gmag) in enumerate(SCHEDULE):
        if wmul is not None:
            with torch.no_grad():
                layer.weight.mul_(wmul)
        x = _mag_tensor((M, K), xmag, gen).requires_grad_()
        g = _mag_tensor((M, N), gmag, gen)
        with fp8_autocast(fp8_recipe=recipe):
            y = layer(x)
        y.backward(g)

        if pending is not None:
            ref.record(2, pending)
        fx, fw, fg = (role_fmt(recipe.fp8_format, r) for r in range(3))
        s_x = ref.use(0, amax_of(x))
        w_scale = ref.use(1, amax_of(layer.weight))  # no is_first_microbatch: cast every forward
        s_g = ref.scale_for(2, amax_of(g))
        pending = amax_of(g)

        h, s, n, pend, cap = _state(layer)
        where = f"{variant}, step {step}"
        assert n.tolist() == ref.steps, where
        assert h.shape == (max(1024, ref.L), 3), where
        assert torch.equal(h[: ref.L], ref.h), f"{where}: history\n{h[:ref.L]}\nexpected\n{ref.h}"
        assert not h[ref.L:].any(), f"{where}: rows beyond the recipe's length stay empty"
        assert s.tolist() == ref.scale, f"{where}: scale {s.tolist()} expected {ref.scale}"
        filled = pend[pend >= 0].tolist()
        assert filled == [pending if math.isfinite(pending) else 0.0], f"{where}: pending {pend.tolist()}"
        if recipe.power_2_scale:
            assert all(math.frexp(v)[0] == 0.5 for v in s.tolist()), where

        xd, wd, gd = q_dq(x, s_x, fx), q_dq(layer.weight, w_scale, fw), q_dq(g, s_g, fg)
        y_ref = xd @ wd.t() + layer.bias.double()
        if xmag == INF:  # an inf in x: the output is NaN, as a high-precision layer's would be non-finite
            assert not torch.isfinite(y).all(), where
        else:
            assert close(y, y_ref), f"{where}: output is not the FP8 product with the expected scales"
        w_grad = layer.weight.grad
        if gmag == INF:  # an inf in dy: NaN gradients (as high precision), not saturated ones
            assert torch.isnan(x.grad).any() and torch.isnan(w_grad).any(), where
        elif xmag != INF:
            assert close(x.grad, gd @ wd), f"{where}: dgrad"
            assert close(w_grad, gd.t() @ xd), f"{where}: wgrad"
        layer.weight.grad = None
        layer.bias.grad = None


def test_delayed_first_use_scales_from_tensor():
    layer = fp8mix.Linear(64, 64)
    ref_layer = torch.nn.Linear(64, 64)
    ref_layer.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("fp8")})
    x = torch.randn(32, 64) * 1e-3   # scale 1 would flush all of it to zero in E4M3
    with fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=4)):
        y = layer(x)
    assert layer.fp8_scale[0].item() == ref_scale(amax_of(x), Format.E4M3)
    assert layer.fp8_scale[1].item() == ref_scale(amax_of(layer.weight), Format.E4M3)
    yr = ref_layer(x) - ref_layer.bias
    err = (y - layer.bias - yr).norm() / yr.norm()
    assert err < 0.06


def test_delayed_interval_updates_scale_only_every_interval_uses():
    recipe = DelayedScaling(amax_history_len=8, interval=3, amax_compute_algo="most_recent")
    layer = fp8mix.Linear(32, 32)
    seen = []
    for i in range(7):
        x = torch.full((4, 32), float(2 ** i))
        with torch.no_grad(), fp8_autocast(fp8_recipe=recipe, calibrating=True):  # records under no_grad
            layer(x)
        seen.append(layer.fp8_scale[0].item())
    # first use: from the tensor (448/1); then updated after uses 3 and 6 only
    expect = [448.0, 448.0, 448.0 / 4, 448.0 / 4, 448.0 / 4, 448.0 / 32, 448.0 / 32]
    assert seen == expect


def test_two_backward_uses_between_forwards_roll_history_twice():
    """A layer used twice in one graph (weight sharing) or two backward passes of two
    micro-batches: each backward use of grad_output is a use and rolls the history."""
    recipe = DelayedScaling(amax_history_len=4)
    layer = fp8mix.Linear(32, 32)
    x1, x2 = torch.randn(8, 32), torch.randn(8, 32)
    g1, g2 = torch.randn(8, 32) * 2.0, torch.randn(8, 32) * 3.0
    with fp8_autocast(fp8_recipe=recipe):
        y1 = layer(x1)
        y2 = layer(x2)
    torch.autograd.backward([y1, y2], [g1, g2])
    h, _, n, pend, _ = _state(layer)
    assert n.tolist() == [2, 2, 0] and sorted(pend[pend >= 0].tolist()) == sorted([amax_of(g1), amax_of(g2)])
    with fp8_autocast(fp8_recipe=recipe):  # the next training forward records both, in call order
        layer(torch.randn(8, 32))
    h, _, n, pend, _ = _state(layer)
    assert n.tolist() == [3, 3, 2] and not (pend >= 0).any()
    assert h[:2, 2].tolist() == [amax_of(g2), amax_of(g1)], f"grad_output history {h[:4, 2].tolist()}"


def test_backwards_through_one_forward_keep_the_max():
    """retain_graph: several backward passes through one forward record one amax, their max."""
    recipe = DelayedScaling(amax_history_len=4)
    layer = fp8mix.Linear(32, 32)
    with fp8_autocast(fp8_recipe=recipe):
        y = layer(torch.randn(8, 32))
    gs = [torch.randn(8, 32) * m for m in (1.0, 5.0, 2.0, 0.5, 3.0)]
    for g in gs:
        y.backward(g, retain_graph=True)
    with fp8_autocast(fp8_recipe=recipe):
        layer(torch.randn(8, 32))
    h, _, n, _, _ = _state(layer)
    assert n.tolist()[2] == 1 and h[0, 2].item() == max(amax_of(g) for g in gs)


def test_more_forwards_in_flight_than_slots_drop_nothing():
    """20 forwards, then their backwards: with 8 slots, later calls share slots (max); every
    backward's amax reaches the history (as the max of its slot's group)."""
    recipe = DelayedScaling(amax_history_len=32)
    layer = fp8mix.Linear(32, 32)
    with fp8_autocast(fp8_recipe=recipe):
        ys = [layer(torch.randn(8, 32)) for _ in range(20)]
    gs = [torch.randn(8, 32) * (i + 1) for i in range(20)]
    torch.autograd.backward(ys, gs)
    with fp8_autocast(fp8_recipe=recipe):
        layer(torch.randn(8, 32))
    h, _, n, _, _ = _state(layer)
    k = n.tolist()[2]
    assert k == 8
    slots = [max(amax_of(gs[c]) for c in range(20) if c % 8 == j) for j in range(8)]
    assert sorted(h[:k, 2].tolist()) == sorted(slots)
    assert h[:k, 2].max().item() == max(amax_of(g) for g in gs)


# --------------------------------------------------------------------------------------
# CurrentScaling / BlockScaling
# --------------------------------------------------------------------------------------
CURRENT_VARIANTS = {
    "hybrid": dict(),
    "e4m3": dict(fp8_format=Format.E4M3),
    "e5m2_str": dict(fp8_format="e5m2"),
    "pow2": dict(power_2_scale=True),
    "eps": dict(amax_epsilon=4.0),
    "margin": dict(margin=3),
}


@pytest.mark.parametrize("variant", list(CURRENT_VARIANTS))
def test_current_scaling_matches_emulation(variant):
    recipe = CurrentScaling(**CURRENT_VARIANTS[variant])
    torch.manual_seed(2)
    layer = fp8mix.Linear(48, 40)
    gen = torch.Generator().manual_seed(3)
    for xmag, gmag in [(1.0, 1.0), (1e-3, 1e3), (0.0, 1e-2), (50.0, 0.0), (INF, 1.0)]:
        x = _mag_tensor((16, 48), xmag, gen).requires_grad_()
        g = _mag_tensor((16, 40), gmag, gen)
        with fp8_autocast(fp8_recipe=recipe):
            y = layer(x)
        y.backward(g)
        fx, fw, fg = (role_fmt(recipe.fp8_format, r) for r in range(3))
        def sc(t, f):
            return ref_scale(amax_of(t), f, recipe.margin, recipe.power_2_scale, recipe.amax_epsilon)
        xd = q_dq(x, sc(x, fx), fx)
        wd = q_dq(layer.weight, sc(layer.weight, fw), fw)
        gd = q_dq(g, sc(g, fg), fg)
        assert close(x.grad, gd @ wd), (xmag, gmag)
        if xmag == INF:  # an inf in x stays non-finite (a saturated 448 would hide it)
            assert not torch.isfinite(y).all() and not torch.isfinite(layer.weight.grad).all()
        else:
            assert close(y, xd @ wd.t() + layer.bias.double()), (xmag, gmag)
            assert close(layer.weight.grad, gd.t() @ xd), (xmag, gmag)
        layer.weight.grad = layer.bias.grad = None
    assert layer.fp8_steps.tolist() == [0, 0, 0]  # current scaling keeps no delayed state


def _block_q_dq(t: torch.Tensor, fmt: Format, rows: int, cols: int = 128, **kw) -> torch.Tensor:
    """Per-tile current scaling of a 2-D tensor with rows x cols tiles."""
    out = torch.empty(t.shape, dtype=torch.float64)
    for i in range(0, t.shape[0], rows):
        for j in range(0, t.shape[1], cols):
            tile = t[i:i + rows, j:j + cols]
            out[i:i + rows, j:j + cols] = q_dq(tile, ref_scale(amax_of(tile), fmt, **kw), fmt)
    return out


@pytest.mark.parametrize("kw", [dict(), dict(power_2_scale=True), dict(margin=1), dict(fp8_format=Format.HYBRID)],
                         ids=["default", "pow2", "margin", "hybrid"])
def test_block_scaling_forward_matches_emulation(kw):
    recipe = BlockScaling(**kw)
    torch.manual_seed(4)
    M, K, N = 20, 300, 140   # partial tiles in every dimension
    layer = fp8mix.Linear(K, N)
    x = torch.randn(M, K) * torch.logspace(-3, 3, K)  # tile amaxes differ by orders of magnitude
    with fp8_autocast(fp8_recipe=recipe):
        y = layer(x)
    f = role_fmt(recipe.fp8_format, 0)
    opts = dict(margin=recipe.margin, pow2=recipe.power_2_scale)
    xd = _block_q_dq(x, f, 1, **opts)                  # 1 x 128 tiles along K
    wd = _block_q_dq(layer.weight, f, 128, **opts)     # 128 x 128 blocks
    assert close(y, xd @ wd.t() + layer.bias.double(), rel=1e-5)


def test_block_scaling_isolates_outliers():
    torch.manual_seed(5)
    layer = fp8mix.Linear(256, 64)
    ref = torch.nn.Linear(256, 64)
    ref.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("fp8")})
    x = torch.randn(32, 256)
    x[0] *= 1e6  # one huge row
    g = torch.randn(32, 64)
    errs = {}
    for name, rec in (("block", BlockScaling()), ("current", CurrentScaling())):
        xx = x.clone().requires_grad_()
        with fp8_autocast(fp8_recipe=rec):
            y = layer(xx)
        y.backward(g)
        with torch.no_grad():
            yr = ref(x)
            y = y.detach()
        errs[name] = float((y[1:] - yr[1:]).norm() / yr[1:].norm())
    assert errs["block"] < 0.06, errs
    assert errs["current"] > 0.5, errs  # per-tensor scale flushes the small rows


# --------------------------------------------------------------------------------------
# recipe fields
# --------------------------------------------------------------------------------------
def test_recipe_defaults():
    d = DelayedScaling()
    assert (d.margin, d.interval, d.fp8_format, d.amax_history_len, d.amax_compute_algo, d.power_2_scale) == \
        (0, 1, Format.HYBRID, 1024, "max", False)
    # TE's positional order; TE's common fields (the base class's) keyword-only
    params = inspect.signature(DelayedScaling).parameters.values()
    assert [p.name for p in params][:6] == ["margin", "interval", "fp8_format", "amax_history_len",
                                            "amax_compute_algo", "power_2_scale"]
    for cls in RECIPES:
        kw = [p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert kw == ["use_power_2_scales", "reduce_amax", "fp8_dpa", "fp8_mha"], cls
        assert repr(cls()).startswith(f"{cls.__name__}(") and repr(cls()).endswith("fp8_dpa=False, fp8_mha=False)")
    c = CurrentScaling()
    assert c.power_2_scale is False and c.amax_epsilon == 0.0
    assert c.fp8_format is Format.HYBRID  # Transformer Engine's Float8CurrentScaling default
    b = BlockScaling()
    assert b.fp8_format is Format.E4M3  # Transformer Engine's Float8BlockScaling default
    assert DelayedScaling(fp8_format="hybrid").fp8_format is Format.HYBRID
    assert CurrentScaling(fp8_format="E4M3").fp8_format is Format.E4M3


BAD = [  # (recipe, a bad field, the error it raises)
    (DelayedScaling, dict(margin=-1), ValueError),
    (DelayedScaling, dict(margin=1.5), ValueError),
    (DelayedScaling, dict(amax_history_len=0), ValueError),
    (DelayedScaling, dict(amax_history_len=-3), ValueError),
    (DelayedScaling, dict(interval=0), ValueError),
    (DelayedScaling, dict(interval=-1), ValueError),
    (DelayedScaling, dict(amax_compute_algo="mean"), ValueError),
    (DelayedScaling, dict(amax_compute_algo="MAX "), ValueError),
    (DelayedScaling, dict(amax_compute_algo=None), ValueError),
    (DelayedScaling, dict(fp8_format="E3M4"), ValueError),
    (DelayedScaling, dict(fp8_format=3), ValueError),
    (DelayedScaling, dict(power_2_scale=1), TypeError),
    (DelayedScaling, dict(power_2_scale="yes"), TypeError),
    (CurrentScaling, dict(fp8_format="E8M0"), ValueError),
    (CurrentScaling, dict(power_2_scale=0), TypeError),
    (CurrentScaling, dict(amax_epsilon=-1.0), ValueError),
    (CurrentScaling, dict(amax_epsilon=float("nan")), ValueError),
    (CurrentScaling, dict(amax_epsilon=float("inf")), ValueError),
    (CurrentScaling, dict(margin=-2), ValueError),
    (BlockScaling, dict(fp8_format="fp8"), ValueError),
    (BlockScaling, dict(power_2_scale=None), TypeError),
    (BlockScaling, dict(amax_epsilon=-0.5), ValueError),
]


@pytest.mark.parametrize("cls,kw,error", BAD,
                         ids=[f"{c.__name__}-{list(k)[0]}={list(k.values())[0]!r}" for c, k, _ in BAD])
def test_bad_recipe_fields_raise(cls, kw, error):
    with pytest.raises(error, match=list(kw)[0]):  # the message names the field
        cls(**kw)


def test_delayed_nonfinite_amax_does_not_poison_the_history():
    """A step with inf/NaN in its tensors (which a gradient scaler would skip) leaves the
    scale finite, is recorded as 0, and the next clean step scales from clean history."""
    recipe = DelayedScaling(amax_history_len=8)
    layer = fp8mix.Linear(32, 32)
    x = torch.randn(8, 32)
    with fp8_autocast(fp8_recipe=recipe):
        layer(x)
        s_before = layer.fp8_scale[0].item()
        for bad in (float("nan"), float("inf")):
            xb = x.clone()
            xb[0, 0] = bad
            layer(xb)
            assert layer.fp8_amax_history[0, 0].item() == 0.0
            assert math.isfinite(layer.fp8_scale[0].item()) and layer.fp8_scale[0].item() == s_before
        layer(x * 4)
    assert layer.fp8_scale[0].item() == ref_scale(amax_of(x * 4), Format.E4M3)


def test_delayed_amax_spike_saturates_one_step_then_recovers():
    """Documented behaviour: with interval 1 a spike saturates only the cast that sees it
    (its scale came from the history before it); the next cast scales from the spike."""
    recipe = DelayedScaling(amax_history_len=16)
    layer = fp8mix.Linear(64, 64)
    x = torch.randn(16, 64)
    with fp8_autocast(fp8_recipe=recipe):
        for _ in range(3):
            layer(x)
        spike = x * 1000
        s = layer.fp8_scale[0].item()
        q = fp8mix.quantize(spike, scale=s)
        assert (q.data.float().abs() == 448).float().mean() > 0.5  # the spike step saturates
        y = layer(spike)
        assert torch.isfinite(y).all()
        s_after = layer.fp8_scale[0].item()
        assert s_after == ref_scale(amax_of(spike), Format.E4M3)
        q2 = fp8mix.quantize(spike, scale=s_after)
        assert (q2.data.float().abs() == 448).sum() <= 1  # next step: only the max itself


# --------------------------------------------------------------------------------------
# Transformer Engine's field names (issue #14)
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [DelayedScaling, CurrentScaling, BlockScaling])
def test_te_field_names_are_accepted(cls):
    r = cls(use_power_2_scales=True, reduce_amax=False, fp8_dpa=False, fp8_mha=False)
    assert r.power_2_scale is True and r.reduce_amax is False
    assert cls(power_2_scale=True) == r.__class__(power_2_scale=True)
    with pytest.raises(NotImplementedError, match="attention in FP8"):
        cls(fp8_dpa=True)
    with pytest.raises(NotImplementedError, match="attention in FP8"):
        cls(fp8_mha=True)
    with pytest.raises(TypeError, match=r"unknown field\(s\) \['amax_histroy_len'\]; the fields are \["):
        cls(amax_histroy_len=8)


def test_te_block_scaling_dims():
    assert BlockScaling(x_block_scaling_dim=1, w_block_scaling_dim=2, grad_block_scaling_dim=1) == BlockScaling()
    with pytest.raises(NotImplementedError, match="x_block_scaling_dim=1"):
        BlockScaling(w_block_scaling_dim=1)
    with pytest.raises(NotImplementedError, match="scaling_factor_compute_algo"):
        DelayedScaling(scaling_factor_compute_algo=lambda *a: 1.0)


def test_te_recipe_aliases_are_the_classes():
    assert fp8mix.recipe.Float8CurrentScaling is CurrentScaling and fp8mix.recipe.Float8BlockScaling is BlockScaling
