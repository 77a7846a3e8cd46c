"""Shared pytest setup for the fp8mix Python tests.

* `import fp8mix` failing is a hard error for the whole session (not a pile of
  per-test errors or, worse, silent skips): the native extension must be built.
* After every test the CPU kernels' ISA cap is restored to the widest one
  ('avx512bf16', i.e. "whatever the CPU has") and torch's thread count is put
  back, so a test that narrows either cannot leak into the next.
"""
from __future__ import annotations

import pytest
import torch

try:
    import fp8mix  # noqa: F401
    from fp8mix import ops
except Exception as exc:  # pragma: no cover - only when the build is broken
    raise RuntimeError(
        "\n\n*** cannot import fp8mix: "
        f"{type(exc).__name__}: {exc}\n"
        "*** build the native extension first:  . .venv/bin/activate && "
        "pip install --no-build-isolation -e .\n"
    ) from exc


@pytest.fixture(autouse=True)
def _restore_isa_and_threads():
    threads = torch.get_num_threads()
    yield
    ops.set_max_isa("avx512bf16")
    torch.set_num_threads(threads)
