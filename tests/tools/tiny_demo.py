"""The tiny demo configuration of the tools' tests (a run takes about a second)."""

TINY = ["--steps", "12", "--layers", "1", "--d-model", "32", "--seq-len", "32", "--batch-size", "4",
        "--eval-every", "6", "--eval-batches", "2", "--no-progress"]
