"""Running every jitted function eagerly, for debugging (jax.disable_jit, torch.compiler's
"force_eager" stance): KILN_DISABLE_JIT=1 in the environment when kiln is imported, or the
context manager kiln.disable_jit(). kiln.jit and kiln.trace functions then call the Python
function itself at every call: nothing is captured or compiled, and graphs compiled before are
kept for when the switch is off again."""
import contextlib
import os
import threading

from .. import _C

_lock = threading.Lock()
_depth = 0  # open disable_jit contexts (process-wide, as the C fast path's switch)
_from_env = os.environ.get("KILN_DISABLE_JIT", "").strip().lower() not in ("", "0", "false", "no", "off")


def jit_disabled():
    """Whether jitted functions run eagerly now (KILN_DISABLE_JIT or an open disable_jit)."""
    return _from_env or _depth > 0


def _sync():
    _C.JitDispatcher._set_all_disabled(jit_disabled())


class disable_jit(contextlib.ContextDecorator):
    """Context manager (or decorator): inside it, every kiln.jit / kiln.trace function runs its
    Python code eagerly. disable_jit(False) changes nothing (a switch to keep in code)."""

    def __init__(self, disable=True):
        if not isinstance(disable, bool):
            raise TypeError(f"disable_jit: expected True or False, got {disable!r}")
        self.disable = disable
        self._entered = []

    def __enter__(self):
        global _depth
        with _lock:
            self._entered.append(self.disable)
            if self.disable:
                _depth += 1
                _sync()
        return self

    def __exit__(self, *exc):
        global _depth
        with _lock:
            if self._entered.pop():
                _depth -= 1
                _sync()
        return False


_sync()
