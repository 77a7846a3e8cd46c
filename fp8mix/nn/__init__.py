"""fp8mix's modules: FP8 versions of torch's and Hugging Face's linear layers, converting
models to and from them, and activation-checkpointing support.

    Linear            drop-in nn.Linear (fp8mix.Linear)
    Conv1D            Hugging Face's GPT-2 Conv1D (weight stored (in, out))
    convert_model     nn.Linear / Conv1D -> fp8mix modules, in place
    unconvert_model   back again; strip_fp8_state / load_fp8_state for checkpoints
    checkpoint        torch.utils.checkpoint for fp8mix models (Transformer Engine's spelling)
    FP8StateMixin     the per-module FP8 state every fp8mix module shares
"""
from .recompute import checkpoint
from .conv1d import Conv1D
from .convert import convert_model, load_fp8_state, strip_fp8_state, unconvert_model
from .fp8_state import FP8StateMixin
from .linear import Linear

__all__ = ["Linear", "Conv1D", "convert_model", "unconvert_model", "strip_fp8_state", "load_fp8_state",
           "checkpoint", "FP8StateMixin"]
