"""fp8mix's modules: FP8 versions of torch's and Hugging Face's linear layers, converting
models to and from them, and activation-checkpointing support.

    Linear            drop-in nn.Linear (fp8mix.Linear)
    GroupedLinear     Transformer Engine's GroupedLinear (mixture-of-experts expert layers)
    Conv1D            Hugging Face's GPT-2 Conv1D (weight stored (in, out))
    convert_model     nn.Linear / Conv1D -> fp8mix modules, in place
    mark_layer_order  stamp a model's fp8mix modules with their place in module order
    unconvert_model   back again; strip_fp8_state / load_fp8_state for checkpoints
    checkpoint        torch.utils.checkpoint for fp8mix models (Transformer Engine's spelling)
    FP8StateMixin     the per-module FP8 state every fp8mix module shares
    LayerNorm, RMSNorm, LayerNormLinear, LayerNormMLP, TransformerLayer
                      Transformer Engine's module family (fused norm / activation FP8 casts)
"""
from .conv1d import Conv1D
from .convert import convert_model, load_fp8_state, strip_fp8_state, unconvert_model
from .fp8_state import FP8StateMixin
from .grouped_linear import GroupedLinear
from .layer_order import mark_layer_order
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .norms import LayerNorm, RMSNorm
from .recompute import checkpoint
from .transformer import TransformerLayer

__all__ = ["Linear", "GroupedLinear", "Conv1D", "convert_model", "unconvert_model", "strip_fp8_state", "load_fp8_state",
           "checkpoint", "FP8StateMixin", "mark_layer_order", "LayerNorm", "RMSNorm", "LayerNormLinear",
           "LayerNormMLP", "TransformerLayer"]
