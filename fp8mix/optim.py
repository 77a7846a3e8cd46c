"""AdamW with its moments stored in low precision (FP8 / bfloat16), as MS-AMP and COAT do.

Covers: ``fp8mix.optim.AdamW`` (decoupled weight decay, the same update as
``torch.optim.AdamW``), optional float32 master weights for bfloat16/float16 parameters,
the memory accounting ``AdamW.state_bytes()`` / ``bytes_per_param(opt)``, and
``FP8MasterWeights``: float32 master weights for FP8 weights (fp8mix.fp8_model_init)
around any torch optimizer.
Does not cover: amsgrad, maximize, capturable/fused/differentiable modes, Tensor
learning rates, sparse gradients, complex or float64 parameters.

Policy only: the arithmetic of a step is float32 torch ops, and every FP8 cast goes
through ``fp8mix.quantize`` / ``Float8Tensor.dequantize`` (the C kernels).

State formats (``exp_avg_dtype`` for the first moment m, ``exp_avg_sq_dtype`` for the
second moment v), bytes of optimizer state per parameter (the 4-byte ``step`` per
tensor aside; B = ``block_size``, default 128):

======================  ======================  ===========================================
format                  bytes per element       what it is
======================  ======================  ===========================================
``"fp32"``              4                       as torch.optim.AdamW
``"bf16"``              2                       round-to-nearest bfloat16 (8 mantissa bits)
``"e4m3"``              1 + 4/B                 E4M3 bytes, one float32 scale per block of B
``"e5m2"``              1 + 4/B                 E5M2 bytes, one float32 scale per block of B
``"e4m3_expand"`` (v)   1 + 8/B                 E4M3 of v**k per block (COAT), block max + k
======================  ======================  ===========================================

So the state costs 8 bytes/param for fp32/fp32 (torch's AdamW), 4 for bf16/bf16,
~3.03 for the default e4m3/bf16, ~2.06 for e4m3/e4m3 and ~2.09 for e4m3/e4m3_expand;
bfloat16/float16 parameters add 4 bytes for their float32 master copy. A tensor whose
size is not a multiple of B pays for the padding of its last block.

FP8 moments: the state is flattened, zero-padded to a multiple of B and viewed as
``(-1, B)``; each block is cast with ``fp8mix.quantize(..., granularity="row")``
(current scaling: scale = fp8_max / block amax, round to nearest even), so every block
uses the whole format range whatever its magnitude.

Dynamic range expansion (``"e4m3_expand"``, second moment only), from COAT: Xi et al.,
"COAT: Compressing Optimizer states and Activation for Memory-Efficient FP8 Training",
arXiv 2410.19313, section 4. v spans many decades inside one block (rarely-updated
weights sit next to busy ones), far more than E4M3's 2**15 between its largest and
smallest normal values, so plain per-block E4M3 flushes its small values to zero, and
a zero v with a non-zero m makes the step m/eps: huge. Per block, with vmax and vmin the
largest and smallest non-zero values and R = vmax / vmin::

    k = log(T) / log(R)          (k = 1 when R == 1 or the block is all zero)
    y = (v / vmax) ** k          in [1/T, 1] for non-zero v; stored as E4M3 of 448*y
    v = vmax * y ** (1/k)        on load

Then the block's non-zero values span exactly T after expansion. COAT quotes E4M3's range
with subnormals (T = 448 / 2**-9); we use the normal range T = 448 / 2**-6 = 28672, so
every non-zero value lands on a normal E4M3 number with all 3 mantissa bits: the relative
error of y is <= 2**-4, hence that of v is <= (1 + 2**-4)**(1/k) - 1 (6.25%/k to first
order) and nothing underflows. Measured on blocks spanning 1e-12..1e-2 the subnormal range
gave up to 70% error on the smallest values, the normal range at most 14%. k > 1 (a block
narrower than T) makes v *more* precise than plain E4M3; k < 1 trades precision for range.
The zeros of v (never-updated elements) stay exactly 0.

Which to use: the default e4m3/bf16 (MS-AMP's choice: FP8 first moment, 16-bit second
moment) cuts fp32's 8 bytes to ~3; e4m3/e4m3_expand (COAT) reaches ~2. Both end within
1% of torch's AdamW in our tests and benchmark; keep the second moment out of plain
e4m3 (flushes small values) and e5m2 (2 mantissa bits). bf16/bf16 (4 bytes) is the
closest to fp32. fp32/fp32 is torch's AdamW, for reference. FP8 states are for memory,
not speed: on CPU the extra casts make a step slower (benchmarks/bench_optim.py).

Rounding caveat: every format rounds to nearest, so a moment whose per-step change is
below half an ulp of its format does not change at all. With beta2 = 0.999, v*beta2 is
such a change for bf16 (a bfloat16 v of 1.0 stays 1.0 through any number of zero-gradient
steps) and for E4M3; v then only grows. A per-block FP8 scale carries a decay shared by
the whole block exactly (tested), not that of one element among busy neighbours. The
cost measured in tests is a fraction of a percent of final loss; with beta2 = 0.95 (the
demo's) bf16 decays fine. Stochastic rounding of the states is the known remedy (not
implemented: round-to-nearest keeps the step deterministic without an RNG in the state).
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Any

import torch

from .nn.fp8_weight import fp8_weight_of, write_fp8
from .quantization import quantize
from .tensor import Float8Tensor

__all__ = ["AdamW", "bytes_per_param", "FP8MasterWeights"]

EXP_AVG_DTYPES = ("fp32", "bf16", "e4m3", "e5m2")
EXP_AVG_SQ_DTYPES = ("fp32", "bf16", "e4m3", "e4m3_expand", "e5m2")
_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e4m3_expand": torch.float8_e4m3fn}
_EXPAND_RANGE = 448.0 / 2.0 ** -6  # T: largest / smallest normal E4M3 value (see the module docstring)
_BUCKET_NUMEL = 1 << 22  # parameters updated together: 4M elements, 16 MiB per float32 working copy


# ---- one moment in its storage format ---------------------------------------------------
# A moment of parameter p lives in state[name] (+ name_scale_inv, or name_amax and name_k
# for e4m3_expand). _load_moments gives float32 working copies shaped like the parameters,
# _store_moments writes them back. For "fp32" the working copy *is* the state (updated in
# place). FP8 moments are kept as (nblocks, B): p flattened, its last block zero-padded; the
# zeros stay zeros (0 scales to 0, and the update only touches the first numel elements).
# The FP8 moments of a bucket of parameters are decoded and encoded by one call on all their
# blocks stacked: the casts are per block, so the bytes are those of one call per tensor,
# without paying a call (and, for e4m3_expand, a dozen small torch ops) per tensor.

def _blocks(p: torch.Tensor, block_size: int) -> int:
    return max(1, -(-p.numel() // block_size))


def _init_moment(state: dict, name: str, fmt: str, p: torch.Tensor, block_size: int) -> None:
    if fmt in ("fp32", "bf16"):
        dtype = torch.float32 if fmt == "fp32" else torch.bfloat16
        state[name] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
        return
    nb = _blocks(p, block_size)
    state[name] = torch.zeros(nb, block_size, dtype=_FP8[fmt], device=p.device)
    if fmt == "e4m3_expand":
        state[name + "_amax"] = torch.zeros(nb, 1, dtype=torch.float32, device=p.device)
        state[name + "_k"] = torch.ones(nb, 1, dtype=torch.float32, device=p.device)
    else:
        state[name + "_scale_inv"] = torch.ones(nb, 1, dtype=torch.float32, device=p.device)


def _check_moment(state: dict, name: str, fmt: str, p: torch.Tensor, block_size: int) -> None:
    """The stored state must be what the group's options describe (they travel together in a
    state_dict; editing a group's dtype options mid-run would misread the bytes)."""
    t = state.get(name)
    if fmt in ("fp32", "bf16"):
        want = (torch.float32 if fmt == "fp32" else torch.bfloat16, tuple(p.shape))
    else:
        want = (_FP8[fmt], (_blocks(p, block_size), block_size))
    extra = {"e4m3_expand": ("_amax", "_k")}.get(fmt, ("_scale_inv",) if fmt in _FP8 else ())
    if t is None or (t.dtype, tuple(t.shape)) != want or any(name + e not in state for e in extra):
        got = "nothing" if t is None else f"{t.dtype} of shape {tuple(t.shape)}"
        raise RuntimeError(f"fp8mix.optim.AdamW: state {name!r} holds {got}, but the group's {name}_dtype="
                           f"{fmt!r} (block_size={block_size}) needs {want[0]} of shape {want[1]}; "
                           "the state and the group's dtype options must come from the same optimizer")


def _load_moments(states: list, params: list, name: str, fmt: str):
    """(xs, buf): xs the float32 working copies, shaped like the parameters; for FP8 formats
    buf is the (total blocks, B) buffer they are views of (its padding stays 0), else None."""
    if fmt == "fp32":
        return [st[name] for st in states], None
    if fmt == "bf16":
        return [st[name].float() for st in states], None
    data = torch.cat([st[name] for st in states])
    if fmt == "e4m3_expand":
        buf = _expand_dequantize(data, torch.cat([st[name + "_amax"] for st in states]),
                                 torch.cat([st[name + "_k"] for st in states]))
    else:
        sinv = torch.cat([st[name + "_scale_inv"] for st in states])
        buf = Float8Tensor(data, sinv, None, "row").dequantize(torch.float32)
    xs = []
    for block, p in zip(buf.split([st[name].shape[0] for st in states]), params):
        xs.append(block.view(-1)[: p.numel()].view(p.shape))  # views: updating xs updates buf
    return xs, buf


def _store_moments(states: list, name: str, fmt: str, xs: list, buf) -> None:
    """Write the working copies back: xs (fp32, bf16) or their buffer buf (FP8)."""
    if fmt == "fp32":
        return  # xs are the states themselves, already updated in place
    if fmt == "bf16":
        for st, x in zip(states, xs):
            st[name].copy_(x)  # round to nearest even
        return
    if fmt == "e4m3_expand":
        data, vmax, k = _expand_quantize(buf)
        parts = {"": data, "_amax": vmax, "_k": k}
    else:
        q = quantize(buf, fmt, granularity="row", rounding="nearest")
        parts = {"": q.data, "_scale_inv": q.scale_inv}
    sizes = [st[name].shape[0] for st in states]
    for suffix, t in parts.items():
        for st, piece in zip(states, t.split(sizes)):
            # in place, as torch's AdamW updates its state: a state_dict() held by the caller
            # stays consistent (its step and moments advance together)
            st[name + suffix].copy_(piece)


def _expand_quantize(v: torch.Tensor):
    """COAT's dynamic range expansion of a non-negative (nblocks, B) float32 tensor.
    Returns (E4M3 bytes of 448 * (v/vmax)**k, vmax, k), the last two (nblocks, 1)."""
    vmax = v.amax(dim=1, keepdim=True)
    vmin = torch.where(v > 0, v, torch.inf).amin(dim=1, keepdim=True)
    nonzero = vmax > 0
    # log(vmax) - log(vmin) rather than log(vmax / vmin): the ratio can overflow float32.
    log_r = torch.where(nonzero, torch.log(vmax) - torch.log(torch.where(nonzero, vmin, 1.0)), 0.0)
    k = torch.where(log_r > 0, math.log(_EXPAND_RANGE) / log_r, 1.0)
    # Normalise by vmax first: v**k itself could underflow float32 (v ~ 1e-30, k ~ 2).
    y = (v / torch.where(nonzero, vmax, 1.0)).pow_(k)  # 0 stays 0 (k > 0)
    q = quantize(y, "e4m3", 448.0, rounding="nearest")  # y in [0, 1] -> [0, 448]
    return q.data, vmax, k


def _expand_dequantize(data: torch.Tensor, vmax: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    y = Float8Tensor(data, torch.full((), 1.0 / 448.0, device=data.device), None, "tensor").dequantize()
    return y.pow_(1.0 / k).mul_(vmax)


def _buckets(params: list, limit: int = _BUCKET_NUMEL):
    """(lo, hi) ranges of consecutive parameters on one device with at most `limit`
    elements in all (a larger tensor is a bucket of its own). A step's float32 working
    memory (m, v, sqrt(v), bfloat16 parameters and gradients) is ~12-20 bytes per element
    of one bucket, not of the whole model."""
    lo, n = 0, 0
    for i, p in enumerate(params):
        if i > lo and (n + p.numel() > limit or p.device != params[lo].device):
            yield lo, i
            lo, n = i, 0
        n += p.numel()
    if lo < len(params):
        yield lo, len(params)


# ---- argument checks ------------------------------------------------------------------
def _check_options(g: dict) -> None:
    """Messages follow torch.optim.AdamW's where it has one."""
    lr, betas, eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
    if isinstance(lr, torch.Tensor) or not isinstance(lr, (int, float)):
        raise TypeError(f"fp8mix.optim.AdamW: lr must be a float, got {type(lr).__name__}")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 < eps:  # torch accepts 0; a quantized v can be exactly 0, so eps is the only floor
        raise ValueError(f"Invalid epsilon value: {eps} (must be > 0)")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)):
        raise TypeError(f"fp8mix.optim.AdamW: betas must be a pair of floats, got {betas!r}")
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b}")
    if not 0.0 <= wd:
        raise ValueError(f"Invalid weight_decay value: {wd}")
    for key, allowed in (("exp_avg_dtype", EXP_AVG_DTYPES), ("exp_avg_sq_dtype", EXP_AVG_SQ_DTYPES)):
        v = g[key]
        if not isinstance(v, str) or v.lower() not in allowed:
            raise ValueError(f"fp8mix.optim.AdamW: {key} must be one of {list(allowed)}, got {v!r}")
        g[key] = v.lower()
    bs = g["block_size"]
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise ValueError(f"fp8mix.optim.AdamW: block_size must be a positive int, got {bs!r}")
    if g["master_weights"] not in (None, True, False):
        raise ValueError(f"fp8mix.optim.AdamW: master_weights must be None, True or False, got {g['master_weights']!r}")


class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter) with low-precision optimizer states.

    The update is torch.optim.AdamW's, op for op: ``p *= 1 - lr*wd``;
    ``m = lerp(m, g, 1-beta1)``; ``v = beta2*v + (1-beta2)*g*g``;
    ``p -= lr/(1-beta1**t) * m / (sqrt(v)/sqrt(1-beta2**t) + eps)``, in float32, using the
    freshly updated m and v; they are rounded to their storage formats afterwards. With
    ``exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32"`` it gives torch.optim.AdamW's
    parameters (CPU: the same float32 ops in the same order).

    Args:
        params: parameters (float32, bfloat16 or float16) or parameter groups. Every
            keyword below may also be set per group, the dtype options included (e.g.
            fp32 moments for a group of small, sensitive tensors).
        lr, betas, eps, weight_decay: as torch.optim.AdamW (eps must be > 0).
        exp_avg_dtype: first moment storage: ``"fp32"``, ``"bf16"``, ``"e4m3"`` (default)
            or ``"e5m2"``.
        exp_avg_sq_dtype: second moment storage: ``"fp32"``, ``"bf16"`` (default),
            ``"e4m3"``, ``"e4m3_expand"`` (COAT's dynamic range expansion) or ``"e5m2"``.
        block_size: elements per FP8 scale (and per expansion exponent); default 128.
        master_weights: keep a float32 copy of each bfloat16/float16 parameter in the state,
            update it, and write its round-to-nearest value back to the parameter. ``None``
            (auto) and ``True``: for non-float32 parameters (a float32 parameter is its own
            master). ``False``: update a float32 copy of the parameter and round it back each
            step, so updates below half a bfloat16 ulp are lost.

    State per parameter (``self.state[p]``, all tensors, so ``state_dict()`` and
    ``load_state_dict()`` work): ``step`` (float32 scalar), ``exp_avg``, ``exp_avg_sq``
    in their formats; FP8 moments add ``<name>_scale_inv`` (nblocks, 1), e4m3_expand adds
    ``exp_avg_sq_amax`` and ``exp_avg_sq_k`` (nblocks, 1); ``master_param`` (float32) when
    kept. The module docstring has the formats, bytes per parameter and when to use which.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, exp_avg_dtype: str = "e4m3", exp_avg_sq_dtype: str = "bf16",
                 block_size: int = 128, master_weights: bool | None = None):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, exp_avg_dtype=exp_avg_dtype,
                        exp_avg_sq_dtype=exp_avg_sq_dtype, block_size=block_size, master_weights=master_weights)
        _check_options(defaults)  # the constructor's own arguments first, for a direct message
        if isinstance(defaults["betas"], list):
            defaults["betas"] = tuple(defaults["betas"])
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_options(group)
            for p in group["params"]:
                if p.is_complex():
                    raise TypeError("fp8mix.optim.AdamW does not support complex parameters; "
                                    "use torch.optim.AdamW or view them as real")
                if p.dtype not in _PARAM_DTYPES:
                    raise TypeError(f"fp8mix.optim.AdamW: parameters must be float32, bfloat16 or float16, "
                                    f"got {p.dtype}")
                if fp8_weight_of(p) is not None:
                    raise TypeError("fp8mix.optim.AdamW: an FP8 weight (fp8mix.fp8_model_init) cannot be updated in "
                                    "place; use fp8mix.optim.FP8MasterWeights(params, fp8mix.optim.AdamW, ...)")
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise

    # -- checkpointing ------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict) -> None:
        """As torch's, but every state tensor keeps the dtype it was saved with.

        The base class casts each floating-point state tensor to its parameter's dtype
        (right for torch's AdamW). Here that would turn FP8 bytes and bfloat16 moments into
        float32 (harmless but 4x the memory) and float32 master weights of a bfloat16
        parameter into bfloat16 (lossy): so the saved tensors are put back, copied to the
        parameter's device.
        """
        saved = {k: dict(v) for k, v in state_dict["state"].items()}
        saved_ids = list(chain.from_iterable(g["params"] for g in state_dict["param_groups"]))
        super().load_state_dict(state_dict)
        for k, p in zip(saved_ids, chain.from_iterable(g["params"] for g in self.param_groups)):
            for name, v in saved.get(k, {}).items():
                if isinstance(v, torch.Tensor) and name != "step":
                    self.state[p][name] = v.detach().to(device=p.device, copy=True)
        for g in self.param_groups:  # a state_dict from an older version may lack an option
            for name, default in self.defaults.items():
                g.setdefault(name, default)

    # -- the step -----------------------------------------------------------------------
    def _init_group(self, group: dict):
        """(params, states) of the group's parameters that have a gradient; creates the
        state on a parameter's first step."""
        params, states = [], []
        bs = group["block_size"]
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("fp8mix.optim.AdamW does not support sparse gradients, "
                                   "please consider SparseAdam instead")
            state = self.state[p]
            if len(state) == 0:
                # step on the CPU as in torch.optim.AdamW (capturable/fused off)
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                _init_moment(state, "exp_avg", group["exp_avg_dtype"], p, bs)
                _init_moment(state, "exp_avg_sq", group["exp_avg_sq_dtype"], p, bs)
                if p.dtype != torch.float32 and group["master_weights"] is not False:
                    state["master_param"] = p.detach().float().clone(memory_format=torch.preserve_format)
            else:
                _check_moment(state, "exp_avg", group["exp_avg_dtype"], p, bs)
                _check_moment(state, "exp_avg_sq", group["exp_avg_sq_dtype"], p, bs)
            params.append(p)
            states.append(state)
        return params, states

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter that has a gradient. Returns closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, states = self._init_group(group)
            for lo, hi in _buckets(params):
                self._update(group, params[lo:hi], states[lo:hi])
        return loss

    def _update(self, group: dict, params: list, states: list) -> None:
        """The update of one bucket of parameters (one device)."""
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        m_fmt, v_fmt = group["exp_avg_dtype"], group["exp_avg_sq_dtype"]

        # float32 working copies: the master (or the float32 parameter itself) and the moments
        p32 = [st["master_param"] if "master_param" in st else p if p.dtype == torch.float32 else p.float()
               for p, st in zip(params, states)]
        grads = [p.grad.float() for p in params]  # no copy for float32 gradients; never written to
        m, m_buf = _load_moments(states, params, "exp_avg", m_fmt)
        v, v_buf = _load_moments(states, params, "exp_avg_sq", v_fmt)
        steps = []
        for st in states:
            st["step"] += 1
            steps.append(st["step"].item())

        # torch.optim.AdamW's single-tensor update (the path it takes on CPU), as foreach ops
        if wd != 0:
            torch._foreach_mul_(p32, 1 - lr * wd)
        torch._foreach_lerp_(m, grads, 1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
        step_size = [-(lr / (1 - beta1 ** s)) for s in steps]
        bc2_sqrt = [(1 - beta2 ** s) ** 0.5 for s in steps]
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(p32, m, denom, step_size)

        _store_moments(states, "exp_avg", m_fmt, m, m_buf)
        _store_moments(states, "exp_avg_sq", v_fmt, v, v_buf)
        for p, w in zip(params, p32):
            if w is not p:
                p.copy_(w)  # round to the parameter's dtype (nearest even)

    @torch.no_grad()
    def moments(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(exp_avg, exp_avg_sq) of parameter `p` as the optimizer sees them: float32
        copies shaped like p, decoded from their storage formats (for inspection and tests)."""
        state = self.state.get(p)
        if not state:
            raise KeyError("fp8mix.optim.AdamW.moments: this parameter has no state (not in the optimizer, "
                           "or no step with a gradient yet)")
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        return tuple(_load_moments([state], [p], name, group[name + "_dtype"])[0][0].clone()
                     for name in ("exp_avg", "exp_avg_sq"))

    # -- memory ---------------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes held by the optimizer state: every tensor in ``self.state`` (moments,
        scales, expansion exponents, master weights, step counters)."""
        return sum(t.numel() * t.element_size() for st in self.state.values() for t in st.values()
                   if isinstance(t, torch.Tensor))


def bytes_per_param(opt: torch.optim.Optimizer) -> float:
    """Optimizer state bytes per parameter element: ``opt.state_bytes()`` (or, for any other
    torch optimizer, the bytes of the tensors in ``opt.state``) over the elements of all
    parameters in ``opt.param_groups``. State is created on the first step, so measure after it."""
    n = sum(p.numel() for p in {id(p): p for g in opt.param_groups for p in g["params"]}.values())
    if isinstance(opt, AdamW):
        total = opt.state_bytes()
    else:
        total = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                    if isinstance(t, torch.Tensor))
    return total / n if n else 0.0


# ---- float32 master weights for FP8 weights -----------------------------------------------
class FP8MasterWeights(torch.optim.Optimizer):
    """Train FP8 weights (fp8mix.fp8_model_init) with any torch optimizer on float32 masters.

    ``FP8MasterWeights(params, optimizer_class, **kwargs)`` (torch's
    ZeroRedundancyOptimizer's shape) builds ``optimizer_class(masters, **kwargs)`` where
    each FP8 weight is replaced by a float32 master holding its value (its high-precision
    initial value when fp8_model_init kept it, else the dequantised FP8 weight) and every
    other parameter is itself. ``step()`` hands each FP8 weight's gradient (as float32) to
    its master, runs the inner step, and writes every updated master back into its FP8
    weight by the weight's rule (current per-tensor scaling: fp8mix.nn.fp8_weight), the
    amaxes of FSDP2-sharded weights in one all-reduce, so that every shard of a weight has
    the same scale. The high-precision weight lives only here: the module holds 1 byte per
    element.

    ``param_groups`` hold the model's parameters (as any optimizer's), with the inner
    optimizer's hyperparameters: LR schedulers, gradient scalers (``unscale_`` reads the
    model's gradients) and gradient clipping work as usual; each step hands the groups'
    hyperparameters to the inner optimizer. ``state`` is the inner optimizer's (keyed by
    the masters); ``state_dict()`` is the inner one's plus ``"fp8_masters"`` (the masters,
    in parameter order): a resume is exact. DTensor parameters (FSDP2) get DTensor masters
    with the same placements. A closure (LBFGS's re-evaluations) is not supported: the
    masters would not see its gradients.
    """

    def __init__(self, params, optimizer_class=None, **optimizer_kwargs):
        if optimizer_class is None:
            optimizer_class = torch.optim.AdamW
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"FP8MasterWeights: optimizer_class must be a torch.optim.Optimizer subclass, got "
                            f"{optimizer_class!r}")
        super().__init__(params, {})  # the model's parameters, grouped as given
        self._pairs: list = []  # (FP8 weight Parameter, its float32 master)
        inner_groups = [{**g, "params": [self._master_of(p) for p in g["params"]]} for g in self.param_groups]
        self.inner = optimizer_class(inner_groups, **optimizer_kwargs)
        for g, ig in zip(self.param_groups, self.inner.param_groups):  # the inner defaults, where schedulers look
            g.update({k: v for k, v in ig.items() if k != "params"})
        self.defaults = self.inner.defaults
        self.state = self.inner.state

    @staticmethod
    def _new_master(p: Any) -> torch.Tensor:
        w = fp8_weight_of(p)
        assert w is not None
        hp = w.get_high_precision_init_val() if w is p else None
        local = hp.to(device=w.device, dtype=torch.float32, copy=True) if hp is not None \
            else w.dequantize(torch.float32)
        if w is p:
            return local
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())

    def _master_of(self, p: torch.Tensor) -> torch.Tensor:
        if fp8_weight_of(p) is None:
            return p
        m = self._new_master(p).detach().requires_grad_(p.requires_grad)
        self._pairs.append((p, m))
        return m

    def _sync_hyperparameters(self) -> None:
        for g, ig in zip(self.param_groups, self.inner.param_groups):
            ig.update({k: v for k, v in g.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure=None):
        """The inner step on the masters, then the FP8 weights written from them."""
        if closure is not None:
            raise NotImplementedError("FP8MasterWeights.step: a closure is not supported (its re-evaluated "
                                      "gradients would not reach the masters)")
        self._sync_hyperparameters()
        stepped = []
        for p, m in self._pairs:
            if p.grad is None:
                m.grad = None
                continue
            m.grad = p.grad if p.grad.dtype == torch.float32 else p.grad.float()
            stepped.append((p, m))
        self.inner.step()
        if stepped:
            write_fp8([p for p, _ in stepped], [m for _, m in stepped])
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)  # the model's parameters
        for _, m in self._pairs:
            m.grad = None

    def state_dict(self) -> dict:
        self._sync_hyperparameters()
        sd = self.inner.state_dict()
        sd["fp8_masters"] = [m.detach() for _, m in self._pairs]
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """The inner optimizer's state, its hyperparameters and the masters (the FP8 weights
        are the model's checkpoint; they equal the masters cast, as after every step)."""
        sd = dict(state_dict)
        masters = sd.pop("fp8_masters", None)
        if masters is None or len(masters) != len(self._pairs):
            raise ValueError(f"FP8MasterWeights.load_state_dict: expected {len(self._pairs)} masters under "
                             f"'fp8_masters', got {None if masters is None else len(masters)}")
        with torch.no_grad():
            for (_, m), saved in zip(self._pairs, masters):
                m.copy_(saved)
        self.inner.load_state_dict(sd)
        self.state = self.inner.state
        for g, ig in zip(self.param_groups, self.inner.param_groups):
            g.update({k: v for k, v in ig.items() if k != "params"})

    def masters(self) -> list:
        """(FP8 weight, float32 master) pairs, in parameter order."""
        return list(self._pairs)
