"""The layout of a Monitor record: its columns in CSV order and their types, the order of
tensor roles in reports, and the FP8 formats' ranges the plots draw. No logic that reads
tensors lives here (record.py measures, export.py writes and reads back)."""
from __future__ import annotations

# Representable magnitudes of each format, in FP8 units (after scaling):
# (min subnormal, min normal, max).
FP8_RANGES = {"E4M3": (2.0 ** -9, 2.0 ** -6, 448.0), "E5M2": (2.0 ** -16, 2.0 ** -14, 57344.0)}

# Columns of a record, in CSV order, by type.
INT_FIELDS = ("step", "call", "rows", "cols", "numel", "nonzero", "nonfinite", "nan", "underflow", "subnormal",
              "saturated", "overflow")
FLOAT_FIELDS = ("amax", "scale", "scale_min", "scale_max", "underflow_frac", "subnormal_frac", "saturation_frac",
                "overflow_frac", "sqnr_db", "kurtosis", "log2_range", "min_nonzero")
STR_FIELDS = ("layer", "role", "fmt", "granularity")
FIELDS = ("step", "call", "layer", "role", "fmt", "granularity", "rows", "cols", "amax", "scale", "scale_min",
          "scale_max", "numel", "nonzero", "nonfinite", "nan", "underflow", "subnormal", "saturated", "overflow",
          "underflow_frac", "subnormal_frac", "saturation_frac", "overflow_frac", "sqnr_db", "kurtosis",
          "log2_range", "min_nonzero", "hist")

# Version of Monitor.state_dict() and of the JSON export.
STATE_VERSION = 1

ROLE_ORDER = ("input", "weight", "grad_output")


def role_key(role: str) -> tuple:
    """Sort key of a tensor role: input, weight, grad_output, then others by name."""
    return (ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER), role)
