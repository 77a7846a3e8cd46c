"""Fixtures of the tools' tests: a small corpus to train on."""
from __future__ import annotations

import pytest


@pytest.fixture()
def corpus(tmp_path):
    """A ~28 KB text file to train on."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}  # line {i}\n" for i in range(600)))
    return path
