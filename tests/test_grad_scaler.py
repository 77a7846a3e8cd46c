"""fp8mix.FP8GradScaler: torch.amp.GradScaler's behaviour, step for step, plus the FP8
feedback rules (driven here by counts injected with fp8mix.grad_stats.add, so these
tests do not depend on which layers report them; tests/test_faults.py runs real layers).
"""
from __future__ import annotations

import copy
import gc
import pickle

import pytest
import torch
import torch.nn as nn

import fp8mix
from fp8mix import FP8GradScaler, grad_stats

INF, NAN = float("inf"), float("nan")


@pytest.fixture(autouse=True)
def _clean_grad_stats():
    """No counts leak into or out of a test, and every test releases the collection it took."""
    before = grad_stats.enabled()
    yield
    if grad_stats.enabled() != before:
        gc.collect()  # a scaler a test dropped stops collecting when it is collected
    assert grad_stats.enabled() == before, "a test left fp8mix.grad_stats collection on"


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _batch(t):
    g = torch.Generator().manual_seed(100 + t)
    return torch.randn(12, 8, generator=g), torch.randn(12, 4, generator=g)


def _inject(**counts):
    """One grad_output cast's counts (fp8mix.grad_stats.FIELDS); 1000 non-zero values by default."""
    c = {"numel": 1000, "nonzero": 1000}
    c.update(counts)
    grad_stats.add(torch.tensor([float(c.get(k, 0)) for k in grad_stats.FIELDS], dtype=torch.float64))


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _poison(model, t, infs, nans):
    if t in infs:
        model[0].weight.grad[1, 2] = INF
    if t in nans:
        model[2].bias.grad[0] = NAN


def _train_step(model, opt, scaler, t, *, infs=(), nans=(), clip=None):
    x, y = _batch(t)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    _poison(model, t, infs, nans)
    if clip is not None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    ret = scaler.step(opt)
    scaler.update()
    return ret


# ---- same as torch.amp.GradScaler ------------------------------------------------------

@pytest.mark.parametrize("init_scale,growth,backoff,interval", [
    (2.0 ** 16, 2.0, 0.5, 3),
    (1000.0, 1.7, 0.3, 2),   # factors that are not powers of two: same fp32 rounding as torch
    (3.0e38, 2.0, 0.5, 1),   # growth to inf is refused, as torch
])
def test_matches_torch_step_for_step(init_scale, growth, backoff, interval):
    kw = dict(init_scale=init_scale, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    ours, theirs = FP8GradScaler("cpu", fp8_feedback=False, **kw), torch.amp.GradScaler("cpu", **kw)
    ma, mb = _model(), _model()
    oa, ob = torch.optim.SGD(ma.parameters(), lr=0.05), torch.optim.SGD(mb.parameters(), lr=0.05)
    infs, nans = {2, 3, 9, 17}, {12}
    for t in range(24):
        before = _params(ma)
        clip = 0.5 if t % 4 == 1 else None
        _train_step(ma, oa, ours, t, infs=infs, nans=nans, clip=clip)
        _train_step(mb, ob, theirs, t, infs=infs, nans=nans, clip=clip)
        assert ours.get_scale() == theirs.get_scale(), t
        assert ours._get_growth_tracker() == theirs._get_growth_tracker(), t
        assert _same(_params(ma), _params(mb)), t
        assert _same(before, _params(ma)) == (t in infs or t in nans), t
        if t == 14:
            ours.update(1234.5)
            theirs.update(1234.5)
    assert {k: v for k, v in ours.state_dict().items() if k in theirs.state_dict()} == theirs.state_dict()


def test_matches_torch_with_two_optimizers():
    ours, theirs = (FP8GradScaler("cpu", init_scale=64.0, growth_interval=2, fp8_feedback=False),
                    torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=2))
    runs = []
    for scaler in (ours, theirs):
        m = _model()
        o1 = torch.optim.SGD(m[0].parameters(), lr=0.1)
        o2 = torch.optim.Adam(m[2].parameters(), lr=0.01)
        traj = []
        for t in range(8):
            x, y = _batch(t)
            o1.zero_grad()
            o2.zero_grad()
            scaler.scale(nn.functional.mse_loss(m(x), y)).backward()
            if t == 3:
                m[2].weight.grad[0, 0] = INF  # only o2 is skipped, as torch
            scaler.step(o1)
            scaler.step(o2)
            scaler.update()
            traj.append((scaler.get_scale(), _params(m)))
        runs.append(traj)
    for (sa, pa), (sb, pb) in zip(*runs):
        assert sa == sb and _same(pa, pb)


def test_fused_optimizer_protocol_matches_torch():
    try:
        torch.optim.Adam(_model().parameters(), fused=True)
    except (RuntimeError, ValueError) as e:  # pragma: no cover - depends on the torch build
        pytest.skip(f"no fused Adam on CPU here: {e}")
    out = []
    for scaler in (FP8GradScaler(init_scale=256.0, fp8_feedback=False), torch.amp.GradScaler("cpu", init_scale=256.0)):
        m = _model()
        opt = torch.optim.Adam(m.parameters(), lr=0.01, fused=True)
        for t in range(5):
            _train_step(m, opt, scaler, t, infs={2})
        out.append((scaler.get_scale(), _params(m)))
    assert out[0][0] == out[1][0] and _same(out[0][1], out[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fallback_inf_check_equals_fused(monkeypatch, dtype):
    """Devices without torch's fused kernel get plain tensor ops with the same result."""
    from fp8mix import grad_scaler as gs
    g = torch.Generator().manual_seed(0)
    cases = [[torch.randn(7, 5, generator=g), torch.randn(300, generator=g)]]
    cases.append([c.clone() for c in cases[0]])
    cases[1][1][17] = INF
    cases.append([c.clone() for c in cases[0]])
    cases[2][0][3, 1] = NAN
    inv = torch.tensor(1 / 3.0)
    for grads in cases:
        outs = []
        for fused in (True, False):
            monkeypatch.setattr(gs, "_inf_check_has_kernel", lambda dev, fused=fused: fused)
            gr = [t.to(dtype) for t in grads]
            found = torch.zeros(())
            gs._non_finite_check_and_unscale_(gr, found, inv)
            outs.append((found, gr))
        (fa, ga), (fb, gb) = outs
        assert torch.equal(fa, fb) and float(fa) == (grads is not cases[0])
        assert all(torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())
                   for x, y in zip(ga, gb))


def test_skip_on_inf_keeps_params_and_optimizer_state():
    m = _model()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    scaler = FP8GradScaler(init_scale=2.0 ** 10, fp8_feedback=False)
    _train_step(m, opt, scaler, 0)
    before, steps = _params(m), opt.state[m[0].weight]["step"].clone()
    assert _train_step(m, opt, scaler, 1, infs={1}) is None
    assert _same(before, _params(m))
    assert torch.equal(opt.state[m[0].weight]["step"], steps)
    assert scaler.get_scale() == 2.0 ** 9 and scaler._get_growth_tracker() == 0
    _train_step(m, opt, scaler, 2)
    assert not _same(before, _params(m))


def test_step_returns_optimizer_result():
    class Opt(torch.optim.SGD):
        def step(self, closure=None, *, tag=None):
            super().step()
            return ("stepped", tag)
    m = _model()
    opt, scaler = Opt(m.parameters(), lr=0.1), FP8GradScaler(fp8_feedback=False)
    x, y = _batch(0)
    scaler.scale(nn.functional.mse_loss(m(x), y)).backward()
    assert scaler.step(opt, tag=7) == ("stepped", 7)
    scaler.update()


def test_growth_after_interval_and_backoff():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    scaler = FP8GradScaler(init_scale=8.0, growth_interval=4, fp8_feedback=False)
    seen = []
    for t in range(10):
        _train_step(m, opt, scaler, t, infs={6})
        seen.append((scaler.get_scale(), scaler._get_growth_tracker()))
    assert seen == [(8.0, 1), (8.0, 2), (8.0, 3), (16.0, 0), (16.0, 1), (16.0, 2),
                    (8.0, 0), (8.0, 1), (8.0, 2), (8.0, 3)]


def test_clip_after_unscale_equals_clipping_fp32_grads():
    """unscale_ with a power-of-two scale is exact, so clipping sees the fp32 gradients."""
    ma, mb = _model(), _model()
    oa, ob = torch.optim.SGD(ma.parameters(), lr=0.1), torch.optim.SGD(mb.parameters(), lr=0.1)
    scaler = FP8GradScaler(init_scale=2.0 ** 12, fp8_feedback=False)
    for t in range(5):
        x, y = _batch(t)
        oa.zero_grad()
        scaler.scale(nn.functional.mse_loss(ma(x), y)).backward()
        scaler.unscale_(oa)
        na = torch.nn.utils.clip_grad_norm_(ma.parameters(), 0.05)
        scaler.step(oa)
        scaler.update()
        ob.zero_grad()
        nn.functional.mse_loss(mb(x), y).backward()
        nb = torch.nn.utils.clip_grad_norm_(mb.parameters(), 0.05)
        ob.step()
        assert na > 0.05 and torch.equal(na, nb)  # it did clip, on the same norm
        assert _same(_params(ma), _params(mb))


def test_clip_after_unscale_fp8_linear():
    """Same through fp8mix.Linear under delayed scaling: a constant power-of-two loss scale
    moves every grad_output scale by the same power of two, so the FP8 bytes and the
    gradients agree. (Not across a change of the loss scale: delayed scales lag it by a
    step, which is what the FP8 feedback is about; growth_interval keeps it fixed here.)"""
    def make():
        torch.manual_seed(3)
        return nn.Sequential(fp8mix.Linear(32, 32), nn.ReLU(), fp8mix.Linear(32, 16))
    recipe = fp8mix.recipe.DelayedScaling(amax_history_len=4)
    ma, mb = make(), make()
    oa, ob = torch.optim.SGD(ma.parameters(), lr=0.1), torch.optim.SGD(mb.parameters(), lr=0.1)
    with FP8GradScaler(init_scale=2.0 ** 8, growth_interval=100, fp8_feedback=False) as scaler:
        for t in range(6):
            g = torch.Generator().manual_seed(t)
            x, y = torch.randn(20, 32, generator=g), torch.randn(20, 16, generator=g)
            for m, o, s in ((ma, oa, scaler), (mb, ob, None)):
                o.zero_grad()
                with fp8mix.fp8_autocast(fp8_recipe=recipe):
                    loss = nn.functional.mse_loss(m(x), y)
                (s.scale(loss) if s else loss).backward()
                if s:
                    s.unscale_(o)
                torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
                if s:
                    s.step(o)
                    s.update()
                else:
                    o.step()
            assert _same(_params(ma), _params(mb)), t


# ---- protocol errors and the disabled scaler ---------------------------------------------

def test_call_order_errors():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = FP8GradScaler(fp8_feedback=False)
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.step(opt)
    x, y = _batch(0)
    scaler.scale(nn.functional.mse_loss(m(x), y)).backward()
    with pytest.raises(RuntimeError, match="no inf checks"):
        scaler.update()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="closure"):
        scaler.step(opt, closure=lambda: 0.0)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    scaler.update()
    m.half()
    opt.zero_grad()
    scaler.scale(m(x.half()).float().square().mean()).backward()
    with pytest.raises(ValueError, match="FP16"):
        scaler.unscale_(opt)


def test_scale_nested_outputs():
    scaler = FP8GradScaler(init_scale=4.0, fp8_feedback=False)
    a, b, c = torch.ones(2), torch.full((3,), 2.0), torch.tensor([0.5], dtype=torch.bfloat16)
    out = scaler.scale([a, (b, [c])])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    assert torch.equal(out[0], a * 4) and torch.equal(out[1][0], b * 4)
    assert out[1][1][0].dtype == torch.bfloat16 and out[1][1][0].item() == 2.0
    with pytest.raises(TypeError, match="outputs must be a tensor"):
        scaler.scale([a, 3.0])


def test_disabled_is_a_pass_through():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = FP8GradScaler(enabled=False)
    x, y = _batch(0)
    loss = nn.functional.mse_loss(m(x), y)
    assert scaler.scale(loss) is loss
    loss.backward()
    before = _params(m)
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert not _same(before, _params(m))
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled() and scaler.state_dict() == {}
    assert not grad_stats.enabled()


@pytest.mark.parametrize("kw,msg", [
    (dict(init_scale=0.0), "init_scale"), (dict(init_scale=-1.0), "init_scale"),
    (dict(init_scale=INF), "init_scale"), (dict(init_scale=NAN), "init_scale"),
    (dict(growth_factor=1.0), "growth_factor"), (dict(growth_factor=0.5), "growth_factor"),
    (dict(growth_factor=INF), "growth_factor"),
    (dict(backoff_factor=0.0), "backoff_factor"), (dict(backoff_factor=1.0), "backoff_factor"),
    (dict(backoff_factor=1.5), "backoff_factor"), (dict(backoff_factor=NAN), "backoff_factor"),
    (dict(growth_interval=0), "growth_interval"), (dict(growth_interval=-3), "growth_interval"),
    (dict(overflow_threshold=1.0), "overflow_threshold"), (dict(underflow_threshold=-0.1), "underflow_threshold"),
    (dict(max_scale=0.0), "max_scale"),
])
def test_bad_arguments(kw, msg):
    with pytest.raises(ValueError, match=msg):
        FP8GradScaler(**kw)


def test_bad_argument_types_and_setters():
    with pytest.raises(TypeError, match="growth_interval must be an int"):
        FP8GradScaler(growth_interval=2.5)
    with pytest.raises(TypeError, match="init_scale must be a number"):
        FP8GradScaler(init_scale=True)
    s = FP8GradScaler(fp8_feedback=False)
    s.set_growth_factor(3.0)
    s.set_backoff_factor(0.25)
    s.set_growth_interval(7)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (3.0, 0.25, 7)
    with pytest.raises(ValueError, match="growth_factor must be finite and > 1"):
        s.set_growth_factor(1.0)
    with pytest.raises(ValueError, match=r"backoff_factor must be in \(0, 1\)"):
        s.set_backoff_factor(2.0)
    with pytest.raises(ValueError, match="growth_interval must be >= 1"):
        s.set_growth_interval(0)


# ---- checkpoints -----------------------------------------------------------------------

def _feedback_run(scaler, m, opt, t0, n):
    """n steps with a fixed pattern of injected FP8 counts; the scale trajectory."""
    traj = []
    for t in range(t0, t0 + n):
        x, y = _batch(t)
        opt.zero_grad()
        scaler.scale(nn.functional.mse_loss(m(x), y)).backward()
        if t % 5 == 1:
            _inject(underflow=200)
        elif t % 5 == 3:
            _inject(overflow=30)
        else:
            _inject()
        _poison(m, t, {7}, ())
        scaler.step(opt)
        scaler.update()
        traj.append((scaler.get_scale(), scaler._get_growth_tracker(), scaler.last_fp8_action))
    return traj


def test_state_dict_round_trip_and_resume():
    ref_m, m = _model(), _model()
    ref_opt, opt = torch.optim.SGD(ref_m.parameters(), lr=0.05), torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=2.0 ** 10, growth_interval=3) as ref, \
            FP8GradScaler(fp8_feedback_interval=1, init_scale=2.0 ** 10, growth_interval=3) as first:
        ref_traj = _feedback_run(ref, ref_m, ref_opt, 0, 20)
        traj = _feedback_run(first, m, opt, 0, 10)
        sd = first.state_dict()
    assert sd["fp8_growths"] > 0 and sd["fp8_backoffs"] > 0 and sd["_growth_tracker"] > 0
    sd = pickle.loads(pickle.dumps(sd))
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=1.0, growth_factor=5.0, growth_interval=99,
                       underflow_threshold=0.5) as resumed:
        resumed.load_state_dict(sd)
        assert resumed.state_dict() == sd  # exact, before and after the scale tensor exists
        traj += _feedback_run(resumed, m, opt, 10, 10)
        assert resumed.state_dict()["fp8_growths"] == ref.fp8_growths
    assert traj == ref_traj
    assert _same(_params(m), _params(ref_m))


def test_state_dict_interoperates_with_torch():
    ours = FP8GradScaler(init_scale=2.0 ** 5, growth_interval=3, fp8_feedback=False)
    m, opt = _model(), None
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for t in range(4):
        _train_step(m, opt, ours, t)
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(ours.state_dict())
    assert theirs.get_scale() == ours.get_scale() and theirs._get_growth_tracker() == ours._get_growth_tracker()
    back = FP8GradScaler(fp8_feedback=False)
    back.load_state_dict(theirs.state_dict())
    assert back.get_scale() == ours.get_scale() and back._get_growth_tracker() == 1
    assert back.fp8_backoffs == 0
    with pytest.raises(RuntimeError, match="empty"):
        back.load_state_dict({})


def test_pickle_and_deepcopy():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=2.0 ** 6, growth_interval=2) as s:
        _feedback_run(s, m, opt, 0, 3)
        for clone in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
            assert clone.state_dict() == s.state_dict()
            assert not clone._stats.is_active and clone._stats is not s._stats  # its own collector, idle
        x, y = _batch(0)
        s.scale(nn.functional.mse_loss(m(x), y)).backward()
        s.unscale_(opt)
        with pytest.raises(RuntimeError, match="pickled"):
            pickle.dumps(s)
        s.step(opt)
        s.update()


# ---- FP8 feedback ------------------------------------------------------------------------

def _feedback_step(scaler, m, opt, t, inject=None, infs=()):
    x, y = _batch(t)
    opt.zero_grad()
    scaler.scale(nn.functional.mse_loss(m(x), y)).backward()
    if inject is not None:
        for kw in (inject if isinstance(inject, list) else [inject]):
            _inject(**kw)
    _poison(m, t, infs, ())
    before = _params(m)
    scaler.step(opt)
    scaler.update()
    return not _same(before, _params(m))  # stepped


@pytest.fixture
def fb():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=2.0 ** 10, growth_interval=100) as s:
        yield s, m, opt


def test_collection_is_lazy_and_released():
    assert not grad_stats.enabled()
    s = FP8GradScaler(fp8_feedback_interval=1)
    assert not grad_stats.enabled()  # nothing until the first scale()
    s.scale(torch.ones(()))
    assert grad_stats.enabled()
    s.close()
    assert not grad_stats.enabled()
    s.close()  # idempotent
    s.scale(torch.ones(()))
    assert grad_stats.enabled()
    del s
    gc.collect()
    assert not grad_stats.enabled()  # the finalizer released it
    off = FP8GradScaler(fp8_feedback=False)
    off.scale(torch.ones(()))
    assert not grad_stats.enabled()


def test_feedback_off_ignores_counts():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    s = FP8GradScaler(init_scale=2.0 ** 10, fp8_feedback=False)
    other = grad_stats.GradStats()
    other.activate()  # someone else collects: this scaler still ignores the counts
    try:
        assert _feedback_step(s, m, opt, 0, dict(overflow=500, underflow=500, nonfinite=3))
        assert s.get_scale() == 2.0 ** 10 and s.last_fp8_stats is None
        got = other.pop()
        assert got is not None and got["overflow"] == 500 and got["nonfinite"] == 3  # the other one saw them
    finally:
        other.deactivate()


def test_two_scalers_each_see_every_count():
    """Each scaler owns its collector: two sampling scalers both receive a cast's counts
    (one module-global sum would hand them to whichever read first)."""
    a, b = grad_stats.GradStats(), grad_stats.GradStats()
    a.activate()
    b.activate()
    try:
        _inject(underflow=7)
        _inject(overflow=2)
        for c in (a, b):
            d = c.pop()
            assert d["underflow"] == 7 and d["overflow"] == 2 and d["numel"] == 2000
            assert d["max_overflow_frac"] == pytest.approx(0.002)
            assert c.pop() is None
    finally:
        a.deactivate()
        b.deactivate()


def test_overflow_backs_off_without_skipping(fb):
    s, m, opt = fb
    assert _feedback_step(s, m, opt, 0)
    assert _feedback_step(s, m, opt, 1, dict(overflow=20))  # 2% > 0.1%: the step still happens
    assert s.get_scale() == 2.0 ** 9 and s._get_growth_tracker() == 0
    assert s.last_fp8_action == "backoff" and s.fp8_backoffs == 1
    assert s.last_fp8_stats["overflow"] == 20 and s.last_fp8_stats["overflow_frac"] == pytest.approx(0.02)


def test_overflow_threshold_is_strict(fb):
    s, m, opt = fb
    _feedback_step(s, m, opt, 0, dict(numel=10000, nonzero=10000, overflow=10))  # exactly 1e-3
    assert s.get_scale() == 2.0 ** 10 and s.last_fp8_action is None and s._get_growth_tracker() == 1


def test_underflow_grows_at_once(fb):
    s, m, opt = fb
    _feedback_step(s, m, opt, 0)
    _feedback_step(s, m, opt, 1, dict(underflow=60))  # 6% > 5%
    assert s.get_scale() == 2.0 ** 11 and s._get_growth_tracker() == 0 and s.last_fp8_action == "grow"
    _feedback_step(s, m, opt, 2, dict(underflow=40))  # 4%: below the threshold
    assert s.get_scale() == 2.0 ** 11 and s.last_fp8_action is None


def test_underflow_fraction_counts_nonzero_values_only(fb):
    s, m, opt = fb
    # 90% zeros (ReLU gradients): 60 of the 100 non-zero values underflowed
    _feedback_step(s, m, opt, 0, dict(numel=1000, nonzero=100, underflow=60))
    assert s.last_fp8_action == "grow"


def test_counts_of_microbatches_add_up(fb):
    s, m, opt = fb
    # 2% of a small cast, none of a large one: pooled 20 of 101000 (0.02%) is under 0.1%,
    # but one cast clipped 2% of its values: that alone backs off
    _feedback_step(s, m, opt, 0, [dict(overflow=20), dict(numel=10 ** 5, nonzero=10 ** 5)])
    assert s.last_fp8_action == "backoff" and s.last_fp8_stats["overflow"] == 20
    assert s.last_fp8_stats["overflow_frac"] == pytest.approx(20 / 101000)
    assert s.last_fp8_stats["max_overflow_frac"] == pytest.approx(20 / 1000)
    _feedback_step(s, m, opt, 1, [dict(overflow=0), dict(numel=10 ** 5, nonzero=10 ** 5)])
    assert s.last_fp8_action is None
    _feedback_step(s, m, opt, 2, [dict(overflow=1), dict(numel=1000, nonzero=200, overflow=1)])
    assert s.last_fp8_stats["overflow_frac"] == pytest.approx(2 / 1200)
    assert s.last_fp8_action == "backoff"


def test_overflow_wins_over_underflow(fb):
    s, m, opt = fb
    _feedback_step(s, m, opt, 0, dict(underflow=300, overflow=5))
    assert s.get_scale() == 2.0 ** 9 and s.last_fp8_action == "backoff"


def test_no_underflow_growth_on_inf_step(fb):
    s, m, opt = fb
    assert not _feedback_step(s, m, opt, 0, dict(underflow=300), infs={0})
    assert s.get_scale() == 2.0 ** 9 and s.last_fp8_action is None and s.fp8_growths == 0


def test_no_double_growth_with_interval_growth():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=4.0, growth_interval=2) as s:
        _feedback_step(s, m, opt, 0)
        _feedback_step(s, m, opt, 1, dict(underflow=300))  # the interval growth happens: one growth only
        assert s.get_scale() == 8.0 and s.fp8_growths == 0


def test_underflow_growth_is_capped():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=2.0 ** 23, growth_interval=1000) as s:
        for t in range(3):
            _feedback_step(s, m, opt, t, dict(underflow=500))
        assert s.get_scale() == 2.0 ** 24 and s.fp8_growths == 1
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=3.0, max_scale=10.0, growth_interval=1000) as s:
        for t in range(4):
            _feedback_step(s, m, opt, t, dict(underflow=500))
        assert s.get_scale() == 6.0


def test_no_ping_pong_between_overflow_and_underflow():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(fp8_feedback_interval=1, init_scale=2.0 ** 10, growth_interval=3) as s:
        _feedback_step(s, m, opt, 0, dict(overflow=50))          # 2**10 overflowed
        assert s.get_scale() == 2.0 ** 9
        _feedback_step(s, m, opt, 1, dict(underflow=300))         # growing back to 2**10 is refused
        _feedback_step(s, m, opt, 2, dict(underflow=300))
        assert s.get_scale() == 2.0 ** 9 and s.fp8_growths == 0
        _feedback_step(s, m, opt, 3)                              # 3 clean steps: interval growth
        assert s.get_scale() == 2.0 ** 10
        _feedback_step(s, m, opt, 4, dict(underflow=300))         # the ceiling is lifted
        assert s.get_scale() == 2.0 ** 11 and s.fp8_growths == 1


def test_hidden_inf_skips_the_step(fb):
    """Finite parameter gradients, but a grad_output cast saw an inf (saturated away)."""
    s, m, opt = fb
    _feedback_step(s, m, opt, 0)
    assert not _feedback_step(s, m, opt, 1, dict(nonfinite=1))
    assert s.get_scale() == 2.0 ** 9 and s.last_fp8_action == "skip" and s.fp8_skips == 1
    assert _feedback_step(s, m, opt, 2)  # the next step goes on
    assert s.last_fp8_action is None


def test_hidden_inf_skips_every_optimizer_of_the_iteration():
    m = _model()
    o1, o2 = torch.optim.SGD(m[0].parameters(), lr=0.1), torch.optim.SGD(m[2].parameters(), lr=0.1)
    with FP8GradScaler(fp8_feedback_interval=1) as s:
        x, y = _batch(0)
        s.scale(nn.functional.mse_loss(m(x), y)).backward()
        _inject(nonfinite=2)
        before = _params(m)
        s.step(o1)
        s.step(o2)
        s.update()
        assert _same(before, _params(m)) and s.get_scale() == 2.0 ** 15


def test_new_scale_discards_counts(fb):
    s, m, opt = fb
    x, y = _batch(0)
    s.scale(nn.functional.mse_loss(m(x), y)).backward()
    _inject(overflow=500)
    s.step(opt)
    s.update(new_scale=100.0)
    assert s.get_scale() == 100.0 and s.last_fp8_stats["overflow"] == 500
    _feedback_step(s, m, opt, 1, {})
    assert s.get_scale() == 100.0 and s.last_fp8_stats["overflow"] == 0
    with pytest.raises(ValueError, match="new_scale must be finite and > 0"):
        s.update(new_scale=-1.0)
    assert s.get_scale() == 100.0  # a refused new_scale changes nothing


def test_feedback_is_sampled_every_interval():
    """The gradient casts are counted on iterations 0, n, 2n, ... only (counting costs a
    read of dy), and the iteration counter survives state_dict."""
    m = nn.Sequential(fp8mix.Linear(32, 32), nn.ReLU(), fp8mix.Linear(32, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    seen = []
    with FP8GradScaler(init_scale=2.0 ** 8, fp8_feedback_interval=3) as s:
        for t in range(7):
            x, y = torch.randn(16, 32), torch.randn(16, 4)
            with fp8mix.fp8_autocast():
                loss = nn.functional.mse_loss(m(x), y)
            s.scale(loss).backward()
            seen.append(grad_stats.enabled())
            s.step(opt)
            s.update()
            assert (s.last_fp8_stats is not None) == (t % 3 == 0)
            opt.zero_grad()
        sd = s.state_dict()
    assert seen == [t % 3 == 0 for t in range(7)]
    assert sd["fp8_feedback_iter"] == 7 and sd["fp8_feedback_interval"] == 3
    with FP8GradScaler() as r:
        r.load_state_dict(sd)
        r.scale(torch.ones(()))
        assert not grad_stats.enabled()  # iteration 7: not sampled
    with pytest.raises(ValueError, match="fp8_feedback_interval"):
        FP8GradScaler(fp8_feedback_interval=0)


def test_feedback_follows_every_step_while_it_acts():
    """Off-interval iterations are counted too right after the counts made the scaler act,
    so a scale in motion is followed step by step (growth from a tiny scale is not 10x slower)."""
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with FP8GradScaler(init_scale=1.0, growth_interval=100, fp8_feedback_interval=5) as s:
        sampled, actions = [], []
        for t in range(9):
            x, y = _batch(t)
            opt.zero_grad()
            s.scale(nn.functional.mse_loss(m(x), y)).backward()
            sampled.append(grad_stats.enabled())
            _inject(underflow=500 if t < 3 else 0)  # heavy underflow for three iterations
            s.step(opt)
            s.update()
            actions.append(s.last_fp8_action)
    assert sampled == [True, True, True, True, False, True, False, False, False]
    assert actions[:4] == ["grow", "grow", "grow", None] and s.get_scale() == 8.0
