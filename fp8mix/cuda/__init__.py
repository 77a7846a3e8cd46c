"""fp8mix's CUDA helpers that live in Python: the first-use self-check of the CUDA
kernels against the C core (``run_selfcheck``) and the torch._scaled_mm fallback for
GEMMs fp8mix's cuBLASLt call refuses (``scaled_mm_fallback``, ``is_refusal``).
Importing this package touches no GPU."""
from .compare import SelfCheckError
from .fallback import REFUSED_PREFIX, FallbackUnavailable, is_refusal, scaled_mm_fallback
from .selfcheck import run_selfcheck, selfcheck_enabled

__all__ = ["SelfCheckError", "REFUSED_PREFIX", "FallbackUnavailable", "is_refusal", "scaled_mm_fallback",
           "run_selfcheck", "selfcheck_enabled"]
