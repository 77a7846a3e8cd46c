"""FSDP2 (torch.distributed.fsdp.fully_shard) with FP8 weights on the wire.

    convert_model(model, fsdp_fp8_all_gather=True)   before fully_shard: FSDP2 all-gathers
                                                      the fp8mix layers' weights in FP8
    fp8_model_init()                                  FP8 primary weights: FSDP2 shards and
                                                      all-gathers their FP8 bytes as they are
    precompute_fp8_scales_for_fsdp(model)             after optimizer.step(): every layer's
                                                      scale from one all-reduce

The all-gathered FP8 weight is the GEMMs' operand itself (fp8mix.nn.fp8_weight has the
rule and the flow). Without precompute_fp8_scales_for_fsdp each layer's first all-gather
after a weight update all-reduces its own amax (4 bytes, one collective per layer); with
it, one collective serves every layer of the model (torchao's
precompute_float8_dynamic_scale_for_fsdp, the same place in the loop). Either way every
rank casts its shard with the same scale, so the gathered bytes are those the unsharded
weight casts to.

Not here: tensor parallelism (fp8mix.distributed.tensor_parallel) and the communication itself
(torch.distributed's collectives, called by FSDP2).
"""
from __future__ import annotations

import torch

from ..nn.fp8_weight import FP8AllGatherWeight, _local, _shard_groups, global_amaxes

__all__ = ["precompute_fp8_scales_for_fsdp", "precompute_float8_dynamic_scale_for_fsdp"]


@torch.no_grad()
def precompute_fp8_scales_for_fsdp(module: torch.nn.Module) -> int:
    """Compute the FP8 all-gather scale of every FSDP2-sharded FP8AllGatherWeight in
    `module` from one MAX all-reduce of their amaxes (per mesh), for the all-gathers until
    the weights change again. Call it after ``optimizer.step()`` on every rank (it is a
    collective). Returns how many weights it set; FP8 primary weights (fp8_model_init)
    need nothing (their scale is written with them). A scale serves until its weight's
    Parameter changes (its version counter: in-place updates, load_state_dict; not a
    write through ``.data``), after which the all-gather all-reduces the amax again."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"precompute_fp8_scales_for_fsdp expects an nn.Module, got {type(module).__name__}")
    params: list = [p for p in module.parameters() if isinstance(_local(p), FP8AllGatherWeight)]
    if not params:
        return 0
    shards = [_local(p) for p in params]
    amaxes = global_amaxes([s._tensor for s in shards], [_shard_groups(p) for p in params])
    by_rule: dict = {}
    for i, s in enumerate(shards):
        by_rule.setdefault(s.scaling, []).append(i)
    for rule, idx in by_rule.items():  # one scale op per rule, not per layer
        scale, sinv = rule.scales(torch.cat([amaxes[i] for i in idx]))
        for k, i in enumerate(idx):
            shards[i].set_scale(scale[k:k + 1], sinv[k:k + 1], version=params[i]._version)
    return len(params)


precompute_float8_dynamic_scale_for_fsdp = precompute_fp8_scales_for_fsdp  # torchao's name
