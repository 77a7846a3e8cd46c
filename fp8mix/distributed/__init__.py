"""fp8mix on many processes, built on torch.distributed: FSDP2 with FP8 all-gathers and FP8
primary weights (fsdp), tensor and sequence parallel through DTensor (tensor_parallel).
Imported only by who uses it (``import fp8mix`` does not).

    precompute_fp8_scales_for_fsdp   every FP8-gathered layer's scale in one all-reduce
                                     (also under torchao's name,
                                     precompute_float8_dynamic_scale_for_fsdp)
    FP8Weight, FP8AllGatherWeight    the weight tensors FSDP2 moves in FP8 (fp8mix.nn.fp8_weight)
    Float8ColwiseParallel,           torchao's names of the tensor-parallel styles, for
    Float8RowwiseParallel,           fp8mix modules (torch's ColwiseParallel / RowwiseParallel
    PrepareFloat8ModuleInput         serve them as well)
"""
from ..nn.fp8_weight import FP8AllGatherWeight, FP8Weight
from .fsdp import precompute_float8_dynamic_scale_for_fsdp, precompute_fp8_scales_for_fsdp
from .tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput

__all__ = ["precompute_fp8_scales_for_fsdp", "precompute_float8_dynamic_scale_for_fsdp", "FP8Weight",
           "FP8AllGatherWeight", "Float8ColwiseParallel", "Float8RowwiseParallel", "PrepareFloat8ModuleInput"]
