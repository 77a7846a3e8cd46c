"""`python -m fp8mix demo`: train one small GPT in float32, bfloat16 and FP8 and compare.

"Is FP8 as good as float32 here?" Every variant trains the same byte-level GPT from the
same initial weights on the same batches; ``--seeds N`` repeats that for N seeds and
reports each variant's validation-loss gap to float32 as mean +- 95% interval of the
paired differences, with a verdict and the seeds a 0.25% gap would need. Outputs (in
``--out``): ``loss_curves.png``, ``val_gap.png`` (matplotlib optional), ``loss_curves.csv``
(run, step, split, loss, seed) and ``results.json``. Exit code 1 when a run diverged.

The package, one concern per module (imports flow down this list, never back up):

- ``data``: the corpus (this Python's stdlib sources by default, offline), split, batches;
- ``variants``: the runs (fp32, bf16, fp8-delayed/current/block) and their precision;
- ``model``: the GPT, the warmup + cosine schedule, evaluation;
- ``counters``: bytes saved for backward, FP8 overflow/underflow (fp8mix.numerics);
- ``checkpoint``: atomic checkpoints, resume, the per-step loss log;
- ``progress``: tqdm bar, or plain lines without tqdm;
- ``train``: one run (``train_one``, ``Run``);
- ``budget``: timed steps, ETA, a slow bfloat16 skipped;
- ``paired``: paired-difference statistics (Student t, no scipy);
- ``report``, ``plots``: tables, CSV, JSON, PNGs;
- ``main``: ``run(args)``, the command.

``data`` and ``model`` (and ``train.train_one``) are the public pieces benchmarks build on;
the names below are re-exported for them.
"""
from .data import batch, draw_starts, load_corpus, split_corpus
from .main import run
from .model import GPT, evaluate, lr_at
from .train import train_one

__all__ = ["GPT", "batch", "draw_starts", "evaluate", "load_corpus", "lr_at", "run", "split_corpus", "train_one"]
