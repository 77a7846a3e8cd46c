"""fp8mix.integrations is imported only by its users: ``import fp8mix`` loads none of it and
none of the libraries it glues to, and importing an integration whose library is missing
raises an ImportError that names the pip package. A missing library is simulated by
``sys.modules[name] = None`` (what Python does for a module that cannot be found) in a
fresh interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_import_fp8mix_imports_no_integration_and_no_training_library():
    r = _run("import sys, fp8mix\n"
             "bad = [m for m in sys.modules if m.startswith(('fp8mix.integrations', 'lightning', 'accelerate',"
             " 'transformers'))]\n"
             "print(bad)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_an_integration_without_its_library_names_the_pip_package():
    cases = [("lightning", "lightning", "lightning"), ("accelerate", "accelerate", "accelerate"),
             ("transformers", "transformers", "transformers")]
    code = ("import json, sys\nimport fp8mix\nout = {}\n"
            f"for integration, library in {[(i, lib) for i, lib, _ in cases]!r}:\n"
            "    sys.modules[library] = None\n"
            "    try:\n"
            "        __import__('fp8mix.integrations.' + integration)\n"
            "        out[integration] = 'imported'\n"
            "    except ImportError as e:\n"
            "        out[integration] = str(e)\n"
            "    del sys.modules[library]\n"
            "print(json.dumps(out))\n")
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for integration, _, pip_name in cases:
        msg = got[integration]
        assert msg.startswith(f"fp8mix.integrations.{integration} needs the '{pip_name}' package"), msg
        assert f"pip install {pip_name}" in msg, msg
