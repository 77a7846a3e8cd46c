"""Tensor parallelism of an nn.Linear-shaped fp8mix module whose weight is a DTensor
(torch.distributed.tensor.parallel's ColwiseParallel / RowwiseParallel, or fp8mix.Linear's
Transformer Engine arguments, which apply them): the FP8 GEMMs run on the local shards.

    column  weight Shard(0) (out_features split), bias Shard(0); x Replicate (its gradient
            a Partial sum); y = x W_r^T + b_r, Shard(-1)
    row     weight Shard(1) (in_features split), bias Replicate; x Shard(-1); y = sum over
            ranks of x_r W_r^T (Partial), + b once; the style's output layout all-reduces it
            (Replicate) or reduce-scatters it (Shard(seq): sequence parallel)

Every amax of the layer is MAX all-reduced over the tensor-parallel group (fp8mix.nn._forward's
amax_groups): the weight's (always sharded), the input's (sharded in row mode), the
grad-output's (sharded in column mode); a replicated tensor's all-reduce changes nothing.
So every rank casts with the scales the unsharded layer uses, and each rank's FP8 bytes are
the unsharded layer's bytes of its shard. What the sum over ranks adds: the row mode's
output and the column mode's input gradient are sums of per-rank FP32 partial products, in
another order than one GEMM's (rounding-level differences, no FP8 effect).

Before the GEMMs each forward checks (one all-gather of 8 bytes per rank over the group,
read back to the host: on a GPU a synchronisation per layer) that every rank runs the same
FP8 recipe and mode: a rank out of step raises a ValueError naming the module on every
rank instead of pairing collectives wrongly (a hang, or scales that silently differ). A
module's ``fp8_tp_check = False`` skips it.

Not here: the styles themselves (torch's, and fp8mix.distributed.tensor_parallel's FP8
names), meshes of more than one dimension in the forward (under FSDP2 x TP the forward sees
the weight FSDP2 all-gathered: a DTensor on the TP mesh), FP8 weights (fp8_model_init /
FSDP2 FP8 all-gather) under TP, the fused norm modules (LayerNormLinear, LayerNormMLP).
"""
from __future__ import annotations

import re
import zlib

import torch

from ..context import current_frame
from ..formats import Granularity
from ..recipe import ROLES

__all__ = ["is_dtensor", "tp_linear_forward", "check_divides", "recipe_fingerprint", "local_fp8_state", "te_parallel",
           "te_parallel_norm", "norm_linear_tp_forward"]


def is_dtensor(t) -> bool:
    # (a class-name test first: importing torch.distributed.tensor costs, and most weights are plain)
    return type(t).__name__ == "DTensor" and isinstance(t, _dtensor_types()[0])


def _dtensor_types():
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    return DTensor, Partial, Replicate, Shard


def _label(m) -> str:
    name = getattr(m, "_fp8_name", None)
    return f"fp8mix.{type(m).__name__}" + (f" {name!r}" if name else "")


def check_divides(m, *, mode: str, tp: int, in_features: int, out_features: int) -> None:
    """A ValueError naming the module when `tp` does not divide the features its mode splits."""
    feature, n = ("out_features", out_features) if mode == "column" else ("in_features", in_features)
    if n % tp:
        raise ValueError(f"{_label(m)}: tensor-parallel size {tp} does not divide its {feature} ({n}); "
                         f"{mode}-parallel splits {feature} evenly over the ranks (in_features={in_features}, "
                         f"out_features={out_features})")


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _recipe_in_force(m):
    """The recipe this module's forward runs now, or None (FP8 off for it)."""
    frame = current_frame()
    if frame is None or not (frame.enabled or frame.calibrating) or not m.fp8_enabled:
        return None
    return m.fp8_recipe if m.fp8_recipe is not None else frame.recipe


def _check_per_tensor(m, recipe) -> None:
    """Only per-tensor scales are one value over the shards: a row's or a block's scale of a
    sharded tensor belongs to one rank's part (its MAX over the ranks would mix rows)."""
    if recipe is None or not hasattr(recipe, "granularity"):  # (NVFP4: fp8mix.nn._forward refuses it under TP)
        return
    if not recipe.along_reduction() and all(recipe.granularity(r) == Granularity.TENSOR for r in ROLES):
        return
    raise NotImplementedError(f"{_label(m)}: {type(recipe).__name__} under tensor parallelism is not implemented "
                              "(its scales are per row or block of a sharded tensor); use DelayedScaling or "
                              "CurrentScaling (per-tensor scales) with tensor parallel layers")


def recipe_fingerprint(m, is_first_microbatch) -> tuple:
    """(int, text): what must agree across the tensor-parallel ranks for their collectives to
    pair: FP8 on or off, the recipe (its fields; a callable by its name), recording or not,
    is_first_microbatch."""
    frame = current_frame()
    recipe = _recipe_in_force(m)
    if recipe is None or frame is None:
        text = "fp8 off"
    else:
        record = (torch.is_grad_enabled() and m.training) or frame.calibrating
        text = (f"{_ADDRESS.sub('', repr(recipe))}, enabled={frame.enabled}, calibrating={frame.calibrating}, "
                f"training={record}, is_first_microbatch={is_first_microbatch}")
    return zlib.crc32(text.encode()), text


def _check_same_recipe(m, group, is_first_microbatch, device) -> None:
    code, text = recipe_fingerprint(m, is_first_microbatch)
    n = torch.distributed.get_world_size(group)
    mine = torch.tensor([code], dtype=torch.int64, device=device)  # (on the mesh's device: NCCL moves CUDA tensors)
    every = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(n)]
    torch.distributed.all_gather(every, mine, group=group)
    codes = [int(c) for c in every]
    if len(set(codes)) > 1:
        me = torch.distributed.get_rank(group)
        others = [r for r, c in enumerate(codes) if c != code]
        raise ValueError(f"{_label(m)}: the ranks of its tensor-parallel group run different FP8 settings: this "
                         f"rank ({me} in the group) has {text}; ranks {others} differ. Every rank of a tensor-"
                         "parallel group must enter fp8_autocast with the same recipe (and the same "
                         "is_first_microbatch, train/eval mode)")


def check_group_recipe(m, recipe, group, device) -> None:
    """Once per module and recipe (the first training forward under fp8_autocast's group):
    the ranks of the group whose amaxes are all-reduced run the same recipe, else a
    ValueError naming the module on every rank (a difference would pair mismatched
    collectives: a hang until the timeout). One 8-byte all-gather, then nothing."""
    done = m.__dict__.get("_fp8_group_checked")
    if done is not None and done[0] is recipe and done[1] is group:  # (recipes are frozen values)
        return
    text = _ADDRESS.sub("", repr(recipe))
    code = zlib.crc32(text.encode())
    n = torch.distributed.get_world_size(group)
    mine = torch.tensor([code], dtype=torch.int64, device=device)
    every = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(n)]
    torch.distributed.all_gather(every, mine, group=group)
    codes = [int(c) for c in every]
    if len(set(codes)) > 1:
        me = torch.distributed.get_rank(group)
        others = [r for r, c in enumerate(codes) if c != code]
        raise ValueError(f"{_label(m)}: the ranks of its fp8_autocast group run different FP8 recipes: this rank "
                         f"({me} in the group) has {text}; ranks {others} differ. Every rank must enter "
                         "fp8_autocast with the same recipe (amaxes are all-reduced over the group)")
    m.__dict__["_fp8_group_checked"] = (recipe, group)


def local_fp8_state(m) -> None:
    """Make the module's FP8 state buffers plain tensors again: torch's distribute_module
    (under every parallel style) turns the buffers a style leaves alone into Replicate
    DTensors, and the FP8 state is each rank's own, kept equal by the amax all-reduces."""
    for k, v in list(m._buffers.items()):
        if k.startswith("fp8_") and is_dtensor(v):
            m._buffers[k] = v.to_local()


def _mode(m, weight) -> str:
    _, _, _, Shard = _dtensor_types()
    if weight.device_mesh.ndim != 1 or len(weight.placements) != 1:
        raise NotImplementedError(f"{_label(m)}: its weight is a DTensor on a {weight.device_mesh.ndim}-D mesh "
                                  f"{tuple(weight.placements)}; fp8mix computes on a tensor-parallel weight of a "
                                  "1-D mesh (apply FSDP2's fully_shard on the other mesh dimension: its forward "
                                  "then sees the TP-mesh weight)")
    (p,) = weight.placements
    if isinstance(p, Shard) and p.dim in (0, -2):
        return "column"
    if isinstance(p, Shard) and p.dim in (1, -1):
        return "row"
    raise NotImplementedError(f"{_label(m)}: a DTensor weight placed {p} is not tensor parallel as fp8mix runs "
                              "it (ColwiseParallel: Shard(0); RowwiseParallel: Shard(1))")


def tp_linear_forward(m, x, weight, bias, *, in_features: int, out_features: int, is_first_microbatch,
                      local_forward):
    """y = x W^T + b of a column- or row-parallel module (the module docstring's layouts),
    computed as local_forward(x_local, w_local, b_local or None, in_local, out_local, tp_group)
    on the shards; returns a DTensor (column: Shard(-1); row: Partial plus the bias)."""
    DTensor, Partial, Replicate, Shard = _dtensor_types()
    mesh = weight.device_mesh
    mode = _mode(m, weight)
    tp = mesh.size()
    check_divides(m, mode=mode, tp=tp, in_features=in_features, out_features=out_features)
    group = mesh.get_group()
    if is_dtensor(m._buffers.get("fp8_scale")):  # (once, after the style was applied)
        local_fp8_state(m)
    if getattr(m, "fp8_tp_check", True):
        _check_same_recipe(m, group, is_first_microbatch, weight.to_local().device)
    _check_per_tensor(m, _recipe_in_force(m))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_label(m)}: input must be a tensor, got {type(x).__name__}")
    want = [Replicate()] if mode == "column" else [Shard(x.dim() - 1)]
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, want, run_check=False)
    elif x.device_mesh != mesh:
        raise ValueError(f"{_label(m)}: its input is a DTensor on mesh {x.device_mesh}, its weight on {mesh}")
    if tuple(x.placements) != tuple(want):
        x = x.redistribute(mesh, want)
    # column: each rank's dx is its shard's part of the sum (Partial); row: its own slice
    x_local = x.to_local(grad_placements=[Partial()] if mode == "column" else None)
    w_local = weight.to_local()
    if type(w_local) not in (torch.Tensor, torch.nn.Parameter):
        raise NotImplementedError(f"{_label(m)}: its tensor-parallel weight holds a {type(w_local).__name__}; FP8 "
                                  "weights (fp8_model_init, FSDP2 FP8 all-gather) are not implemented under tensor "
                                  "parallelism: build the model without them")
    b_local = bias.to_local() if (mode == "column" and bias is not None) else None
    y_local = local_forward(x_local, w_local, b_local, w_local.shape[1], w_local.shape[0], group)
    y = DTensor.from_local(y_local, mesh, [Shard(y_local.dim() - 1)] if mode == "column" else [Partial()],
                           run_check=False)
    if mode == "row" and bias is not None:  # added once, to the sum (DTensor: Partial + Replicate)
        if not isinstance(bias, DTensor):
            bias = DTensor.from_local(bias, mesh, [Replicate()], run_check=False)
        y = y + bias
    return y


_MODES = (None, "column", "row")


def _te_group(m, *, tp_group, tp_size, sequence_parallel, parallel_mode):
    """Check TE's tensor-parallel arguments; returns (process group, its size), or None when
    the module stays whole (parallel_mode None, or one rank)."""
    if parallel_mode not in _MODES:
        raise ValueError(f"{_label(m)}: parallel_mode must be 'column', 'row' or None, got {parallel_mode!r}")
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"{_label(m)}: sequence_parallel must be a bool, got {type(sequence_parallel).__name__}")
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"{_label(m)}: tp_size must be a positive int, got {tp_size!r}")
    dist = torch.distributed
    if tp_group is not None or tp_size > 1:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"{_label(m)}: tp_group / tp_size={tp_size} need torch.distributed initialised "
                               "(init_process_group) before the module is built")
        size = dist.get_world_size(tp_group)
        if tp_group is None and tp_size != size:
            raise ValueError(f"{_label(m)}: tp_size={tp_size} without tp_group means the world group, which has "
                             f"{size} ranks; pass the tensor-parallel process group")
        if tp_group is not None and tp_size not in (1, size):
            raise ValueError(f"{_label(m)}: tp_size={tp_size} but tp_group has {size} ranks")
        tp_size = size
    if parallel_mode is None:
        if sequence_parallel and tp_size > 1:
            raise NotImplementedError(f"{_label(m)}: sequence_parallel=True with parallel_mode=None (a replicated "
                                      "layer on sequence-sharded input) is not implemented; give parallel_mode")
        return None
    in_f, out_f = m.weight.shape[1], m.weight.shape[0]
    check_divides(m, mode=parallel_mode, tp=tp_size, in_features=in_f, out_features=out_f)
    if tp_size == 1:
        return None
    group = tp_group if tp_group is not None else dist.group.WORLD
    assert group is not None  # (initialised above)
    return group, tp_size


def _te_mesh(m, group):
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh.from_group(group, device_type=m.weight.device.type)


def te_parallel(m, *, tp_group, tp_size, sequence_parallel, parallel_mode) -> None:
    """Transformer Engine's tp_group / tp_size / sequence_parallel / parallel_mode on a built
    (unsharded, seeded alike on every rank) nn.Linear-shaped module: shard it over the group
    with torch's styles, as TE's Linear runs.

        column   x whole (sequence_parallel: x's local rows of dim 0, all-gathered before);
                 returns the local columns of y
        row      x's local columns (input_is_parallel); returns y all-reduced
                 (sequence_parallel: reduce-scattered along dim 0, TE's [s, b, h] layout)

    parallel_mode=None keeps the module whole on every rank (TE's default)."""
    got = _te_group(m, tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel,
                    parallel_mode=parallel_mode)
    if got is None:
        return
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    _, _, Replicate, Shard = _dtensor_types()
    seq = Shard(0)  # TE's sequence dimension: the first of [s, b, h]
    style: "ColwiseParallel | RowwiseParallel"
    if parallel_mode == "column":
        style = ColwiseParallel(input_layouts=seq if sequence_parallel else Replicate(), use_local_output=True)
    else:
        style = RowwiseParallel(input_layouts=Shard(-1), output_layouts=seq if sequence_parallel else Replicate(),
                                use_local_output=True)
    parallelize_module(m, _te_mesh(m, got[0]), style)
    local_fp8_state(m)


def te_parallel_norm(m, *, tp_group, tp_size, sequence_parallel, parallel_mode) -> None:
    """TE's tensor-parallel arguments on a LayerNormLinear: column mode only (TE's use: the
    norm before a column-parallel GEMM). The GEMM's weight and bias become Shard(0)
    DTensors, the norm's parameters Replicate ones; the forward (norm_linear_tp_forward)
    runs the norm on DTensors (sequence_parallel: on the rank's rows of dim 0, then the
    all-gather), so its parameters' gradients are summed over the ranks by DTensor."""
    if parallel_mode == "row":
        raise NotImplementedError(f"{_label(m)}: parallel_mode='row' (a norm over a feature-sharded input) is not "
                                  "implemented; LayerNormLinear runs column parallel, fp8mix.Linear both")
    got = _te_group(m, tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel,
                    parallel_mode=parallel_mode)
    if got is None:
        return
    from torch.distributed.tensor import distribute_tensor
    _, _, Replicate, Shard = _dtensor_types()
    mesh = _te_mesh(m, got[0])
    for name, place in (("weight", Shard(0)), ("bias", Shard(0)), ("layer_norm_weight", Replicate()),
                        ("layer_norm_bias", Replicate())):
        p = getattr(m, name)
        if p is not None:
            setattr(m, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [place]),
                                                requires_grad=p.requires_grad))
    m._tp_sequence_parallel = sequence_parallel


def norm_linear_tp_forward(m, inp, norm, *, is_first_microbatch, return_bias: bool, local_forward):
    """(out, bias or None, ln_out) of a column-parallel LayerNormLinear (te_parallel_norm):
    out and the returned bias are the rank's columns; ln_out the norm's output as this rank
    holds it (sequence parallel: its rows, before the all-gather)."""
    DTensor, _, Replicate, Shard = _dtensor_types()
    mesh = m.weight.device_mesh
    if not hasattr(m, "_tp_sequence_parallel"):
        raise NotImplementedError(f"{_label(m)}: a DTensor weight its tensor-parallel arguments did not make; build "
                                  "it with tp_group / tp_size and parallel_mode='column' (torch's styles take "
                                  "nn.Linear layers only)")
    sp = m._tp_sequence_parallel
    if not isinstance(inp, torch.Tensor) or isinstance(inp, DTensor):
        raise TypeError(f"{_label(m)}: input must be a plain tensor (this rank's part), got {type(inp).__name__}")
    ln = norm(DTensor.from_local(inp, mesh, [Shard(0)] if sp else [Replicate()], run_check=False))
    ln_local = ln.to_local()
    if sp:
        ln = ln.redistribute(mesh, [Replicate()])  # the all-gather (backward: the reduce-scatter)
    bias = None if return_bias else m.bias
    y = tp_linear_forward(m, ln, m.weight, bias, in_features=m.in_features, out_features=m.out_features,
                          is_first_microbatch=is_first_microbatch, local_forward=local_forward)
    out_bias = m.bias.to_local() if (return_bias and m.bias is not None) else None
    return y.to_local(), out_bias, ln_local
