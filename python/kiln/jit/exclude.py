"""MegEngine's exclude_from_trace: code whose ops run eagerly, unrecorded, while a function is
traced. Its results may feed the traced computation (MegEngine's own test flips a sign inside it on
odd calls), so a recording that excluded code is not replayed from the graph: kiln.trace returns
each call's own run (its Python runs every call, as verification runs it), kiln.jit runs such a
function eagerly, and kiln.trace(without_host=True), which runs no Python after recording,
refuses it."""
import contextlib
import threading

from .. import _C

_local = threading.local()


@contextlib.contextmanager
def exclude_from_trace():
    """Ops inside run eagerly and are not recorded into the trace being made."""
    token = _C.suspend_tracing()
    if token:
        _local.used = True
    try:
        yield
    finally:
        _C.resume_tracing(token)


class noting:
    """While a recording runs: whether exclude_from_trace was entered (`.used` after the block)."""

    def __enter__(self):
        self.prev = getattr(_local, "used", False)
        _local.used = False
        return self

    def __exit__(self, *exc):
        self.used = _local.used
        _local.used = self.prev or self.used
