"""Hostile-input cases for every public fp8mix op and module, and the worker that
runs them: the shared part (expectations, the case registry, helpers).

The cases live in tests/hostile/cases_*.py, one file per module of fp8mix;
tests/hostile/worker.py runs them in a subprocess for tests/test_hostile.py.

Each case is a function that makes one call with a hostile argument, and an
expectation:

* ``Raises(types, pattern)``: a Python exception of one of `types` whose message
  matches `pattern` (a case-insensitive regex that names the problem: the
  argument, the dtype, the device...);
* ``Valid()``: the call returns; a valid but unusual input (a transposed,
  strided, stride-0 or overlapping view, an empty or 0-d tensor) must give what
  the plain contiguous input gives, which the case function asserts itself;
* ``MetaOrRaises(types, pattern)``: meta-device inputs: either a result on the
  meta device (shape inference through the fake kernels) or a clean exception.

Never acceptable: a signal (segfault, abort), a hang, or an exception of the
wrong type / with a message that does not say what is wrong.

Run as a script: ``python tests/hostile/worker.py NAME...`` runs the named cases
(all when none are named) and prints one JSON line per case:
``{"start": name}`` before it runs, then
``{"name": ..., "ok": bool, "detail": str}``. The address space is capped
(RLIMIT_AS: what torch maps after import + 3 GiB) so that huge allocations fail
fast and cleanly instead of swapping the machine.
"""
from __future__ import annotations

import re

__all__ = [
    'ALLOC', 'DEVICE', 'HP', 'MetaOrRaises', 'Raises', 'SCALE', 'Valid', '_R', '_devices', '_f', '_short', '_t',
    '_views', 'add', 'case', 'f8_equal', 'mm', 'x_',
]

# ---- expectations ------------------------------------------------------------------


class Raises:
    def __init__(self, types, pattern: str):
        self.types = types if isinstance(types, tuple) else (types,)
        self.pattern = pattern

    def judge(self, result, exc):
        want = "/".join(t.__name__ for t in self.types)
        if exc is None:
            return False, f"returned {_short(result)}; expected {want} matching /{self.pattern}/"
        msg = str(exc)
        if not isinstance(exc, self.types):
            return False, f"raised {type(exc).__name__}: {msg[:300]!r}; expected {want} matching /{self.pattern}/"
        if not re.search(self.pattern, msg, re.IGNORECASE | re.DOTALL):
            return False, f"{type(exc).__name__} message {msg[:300]!r} does not match /{self.pattern}/"
        return True, f"{type(exc).__name__}: {msg[:160]}"


class Valid:
    def judge(self, result, exc):
        if exc is not None:
            return False, f"valid input raised {type(exc).__name__}: {str(exc)[:300]!r}"
        return True, "ok"


class MetaOrRaises(Raises):
    def judge(self, result, exc):
        if exc is None:
            devs = _devices(result)
            if devs and all(d == "meta" for d in devs):
                return True, "meta result"
            return False, f"returned a result on {sorted(devs)} for meta input (uninitialised data?)"
        return super().judge(result, exc)


def _short(r):
    s = repr(r)
    return s if len(s) < 120 else s[:117] + "..."


def _devices(r):
    import torch

    from fp8mix import Float8Tensor
    if isinstance(r, torch.Tensor):
        return {r.device.type}
    if isinstance(r, Float8Tensor):
        return {r.data.device.type, r.scale_inv.device.type}
    if isinstance(r, (tuple, list)):
        out = set()
        for x in r:
            out |= _devices(x)
        return out
    return set()


# ---- helpers -------------------------------------------------------------------------

CASES: dict = {}


def case(expect, name=None):
    def deco(fn):
        CASES[name or fn.__name__] = (fn, expect)
        return fn
    return deco


def add(name, fn, expect):
    CASES[name] = (fn, expect)


def _t():
    import torch
    return torch


def _f():
    import fp8mix
    return fp8mix


def x_(*shape, dtype=None, seed=0):
    torch = _t()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    return x if dtype is None else x.to(dtype)


def f8_equal(a, b, what=""):
    """Two Float8Tensors hold the same bytes, scale_inv and amax (NaN-aware)."""
    torch = _t()
    assert a.data.dtype == b.data.dtype, f"{what}: dtype {a.data.dtype} vs {b.data.dtype}"
    assert a.data.shape == b.data.shape, f"{what}: shape {tuple(a.data.shape)} vs {tuple(b.data.shape)}"
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)), f"{what}: FP8 bytes differ"
    assert a.scale_inv.shape == b.scale_inv.shape, f"{what}: scale_inv shape"
    assert torch.equal(a.scale_inv, b.scale_inv), f"{what}: scale_inv differs"
    if a.amax is not None or b.amax is not None:
        assert torch.allclose(a.amax, b.amax, equal_nan=True, rtol=0, atol=0), f"{what}: amax differs"


# Message patterns
HP = r"float32, bfloat16 or float16"
SCALE = r"scale.*(finite|> ?0|positive)"
DEVICE = r"meta|device"
ALLOC = r"alloc|memory|overflow"


def _views(dtype=None):
    """Non-contiguous views (made in `dtype` itself: .to() would copy them into a
    contiguous tensor)."""
    torch = _t()
    dtype = dtype or torch.float32
    base = x_(40, 300, seed=3, dtype=dtype)
    return {
        "transposed": base[:, :24].t(),                                  # (24, 40), strides (1, 300)
        "step_slice": base[::3, ::2],                                    # (14, 150), inner stride 2
        "row_slice": base[5:25, 7:207],                                  # inner stride 1, ld 300
        "stride0_rows": base[3:4, :].expand(9, 300),                     # stride (0, 1)
        "stride0_all": torch.tensor(1.5, dtype=dtype).expand(5, 131),    # stride (0, 0)
        "overlap": torch.as_strided(base, (50, 130), (3, 1)),            # rows overlap
        "permute3d": x_(6, 5, 140, seed=4, dtype=dtype).permute(1, 0, 2),  # 3-D, inner stride 1
        "inner_stride3": torch.as_strided(base, (7, 90), (301, 3)),
    }



def _R(name):
    return getattr(_f().recipe, name)


def mm(*args, **kw):
    return _f().scaled_mm(*args, **kw)
