"""The tools' place in the package (issue #13): ``import fp8mix`` imports none of them, they
import each other without a circle, use only fp8mix's public modules, and stay small.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import fp8mix

ROOT = os.path.dirname(os.path.abspath(fp8mix.__file__))
TOOLS = os.path.join(ROOT, "tools")
# fp8mix modules a tool may import: the package's public surface (and the tools themselves)
PUBLIC = {"fp8mix", "fp8mix.numerics", "fp8mix.recipe", "fp8mix.auto_format", "fp8mix.plan"}


def _modules() -> dict:
    """module name -> path of every .py file under fp8mix/tools."""
    out = {}
    for d, _, names in os.walk(TOOLS):
        for n in names:
            if n.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, n), os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, n)
    return out


def _imports(name: str, path: str) -> set:
    """Absolute names of the fp8mix modules `path` imports (relative imports resolved)."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from . import x` may name a module
    return {m for m in found if m == "fp8mix" or m.startswith("fp8mix.")}


def test_import_fp8mix_imports_no_tool():
    code = "import fp8mix, sys; print(sorted(m for m in sys.modules if m.startswith('fp8mix')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = eval(out)
    assert "fp8mix" in loaded
    assert not [m for m in loaded if m.startswith("fp8mix.tools") or m in ("fp8mix.cli", "fp8mix.demo")], loaded


def test_tools_have_no_import_circle_and_use_only_public_modules():
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = _imports(name, path)
        private = {d for d in deps if d not in PUBLIC and not d.startswith("fp8mix.tools") and d not in mods}
        # `from fp8mix import Linear` names an attribute, not a module: only real modules count
        private = {d for d in private if os.path.exists(os.path.join(os.path.dirname(ROOT),
                                                                     d.replace(".", os.sep) + ".py"))
                   or os.path.isdir(os.path.join(os.path.dirname(ROOT), d.replace(".", os.sep)))}
        assert not private, f"{name} imports private fp8mix modules {sorted(private)}"
        graph[name] = {d for d in deps if d in mods and d != name}
    # a package's __init__ re-exporting its submodules is not a circle: drop parent -> child edges
    for name in graph:
        graph[name] = {d for d in graph[name] if not d.startswith(name + ".")}
    state: dict = {}

    def visit(n, stack):
        state[n] = "open"
        for d in graph[n]:
            assert state.get(d) != "open", "import circle: " + " -> ".join(stack + [n, d])
            if d not in state:
                visit(d, stack + [n])
        state[n] = "done"
    for n in graph:
        if n not in state:
            visit(n, [])
    assert "fp8mix.tools.cli" in graph and "fp8mix.tools.demo.main" in graph


def test_tool_files_and_functions_are_small():
    for name, path in _modules().items():
        src = open(path).read()
        assert src.count("\n") <= 500, f"{path}: {src.count(chr(10))} lines"
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= 80, f"{name}.{node.name}: {n} lines"
