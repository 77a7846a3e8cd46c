"""Shared pytest setup for the fp8mix Python tests.

* `import fp8mix` failing is a hard error for the whole session (not a pile of
  per-test errors or, worse, silent skips): the native extension must be built.
* The CPU GEMMs sum in the canonical order (FP8MIX_GEMM_ORDER=canonical, set before
  fp8mix is imported, and again after every test): tests compare bytes, and the native
  order's bytes depend on the CPU (docs/gemm_order.md). Tests of the native order
  switch to it themselves.
* After every test the CPU kernels' ISA cap is restored to the widest one
  ('amx', i.e. "whatever the CPU has") and torch's thread count is put
  back, so a test that narrows either cannot leak into the next.
* tests/ is on sys.path, so every folder below imports the shared helpers as
  ``from helpers import ...`` (tests/helpers.py), also when pytest runs one file.
* ``one_thread``: a test file whose problems are tiny runs on one thread with
  ``pytestmark = pytest.mark.usefixtures("one_thread")`` (one thread is fastest, and
  immune to a loaded machine); the count is put back after the test.
* ``corpus``: a ~28 KB text file in tmp_path for the demo to train on.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:  # pytest's default import mode puts it there too; other modes do not
    sys.path.insert(0, _TESTS)

os.environ["FP8MIX_GEMM_ORDER"] = "canonical"  # (subprocesses of the tests inherit it)

try:
    import fp8mix
    from fp8mix import ops
except Exception as exc:  # pragma: no cover - only when the build is broken
    raise RuntimeError(
        "\n\n*** cannot import fp8mix: "
        f"{type(exc).__name__}: {exc}\n"
        "*** build the native extension first:  . .venv/bin/activate && "
        "pip install --no-build-isolation -e .\n"
    ) from exc

from helpers import write_corpus  # noqa: E402  (after the import check above)


@pytest.fixture(autouse=True)
def _restore_isa_and_threads():
    threads = torch.get_num_threads()
    yield
    ops.set_max_isa("amx")
    fp8mix.set_gemm_order("canonical")
    torch.set_num_threads(threads)


@pytest.fixture()
def one_thread(_restore_isa_and_threads):
    """torch on one thread for this test (after _restore_isa_and_threads noted the count to put back)."""
    torch.set_num_threads(1)


@pytest.fixture()
def corpus(tmp_path):
    """A ~28 KB text file to train the demo on (helpers.write_corpus)."""
    return write_corpus(tmp_path / "corpus.txt")
