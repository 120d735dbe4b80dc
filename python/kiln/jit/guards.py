"""Guards on the Python state a capture read, and the Python side effects it must not skip.

While kiln.jit captures a function, every frame of user code it enters is shown to a Recorder.
From the frame's bytecode (read once per code object) the recorder knows the globals, closure
variables and attribute chains (`self.scale`, `cfg.alpha`, `config.X`, `TABLE[0]`) the code
reads, and guards each on the value it has: identity for tensors and objects, value for
numbers, strings, bools and tuples of them, function and self for bound methods; a Cell is also
guarded on its state version, bumped by every attribute write. The guards become a
kiln._C.GuardSet, checked in C before a compiled graph serves a call: a change means the graph
no longer computes what the function would, so the function is captured again.

A Python side effect of the captured function would run once, at capture, and never again: a
write to a global or to a closure variable (nonlocal), an attribute write on a Cell, a change of
a list, dict, set or object the function reached through a global, a closure or an argument
(`history.append(loss)`, `cfg.count += 1`), and in trace capture a print() of Python values.
The recorder finds them (the bytecode for global and nonlocal writes; the Cell write log; a
shallow snapshot of each reached container or object taken when the frame starts, compared when
the capture ends) and reports the first with the statement's line.
"""
import builtins
import dis
import gc
import os
import sys
import types
import weakref

from .. import _C
from . import ast_convert

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple({os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
_CONVERTIBLE_IN_PACKAGE = (os.path.join(_PACKAGE_DIR, "models.py"),)

IDENTITY, VALUE, ABSENT, METHOD, VERSION = (_C.GUARD_IDENTITY, _C.GUARD_VALUE, _C.GUARD_ABSENT, _C.GUARD_METHOD,
                                            _C.GUARD_VERSION)

_MUTATORS = frozenset(("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update",
                       "setdefault", "popitem", "add", "discard", "difference_update", "intersection_update",
                       "symmetric_difference_update", "__setitem__", "__delitem__", "__iadd__"))
_CONVERTER_BUILTINS = frozenset(("locals",))  # builtins that ast conversion adds to code
_LOADS = frozenset(("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FAST"))


def is_user_code(code):
    """Whether code is the user's (not kiln itself, the standard library or installed packages)."""
    name = code.co_filename
    if name.startswith("<"):
        return not name.startswith("<frozen")
    filename = os.path.abspath(name)
    if filename.startswith(_PACKAGE_DIR + os.sep):
        return filename in _CONVERTIBLE_IN_PACKAGE
    in_library = filename.startswith(tuple(d + os.sep for d in _LIBRARY_DIRS)) and (
        "site-packages" in filename or "dist-packages" in filename or os.sep + "lib" + os.sep + "python" in filename)
    return not in_library


class _CodeFacts:
    """What one code object reads and writes, from its bytecode."""

    __slots__ = ("globals", "freevars", "chains", "effects", "nested", "prints", "mutations", "converted")

    def __init__(self, code):
        self.converted = ast_convert.RT in code.co_freevars or ast_convert.RT in code.co_cellvars
        self.globals = set()
        self.freevars = set()
        self.chains = set()  # (root kind "global" | "deref" | "fast", root name, steps)
        self.effects = []  # (what, line): writes to globals and closure variables
        self.prints = []  # lines that load the builtin print
        self.mutations = []  # (what, line): statements that may change a container or an object
        self.nested = tuple(c for c in code.co_consts if isinstance(c, types.CodeType))
        nargs = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
        params = set(code.co_varnames[:nargs])
        instrs = list(dis.get_instructions(code))
        stored = {i.argval for i in instrs if i.opname in ("STORE_FAST", "DELETE_FAST")}
        params -= stored
        line = code.co_firstlineno
        for k, ins in enumerate(instrs):
            if ins.positions is not None and ins.positions.lineno is not None:
                line = ins.positions.lineno
            op = ins.opname
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                self.globals.add(ins.argval)
                if ins.argval == "print":
                    self.prints.append(line)
            elif op in ("LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_CLOSURE") and ins.argval in code.co_freevars:
                self.freevars.add(ins.argval)
            elif op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                self.effects.append((f"a write to the global {ins.argval!r}", line))
            elif op in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
                self.effects.append((f"a write to the closure variable {ins.argval!r} (nonlocal)", line))
            elif op in ("LOAD_METHOD", "LOAD_ATTR") and ins.argval in _MUTATORS:
                self.mutations.append((f".{ins.argval}(...)", line))
            elif op in ("STORE_ATTR", "DELETE_ATTR"):
                self.mutations.append((f"an assignment to attribute {ins.argval!r}", line))
            elif op in ("STORE_SUBSCR", "DELETE_SUBSCR"):
                self.mutations.append(("an item assignment", line))
            if op in _LOADS and (op != "LOAD_FAST" or ins.argval in params) and (
                    op not in ("LOAD_DEREF", "LOAD_CLASSDEREF") or ins.argval in code.co_freevars):
                steps = _chain_after(instrs, k + 1)
                if steps:
                    kind = "fast" if op == "LOAD_FAST" else ("deref" if "DEREF" in op else "global")
                    self.chains.add((kind, ins.argval, steps))


def _chain_after(instrs, k):
    """The attribute reads and constant subscripts that follow a load at instrs[k:]."""
    steps = []
    while k < len(instrs):
        ins = instrs[k]
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            steps.append(("attr", ins.argval))
            if ins.opname == "LOAD_METHOD":
                break
            k += 1
        elif (ins.opname == "LOAD_CONST" and k + 1 < len(instrs) and instrs[k + 1].opname == "BINARY_SUBSCR"
              and isinstance(ins.argval, (int, str))):
            steps.append(("item", ins.argval))
            k += 2
        else:
            break
    return tuple(steps)


_facts = weakref.WeakKeyDictionary() if hasattr(types.CodeType, "__weakref__") else {}


def code_facts(code):
    facts = _facts.get(code)
    if facts is None:
        facts = _facts[code] = _CodeFacts(code)
    return facts


def _is_tensor(x):
    return isinstance(x, _C.TensorBase)


def _mode_of(value):
    if _is_tensor(value):
        return IDENTITY
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return VALUE if type(value) in (bool, int, float, complex, str, bytes, type(None)) else IDENTITY
    if type(value) is tuple:
        return VALUE
    if isinstance(value, types.MethodType):
        return METHOD
    return IDENTITY


_SKIP_SNAPSHOT = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                  types.CodeType, weakref.ref, range, str, bytes, int, float, complex, bool, tuple, frozenset)


def _snapshot(obj):
    """A shallow copy of what a Python side effect would change in obj (None: nothing to watch)."""
    from ..nn import Cell

    if obj is None or isinstance(obj, _SKIP_SNAPSHOT) or _is_tensor(obj) or isinstance(obj, Cell):
        return None
    if type(obj).__module__.partition(".")[0] == "kiln":  # kiln's own objects (a jitted function's cache)
        return None
    if isinstance(obj, list):
        return ("list", tuple(obj))
    if isinstance(obj, dict):
        return ("dict", tuple(obj.items()))
    if isinstance(obj, set):
        return ("set", frozenset(obj))
    if isinstance(obj, bytearray):
        return ("bytes", bytes(obj))
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        return ("object", tuple(d.items()))
    return None


def _same_snapshot(a, b):
    if a[0] != b[0] or len(a[1]) != len(b[1]):
        return False
    if a[0] in ("set", "bytes"):
        return a[1] == b[1]
    if a[0] == "list":
        return all(x is y for x, y in zip(a[1], b[1]))
    return all(ka == kb and va is vb for (ka, va), (kb, vb) in zip(a[1], b[1]))


class SideEffect(Exception):
    """A captured function changed Python state; carries what and where ("file:line")."""

    def __init__(self, what, filename, line):
        super().__init__(f"{what} at {filename}:{line}")
        self.what, self.filename, self.line = what, filename, line


class Recorder:
    """Collects guards and Python side effects while one capture runs (see the module's text)."""

    def __init__(self, top=None):
        self.guards = {}  # (id(root), path) -> (root, path, expected, mode, description)
        self.watched = {}  # id(obj) -> (obj, snapshot, description, code that reached it)
        self.effects = []  # (what, filename, line)
        self.local_codes = set()  # code objects of functions defined while capturing
        self.top = top  # the function captured: its closure cells are known without a search
        self._functions_of = {}  # code -> the functions with that code (a search of the heap, once)

    # ---- while capturing ----------------------------------------------------------------
    def on_call(self, frame):
        code = frame.f_code
        if not is_user_code(code):  # (the functions ast conversion makes of branches and loop bodies are)
            return
        facts = code_facts(code)
        self.local_codes.update(facts.nested)
        for what, line in facts.effects:
            self.effects.append((what, code.co_filename, line))
        if not facts.converted:  # (converted code prints through the graph's print op)
            for line in facts.prints:
                if "print" not in frame.f_globals:
                    self.effects.append(("a print() (it would print only when the graph is captured)",
                                         code.co_filename, line))
        g = frame.f_globals
        for name in facts.globals:
            self._guard_global(g, name, code)
        closures = self._closures_of(code, frame) if facts.freevars else ()
        for cells in closures:
            for name in facts.freevars:
                cell = cells.get(name)
                if cell is not None and name != ast_convert.RT:  # (RT: the ast runtime, kiln's own)
                    self._guard_path(cell, (("cell",),), f"closure variable {name!r} of {code.co_qualname}", code)
            self._guard_chains(facts, frame, g, cells, code)
        if not closures:
            self._guard_chains(facts, frame, g, {}, code)

    def _guard_chains(self, facts, frame, g, cells, code):
        for kind, name, steps in facts.chains:
            if kind == "global":
                if name not in g:
                    continue
                root, path, what = g, (("item", name),) + steps, f"global {name}"
            elif kind == "deref":
                cell = cells.get(name)
                if cell is None or name == ast_convert.RT:
                    continue
                root, path, what = cell, (("cell",),) + steps, f"closure variable {name}"
            else:
                root = frame.f_locals.get(name)
                if root is None or _is_tensor(root):
                    continue
                self._watch(root, f"argument {name!r} of {code.co_qualname}", code)
                path, what = steps, name
            self._guard_path(root, path, what + "".join(f".{k}" if s == "attr" else f"[{k!r}]" for s, k in steps),
                             code)

    def _guard_global(self, g, name, code):
        if name in _CONVERTER_BUILTINS and code_facts(code).converted:
            return
        if name in g:
            self._guard_path(g, (("item", name),), f"global {name!r}", code)
        elif not hasattr(builtins, name):
            return  # a NameError when the code runs
        else:
            key = (id(g), (("item", name),))
            if key not in self.guards:
                self.guards[key] = (g, (("item", name),), None, ABSENT, f"global {name!r} (undefined: the builtin)")

    def _guard_path(self, root, path, description, code):
        """Guards each step of path from root on the object it reaches now: a chain of one-step
        guards, each rooted at the object the step before reached (whose identity that step
        guards), so most are items of a dict (a module's globals, an instance's __dict__), which
        the GuardSet skips while the dict is unchanged."""
        cur = root
        for k, step in enumerate(path):
            value = _walk(cur, (step,))
            if value is _MISSING:
                return
            last = k == len(path) - 1
            if step[0] == "attr" and _plain_attribute(cur, step[1]):
                cur, step = cur.__dict__, ("item", step[1])
            self._guard_step(cur, step, value, description if last else f"{description} (a step of it)", code)
            cur = value

    def _guard_step(self, root, step, value, description, code):
        self._guard_step_only(root, step, value, description)
        self._watch(value, description, code)
        self._guard_cell_version(value)

    def _guard_cell_version(self, value):
        from ..nn import Cell

        if isinstance(value, Cell) and "_kiln_version" in value.__dict__:
            self._guard_step_only(value.__dict__, ("item", "_kiln_version"), value.__dict__["_kiln_version"],
                                  f"the attributes of {type(value).__name__} cell")

    def _guard_step_only(self, root, step, value, description):
        key = (id(root), step)
        if key not in self.guards:
            self.guards[key] = (root, (step,), value, _mode_of(value), description)

    def add_cells(self, cells):
        for c in cells:
            self._guard_cell_version(c)
            self._guard_step_only(c.__dict__, ("item", "training"), c.training,
                                  f"the training mode of {type(c).__name__} cell")

    def _watch(self, obj, description, code):
        if id(obj) in self.watched:
            return
        snap = _snapshot(obj)
        if snap is not None:
            self.watched[id(obj)] = (obj, snap, description, code)

    def _closures_of(self, code, frame):
        """The closures (name -> cell) of the functions that may be running code: those whose cells
        hold what the frame sees (several functions share a code object; all that match are
        guarded, which can only recompile more). None for functions defined while capturing:
        their free variables are locals of a captured frame, guarded there."""
        if code in self.local_codes:
            return ()
        top = self.top
        if isinstance(top, types.FunctionType) and top.__code__ is code:
            return [dict(zip(code.co_freevars, top.__closure__ or ()))]
        seen = frame.f_locals
        cached = self._functions_of.get(code)
        # a cached search may miss a function made since (converted lazily): search again then
        for funcs in ((cached, None) if cached is not None else (None,)):
            if funcs is None:
                funcs = self._functions_of[code] = [f for f in gc.get_referrers(code)
                                                    if isinstance(f, types.FunctionType) and f.__code__ is code]
            closures = [dict(zip(code.co_freevars, f.__closure__ or ())) for f in funcs]
            matching = [c for c in closures
                        if all(n not in seen or _cell_value(cell) is seen[n] for n, cell in c.items())]
            if matching:
                return matching
        return closures

    # ---- when the capture ends ----------------------------------------------------------
    def side_effect(self, cell_writes):
        """The first Python side effect of the capture, or None."""
        if self.effects:
            return SideEffect(*self.effects[0])
        for cell, name, loc in cell_writes:
            filename, _, line = loc.rpartition(":")
            return SideEffect(f"an assignment to attribute {name!r} of a {type(cell).__name__} cell", filename,
                              int(line) if line.isdigit() else 0)
        for obj, snap, description, code in self.watched.values():
            now = _snapshot(obj)
            if now is None or _same_snapshot(snap, now):
                continue
            facts = code_facts(code)
            what = f"a change of {description} (a {type(obj).__name__})"
            if facts.mutations:
                stmt, line = facts.mutations[0]
                return SideEffect(f"{what}: {stmt}", code.co_filename, line)
            return SideEffect(what, code.co_filename, code.co_firstlineno)
        return None

    def guard_set(self):
        """(the GuardSet, the description of each guard)."""
        items = list(self.guards.values())
        return _C.GuardSet([(r, p, e, m) for r, p, e, m, _ in items]), [d for *_, d in items]


_MISSING = object()


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # empty
        return _MISSING


def _plain_attribute(obj, name):
    """Whether obj.name is read from obj's instance __dict__ (no data descriptor on its type)."""
    d = getattr(obj, "__dict__", None)
    if not isinstance(d, dict) or name not in d or isinstance(obj, type):
        return False
    for klass in type(obj).__mro__:
        attr = klass.__dict__.get(name, _MISSING)
        if attr is not _MISSING:
            return not hasattr(type(attr), "__set__")
    return True


def _walk(root, path):
    cur = root
    try:
        for step in path:
            if step[0] == "cell":
                cur = cur.cell_contents
            elif step[0] == "item":
                cur = cur[step[1]]
            else:
                cur = getattr(cur, step[1])
    except (AttributeError, KeyError, IndexError, ValueError, TypeError):
        return _MISSING
    except Exception:  # a property that fails: not guarded (the function meets it itself)
        return _MISSING
    return cur
