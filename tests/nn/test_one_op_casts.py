"""A linear layer's forward casts and its backward as one op each (ops.linear_delayed_casts,
linear_current_casts, linear_backward).

They replace, in fp8mix.nn's eager CPU step of a per-tensor recipe, two or three separate
ops each (delayed_flush + delayed_cast of x and W, or quantize_current of x and W; grad_cast
+ the dgrad and wgrad scaled_mm) to cut the per-layer dispatch overhead. Checked here:
bit-equality with the separate ops (outputs and every FP8 state buffer), current scaling
against torch's own float8 cast, the backward against torch, opcheck, clear errors, and a
Linear training run through the one-op path equal bit for bit to the same run through the
separate ops.
"""
from __future__ import annotations

import pytest
import torch
from helpers import OpNames

import fp8mix
from fp8mix import _C, ops
from fp8mix.nn import _direct, _plan
from fp8mix.recipe import CurrentScaling, DelayedScaling

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
R = torch.ops.fp8mix


def _state(roles=3, slots=8, hist=16):
    torch.manual_seed(3)
    h = torch.zeros(hist, roles)
    h[:4] = torch.rand(4, roles) * 3  # some history already
    steps = torch.tensor([4] * roles, dtype=torch.int64)
    pending = torch.full((slots,), -1.0)
    pending[2] = 5.5  # a backward's amax waiting to be recorded
    return [h, torch.full((roles,), 2.0), steps, pending, torch.tensor(2, dtype=torch.int64)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in (E4, E5) else t


def _equal(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("record,reserve", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_delayed_casts_equal_the_separate_ops(record, reserve, transpose, dtype):
    x = (torch.randn(37, 48) * 7).to(dtype)
    w = (torch.randn(40, 48) * 0.1).to(dtype)
    x[3, 5] = float("inf")  # inf_to_nan: NaN in the FP8 x, as the separate cast writes it
    a, b = _state(), _state()
    spec = ops.DelayedSpec(history_len=16, margin=1)
    got = ops.linear_delayed_casts(x, w, *a, gemm=0, x_dtype=E4, w_dtype=E4, grad_dtype=E5, spec=spec, record=record,
                                   reserve=reserve, transpose=transpose)
    plan, slot = ops.delayed_flush(*b, role=2, fp8_dtype=E5, spec=spec, record=record, reserve=reserve)
    xq, xqt, xs, _ = ops.delayed_cast(x, *b[:3], role=0, fp8_dtype=E4, spec=spec, record=record, transpose=transpose,
                                      inf_to_nan=True)
    wq, wqt, ws, _ = ops.delayed_cast(w, *b[:3], role=1, fp8_dtype=E4, spec=spec, record=record, transpose=transpose,
                                      inf_to_nan=True)
    want = (xq, xqt, xs, xs[1], wq, wqt, ws, ws[1], plan, slot)
    assert len(got) == len(want)
    for i, (g, e) in enumerate(zip(got, want)):
        assert _equal(g, e), f"output {i}: {g} vs {e}"
    for i, (sa, sb) in enumerate(zip(a, b)):
        assert torch.equal(sa, sb), f"state tensor {i} differs"
    assert (a[0][0] != _state()[0][0]).any() == record  # the records did happen (or not)
    assert got[3].dim() == 0 and got[3].data_ptr() != got[2].data_ptr()  # its own tensor, not a view
    assert torch.isnan(got[0].float()[3, 5])


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_current_casts_equal_the_separate_ops_and_torch(transpose, dtype):
    x = (torch.randn(33, 64) * 3).to(dtype)
    w = (torch.randn(20, 64) * 0.05).to(dtype)
    got = ops.linear_current_casts(x, w, x_dtype=E4, w_dtype=E5, transpose=transpose)
    xs = ops.quantize_current(x, E4, transpose=transpose, inf_to_nan=True)
    ws = ops.quantize_current(w, E5, transpose=transpose, inf_to_nan=True)
    want = (*xs, *ws)
    assert len(got) == len(want) == 8
    for i, (g, e) in enumerate(zip(got, want)):
        assert _equal(g, e), f"output {i}"
    for t, (q, _, sinv, am), fmax, fdt in ((x, got[:4], 448.0, E4), (w, got[4:], 57344.0, E5)):
        assert am.item() == t.float().abs().max().item()
        scale = torch.tensor(fmax, dtype=torch.float32) / t.float().abs().max()  # float32, as fp8mix.h's rule
        assert sinv.item() == (1 / scale).item()
        assert torch.equal(_bits(q), _bits((t.float() * scale).to(fdt)))  # torch's own round-to-nearest cast
    if transpose:
        assert torch.equal(_bits(got[1]), _bits(got[0]).t())


@pytest.mark.parametrize("delayed", [True, False])
@pytest.mark.parametrize("want", [(True, True), (True, False), (False, True)])
def test_linear_backward_equals_the_separate_ops(delayed, want):
    torch.manual_seed(5)
    x, w, dy = torch.randn(24, 48), torch.randn(40, 48) * 0.1, torch.randn(24, 40) * 1e-3
    xq, _, xs, _ = ops.quantize_current(x, E4)
    wq, _, ws, _ = ops.quantize_current(w, E4)
    a, b = torch.full((8,), -1.0), torch.full((8,), -1.0)
    slot = torch.tensor(3, dtype=torch.int64)
    kw = dict(plan=torch.tensor([2.0 ** 14, 0.0]), pending=a, slot=slot) if delayed else {}
    got = ops.linear_backward(dy, wq, ws, xq, xs, fp8_dtype=E5, colsum=True, want_dx=want[0], want_dw=want[1],
                              dx_dtype=torch.bfloat16, **kw)
    kw2 = dict(kw, pending=b) if delayed else {}
    gq, _, gs, _, cs = ops.grad_cast(dy, E5, colsum=True, **kw2)
    k = (fp8mix.Granularity.TENSOR, fp8mix.Granularity.TENSOR)
    dx = ops.scaled_mm(gq, wq, gs, ws, out_dtype=torch.bfloat16, scale_granularity=k) if want[0] else None
    dw = ops.scaled_mm(gq.t(), xq, gs, xs, scale_granularity=k) if want[1] else None
    for g, e in ((got[0], dx), (got[1], dw)):
        assert g.numel() == 0 if e is None else _equal(g, e)
    assert _equal(got[2], cs) and _equal(got[3], gq) and _equal(got[4], gs)
    assert torch.equal(a, b) and (a[3] > 0) == delayed  # the pending amax kept by delayed scaling only
    torch.testing.assert_close(got[2], dy.sum(0))  # the bias gradient, against torch
    if want[0]:  # dx against float64 torch on the same FP8 values
        ref = (gq.double() * gs.double()) @ (wq.double() * ws.double())
        torch.testing.assert_close(got[0].double(), ref, rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("kind", ["scale", "amax"])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_linear_backward_recasts_the_weight_as_the_forward_did(kind, wdtype):
    """With w_scale (delayed) / w_amax (current) the op takes the high-precision weight and
    casts it itself: the same bits as casting it first (ops.cast with that scale, or with
    compute_scale's scale of the amax) and passing the FP8 weight; also checked against
    torch's own float8 cast of W * scale."""
    torch.manual_seed(6)
    x, w, dy = torch.randn(24, 48), (torch.randn(40, 48) * 0.1).to(wdtype), torch.randn(24, 40) * 1e-3
    xq, _, xs, _ = ops.quantize_current(x, E4)
    amax = w.float().abs().amax()
    scale, ws = ops.compute_scale(amax.reshape(1), E4, margin=1)
    wq, _, _ = ops.cast(w, scale, E4, inf_to_nan=True)
    ref_q = (w.float() * scale).to(E4)  # torch's cast (round to nearest even, saturating here: |w s| <= 448)
    assert torch.equal(_bits(wq), _bits(ref_q))
    arg = {"w_scale": scale} if kind == "scale" else {"w_amax": amax}
    got = ops.linear_backward(dy, w, ws, xq, xs, fp8_dtype=E5, margin=1, w_fp8_dtype=E4, **arg)
    exp = ops.linear_backward(dy, wq, ws, xq, xs, fp8_dtype=E5, margin=1)
    assert all(_equal(g, e) for g, e in zip(got, exp))
    with pytest.raises(ValueError, match="w_fp8_dtype is required"):
        ops.linear_backward(dy, w, ws, xq, xs, fp8_dtype=E5, **arg)
    with pytest.raises(ValueError, match="not both"):
        ops.linear_backward(dy, w, ws, xq, xs, fp8_dtype=E5, w_scale=scale, w_amax=amax, w_fp8_dtype=E4)


def test_one_op_casts_opcheck_and_errors():
    x, w = torch.randn(8, 32), torch.randn(16, 32)
    torch.library.opcheck(R.linear_delayed_casts, (x, w, *_state(), 0, 16, E4, E4, E5), {})
    torch.library.opcheck(R.linear_current_casts, (x, w, E4, E4), dict(transpose=True))
    xq, wq = x.to(E4), w.to(E4)
    one = torch.ones(())
    # FP8 inputs: test_schema fails inside torch (tests/test_cast.py documents it), the rest is checked
    no_schema = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(R.linear_backward, (torch.randn(8, 16), wq, one, xq, one, E5), dict(colsum=True),
                          test_utils=no_schema)
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.linear_backward(torch.randn(8, 15), wq, one, xq, one, fp8_dtype=E5)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        ops.linear_current_casts(x.long(), w, x_dtype=E4, w_dtype=E4)
    with pytest.raises(TypeError, match="FP8 dtype"):
        ops.linear_current_casts(x, w, x_dtype=torch.float32, w_dtype=E4)
    kw = dict(x_dtype=E4, w_dtype=E4, grad_dtype=E5, spec=ops.DelayedSpec(16), record=True, reserve=True)
    with pytest.raises(ValueError, match="role"):
        ops.linear_delayed_casts(x, w, *_state(), gemm=1, **kw)  # GEMM 1 of a 3-role state
    with pytest.raises(ValueError, match="gemm must be >= 0"):
        ops.linear_delayed_casts(x, w, *_state(), gemm=-1, **kw)


class _DirectCalls:
    """fp8mix._C as fp8mix.nn._direct sees it, each direct call counted."""

    def __init__(self, count: "_Count"):
        self._count = count

    def __getattr__(self, name):
        f = getattr(_C, name)

        def call(*args):
            self._count.names.append(name)
            self._count.direct.append(name)
            return f(*args)
        return call


class _Count:
    """Counts the fp8mix ops a step runs without a TorchDispatchMode (which would select the
    separate ops: fp8mix.nn._forward runs those under any dispatch mode), and which of them
    were called directly (fp8mix._C through fp8mix.nn._direct, not torch.ops)."""

    def __init__(self):
        self.names: list = []
        self.direct: list = []
        self._orig: dict = {}

    def __enter__(self):
        for name in ("linear_delayed_casts", "linear_current_casts", "linear_backward", "scaled_mm", "grad_cast",
                     "delayed_cast", "delayed_flush", "quantize_current"):
            self._orig[name] = getattr(ops, name)
            setattr(ops, name, self._counting(name, self._orig[name]))
        self._c = _direct._C
        _direct._C = _DirectCalls(self)
        return self

    def _counting(self, name, f):
        def call(*args, **kwargs):
            self.names.append(name)
            return f(*args, **kwargs)
        return call

    def __exit__(self, *exc):
        for name, f in self._orig.items():
            setattr(ops, name, f)
        _direct._C = self._c


def test_a_dispatch_mode_sees_the_separate_ops():
    lin, x = fp8mix.Linear(32, 32), torch.randn(8, 32, requires_grad=True)
    with OpNames() as seen:
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
            y = lin(x)
        y.sum().backward()
    assert seen.names.count("scaled_mm") == 3 and not any(n.startswith("linear_") for n in seen.names)


def _train(recipe, *, one_op: bool, steps=4):
    """A few training steps of one Linear (with gradient accumulation in the last), returning
    everything a step leaves: outputs, gradients, FP8 state, and the ops the last step ran."""
    _plan.recipe_consts(recipe).one_op = one_op  # the cached per-recipe answer: off forces the separate ops
    torch.manual_seed(0)
    lin = fp8mix.Linear(48, 40)
    out = []
    for i in range(steps):
        x = torch.randn(24, 48, requires_grad=True)
        with _Count() as seen:
            with fp8mix.fp8_autocast(fp8_recipe=recipe):
                y = lin(x, is_first_microbatch=True if i == steps - 1 else None)
            y.backward(torch.randn_like(y))
        out += [y.detach(), x.grad, lin.weight.grad.clone(), lin.bias.grad.clone()]
        lin.weight.grad = lin.bias.grad = None
        with torch.no_grad():
            lin.weight.add_(0.01)
    # every FP8 buffer (of fp8_rng its offset: the key comes from the order modules are built in)
    state = [b[1:].clone() if k == "fp8_rng" else b.clone() for k, b in lin.named_buffers() if k.startswith("fp8_")]
    return out, state, seen.names, seen.direct


@pytest.mark.parametrize("recipe_cls", [DelayedScaling, CurrentScaling])
def test_linear_through_one_op_equals_the_separate_ops(recipe_cls):
    out_a, state_a, names_a, direct_a = _train(recipe_cls(), one_op=True)
    out_b, state_b, names_b, direct_b = _train(recipe_cls(), one_op=False)
    merged = "linear_delayed_forward" if recipe_cls is DelayedScaling else "linear_current_forward"
    assert merged in names_a and merged not in names_b
    assert direct_a == [merged, "linear_backward"] and not direct_b  # fp8mix._C, not torch.ops
    assert "linear_backward" in names_a and "linear_backward" not in names_b
    assert names_a.count("scaled_mm") == 0 and names_b.count("scaled_mm") == 3  # in the forward / backward calls
    casts = [n for n in names_a if n.startswith(("delayed", "quantize", "linear_", "grad"))]
    assert casts == [merged, "linear_backward"]
    for i, (a, b) in enumerate(zip(out_a, out_b)):
        assert torch.equal(a, b), f"tensor {i} of the run differs"
    assert len(state_a) == 8
    for a, b in zip(state_a, state_b):
        assert torch.equal(a, b)
    torch.manual_seed(0)  # and it is a Linear: the first step is close to nn.Linear's (same init, same input)
    ref = torch.nn.Linear(48, 40)
    y_ref = ref(torch.randn(24, 48)).detach()
    assert (out_a[0] - y_ref).norm() / y_ref.norm() < 0.1  # E4M3 operands: a few percent


# ---- the direct calls (fp8mix._C): the ops' CPU functions without torch.ops ------------

def _direct_and_op(name, args, mutated=()):
    """Runs fp8mix._C.<name> and torch.ops.fp8mix.<name> (the same positional arguments, in
    the schema's order) on separate copies of the mutated state; returns both results and
    both copies of the state."""
    a_args, b_args = list(args), list(args)
    for i in mutated:
        a_args[i], b_args[i] = args[i].clone(), args[i].clone()
    got = getattr(_C, name)(*a_args)
    exp = getattr(R, name)(*b_args)
    return got, exp, [a_args[i] for i in mutated], [b_args[i] for i in mutated]


def _same(got, exp):
    got, exp = (got, exp) if isinstance(got, tuple) else ((got,), (exp,))
    assert len(got) == len(exp)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    for i, (g, e) in enumerate(zip(got, exp)):  # bit for bit (NaN included)
        g, e = (g.view(ints[g.dtype]), e.view(ints[e.dtype])) if g.dtype in ints and g.dim() else (g, e)
        assert _equal(g, e) or (g.dim() == 0 and g.isnan() and e.isnan()), f"output {i}: {g} vs {e}"


@pytest.mark.parametrize("record", [True, False])
def test_direct_calls_equal_torch_ops(record):
    torch.manual_seed(7)
    x, w = torch.randn(29, 64) * 5, torch.randn(40, 64) * 0.1
    x[2, 3] = float("nan")
    got, exp, sa, sb = _direct_and_op("linear_delayed_casts", (x, w, *_state(), 0, 16, E4, E4, E5, 1, False, "max", 1,
                                                               record, record, True, True), mutated=range(2, 7))
    _same(got, exp)
    for a, b in zip(sa, sb):
        assert torch.equal(a, b)
    _same(*_direct_and_op("linear_current_casts", (x.half(), w.half(), E4, E5, 2, False, 0.0, False, True))[:2])
    xq, _, xs, _ = ops.quantize_current(x, E4)
    wq, _, ws, _ = ops.quantize_current(w, E4)
    bias = torch.randn(40).bfloat16()
    t = ops.mm_scale_code("tensor")
    _same(*_direct_and_op("scaled_mm", (xq, wq.t(), xs, ws, bias, torch.bfloat16, "fp32", 128, t, t))[:2])
    dy = torch.randn(29, 40) * 1e-2
    pend, slot = torch.full((4,), -1.0), torch.tensor(1)
    got, exp, sa, sb = _direct_and_op("linear_backward", (dy, w, ws, xq, xs, E5, torch.tensor([512.0, 1 / 512]), pend,
                                                          slot, 0, False, 0.0, True, True, True, torch.float32,
                                                          torch.float32, None, w.abs().amax(), E4))
    _same(got, exp)
    assert pend[1] > 0  # both kept dy's amax (in the same buffer: the op ran second and found it)


def test_direct_calls_refuse_wrapped_tensors_and_raise_the_ops_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fx = torch.randn(8, 32)
    w = torch.randn(16, 32)
    with pytest.raises(TypeError, match="plain CPU tensors"):
        _C.linear_current_casts(fx, w, E4, E4, 0, False, 0.0, False, True)
    assert _direct.direct_ok()  # outside any mode or transform
    with FakeTensorMode():
        assert not _direct.direct_ok()
    with OpNames():
        assert not _direct.direct_ok()
    assert torch.func.vmap(lambda t: t * _direct.direct_ok())(torch.ones(2, 2)).sum() == 0  # a transform: False
    x = torch.randn(8, 32)
    bwd = (torch.randn(8, 15), w.to(E4), torch.ones(()), x.to(E4), torch.ones(()), E5)
    for lib in (R, _C):
        with pytest.raises(TypeError, match="FP8 dtype"):
            lib.linear_current_casts(x, w, torch.float32, E4, 0, False, 0.0, False, True)
        with pytest.raises(ValueError, match="inner dimensions"):
            lib.linear_backward(*bwd, None, None, None, 0, False, 0.0, False, True, True, torch.float32,
                                torch.float32, None, None, None)


def test_the_profiler_sees_the_direct_calls_by_name():
    lin, x = fp8mix.Linear(32, 32), torch.randn(8, 32, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling()):
            y = lin(x)
        y.sum().backward()
    names = [e.name for e in prof.events()]
    for op in ("fp8mix::linear_delayed_forward", "fp8mix::linear_backward"):
        assert names.count(op) == 1, (op, sorted(set(n for n in names if "fp8mix" in n)))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_forward_calls_equal_the_casts_then_scaled_mm(out_dtype, with_bias):
    """linear_delayed_forward / linear_current_forward: the one-op casts, then the forward
    GEMM, in one direct call; the same bits (and FP8 state) as the two ops, and y close to
    float64 math on the same FP8 values."""
    torch.manual_seed(11)
    x, w = torch.randn(35, 64) * 4, torch.randn(24, 64) * 0.2
    x[1, 2] = float("inf")
    bias = torch.randn(24) if with_bias else None
    k = (fp8mix.Granularity.TENSOR, fp8mix.Granularity.TENSOR)
    spec = ops.DelayedSpec(history_len=16)
    a, b = _state(), _state()
    got = _C.linear_delayed_forward(x, w, bias, out_dtype, *a, 0, 16, E4, E4, E5, 0, False, "max", 1, True, True)
    c = ops.linear_delayed_casts(x, w, *b, gemm=0, x_dtype=E4, w_dtype=E4, grad_dtype=E5, spec=spec, record=True,
                                 reserve=True)
    y = ops.scaled_mm(c[0], c[4].t(), c[3], c[7], bias=bias, out_dtype=out_dtype, scale_granularity=k)
    _same(got, (y, c[0], c[2], c[3], c[4], c[6], c[7], c[8], c[9], c[6][0:1]))
    for sa, sb in zip(a, b):
        assert torch.equal(sa, sb)
    ok = torch.isfinite(y.float()).all(1)  # the inf row is NaN in both
    ref = (c[0].double() * c[3].double()) @ (c[4].double() * c[7].double()).t() + (0 if bias is None else bias.double())
    torch.testing.assert_close(got[0][ok].double(), ref[ok], rtol=1e-2 if out_dtype == torch.bfloat16 else 1e-5,
                               atol=1e-5)
    assert got[0][1].isnan().all() and not ok[1]
    got = _C.linear_current_forward(x, w, bias, out_dtype, E4, E5, 1, False, 0.0)
    c = ops.linear_current_casts(x, w, x_dtype=E4, w_dtype=E5, margin=1)
    y = ops.scaled_mm(c[0], c[4].t(), c[2], c[6], bias=bias, out_dtype=out_dtype, scale_granularity=k)
    _same(got, (y, c[0], c[2], c[4], c[6], c[7]))


class _Sub(torch.Tensor):
    """A torch.Tensor subclass (torch function only): not a plain tensor to the direct path."""


def test_a_tensor_subclass_input_goes_through_torch_ops():
    torch.manual_seed(2)
    lin = fp8mix.Linear(32, 24)
    x = torch.randn(8, 32)
    out = {}
    for name, inp in (("plain", x), ("subclass", x.as_subclass(_Sub))):
        inp = inp.detach().requires_grad_()
        with _Count() as seen:
            with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=4)):
                y = lin(inp)
            y.backward(torch.ones_like(y))
        out[name] = (torch.Tensor(y.detach()), torch.Tensor(inp.grad), seen.direct)
        lin.weight.grad = lin.bias.grad = None
    assert out["plain"][2] == ["linear_delayed_forward", "linear_backward"]
    assert out["subclass"][2] == []  # the separate ops, through torch.ops
    assert torch.isfinite(out["subclass"][0]).all()
    ref = torch.nn.functional.linear(x, lin.weight, lin.bias).detach()
    for y, _, _ in out.values():
        assert (y - ref).norm() / ref.norm() < 0.1
