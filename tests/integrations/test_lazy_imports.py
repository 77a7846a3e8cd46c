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


def test_lazy_imports_and_missing_libraries():
    """One fresh interpreter: ``import fp8mix`` loads no integration and no training library;
    then each integration, with its library made unimportable, raises an ImportError that
    names the pip package."""
    cases = [("lightning", "lightning", "lightning"), ("accelerate", "accelerate", "accelerate"),
             ("transformers", "transformers", "transformers")]
    code = ("import json, sys\nimport fp8mix\n"
            "out = {'loaded': [m for m in sys.modules if m.startswith(('fp8mix.integrations', 'lightning', "
            "'accelerate', 'transformers'))]}\n"
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
    assert got["loaded"] == []
    for integration, _, pip_name in cases:
        msg = got[integration]
        assert msg.startswith(f"fp8mix.integrations.{integration} needs the '{pip_name}' package"), msg
        assert f"pip install {pip_name}" in msg, msg
