#!/usr/bin/env python3
"""Layers call downward only. Fails on

  C, includes: an #include of src/ that reaches a folder of a layer above the includer's, an
     include of a public header (include/kiln/) of a layer above it, and folders of src/ that
     include each other in a cycle;
  C, linked symbols (after the build): an object file of src/ that needs a symbol defined by an
     object file of a layer above its own (an upward call), and folders that call each other in a
     cycle;
  Python: an import cycle between the modules of the package (imports inside functions count),
     an import of a module of a layer above the importer's (PY_LAYERS), and an import of a
     private name of another module.

The C layers, lowest first (LAYERS below):

    core | comm -> ops -> autograd -> ir -> passes -> plan -> codegen | runtime -> python

comm, the communication layer (ranks, groups and collectives over a backend chosen by name,
src/comm/comm.h), is core's peer: it uses core (tensors, errors) and the collective ops' kernels
(src/ops/collective.c) call it; core never reaches comm (that would be a cycle).

autograd sits just above ops: the eager tape records the ops the dispatcher ran and runs their
gradient rules through kiln_apply, needing nothing of the graph IR; the tracer and the graph
(ir) come after it, so a traced backward or the gradient of a control-flow body (which traces
that body) may use autograd. The dispatcher (ops) and tensor release (core) reach the tape and
the tracer only through hooks those fill in (src/core/hooks.h). codegen and runtime are peers:
either may include the other, as long as they do not include (or call) each other (a cycle).

Public headers (include/kiln/, PUBLIC_HEADERS): each belongs to the layer of the types it
defines, and src/ may include it from that layer up:

    kiln/core.h, kiln/config.h    core      status, dtypes, tensors; the build and the CPU
    kiln/ops.h                    core      the op table (enum, attributes, per-op facts, what a
                                            gradient rule sees), read by every layer like ops.def
    kiln/autograd.h               autograd  the tape
    kiln/graph.h, kiln/model.h    ir        graphs, traces, model files
    kiln/passes.h                 passes    the passes and the pipeline
    kiln/sublinear.h              passes    recomputation (the checkpoint search of src/plan is
                                            declared here too)
    kiln/kiln.h                   -         the users' aggregate: the layer of the highest header
                                            it includes (plan), so src/ below it includes the
                                            specific headers instead

A public header declares functions of higher layers too (kiln/graph.h declares kiln_compile, a
runtime function); the linked-symbol check, not the include check, holds a layer to not call them.
src/ops/ops.def is the op table's data: every layer may include it.

Linked symbols: `nm` over the object files of the build (BUILD/**/src/<folder>/<file>.o, as
CMakeLists.txt's kiln_objects and _C targets leave them): an undefined global symbol of a file of
folder A that a file of folder B defines is a call from A to B. Without a build directory the
check says so and skips this part (scripts/test.sh runs it after the build: --build build).

Python: every import of a module of the package counts, at module level and inside functions
(a lazy import is still a dependency: it fails, or runs the other module's import, when the
function first runs), except those under `if TYPE_CHECKING:`. `from P import x` depends on module
P.x when there is one, else on P (x is an attribute P's import sets: `from .. import X` depends on
the whole package). Importing P.x counts as depending on P.x alone, though Python runs P's
__init__ first: kiln/__init__.py imports every layer at start-up, so the namespaces are loaded
before any of their modules is used. The package's modules have layers (PY_LAYERS, lowest first):

    base -> ops -> autograd -> ops namespace -> tensor -> cell -> jit -> nn -> library -> kiln
         -> programs

and a module imports only modules of its own layer or below (within a layer, without cycles).
Where a lower module needs a higher one at run time, the higher one registers itself at import
(kiln.hooks) or the shared piece moves down.

A private name is one that starts with "_" and is not a dunder. `from M import _x` where M is
another module of the package and M._x is not a module reaches into M's privates: a violation.
Modules named with an underscore (kiln._C, kiln._tensor, kiln.ops._util) are the package's own
modules, private to the package, not to a module: importing them is fine. `import m as _m`
renames in the importer and is fine.

    python3 tools/check_layers.py [--src DIR] [--include DIR] [--python DIR] [--build DIR]

Exit 0 with a one-line summary, or 1 with every violation (file:line -> what, why)."""
import argparse
import ast
import fnmatch
import os
import re
import subprocess
import sys

# src/<folder>: its layer. Folders at the same level are peers.
LAYERS = {
    "core": 0,
    "comm": 0,
    "ops": 1,
    "autograd": 2,
    "ir": 3,
    "passes": 4,
    "plan": 5,
    "codegen": 6,
    "runtime": 6,
    "python": 7,
}

# include/<path>: the folder of src/ whose layer it belongs to; None: an aggregate, whose layer is
# the highest of the public headers it includes.
PUBLIC_HEADERS = {
    "kiln/core.h": "core",
    "kiln/config.h": "core",
    "kiln/ops.h": "core",
    "kiln/op_attrs.h": "core",
    "kiln/autograd.h": "autograd",
    "kiln/graph.h": "ir",
    "kiln/model.h": "ir",
    "kiln/passes.h": "passes",
    "kiln/sublinear.h": "passes",
    "kiln/kiln.h": None,
}

# Files under src/ every layer may include (paths relative to src/).
API_FILES = {"ops/ops.def"}

# Where a quoted include is looked for after the includer's own folder, as the build does
# (CMakeLists.txt: include/ and src/ops on the path; the extension adds src/).
INCLUDE_DIRS = ("../include", ".", "ops")

# Modules of the package built from C (src/python is kiln._C): `from . import _C` imports
# the extension, not the package's __init__, whether or not it is built yet.
EXTENSIONS = {"_C"}

# The Python package whose modules PY_LAYERS places (other packages get the cycle and private-name
# checks only).
PY_PACKAGE = "kiln"

# Module name patterns (fnmatch; the longest matching pattern wins) -> layer, lowest first.
PY_LAYERS = {
    # the extension and what builds on it alone: the op table, grad mode, start-up hooks, the
    # flattening of arguments, settings, profiling and memory tools
    "kiln._C": 0, "kiln._optable": 0, "kiln.grad_mode": 0, "kiln.hooks": 0, "kiln.context": 0, "kiln.version": 0,
    "kiln.profiler": 0, "kiln.tools": 0, "kiln.tools.*": 0, "kiln.jit.tree": 0, "kiln.tree_util": 0,
    "kiln.jit.replay": 0, "kiln._gemm_cache": 0, "kiln.gemm_select": 0,
    "kiln.jit.options": 0, "kiln.jit.config": 0, "kiln.jit.sublinear_memory_config": 0,
    "kiln.jit.dtr_config": 0, "kiln.jit.graph_opt_config": 0,
    # the functions of the op table, one module per family
    "kiln.ops.*": 1,
    # the tape's functional API over them
    "kiln.autograd": 2, "kiln.grad_hooks": 2, "kiln.autodiff": 2, "kiln.recomputation": 2, "kiln.derivatives": 2,
    # kiln.ops: the functional namespace (the op modules and the autodiff functions)
    "kiln.ops": 3,
    # kiln.Tensor, whose methods are the namespace's functions
    "kiln._tensor": 4,
    "kiln._tensor_torch": 4,
    # kiln.zeros, kiln.cat, ...: the table of kiln.ops' names bound at the top level
    "kiln.toplevel": 4,
    # Cell, Parameter and initializers: what kiln.jit knows of networks
    "kiln.nn.cell": 5, "kiln.nn.parameter": 5, "kiln.nn.init": 5,
    # the data-parallel gradient all-reduce TrainOneStepCell makes in data-parallel mode
    "kiln.nn.grad_reduce": 5,
    # capture, compilation, kiln.trace, deployment
    "kiln.jit": 6, "kiln.jit.*": 6,
    # layers, losses, optimizers; the model zoo
    "kiln.nn": 7, "kiln.nn.*": 7, "kiln.models": 7,
    # checkpoints (serialization), data loading, the pytree alias and configuration reports
    "kiln.serialization": 8, "kiln.common": 8, "kiln.common.*": 8, "kiln.optim": 8, "kiln.dataset": 8, "kiln.dataset.*": 8, "kiln.tree": 8, "kiln.config": 8,
    # kiln.vmap and kiln.jacrev (ensembles of CellLists)
    "kiln.batching": 8,
    # communication across processes: MindSpore's kiln.communication, MegEngine's kiln.distributed
    "kiln.communication": 8, "kiln.distributed": 8, "kiln.distributed.*": 8,
    # mixed precision: MindSpore's and MegEngine's amp
    "kiln.amp": 8,
    # the package: imports everything
    "kiln": 9,
    # programs on the public package
    "kiln.__main__": 10, "kiln.bench": 10, "kiln.bench.*": 10,
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def _rel(path, root):
    return os.path.relpath(path, root).replace(os.sep, "/")


def _resolve(src, include, includer, name):
    """The file a quoted include names: a path under src/, "API:<path under include/>" for a
    public header, or None when it is not in the tree (a system or third-party header)."""
    bases = (os.path.dirname(includer), include) + tuple(os.path.join(src, d) for d in INCLUDE_DIRS[1:])
    for base in bases:
        path = os.path.normpath(os.path.join(base, name))
        if not os.path.isfile(path):
            continue
        if os.path.commonpath([os.path.abspath(path), os.path.abspath(include)]) == os.path.abspath(include):
            return "API:" + _rel(path, include)
        rel = _rel(path, src)
        return None if rel.startswith("../") else rel
    return None


def _folder(rel):
    return rel.split("/", 1)[0] if "/" in rel else ""


def _quoted_includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield lineno, m.group(1)


def _walk(root, exts):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            if fn.endswith(exts):
                yield os.path.join(dirpath, fn)


def c_includes(src, include):
    """Every quoted include of a .c/.h under src that lands in another folder of src or in the
    public headers: (includer, line, included), paths relative to src ("API:kiln/x.h" for a
    public header)."""
    found = []
    for path in _walk(src, (".c", ".h")):
        rel = _rel(path, src)
        for lineno, name in _quoted_includes(path):
            target = _resolve(src, include, path, name)
            if not target or target in API_FILES:
                continue
            if target.startswith("API:") or _folder(target) != _folder(rel):
                found.append((rel, lineno, target))
    return found


def public_header_layers(include):
    """(public header -> layer, violations): each header's layer from PUBLIC_HEADERS (an
    aggregate's the highest of what it includes), and a violation for a header with no layer and
    for a header that includes one of a higher layer."""
    layers, out, includes = {}, [], {}
    for path in _walk(include, (".h",)):
        rel = _rel(path, include)
        includes[rel] = [(lineno, t[4:]) for lineno, name in _quoted_includes(path)
                         for t in [_resolve(os.path.join(include, "..", "src"), include, path, name)]
                         if t and t.startswith("API:")]
        if rel not in PUBLIC_HEADERS:
            out.append(("unknown", f"include/{rel}: a public header with no layer; add it to PUBLIC_HEADERS in "
                        f"{__file__}", rel))
        elif PUBLIC_HEADERS[rel] is not None:
            layers[rel] = LAYERS[PUBLIC_HEADERS[rel]]
    for rel, incs in includes.items():
        if rel in PUBLIC_HEADERS and PUBLIC_HEADERS[rel] is None:
            layers[rel] = max([layers.get(t, 0) for _, t in incs] or [0])
    for rel, incs in includes.items():
        for lineno, t in incs:
            if rel in layers and t in layers and PUBLIC_HEADERS.get(rel) is not None and layers[t] > layers[rel]:
                out.append(("upward", f"include/{rel}:{lineno} -> include/{t}: {PUBLIC_HEADERS[rel]} header "
                            f"(layer {layers[rel]}) includes a header of layer {layers[t]}", (rel, t)))
    return layers, out


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


def _check_folder(f, unknown, out, where):
    if f not in LAYERS and f not in unknown:
        unknown.add(f)
        out.append(("unknown", f"src/{f or '.'}: a folder with no layer; add it to LAYERS in {__file__} ({where})", f))


def c_violations(src, include=None):
    """(kind, message, detail) for every upward include, folder without a layer and cycle of
    folders under src. detail: (includer, included) for upward includes, the cycle's folders
    for cycles, the folder for unknown ones."""
    include = include or os.path.join(src, "..", "include")
    headers, out = public_header_layers(include) if os.path.isdir(include) else ({}, [])
    edges, example = {}, {}
    unknown = set()
    for rel, lineno, target in c_includes(src, include):
        a = _folder(rel)
        _check_folder(a, unknown, out, f"src/{rel}")
        if a not in LAYERS:
            continue
        if target.startswith("API:"):
            header = target[4:]
            if header in headers and headers[header] > LAYERS[a]:
                why = (f"{a} (layer {LAYERS[a]}) includes a public header of layer {headers[header]}"
                       + (", the users' aggregate: include the specific headers" if PUBLIC_HEADERS[header] is None else ""))
                out.append(("upward", f"src/{rel}:{lineno} -> include/{header}: {why}", (rel, target)))
            continue
        b = _folder(target)
        _check_folder(b, unknown, out, f"src/{rel}:{lineno}")
        if b not in LAYERS:
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


# ---- linked symbols --------------------------------------------------------------------------

OBJECT = re.compile(r"(?:^|/)src/([^/]+)/([^/]+?)(?:\.c)?\.o$")


def object_files(build):
    """src-relative source name ("ops/dispatch.c") -> object file, for the objects of src/ under
    build (the first one found when a source is built for several targets)."""
    found = {}
    for path in _walk(build, (".o",)):
        m = OBJECT.search(_rel(path, build))
        if m:
            found.setdefault(f"{m.group(1)}/{m.group(2)}.c", path)
    return found


def object_symbols(objects):
    """(defined, needed): global symbol -> the sources defining it; source -> its undefined
    symbols. objects: as object_files gives them."""
    defined, needed = {}, {}
    by_path = {path: name for name, path in objects.items()}
    paths = sorted(by_path)
    for k in range(0, len(paths), 200):
        p = subprocess.run(["nm", "-P", "-A", "-g", *paths[k:k + 200]], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"nm failed: {p.stderr.strip()}")
        for line in p.stdout.splitlines():
            path, _, rest = line.rpartition(": ")
            fields = rest.split()
            if path not in by_path or len(fields) < 2:
                continue
            name, kind = fields[0], fields[1]
            src = by_path[path]
            if kind in "Uw":
                needed.setdefault(src, set()).add(name)
            else:
                defined.setdefault(name, set()).add(src)
    return defined, needed


def symbol_violations(build):
    """(kind, message, detail) for every upward call and cycle of folders calling each other, by the
    symbols the object files under build define and need; (violations, number of calls between
    folders) or (None, reason) when there are no objects to read."""
    if not build or not os.path.isdir(build):
        return None, f"no build directory at {build}"
    objects = object_files(build)
    if not objects:
        return None, f"no object files of src/ under {build}"
    defined, needed = object_symbols(objects)
    out, edges, example, unknown = [], {}, {}, set()
    for src in sorted(needed):
        a = _folder(src)
        _check_folder(a, unknown, out, f"src/{src}")
        for sym in sorted(needed[src]):
            for where in sorted(defined.get(sym, ())):
                b = _folder(where)
                if b == a:
                    continue
                _check_folder(b, unknown, out, f"src/{where}")
                if a not in LAYERS or b not in LAYERS:
                    continue
                edges.setdefault(a, set()).add(b)
                example.setdefault((a, b), f"src/{src} calls {sym} (src/{where})")
                if LAYERS[b] > LAYERS[a]:
                    why = f"{a} (layer {LAYERS[a]}) calls {b} (layer {LAYERS[b]}), a layer above it"
                    out.append(("upward-call", f"src/{src} needs {sym}, defined in src/{where}: {why}", (src, sym, where)))
    for cycle in _cycles(edges):
        steps = "; ".join(example[(cycle[k], cycle[k + 1])] for k in range(len(cycle) - 1))
        out.append(("call-cycle", f"folders call each other: {' -> '.join(cycle)} ({steps})", frozenset(cycle)))
    return out, sum(len(v) for v in edges.values())


# ---- Python ----------------------------------------------------------------------------------


def _type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node):
    """Every import statement under node (inside functions and classes too), but those under
    `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _type_checking(child.test):
            for part in child.orelse:
                yield from _imports_in(part)
        else:
            yield from _imports(child)


def _imports_in(node):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def python_modules(pkg):
    """Module name -> (path, is_package) for every .py under the package directory pkg, and
    its extension modules (path None: nothing to read)."""
    root = os.path.basename(os.path.normpath(pkg))
    mods = {}
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            # built from C: imports nothing of the package (lib*.so: a plain library kiln dlopens
            # itself, such as the mpi communication backend, not a module)
            if fn.endswith((".so", ".pyd")) and not fn.startswith("lib"):
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
    """((module, line, imported module) for each import of a module of the package,
    (module, line, from module, private name) for each import of a private name, modules)."""
    mods = python_modules(pkg)
    found, private = [], []
    for name, (path, is_pkg) in mods.items():
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = name if is_pkg else name.rpartition(".")[0]
        for node in _imports(tree):
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
                for a in node.names:
                    if base in mods and base != name and f"{base}.{a.name}" not in mods and _is_private(a.name):
                        private.append((name, node.lineno, base, a.name))
            for t in targets:
                while t and t not in mods:  # `import kiln.a.b` of a name that is not a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.append((name, node.lineno, t))
    return found, private, mods


def python_layer(module):
    """The layer PY_LAYERS gives module (its longest matching pattern), or None."""
    best = None
    for pattern, layer in PY_LAYERS.items():
        if fnmatch.fnmatchcase(module, pattern) and (best is None or len(pattern) > len(best[0])):
            best = (pattern, layer)
    return None if best is None else best[1]


def python_violations(pkg):
    imports, private, mods = python_imports(pkg)
    layered = os.path.basename(os.path.normpath(pkg)) == PY_PACKAGE
    out = []

    def where(name, lineno):
        return f"{os.path.relpath(mods[name][0])}:{lineno}"

    if layered:
        for name in sorted(mods):
            if python_layer(name) is None:
                out.append(("unknown-module", f"{name}: a module with no layer; add it to PY_LAYERS in {__file__}", name))
    edges, example = {}, {}
    for name, lineno, target in sorted(set(imports)):
        edges.setdefault(name, set()).add(target)
        example.setdefault((name, target), where(name, lineno))
        la, lb = (python_layer(name), python_layer(target)) if layered else (None, None)
        if la is not None and lb is not None and lb > la:
            out.append(("upward-import", f"{where(name, lineno)} imports {target}: {name} (layer {la}) imports a "
                        f"module of layer {lb}, a layer above it", (name, target)))
    for name, lineno, base, attr in private:
        out.append(("private-name", f"{where(name, lineno)} imports {attr} from {base}: a private name of another "
                    "module (make it public, or move it to the module that needs it)", (name, base, attr)))
    for cycle in _cycles(edges):
        steps = "; ".join(f"{example[(cycle[k], cycle[k + 1])]} imports {cycle[k + 1]}" for k in range(len(cycle) - 1))
        out.append(("import-cycle", f"import cycle: {' -> '.join(cycle)} ({steps})", tuple(cycle)))
    return out, len(mods)


def main(argv=None):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.path.join(here, "src"), help="the C sources (default: src/)")
    ap.add_argument("--include", default=None, help="the public headers (default: include/ beside --src)")
    ap.add_argument("--python", default=os.path.join(here, "python", "kiln"), help="the Python package directory")
    ap.add_argument("--build", default=os.path.join(here, "build"),
                    help="the build directory whose object files' symbols are checked (default: build/)")
    args = ap.parse_args(argv)
    c, nedges = c_violations(args.src, args.include)
    sym, ncalls = symbol_violations(args.build)
    py, nmods = python_violations(args.python)
    bad = c + (sym or []) + py
    if bad:
        print(f"check_layers: {len(bad)} violations of the layering (see {os.path.relpath(__file__)}):")
        for _, message, _ in bad:
            print("  " + message)
        if sym is None:
            print(f"  (linked symbols not checked: {ncalls})")
        return 1
    symbols = (f"{ncalls} calls between folders in the objects of {args.build}" if sym is not None
               else f"linked symbols not checked: {ncalls}")
    print(f"check_layers: ok ({len(LAYERS)} layers, {nedges} folder dependencies, {symbols}, {nmods} Python "
          "modules; no upward includes, calls or imports, no cycles, no private imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
