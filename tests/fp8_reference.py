"""Format facts and tile layouts written from the spec, shared by the tests that check
fp8mix's statistics against float64 torch math (no fp8mix numerics here)."""
import torch

FMAX = {"E4M3": 448.0, "E5M2": 57344.0}
OVF = {"E4M3": 464.0, "E5M2": 59392.0}  # max + half a step: what a saturating cast clips
MIN_NORMAL = {"E4M3": 2.0 ** -6, "E5M2": 2.0 ** -14}


def expand_scale_inv(sinv: torch.Tensor, rows: int, cols: int, gran: str) -> torch.Tensor:
    """Per-element dequantisation factor (float64) of a rows x cols tensor, by the tile
    layouts of Float8Tensor."""
    s = sinv.double()
    if gran == "tensor":
        return s.reshape(()).expand(rows, cols)
    if gran == "row":
        return s.reshape(rows, 1).expand(rows, cols)
    if gran == "block":
        return s.reshape(rows, -1).repeat_interleave(128, 1)[:, :cols]
    return s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
