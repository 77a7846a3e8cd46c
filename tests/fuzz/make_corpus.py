#!/usr/bin/env python3
"""Write the seed corpus of the libFuzzer targets: tests/fuzz/corpus/<target>/.

Each seed is a leading "mode" byte or two that steer the target to one of its
paths (see the byte reader in each fuzz_*.c), followed by deterministic
pseudo-random bytes. Small on purpose (a few KiB per target); libFuzzer grows
its own working corpus from these in a temporary copy, so the files here never
change unless this script is rerun:

    python3 tests/fuzz/make_corpus.py
"""
from __future__ import annotations

import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# target -> list of (name, prefix bytes, payload length)
SEEDS = {
    "cast": [
        ("small_f32", bytes([0x00, 0x00]), 96),
        ("small_bf16_sr", bytes([0x00, 0x01]), 128),
        ("medium", bytes([0x00, 0x04]), 256),
        ("large_block2d", bytes([0x00, 0x06]), 384),
        ("big_threads", bytes([0x00, 0x17]), 64),
        ("rows0", bytes([0x00, 0x30]), 48),
        ("cols0", bytes([0x00, 0xC0]), 48),
        ("hostile", bytes([0x0F]), 48),
        ("hostile_lying", bytes([0x0F, 0x02, 0x06, 0x06, 0x06, 0x06, 0xD8]), 8),
    ],
    "grouped": [
        ("groups", bytes([0x00, 0x04, 0x00, 0x08, 0x00, 0x20, 0x00]), 384),
        ("groups_empty", bytes([0x00, 0x03, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00]), 256),
        ("hostile", bytes([0x01]), 300),
    ],
    "nvfp4": [
        ("quantize", bytes([0x00, 0x05, 0x00, 0x03, 0x00]), 256),
        ("quantize_2d_sr", bytes([0x04, 0x20, 0x00, 0x02, 0x00, 0x01, 0x01]), 384),
        ("gemm", bytes([0x01, 0x04, 0x00, 0x03, 0x00, 0x02, 0x00]), 320),
        ("encode", bytes([0x02]), 256),
        ("hostile", bytes([0x03]), 64),
    ],
    "quantize": [
        ("quantize_small", bytes([0x00, 0x00]), 128),
        ("quantize_block", bytes([0x01, 0x03]), 384),
        ("quantize_rows0", bytes([0x02, 0x0C]), 48),
        ("scale", bytes([0x03]), 200),
        ("scale_bad", bytes([0x04, 0x20, 0xFF]), 120),
        ("dequant", bytes([0x05, 0x00]), 256),
        ("dequant_wide", bytes([0x06, 0x24]), 384),
        ("hostile", bytes([0x07]), 48),
    ],
    "gemm": [
        ("small", bytes([0x00]), 160),
        ("small_fp22", bytes([0x01]), 200),
        ("wide_n", bytes([0x20]), 256),
        ("deep_k_block", bytes([0x30]), 384),
        ("bias", bytes([0x02]), 200),
        ("hostile", bytes([0x0F]), 64),
    ],
    "stats": [
        ("small", bytes([0x00, 0x00]), 128),
        ("rows_block", bytes([0x24, 0x02]), 384),
        ("bf16_wide", bytes([0x20, 0x81, 0x01]), 256),
        ("empty", bytes([0x03]), 32),
        ("bad_scale", bytes([0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07]), 64),
    ],
    "philox": [
        ("zero", bytes(8), 24),
        ("wrap", bytes([0x01]), 40),
        ("carry", bytes([0x02]), 40),
        ("random", bytes([0x03]), 40),
    ],
}


def main() -> None:
    for target, seeds in SEEDS.items():
        d = os.path.join(HERE, "corpus", target)
        os.makedirs(d, exist_ok=True)
        for name in os.listdir(d):
            os.remove(os.path.join(d, name))
        for i, (name, prefix, n) in enumerate(seeds):
            rng = random.Random(f"{target}/{name}")
            payload = bytes(rng.getrandbits(8) for _ in range(n))
            if target == "philox" and name != "zero":
                payload = struct.pack("<Q", rng.getrandbits(64)) + payload
            with open(os.path.join(d, f"{i:02d}_{name}"), "wb") as fh:
                fh.write((prefix + payload) if target != "philox" or name == "zero" else
                         payload[:8] + prefix + payload[8:])


if __name__ == "__main__":
    main()
