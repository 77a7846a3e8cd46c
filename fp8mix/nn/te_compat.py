"""Where Transformer Engine's spellings for fp8mix's modules were first importable: the
constructor options and checkpoint keys now live in fp8mix.nn.te_options, the seed text's
aliases in fp8mix.compat; this module re-exports both (older imports keep working).
"""
from ..compat import FP8GlobalState, convert_module_to_fp8
from .te_options import (
                         TECheckpointMixin,
                         apply_init,
                         params_dtype_of,
                         strip_te_extra_state,
                         te_default_init,
                         te_options,
)

__all__ = ["te_options", "params_dtype_of", "apply_init", "te_default_init", "TECheckpointMixin",
           "strip_te_extra_state", "convert_module_to_fp8", "FP8GlobalState"]
