#!/usr/bin/env python3
"""Layers call downward only: fails on an #include of src/ that reaches a layer above the
includer's, on folders of src/ that include each other in a cycle, and on import cycles between
the modules of the Python package.

The layers, lowest first (LAYERS below):

    core -> ops -> autograd -> ir -> passes -> plan -> codegen | runtime -> python

autograd sits just above ops: the eager tape records the ops the dispatcher ran and runs their
gradient rules through kiln_apply, needing nothing of the graph IR; the tracer and the graph
(ir) come after it, so a traced backward or the gradient of a control-flow body (which traces
that body) may use autograd. The dispatcher (ops) and tensor release (core) reach the tape and
the tracer only through hooks those fill in (src/core/hooks.h). codegen and runtime are peers:
either may include the other, as long as they do not include each other (a cycle).

Exempt: the public API (include/kiln/) and the op table src/ops/ops.def, which the public
header kiln/ops.h includes; every layer may include them.

Python: an import at module level (also in a class body, or under if/try) that reaches a module
of the package; imports inside functions are deliberate lazy imports and do not count, nor do
those under `if TYPE_CHECKING:`.

    python3 tools/check_layers.py [--src DIR] [--python DIR]

Exit 0 with a one-line summary, or 1 with every violation (file:line -> included file, why)."""
import argparse
import ast
import os
import re
import sys

# src/<folder>: its layer. Folders at the same level are peers.
LAYERS = {
    "core": 0,
    "ops": 1,
    "autograd": 2,
    "ir": 3,
    "passes": 4,
    "plan": 5,
    "codegen": 6,
    "runtime": 6,
    "python": 7,
}

# Files under src/ every layer may include (paths relative to src/).
API_FILES = {"ops/ops.def"}

# Where a quoted include is looked for after the includer's own folder, as the build does
# (CMakeLists.txt: include/ and src/ops on the path; the extension adds src/).
INCLUDE_DIRS = ("../include", ".", "ops")

# Modules of the package built from C (src/python is kiln._C): `from . import _C` imports
# the extension, not the package's __init__, whether or not it is built yet.
EXTENSIONS = {"_C"}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def _rel(path, root):
    return os.path.relpath(path, root).replace(os.sep, "/")


def _resolve(src, includer, name):
    """The file a quoted include names: a path under src/, "API" for the public headers, or
    None when it is not in the tree (a system or third-party header)."""
    for base in (os.path.dirname(includer),) + tuple(os.path.join(src, d) for d in INCLUDE_DIRS):
        path = os.path.normpath(os.path.join(base, name))
        if not os.path.isfile(path):
            continue
        rel = _rel(path, src)
        return "API" if rel.startswith("../") else rel
    return None


def _folder(rel):
    return rel.split("/", 1)[0] if "/" in rel else ""


def c_includes(src):
    """Every quoted include of a .c/.h under src that lands in another folder of src:
    (includer, line, included), paths relative to src."""
    found = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, fn)
            rel = _rel(path, src)
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = _resolve(src, path, m.group(1))
                    if target and target != "API" and target not in API_FILES and _folder(target) != _folder(rel):
                        found.append((rel, lineno, target))
    return found


def _cycles(edges):
    """One cycle (a list of nodes, first repeated at the end) per strongly connected component
    of more than one node. edges: node -> set of nodes."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []

    def visit(v):  # Tarjan; the graphs here are small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:  # the shortest way from the component's first node back to it
        start = min(comp)
        came_from, frontier = {}, [start]
        while not any(start in edges.get(v, ()) for v in frontier):
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, ())):
                    if w in comp and w not in came_from and w != start:
                        came_from[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [next(v for v in frontier if start in edges.get(v, ()))]
        while path[-1] != start:
            path.append(came_from[path[-1]])
        cycles.append(path[::-1] + [start])
    return sorted(cycles)


def c_violations(src):
    """(kind, message, detail) for every upward include, folder without a layer and cycle of
    folders under src. detail: (includer, included) for upward includes, the cycle's folders
    for cycles, the folder for unknown ones."""
    out = []
    edges, example = {}, {}
    unknown = set()
    for rel, lineno, target in c_includes(src):
        a, b = _folder(rel), _folder(target)
        for f in (a, b):
            if f not in LAYERS and f not in unknown:
                unknown.add(f)
                out.append(("unknown", f"src/{f or '.'}: a folder with no layer; add it to LAYERS in {__file__}", f))
        if a not in LAYERS or b not in LAYERS:
            continue
        edges.setdefault(a, set()).add(b)
        example.setdefault((a, b), f"src/{rel}:{lineno} -> src/{target}")
        if LAYERS[b] > LAYERS[a]:
            why = f"{a} (layer {LAYERS[a]}) includes {b} (layer {LAYERS[b]}), a layer above it"
            out.append(("upward", f"src/{rel}:{lineno} -> src/{target}: {why}", (rel, target)))
    for cycle in _cycles(edges):
        steps = "; ".join(example[(cycle[k], cycle[k + 1])] for k in range(len(cycle) - 1))
        out.append(("cycle", f"folders include each other: {' -> '.join(cycle)} ({steps})", frozenset(cycle)))
    return out, sum(len(v) for v in edges.values())


def _type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(body):
    """Import statements that run when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from _module_level_imports(node.body)
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from _module_level_imports(node.body)
            yield from _module_level_imports(node.orelse)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            for part in (node.body, node.orelse, node.finalbody):
                yield from _module_level_imports(part)
            for h in node.handlers:
                yield from _module_level_imports(h.body)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from _module_level_imports(node.body)


def python_modules(pkg):
    """Module name -> (path, is_package) for every .py under the package directory pkg, and
    its extension modules (path None: nothing to read)."""
    root = os.path.basename(os.path.normpath(pkg))
    mods = {}
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".so", ".pyd")):  # built from C: imports nothing of the package
                parts = [root] + _rel(os.path.join(dirpath, fn.split(".")[0]), pkg).split("/")
                mods[".".join(parts)] = (None, False)
            if not fn.endswith(".py"):
                continue
            parts = [root] + _rel(os.path.join(dirpath, fn), pkg)[:-3].split("/")
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            mods[".".join(parts)] = (os.path.join(dirpath, fn), is_pkg)
    for ext in EXTENSIONS:
        mods.setdefault(f"{root}.{ext}", (None, False))
    return mods


def python_imports(pkg):
    """(module, line, imported module) for each module-level import of a module of the package."""
    mods = python_modules(pkg)
    found = []
    for name, (path, is_pkg) in mods.items():
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = name if is_pkg else name.rpartition(".")[0]
        for node in _module_level_imports(tree.body):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # `from P import x` reads module P.x when there is one, else an attribute of P
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:  # `import kiln.a.b` of a name that is not a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.append((name, node.lineno, t))
    return found, mods


def python_violations(pkg):
    imports, mods = python_imports(pkg)
    edges, example = {}, {}
    for name, lineno, target in imports:
        edges.setdefault(name, set()).add(target)
        example.setdefault((name, target), f"{os.path.relpath(mods[name][0])}:{lineno}")
    out = []
    for cycle in _cycles(edges):
        steps = "; ".join(f"{example[(cycle[k], cycle[k + 1])]} imports {cycle[k + 1]}" for k in range(len(cycle) - 1))
        out.append(("import-cycle", f"import cycle: {' -> '.join(cycle)} ({steps})", tuple(cycle)))
    return out, len(mods)


def main(argv=None):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.path.join(here, "src"), help="the C sources (default: src/)")
    ap.add_argument("--python", default=os.path.join(here, "python", "kiln"), help="the Python package directory")
    args = ap.parse_args(argv)
    c, nedges = c_violations(args.src)
    py, nmods = python_violations(args.python)
    if c or py:
        print(f"check_layers: {len(c) + len(py)} violations of the layering (see {os.path.relpath(__file__)}):")
        for _, message, _ in c + py:
            print("  " + message)
        return 1
    print(f"check_layers: ok ({len(LAYERS)} layers, {nedges} folder dependencies, {nmods} Python modules; "
          "no upward includes, no cycles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
