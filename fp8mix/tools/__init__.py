"""fp8mix's command-line tools: ``python -m fp8mix {demo,inspect}``.

- ``cli``: the argument parser and ``main`` (the entry point of ``fp8mix/__main__.py``);
- ``demo/``: train a small GPT in float32, bfloat16 and FP8 and compare (its data and
  model modules are public: benchmarks build on them);
- ``inspect``: per-layer FP8 format advice for a user's model;
- ``_common``: what the tools share (``UsageError``, device choice, JSON helpers).

``import fp8mix`` never imports this package; it imports nothing itself.
"""
