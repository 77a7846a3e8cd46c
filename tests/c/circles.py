"""File-level call circles in the C core, read from the compiled objects.

    python3 tests/c/circles.py <build dir>        e.g. build/core, build/core-ext

Builds the graph "file A calls a function (or uses data) defined in file B" from
`nm` over the core's object files under <build dir> and prints every strongly
connected component with more than one file (a circle), each with its edges and
the symbols behind them:

    ['core/gemm', 'core/gemm_blocked']
       core/gemm -> core/gemm_blocked ['fp8mix_gemm_blocked']
       core/gemm_blocked -> core/gemm ['fp8mix_gemm_epilogue']

Why objects and not #includes: the headers are shared on purpose (internal.h is
everyone's); what makes two files one unit is that each calls the other, which
only the symbol tables say reliably (macros, inline helpers and renames
included).  Where <build dir>/libfp8mix_core.a exists, only the objects it holds
count, so an object left behind by a deleted source file does not show up.

Exit status: 0 when there is no circle (nothing printed), 1 when there is one,
2 when the objects cannot be read (no build dir, no objects, no `nm`).
"""

import os
import subprocess
import sys

LIB = "libfp8mix_core.a"
# nm's symbol types of global definitions (text, data, read-only, bss, common,
# weak, small data)
DEFINED = set("TDRBCVWGS")


def object_files(build):
    """Relative names (without .o) -> paths of the core's objects under build."""
    objs = {}
    for dirpath, _dirs, files in os.walk(build):
        for f in files:
            if f.endswith(".o"):
                path = os.path.join(dirpath, f)
                objs[os.path.relpath(path, build)[:-2]] = path
    lib = os.path.join(build, LIB)
    if os.path.exists(lib):
        members = set(subprocess.run(["ar", "t", lib], capture_output=True, text=True, check=True).stdout.split())
        objs = {name: path for name, path in objs.items() if os.path.basename(path) in members}
    return objs


def symbols(path):
    """(defined, undefined) global symbol names of one object."""
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in DEFINED:
            defined.add(p[2])
        elif len(p) == 2 and p[0] == "U":
            undefined.add(p[1])
    return defined, undefined


def call_graph(objs):
    """edges[a][b] = sorted symbols a uses that b defines (a != b)."""
    owner, uses = {}, {}
    for name in sorted(objs):
        defined, undefined = symbols(objs[name])
        for s in defined:
            owner[s] = name
        uses[name] = undefined
    edges = {}
    for a, undefined in uses.items():
        edges[a] = {}
        for s in sorted(undefined):
            b = owner.get(s)
            if b is not None and b != a:
                edges[a].setdefault(b, []).append(s)
    return edges


def circles(edges):
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def main(argv):
    if len(argv) != 2 or argv[1].startswith("-"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    build = argv[1]
    if not os.path.isdir(build):
        print(f"circles.py: {build}: no such build directory (run make core first)", file=sys.stderr)
        return 2
    try:
        objs = object_files(build)
        if not objs:
            print(f"circles.py: no object files under {build}", file=sys.stderr)
            return 2
        edges = call_graph(objs)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"circles.py: cannot read the objects: {e}", file=sys.stderr)
        return 2
    found = circles(edges)
    for comp in found:
        print(comp)
        for a in comp:
            for b in comp:
                if b in edges[a]:
                    print("  ", a, "->", b, edges[a][b])
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
