"""Whether a recording can be replayed: what a trace cannot capture faithfully (Python state read
at every call, a .grad written) is reported here by the code that meets it, in whatever layer, and
read by the capture that is running on this thread (kiln.jit.capture_core's Recording, for
kiln.jit's three capture modes and kiln.trace)."""
import threading

from .. import _C

_local = threading.local()


def mark_not_replayable(reason):
    """Called by code that a trace cannot capture faithfully (Python state read at every call):
    the function being traced is then run eagerly instead of compiled. While a bytecode piece is
    captured it raises at once (bytecode.Unsupported), before the code changes anything: that part
    of the call then runs in Python."""
    refuse = getattr(_local, "refuse", None)
    if refuse is not None:
        raise refuse(reason)
    reasons = getattr(_local, "not_replayable", None)
    if reasons is not None:
        reasons.append(reason)


class refusing_unreplayable:
    """While a bytecode piece is captured: mark_not_replayable (and a .grad written) raises `error`."""

    def __init__(self, error):
        self.error = error

    def __enter__(self):
        self.prev = getattr(_local, "refuse", None)
        _local.refuse = self.error

    def __exit__(self, *exc):
        _local.refuse = self.prev


def set_hooks_traced(flag):
    """Sets whether the recording starting on this thread records the ops of backward hooks into its
    graph (kiln.jit's trace and ast captures: their guard recorder sees the hooks' Python, guarding
    what it reads and finding its side effects); returns the setting it replaces."""
    prev = getattr(_local, "hooks_traced", False)
    _local.hooks_traced = flag
    return prev


def hooks_traced():
    """Whether a backward hook running now is recorded into the graph being captured (set_hooks_traced;
    never while a bytecode piece is captured, which refuses it instead: that part runs in Python)."""
    return getattr(_local, "hooks_traced", False) and getattr(_local, "refuse", None) is None


def grad_writes_replayed():
    """Whether the recording running on this thread replays the .grad assignments it sees."""
    return getattr(_local, "grad_writes", None) is not None and getattr(_local, "refuse", None) is None


def grad_written(tensor, value):
    if grad_writes_replayed():
        _local.grad_writes.writes.append((tensor, value))
    else:
        mark_not_replayable("an assignment to the .grad of a tensor (Python state a graph cannot set at later calls)")


def grad_read(tensor, value):
    """Python code read tensor.grad (value) while a graph is recorded. A gradient set outside the
    graph would be baked in as this call's tensor; a None read before any write of that .grad is
    noted, while writes are collected, as a condition of replaying them (grads_read_as_none)."""
    if value is None:
        log = getattr(_local, "grad_writes", None)
        if log is not None and all(t is not tensor for t, _ in log.writes) and \
                all(t is not tensor for t in log.read_as_none):
            log.read_as_none.append(tensor)
    elif not _C.traced_here(value):
        mark_not_replayable("a .grad read that was set outside the graph (the graph would keep this call's gradient)")


def read_by_kiln(root, key, description):
    """Called by kiln's own code that reads, while a graph may be recorded, a list or dict the user
    holds and may change in place between calls (an optimizer's per-step learning rates): root[key]
    (root a dict) is that container. The guard recorder follows the user's code only; the recording
    running on this thread guards the container's contents too, so a change captures again."""
    reads = getattr(_local, "kiln_reads", None)
    if reads is not None:
        reads.append((root, key, description))


def start_reasons():
    """Starts collecting the reasons the recording that begins on this thread cannot be replayed:
    (the list mark_not_replayable appends to, what end_reasons puts back). The containers kiln's
    code reads (read_by_kiln) are collected beside them, in kiln_reads()."""
    prev = (getattr(_local, "not_replayable", None), getattr(_local, "kiln_reads", None))
    _local.not_replayable = reasons = []
    _local.kiln_reads = []
    return reasons, prev


def kiln_reads():
    """The list of (root, key, description) of the containers read_by_kiln reports on this thread
    (started by start_reasons: the recording running now)."""
    return getattr(_local, "kiln_reads", None)


def end_reasons(prev):
    _local.not_replayable, reads = prev
    if reads is not None:  # (an enclosing recording read them too)
        reads.extend(getattr(_local, "kiln_reads", None) or ())
    _local.kiln_reads = reads


class collect_grad_writes:
    """While a recording runs: the (tensor, value) of each .grad assignment, in order, instead of
    running the function eagerly (kiln.trace sets them after each replay); and read_as_none, the
    tensors whose .grad the code found None before writing it (GradManager.backward then sets
    rather than accumulates: a replay holds only while they are None again)."""

    def __enter__(self):
        self.prev = getattr(_local, "grad_writes", None)
        self.writes, self.read_as_none = [], []
        _local.grad_writes = self
        return self

    def __exit__(self, *exc):
        _local.grad_writes = self.prev
