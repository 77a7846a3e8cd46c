"""The per-tensor recipes' ops on a device against the C core: the cases of the
self-check (fp8mix.cuda.selfcheck) and of tests/test_cuda.py.

Each builder runs one op (or a short training-like chain of them) twice from the same
state, on `dev` and on the CPU, and appends ``(name, got, want)`` comparisons to `out`
(got on the device, fetched later in one copy; want on the CPU): the op's outputs and,
after it, every state tensor (amax history, scale, steps, pending ring, next slot), all
bit for bit.  Covered: delayed_cast (a role's first use from its own amax or a fresh
amax, record on/off, transpose, interval / algo / margin / power-of-two scales),
delayed_record and rescale (non-finite and zero amaxes), delayed_flush (ring order,
wrap-around, a corrupted head, record / reserve), grad_cast (a delayed plan, a fresh plan,
no plan; the pending max with an empty, smaller or larger slot; column sums; transpose;
margin / epsilon), and the tensor-held stochastic-rounding streams (``rng`` [key,
offset] + ``rng_skip``) of cast, quantize_current, delayed_cast and grad_cast.
With the CPU as `dev` the two halves run on the CPU (how CPU tests dry-run the cases).
The ops are fp8mix.ops' typed wrappers, looked up in this module's ``ops`` attribute.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import ops

__all__ = ["Spec", "SPECS", "Twin", "make_state", "values", "delayed_cast_case", "record_case", "flush_case",
           "grad_cast_case", "chain_case", "rng_cast_case", "ROLES", "SLOTS"]

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
ROLES, SLOTS, CAPACITY = 3, 4, 16


@dataclasses.dataclass(frozen=True)
class Spec(ops.DelayedSpec):
    """ops.DelayedSpec with a default history length, named as the cases name it."""

    history_len: int = 4

    def __str__(self) -> str:
        return (f"L={self.history_len} margin={self.margin} pow2={self.power_2_scale} {self.algo} "
                f"interval={self.interval}")


SPECS = (Spec(), Spec(history_len=16, margin=2, power_2_scale=True, algo="most_recent", interval=3),
         Spec(history_len=1, margin=1, interval=2))


def values(shape, dtype, seed: int, *, specials: bool = True) -> torch.Tensor:
    """Wide-range values (magnitudes 2^-20 .. 2^20), with inf, NaN and zeros in front."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape, generator=g).float())
    f = x.view(-1)
    if specials and f.numel() >= 6:
        f[:6] = torch.tensor([float("inf"), -float("nan"), 0.0, -0.0, 1e-30, -7e4])
    return x.to(dtype)


def make_state(seed: int, *, fresh_roles=(), filled=(1, 2), head: int = 1) -> dict:
    """A module's delayed-scaling state: (CAPACITY, ROLES) history with some zeros, scales,
    steps (0 for fresh_roles, whose history is empty and scale 1, as a new module's), a
    pending ring of SLOTS with `filled` slots and the next slot `head`."""
    g = torch.Generator().manual_seed(seed)
    hist = torch.rand(CAPACITY, ROLES, generator=g) * torch.exp2(torch.randint(-6, 6, (CAPACITY, ROLES), generator=g))
    hist[torch.rand(CAPACITY, ROLES, generator=g) < 0.2] = 0.0
    scale = torch.rand(ROLES, generator=g) * 100 + 0.01
    steps = torch.randint(1, 9, (ROLES,), generator=g)
    for r in fresh_roles:
        hist[:, r], scale[r], steps[r] = 0.0, 1.0, 0
    pending = torch.full((SLOTS,), -1.0)
    for k in filled:
        pending[k] = float(torch.rand(1, generator=g)) * 50
    return {"history": hist, "scale": scale, "steps": steps, "pending": pending,
            "next_slot": torch.tensor(head, dtype=torch.int64)}


class Twin:
    """One state on the CPU and a copy on the device, compared after each op."""

    def __init__(self, dev: torch.device, state: dict):
        self.cpu = {k: v.clone() for k, v in state.items()}
        self.dev = {k: v.to(dev) for k, v in state.items()}

    def state3(self, side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = self.cpu if side == "cpu" else self.dev
        return d["history"], d["scale"], d["steps"]

    def check(self, out: list, name: str) -> None:
        for k in self.cpu:
            out.append((f"{name} state {k}", self.dev[k].clone(), self.cpu[k].clone()))


def _to(t, dev):
    return None if t is None else t.to(dev)


def _rng(seed: int, offset: int):
    return torch.tensor([0x1234_5678_9ABC_DEF + seed, offset], dtype=torch.int64)


def delayed_cast_case(dev, out: list, *, shape=(64, 256), dtype=torch.bfloat16, fmt=E4, spec=Spec(), role: int = 0,
                      record: bool = True, transpose: bool = True, first_use: bool = False, fresh: bool = False,
                      sr: bool = False, seed: int = 0) -> None:
    """delayed_cast of one role; first_use: steps 0 (the scale from the tensor, or from
    fresh_amax when `fresh`)."""
    tw = Twin(dev, make_state(seed, fresh_roles=(role,) if first_use else ()))
    x = values(shape, dtype, seed)
    fa = torch.tensor(3.5) if fresh else None
    rng, skip = (_rng(seed, 4 * seed + 1), 8) if sr else (None, 0)
    kw: dict[str, Any] = dict(role=role, fp8_dtype=fmt, spec=spec, record=record, transpose=transpose,
                              inf_to_nan=True, rng_skip=skip)
    want = ops.delayed_cast(x, *tw.state3("cpu"), fresh_amax=fa, rng=rng, **kw)
    got = ops.delayed_cast(x.to(dev), *tw.state3("dev"), fresh_amax=_to(fa, dev), rng=_to(rng, dev), **kw)
    name = (f"delayed_cast[{fmt} {dtype} {tuple(shape)} {spec} record={record} transpose={transpose} "
            f"first_use={first_use} fresh={fresh} sr={sr}]")
    out += [(name + " q", got[0], want[0]), (name + " scales", got[2], want[2]), (name + " amax", got[3], want[3])]
    if transpose:
        out.append((name + " qt", got[1], want[1]))
    tw.check(out, name)


def record_case(dev, out: list, *, spec=Spec(), fmt=E5, first_use: bool = False, seed: int = 0) -> None:
    """delayed_record of amaxes finite, 0, NaN, inf and tiny, then a rescale."""
    tw = Twin(dev, make_state(seed, fresh_roles=(1,) if first_use else ()))
    name = f"delayed_record[{fmt} {spec} first_use={first_use}]"
    for i, a in enumerate((3.0, 0.0, float("nan"), float("inf"), 1e-40, 250.0)):
        am = torch.tensor(a)
        for side, d in (("cpu", "cpu"), ("dev", dev)):
            ops.delayed_record(*tw.state3(side), am.to(d), role=1, fp8_dtype=fmt, spec=spec)
        tw.check(out, f"{name} #{i} amax={a}")
    for side in ("cpu", "dev"):
        ops.delayed_rescale(*tw.state3(side), role=1, fp8_dtype=E4, spec=spec)
    tw.check(out, f"{name} rescale_only")


def flush_case(dev, out: list, *, spec=Spec(), filled=(1, 2), head: int = 1, record: bool = True,
               reserve: bool = True, first_use: bool = False, seed: int = 0) -> None:
    """delayed_flush of the grad_output role (2): ring order from `head` (wrapping; a head
    outside the ring restarts at 0), the plan and the reserved slot."""
    tw = Twin(dev, make_state(seed, fresh_roles=(2,) if first_use else (), filled=filled, head=head))
    kw: dict[str, Any] = dict(role=2, fp8_dtype=E5, spec=spec, record=record, reserve=reserve)
    want = ops.delayed_flush(*tw.state3("cpu"), tw.cpu["pending"], tw.cpu["next_slot"], **kw)
    got = ops.delayed_flush(*tw.state3("dev"), tw.dev["pending"], tw.dev["next_slot"], **kw)
    name = f"delayed_flush[{spec} filled={tuple(filled)} head={head} record={record} reserve={reserve}]"
    out += [(name + " plan", got[0], want[0]), (name + " slot", got[1], want[1])]
    tw.check(out, name)


def grad_cast_case(dev, out: list, *, shape=(64, 256), dtype=torch.bfloat16, fmt=E5, plan: str = "delayed",
                   slot: int | None = 1, slot_value: float = -1.0, colsum: bool = True, transpose: bool = True,
                   margin: int = 0, pow2: bool = False, eps: float = 0.0, sr: bool = False, seed: int = 0) -> None:
    """grad_cast with plan "delayed" ([scale, 0]), "fresh" ([scale, 1]: current scaling) or
    "none"; slot: the pending slot (None: no pending), holding slot_value first."""
    tw = Twin(dev, make_state(seed, filled=()))
    if slot is not None:
        for d in (tw.cpu, tw.dev):
            d["pending"][slot] = slot_value
    dy = values(shape, dtype, seed + 100)
    pl = {"delayed": torch.tensor([0.75, 0.0]), "fresh": torch.tensor([0.75, 1.0]), "none": None}[plan]
    sl = None if slot is None else torch.tensor(slot, dtype=torch.int64)
    rng, skip = (_rng(seed, 3), 5) if sr else (None, 0)
    kw: dict[str, Any] = dict(margin=margin, power_2_scale=pow2, amax_epsilon=eps, transpose=transpose,
                              colsum=colsum, inf_to_nan=True, rng_skip=skip)
    want = ops.grad_cast(dy, fmt, plan=pl, pending=tw.cpu["pending"] if slot is not None else None, slot=sl, rng=rng,
                         **kw)
    got = ops.grad_cast(dy.to(dev), fmt, plan=_to(pl, dev), pending=tw.dev["pending"] if slot is not None else None,
                        slot=_to(sl, dev), rng=_to(rng, dev), **kw)
    name = (f"grad_cast[{fmt} {dtype} {tuple(shape)} plan={plan} slot={slot} holding {slot_value} colsum={colsum} "
            f"transpose={transpose} margin={margin} pow2={pow2} eps={eps} sr={sr}]")
    out += [(name + " q", got[0], want[0]), (name + " scale_inv", got[2], want[2]), (name + " amax", got[3], want[3])]
    if transpose:
        out.append((name + " qt", got[1], want[1]))
    if colsum:
        out.append((name + " colsum", got[4], want[4]))
    tw.check(out, name)


def chain_case(dev, out: list, *, steps: int = 3, spec=Spec(history_len=3, interval=2), dtype=torch.float32,
               sr: bool = False, backwards=(1, 2, 0), seed: int = 0) -> None:
    """A Linear's delayed-scaling steps from a fresh state: per step flush (records the
    pending grad amaxes, reserves a slot), x and W cast and recorded (first use at step 0),
    then `backwards[step]` grad casts into the reserved slot (0: none, 2: their max)."""
    tw = Twin(dev, make_state(seed, fresh_roles=(0, 1, 2), filled=(), head=0))
    w = values((96, 64), dtype, seed + 1, specials=False)
    for step in range(steps):
        x, dy = values((48, 64), dtype, seed + 10 * step), values((48, 96), dtype, seed + 10 * step + 5)
        rng = _rng(seed, 1000 * step) if sr else None
        name = f"chain[{spec} sr={sr}] step {step}"
        res = {}
        for side, d in (("cpu", "cpu"), ("dev", dev)):
            st, rr = tw.state3(side), _to(rng, d)
            pend, nxt = (tw.cpu if side == "cpu" else tw.dev)["pending"], (tw.cpu if side == "cpu" else tw.dev)[
                "next_slot"]
            plan, slot = ops.delayed_flush(*st, pend, nxt, role=2, fp8_dtype=E5, spec=spec, record=True, reserve=True)
            cast: dict[str, Any] = dict(fp8_dtype=E4, spec=spec, record=True, transpose=True, inf_to_nan=True, rng=rr)
            xq = ops.delayed_cast(x.to(d), *st, role=0, rng_skip=0, **cast)
            wq = ops.delayed_cast(w.to(d), *st, role=1, rng_skip=x.numel(), **cast)
            gs = [ops.grad_cast((dy * (1 + b)).to(d), E5, plan=plan, pending=pend, slot=slot, margin=spec.margin,
                                power_2_scale=spec.power_2_scale, transpose=True, colsum=True, inf_to_nan=True, rng=rr,
                                rng_skip=x.numel() + w.numel()) for b in range(backwards[step % len(backwards)])]
            res[side] = (plan, slot, xq, wq, gs)
        for part, g, c in zip(("plan", "slot"), res["dev"][:2], res["cpu"][:2]):
            out.append((f"{name} flush {part}", g, c))
        for tag, g, c in (("x", res["dev"][2], res["cpu"][2]), ("W", res["dev"][3], res["cpu"][3])):
            out += [(f"{name} {tag} {k}", gi, ci) for k, gi, ci in zip(("q", "qt", "scales", "amax"), g, c)]
        for b, (g, c) in enumerate(zip(res["dev"][4], res["cpu"][4])):
            out += [(f"{name} backward {b} {k}", gi, ci) for k, gi, ci in zip(("q", "qt", "scale_inv", "amax",
                                                                                 "colsum"), g, c)]
        tw.check(out, name)


def rng_cast_case(dev, out: list, *, op: str = "cast", gran: int = 0, shape=(37, 203), dtype=torch.float16,
                  fmt=E4, offset: int = 6, skip: int = 3, transpose: bool = False, seed: int = 0) -> None:
    """cast / quantize_current with a tensor-held stream: [key, offset] on the device,
    words from offset + skip on (the plain seed / offset arguments are then ignored)."""
    x = values(shape, dtype, seed)
    rng = torch.tensor([-(2 ** 62) + seed, offset], dtype=torch.int64)
    rows = x.numel() // shape[-1]
    n = {0: 1, 1: rows, 2: rows * -(-shape[-1] // 128), 3: -(-rows // 128) * -(-shape[-1] // 128)}[gran]
    kw: dict[str, Any] = dict(granularity=gran, saturate=True, stochastic=False, seed=99, offset=12, want_q=True,
                              transpose=transpose, inf_to_nan=True, rng_skip=skip)
    if op == "cast":
        s = torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 4 + 0.05 if gran else torch.tensor(1.7)
        want = ops.cast(x, s, fmt, rng=rng, **kw)
        got = ops.cast(x.to(dev), s.to(dev), fmt, rng=rng.to(dev), **kw)
        parts: tuple[str, ...] = ("q", "qt", "amax")
    else:
        kw.update(margin=1, power_2_scale=False, amax_epsilon=0.0)
        want = ops.quantize_current(x, fmt, rng=rng, **kw)
        got = ops.quantize_current(x.to(dev), fmt, rng=rng.to(dev), **kw)
        parts = ("q", "qt", "scale_inv", "amax")
    name = f"{op}[rng offset={offset} skip={skip} gran={gran} {fmt} {dtype} {tuple(shape)} transpose={transpose}]"
    out += [(f"{name} {k}", g, c) for k, g, c in zip(parts, got, want) if k != "qt" or transpose]
