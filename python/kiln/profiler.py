"""Profiling: what ran, for how long, on which shapes, with how many FLOPs and bytes.

``with kiln.profiler.profile(path="trace.json") as prof:`` records every kernel kiln runs while it
is open (eager ops, compiled graphs kernel by kernel or sunk, control-flow bodies, on every
thread), every tensor allocation and every compile phase (capture, each pass, plan, prepare,
codegen with its cache hits and misses), through the C recorder (src/core/profile.h). At exit the
Chrome Trace Event JSON goes to ``path`` (Perfetto, chrome://tracing); ``prof.key_averages()``
is the per-op table. A compiled graph on the sink backend runs its steps interpreted while
recorded, so that each is timed.

``kiln.trace(fn, profiling=True)`` and ``kiln.jit(fn, profiling=True)`` (or ``JitConfig(profiling=True)``)
record every compiled call of that function; their ``get_profile()`` is MegEngine's dict
(``megengine_profile``), which ``python -m kiln.tools.profile_analyze`` reads.
"""
import contextlib
import os
import re
import threading

from . import _C

__all__ = ["profile", "KeyAverage", "KeyAverages", "CallRecorder", "CompilePhases", "megengine_profile",
           "parse_shape"]

_SHAPE = re.compile(r"^([a-z0-9_]+)\[([0-9,]*)\]$")


def parse_shape(text):
    """"float32[2,3]" -> ("float32", (2, 3))."""
    m = _SHAPE.match(text)
    if not m:
        raise ValueError(f"profiler: not a dtype[shape] text: {text!r}")
    return m.group(1), tuple(int(d) for d in m.group(2).split(",") if d)


# a kernel as key_averages reads it: ProfileLog.kernels()' tuples
_NAME, _INPUTS, _TID, _START, _END, _DEPTH, _FLOPS, _BYTES = range(8)


def _self_times(kernels):
    """Per kernel (by index): its duration less that of the kernels nested in it on its thread (a
    control-flow node's body, a fused group's interpreted kernels)."""
    self_ns = [k[_END] - k[_START] for k in kernels]
    by_thread = {}
    for i, k in enumerate(kernels):
        by_thread.setdefault(k[_TID], []).append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (kernels[i][_START], -kernels[i][_END], kernels[i][_DEPTH]))
        stack = []  # the kernels enclosing the current one, outermost first
        for i in idx:
            k = kernels[i]
            while stack and (kernels[stack[-1]][_DEPTH] >= k[_DEPTH] or kernels[stack[-1]][_END] < k[_END]):
                stack.pop()
            if stack:
                self_ns[stack[-1]] -= k[_END] - k[_START]
            stack.append(i)
    return self_ns


def _name_threads():
    """Gives the trace the names of Python's threads (those alive now)."""
    for t in threading.enumerate():
        if t.native_id is not None:
            _C.profile_name_thread(t.native_id, t.name)


class KeyAverage:
    """One row of key_averages: an op (and, grouped by shape, its input shapes)."""

    __slots__ = ("key", "input_shapes", "count", "total_ns", "self_ns", "flops", "bytes")

    def __init__(self, key, input_shapes):
        self.key, self.input_shapes = key, input_shapes
        self.count = self.total_ns = self.self_ns = self.flops = self.bytes = 0

    @property
    def total_time_ms(self):
        return self.total_ns / 1e6

    @property
    def self_time_ms(self):
        return self.self_ns / 1e6

    @property
    def gflops_per_s(self):
        return self.flops / self.self_ns if self.self_ns > 0 else 0.0  # FLOP/ns = GFLOP/s

    @property
    def gb_per_s(self):
        return self.bytes / self.self_ns if self.self_ns > 0 else 0.0

    def __repr__(self):
        return f"<KeyAverage {self.key} calls={self.count} total={self.total_time_ms:.3f}ms>"


class KeyAverages(list):
    """key_averages() rows, with PyTorch's table()."""

    def __init__(self, rows, wall_ns):
        super().__init__(rows)
        self.wall_ns = wall_ns

    _SORT = {"total": "total_ns", "self": "self_ns", "calls": "count", "count": "count", "flops": "flops",
             "cpu_time_total": "total_ns", "self_cpu_time_total": "self_ns"}

    def table(self, sort_by="self", row_limit=None):
        if sort_by not in self._SORT:
            raise ValueError(f"key_averages().table: sort_by must be one of {', '.join(map(repr, self._SORT))}, "
                             f"got {sort_by!r}")
        rows = sorted(self, key=lambda r: -getattr(r, self._SORT[sort_by]))[:row_limit]
        shapes = any(r.input_shapes for r in rows)
        width = max([len("op")] + [len(r.key) for r in rows])
        head = (f"{'op':<{width}}  {'calls':>6}  {'total ms':>10}  {'self ms':>10}  {'% wall':>7}  "
                f"{'GFLOP/s':>9}  {'GB/s':>8}" + ("  input shapes" if shapes else ""))
        lines = [head, "-" * len(head)]
        wall = self.wall_ns or 1
        for r in rows:
            lines.append(f"{r.key:<{width}}  {r.count:>6}  {r.total_time_ms:>10.3f}  {r.self_time_ms:>10.3f}  "
                         f"{100.0 * r.self_ns / wall:>6.1f}%  {r.gflops_per_s:>9.2f}  {r.gb_per_s:>8.2f}"
                         + (f"  {', '.join(r.input_shapes)}" if shapes else ""))
        lines.append(f"wall time {wall / 1e6:.3f} ms; self time of the ops listed "
                     f"{sum(r.self_ns for r in rows) / 1e6:.3f} ms")
        return "\n".join(lines)

    def __str__(self):
        return self.table()


def key_averages(events, wall_ns, group_by_input_shape=False):
    """The per-op table of events (dicts, as profile.events() gives them)."""
    return _key_averages([(e["name"], ";".join(e["inputs"]), e["tid"], e["start"], e["end"], e["depth"], e["flops"],
                           e["bytes_read"] + e["bytes_written"]) for e in events if e["kind"] == "kernel"],
                         wall_ns, group_by_input_shape)


def _key_averages(kernels, wall_ns, group_by_input_shape):
    self_ns = _self_times(kernels)
    rows = {}
    for k, own in zip(kernels, self_ns):
        shapes = tuple(k[_INPUTS].split(";")) if group_by_input_shape and k[_INPUTS] else ()
        row = rows.get((k[_NAME], shapes))
        if row is None:
            row = rows[(k[_NAME], shapes)] = KeyAverage(k[_NAME], shapes)
        row.count += 1
        row.total_ns += k[_END] - k[_START]
        row.self_ns += own
        row.flops += k[_FLOPS]
        row.bytes += k[_BYTES]
    return KeyAverages(rows.values(), wall_ns)


class profile:
    """Records what kiln runs while open (see the module docstring).

    path: where the Chrome Trace JSON is written at exit (None: only on export_chrome_trace).
    record_shapes: keep the input/output shapes of each kernel (in events, the trace and
    key_averages(group_by_input_shape=True)). profile_memory: keep the allocation events (the
    trace's memory counter track, peak_memory_bytes). Profiles may be open on several threads at
    once; each sees the kernels of every thread, one track per thread.

    A closed profile keeps its events packed in C (kiln._C.ProfileLog: 80 bytes an event, texts
    interned), not as Python objects: events() makes the dicts when asked, and the trace JSON is
    streamed from C when written."""

    def __init__(self, path=None, record_shapes=True, profile_memory=True):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"profile: path must be a str or path-like, got {type(path).__name__}")
        self.path = None if path is None else os.fspath(path)
        self.record_shapes, self.profile_memory = bool(record_shapes), bool(profile_memory)
        self._mark = None
        self._log = None
        self.wall_ns = 0

    def __enter__(self):
        if self._mark is not None:
            raise RuntimeError("profile: already open")
        _name_threads()
        self._log = None
        self._mark = _C.profile_start()
        self._t0 = _C.profile_now()
        return self

    def __exit__(self, *exc):
        self.wall_ns = _C.profile_now() - self._t0
        _name_threads()  # those started meanwhile and still running
        try:
            log = _C.profile_take(self._mark)
        finally:
            _C.profile_stop()
            self._mark = None
        self._log = log
        if self.path is not None:
            self.export_chrome_trace(self.path)
        return False

    def _closed(self, what):
        if self._log is None:
            raise RuntimeError(f"profile.{what}: the profile is still open (or was never entered)")
        return self._log

    def events(self):
        """The recorded events as dicts: kind ("kernel", "phase", "alloc"), source ("eager", "kbk",
        "sink", "compile", "memory"), name, op, node, tid, depth, start/end (ns), flops, bytes_read,
        bytes_written, bytes/in_use/peak (allocations), loc (file:line), inputs, outputs. Made
        from the packed events on each call."""
        log = self._closed("events")
        events = []
        for i in range(len(log)):
            e = log[i]
            if e["kind"] == "alloc" and not self.profile_memory:
                continue
            if not self.record_shapes:
                e["inputs"], e["outputs"] = [], []
            events.append(e)
        return events

    def key_averages(self, group_by_input_shape=False):
        """Per op (and, with group_by_input_shape, per input shapes): calls, total and self time,
        share of the wall time, GFLOP/s and GB/s; .table(sort_by=..., row_limit=...) prints it."""
        kernels = self._closed("key_averages").kernels()
        return _key_averages(kernels, self.wall_ns, group_by_input_shape and self.record_shapes)

    def export_chrome_trace(self, path):
        """Writes the Chrome Trace Event JSON of this profile to path (streamed from C)."""
        self._closed("export_chrome_trace").write_chrome(os.fspath(path), self.record_shapes, self.profile_memory)

    @property
    def nbytes(self):
        """Bytes the closed profile holds (its packed events and their texts)."""
        return self._closed("nbytes").nbytes

    @property
    def peak_memory_bytes(self):
        """The most bytes of tensor memory in use at once while the profile was open (profile_memory)."""
        return self._closed("peak_memory_bytes").peak_in_use() if self.profile_memory else 0


class CallRecorder:
    """The compiled calls of one trace / jitted function with profiling=True: every run's events."""

    def __init__(self):
        self.events = []
        self.runs = 0

    def run(self, fn, *args):
        """fn(*args), recorded as one compiled run."""
        mark = _C.profile_start()
        try:
            return fn(*args)
        finally:
            self.events.extend(e for e in _C.profile_events(mark) if e["kind"] != "alloc")
            self.runs += 1
            _C.profile_stop()

    def compile(self, fn, *args):
        """fn(*args) capturing and compiling (see capture_phase): its phases are kept."""
        mark = _C.profile_start()
        try:
            return fn(*args)
        finally:
            self.events.extend(e for e in _C.profile_events(mark) if e["kind"] == "phase")
            _C.profile_stop()

    def get_profile(self):
        if not self.runs:
            raise RuntimeError("get_profile: no compiled run recorded yet; call the function first")
        return megengine_profile([e for e in self.events if e["kind"] == "kernel" and e["source"] in ("kbk", "sink")],
                                 [e for e in self.events if e["kind"] == "phase"])


class CompilePhases:
    """The compile phases of one jitted function (kiln.jit.explain lists them): each capture and
    compile runs with a phase-only recorder session open (no kernel or allocation events, so the
    capture's eager run costs nothing more), and keeps the phases recorded on its thread, by name:
    how many, and their total time."""

    def __init__(self):
        self.by_name = {}  # phase name -> [count, total ns], in the order first met

    def record(self, fn, *args):
        """fn(*args), its phases kept."""
        mark = _C.profile_start_phases()
        try:
            return fn(*args)
        finally:
            try:
                tid = threading.get_native_id()
                for e in _C.profile_events(mark, "phase"):
                    if e["tid"] == tid:
                        got = self.by_name.setdefault(e["name"], [0, 0])
                        got[0] += 1
                        got[1] += e["end"] - e["start"]
            finally:
                _C.profile_stop_phases()

    def merged(self, others=()):
        """[(name, count, seconds)] of these phases and those of `others` (CompilePhases)."""
        total = {}
        for p in (self, *others):
            for name, (n, ns) in p.by_name.items():
                got = total.setdefault(name, [0, 0])
                got[0] += n
                got[1] += ns
        return [(name, n, ns / 1e9) for name, (n, ns) in total.items()]


def capture_phase(what, fn, *args):
    """fn(*args), recorded as the compile phase "capture" (around the passes, plan and codegen
    phases it contains) when a profile is open."""
    start = _C.profile_now()
    try:
        return fn(*args)
    finally:
        _C.profile_phase("capture", start, f"{what}: capture and compile")


def megengine_profile(kernels, phases=()):
    """MegEngine's get_profile() dict from kernel events of compiled graphs:
    {"graph_exec": {"operator": {id: {id, name, type, input, output}}, "var": {id: {id, name, shape,
    dtype}}}, "profiler": {"host": {id: {run: {start, kern, end}}}, "device": (the same: kiln's
    device is the CPU), "opr_footprint": {id: {computation, memory, in_shapes, out_shapes}}}}; times
    in seconds from the first kernel. kiln adds "kiln": {"phases": [...]}, the compile phases."""
    operators, var, host, footprint = {}, {}, {}, {}
    t0 = min((e["start"] for e in kernels), default=0)
    graphs = {}
    for e in kernels:
        gid = graphs.setdefault(e["graph"], len(graphs))
        oid = f"{gid}:{e['node']}"
        if oid not in operators:
            ins, outs = [], []
            for side, texts, ids in (("in", e["inputs"], ins), ("out", e["outputs"], outs)):
                for k, text in enumerate(texts):
                    dtype, shape = parse_shape(text)
                    vid = f"{oid}:{side}{k}"
                    var[vid] = {"id": vid, "name": f"{e['name']}:{side}{k}", "shape": list(shape), "dtype": dtype}
                    ids.append(vid)
            name = e["name"] + (f" ({e['loc']})" if e["loc"] else "")
            operators[oid] = {"id": oid, "name": name, "type": e["name"] if e["op"] < 0 else _op_type(e),
                              "input": ins, "output": outs, "loc": e["loc"]}
            footprint[oid] = {"computation": e["flops"], "memory": e["bytes_read"] + e["bytes_written"],
                              "in_shapes": [list(parse_shape(t)[1]) for t in e["inputs"]],
                              "out_shapes": [list(parse_shape(t)[1]) for t in e["outputs"]], "in_layouts": None}
        runs = host.setdefault(oid, {})
        start, end = (e["start"] - t0) / 1e9, (e["end"] - t0) / 1e9
        runs[f"run{len(runs)}"] = {"start": start, "kern": end, "end": end}
    device = {oid: {run: dict(t) for run, t in runs.items()} for oid, runs in host.items()}
    return {"graph_exec": {"operator": operators, "var": var},
            "profiler": {"host": host, "device": device, "opr_footprint": footprint},
            "kiln": {"phases": [{"name": p["name"], "detail": p["loc"], "seconds": (p["end"] - p["start"]) / 1e9}
                                for p in phases]}}


def _op_type(e):
    """The operator type: the op, or "fused" for a fused group (its ops are in the name)."""
    return "fused" if e["name"].startswith("fused(") else e["name"]


@contextlib.contextmanager
def timed_phase(name, detail):
    """The block, recorded as the compile phase `name` when a profile is open."""
    start = _C.profile_now()
    try:
        yield
    finally:
        _C.profile_phase(name, start, detail)
