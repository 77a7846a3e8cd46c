"""After a plain ``pip install fp8mix`` (no extras) the demo works: without tqdm there are
no bars (one line per validation instead), without matplotlib no PNG, and a one-line note
says how to get each. The two packages are made unimportable in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tiny_demo import TINY

BLOCK = ("import runpy, sys; sys.modules['tqdm'] = None; sys.modules['matplotlib'] = None; "
         "sys.argv = ['fp8mix'] + sys.argv[1:]; runpy.run_module('fp8mix', run_name='__main__', alter_sys=True)")


def test_demo_without_tqdm_and_matplotlib(tmp_path, corpus):
    out = tmp_path / "o"
    args = [a for a in TINY if a != "--no-progress"]
    r = subprocess.run([sys.executable, "-c", BLOCK, "demo", *args, "--recipes", "fp32,fp8-delayed",
                        "--data", str(corpus), "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "no progress bars (tqdm is not installed: pip install tqdm)" in r.stdout
    assert "no PNG plots (matplotlib is not installed: pip install matplotlib)" in r.stdout
    assert "fp32: step 6/12, loss" in r.stderr and "fp8-delayed: step 12/12, loss" in r.stderr
    assert sorted(os.listdir(out)) == ["loss_curves.csv", "results.json"]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [x["run"] for x in runs] == ["fp32", "fp8-delayed"] and not any(x["diverged"] for x in runs)
