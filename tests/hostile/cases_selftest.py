"""Hostile-input cases: the harness's self-test (tests/test_hostile.py checks that a dying
worker is pinned on its case)."""
from __future__ import annotations

import math  # noqa: F401

from .harness import *  # noqa: F401,F403
from .harness import _R, _f, _t, _views  # noqa: F401

# ---- harness self-test (tests/test_hostile.py checks that a dying worker is pinned on its case) -----

if __import__("os").environ.get("FP8MIX_HOSTILE_SELFTEST"):
    def _abort():
        import os
        os.abort()

    def _segv():
        import ctypes
        import faulthandler
        faulthandler.disable()  # keep the report short: the signal is what counts
        ctypes.string_at(0)

    for _n in ("_selftest_ok", "_selftest_ok2", "_selftest_ok3"):
        add(_n, lambda: None, Valid())
    add("_selftest_abort", _abort, Valid())
    add("_selftest_segv", _segv, Valid())
