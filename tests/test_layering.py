"""The house's layering (issue #28): no import circle in fp8mix/, no call circle between the
C core's files, and no package attribute that hides a module of the same name.

Python: every import statement counts, at module level or inside a function (a function-local
import only hides a circle), except those under ``if TYPE_CHECKING:``. Importing ``a.b.c``
also depends on the packages ``a`` and ``a.b`` (their ``__init__`` runs first), except the
importer's own packages, which are always initialised before it.
C: ``tests/c/circles.py`` over the objects of the extension's C core build: file A depends on
file B when A calls a function B defines.
"""
from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys

import pytest

import fp8mix

PKG = os.path.dirname(os.path.abspath(fp8mix.__file__))
ROOT = os.path.dirname(PKG)


def _modules() -> dict:
    """module name -> path of every .py file of the package."""
    out = {}
    for d, _, names in os.walk(PKG):
        for n in names:
            if n.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, n), ROOT)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, n)
    return out


def _type_checking_nodes(tree: ast.AST) -> set:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def _imports(name: str, path: str, mods: dict) -> set:
    """The fp8mix modules `name` depends on (see the module docstring)."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    skip = _type_checking_nodes(tree)
    targets = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
    deps = set()
    for t in targets:
        parts = t.split(".")
        for k in range(1, len(parts) + 1):  # the target and the packages above it
            dep = ".".join(parts[:k])
            if dep in mods and dep != name and not name.startswith(dep + "."):
                deps.add(dep)
    return deps


def _cycles(graph: dict) -> list:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _graph() -> dict:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def test_python_package_has_no_import_circle():
    graph = _graph()
    cycles = _cycles(graph)
    detail = [[f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c] for c in cycles]
    assert not cycles, f"import circles in fp8mix/: {detail}"


def test_circle_finder_sees_a_function_local_circle():
    """The finder itself: a circle closed by a function-local import is found, and an import
    of a package's submodule depends on the package."""
    mods = {"p": "p/__init__.py", "p.a": "p/a.py", "p.b": "p/b.py"}
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.a"}}
    assert _cycles(graph) == [["p.a", "p.b"]]
    src = {"p.a": "def f():\n    from . import b\n", "p.b": "from .a import f\n", "p": ""}
    tmp = {}
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for name, rel in mods.items():
            path = os.path.join(d, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(src[name])
            tmp[name] = path
        g = {name: _imports(name, path, mods) for name, path in tmp.items()}
    assert g["p.a"] == {"p.b"} and g["p.b"] == {"p.a"} and _cycles(g) == [["p.a", "p.b"]]


def _packages() -> list:
    return [m for m, p in _modules().items() if p.endswith("__init__.py")]


@pytest.mark.parametrize("package", _packages())
def test_no_attribute_hides_a_submodule(package):
    """``fp8mix.autocast`` was a function hiding the module fp8mix/autocast.py (and
    ``fp8mix.quantize`` its module): every submodule is what its name gives."""
    import importlib
    pkg = importlib.import_module(package)
    hidden = []
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name == "__main__":  # (importing it runs the CLI)
            continue
        sub = importlib.import_module(f"{package}.{info.name}")
        if getattr(pkg, info.name) is not sub:
            hidden.append(f"{package}.{info.name} is {type(getattr(pkg, info.name)).__name__}")
    assert not hidden, hidden


def test_c_core_has_no_call_circle():
    """tests/c/circles.py over the C core the extension was built from (build/core-ext, made
    by setup.py), or the standalone build (build/core)."""
    script = os.path.join(ROOT, "tests", "c", "circles.py")
    builds = [os.path.join(ROOT, "build", b) for b in ("core-ext", "core")]
    build = next((b for b in builds if os.path.isdir(os.path.join(b, "core"))), None)
    assert build is not None, f"no C core build in {builds}: build the package (setup.py) first"
    r = subprocess.run([sys.executable, script, build], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"call circles in csrc/core:\n{r.stdout}{r.stderr}"
