"""fp8mix's CUDA helpers that live in Python: the first-use self-check of the CUDA
kernels against the C core (``run_selfcheck``) and the torch._scaled_mm fallback for
GEMMs fp8mix's cuBLASLt call refuses (``scaled_mm_fallback``, ``is_refusal``).
Importing this package touches no GPU; it registers itself with the op layer
(``fp8mix.ops.set_cuda_hooks``), which calls it only through those hooks: fp8mix.ops never
imports this package, this package builds on fp8mix.ops."""
from .. import ops
from .compare import SelfCheckError
from .fallback import REFUSED_PREFIX, FallbackUnavailable, is_refusal, refusals, scaled_mm_fallback
from .selfcheck import run_selfcheck, selfcheck_enabled


class _Hooks:
    """fp8mix.ops.CudaHooks: the first-use self-check and the torch._scaled_mm fallback."""

    def first_use(self, device):
        run_selfcheck(device)

    def scaled_mm_refused(self, error, a, b, scale_a, scale_b, bias, out_dtype):
        if not is_refusal(error):
            raise error
        out = scaled_mm_fallback(a, b, scale_a, scale_b, bias, out_dtype)
        refusals.last = str(error)  # (after: a fallback that cannot run raises, and nothing was served)
        return out


ops.set_cuda_hooks(_Hooks())

__all__ = ["SelfCheckError", "REFUSED_PREFIX", "FallbackUnavailable", "is_refusal", "scaled_mm_fallback",
           "run_selfcheck", "selfcheck_enabled"]
