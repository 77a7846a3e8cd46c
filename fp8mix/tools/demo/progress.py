"""Progress of a training run on stderr: a tqdm bar when tqdm is installed, else one line
per validation (tqdm is optional: the demo works after a plain ``pip install fp8mix``).
"""
from __future__ import annotations

import sys

__all__ = ["have_tqdm", "Progress"]


def have_tqdm() -> bool:
    """Whether tqdm can be imported."""
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


class Progress:
    """Progress of run `name` from step `start` of `total`; silent when not `enabled`.

    ``update(step, loss, val)`` after each step (val: the validation loss when the step
    was validated, else None); ``stopped(reason)`` when the run diverged; ``close()``.
    """

    def __init__(self, name: str, start: int, total: int, enabled: bool):
        self.name, self.total, self.enabled = name, total, enabled
        self.bar = None
        if enabled and have_tqdm():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=f"{name:>11}", unit="step", leave=True,
                            dynamic_ncols=True, file=sys.stderr)

    def update(self, step: int, loss: float, val: float | None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if val is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", val=f"{val:.3f}")
            elif step % 10 == 0:
                self.bar.set_postfix(loss=f"{loss:.3f}")
        elif self.enabled and val is not None:
            print(f"{self.name:>11}: step {step + 1}/{self.total}, loss {loss:.3f}, val {val:.3f}",
                  file=sys.stderr, flush=True)

    def stopped(self, reason: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"diverged ({reason})")
        elif self.enabled:
            print(f"{self.name:>11}: diverged ({reason})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
