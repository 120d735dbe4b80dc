"""Guards on the Python state a capture read, and the Python side effects it must not skip.

While kiln.jit captures a function, every frame of user code it enters is shown to a Recorder.
From the frame's bytecode (read once per code object) the recorder knows the globals, closure
variables and attribute chains (`self.scale`, `cfg.alpha`, `config.X`, `TABLE[0]`, and
`getattr(cfg, "opt", default)` with a constant name: an attribute absent at capture is guarded
absent; `type(obj).x` as `obj.__class__.x`; `globals()["X"]` as the global X; a module imported
inside the function, `import cfg; cfg.alpha`, from sys.modules) the code reads, the defaults a frame took, the function, arguments and keywords of a
functools.partial it reached, and guards each on the value it has: identity for tensors and objects (a tensor an
attribute makes anew at each read, `w.T`, by what it views: storage and layout), value for
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

The recorder itself is C (kiln._C.GuardRecorder, src/python/guard_recorder.c), reading each code
object's facts from the bytecode scanner kiln._C.code_facts (src/python/code_facts.c); this
module holds the policy's Python parts: which code is the user's and the SideEffect it reports.
"""
import os
import sys

from .. import _C
from . import ast_convert

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple({os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
_CONVERTIBLE_IN_PACKAGE = (os.path.join(_PACKAGE_DIR, "models.py"),)


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


class SideEffect(Exception):
    """A captured function changed Python state; carries what and where ("file:line")."""

    def __init__(self, what, filename, line):
        super().__init__(f"{what} at {filename}:{line}")
        self.what, self.filename, self.line = what, filename, line


def Recorder(top=None):
    """Collects guards and Python side effects while one capture runs (see the module's text):
    on_call(frame) for each frame of user code as it starts, add_cells(cells) for the Cells it
    called, then side_effect(cell_writes) and guard_set() -> (GuardSet, descriptions). top is the
    function captured: its closure cells are known without a search."""
    from ..nn.cell import Cell

    return _C.GuardRecorder(top, is_user_code, ast_convert.RT, Cell, SideEffect)
