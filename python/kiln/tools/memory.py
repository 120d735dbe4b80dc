"""Memory reports of compiled functions: what the plan holds at its busiest step, and what the
allocator measures for one compiled call and for the same call run eagerly."""
from .. import _C


class MemoryReport:
    """arena_bytes: the planned intermediates' arena; output_bytes: the outputs one call allocates;
    planned_peak_bytes = arena + outputs; live_bytes: planned bytes live at the busiest step
    (peak_step of steps); buffers: those live there, largest first (dicts: bytes, dtype, shape, op,
    loc, value, offset). With the call's arguments also measured_peak_bytes (the allocator's peak
    over one compiled call, plus the arena it holds) and eager_peak_bytes (the allocator's peak
    over the same call run eagerly, grad off); else None. recompute: what recomputation did
    (sublinear_memory_config, Cell.recompute), a dict also read as report[key]: recompute ("none",
    "search" or "cell"), peak_before and peak_after (planned arena bytes without and with it),
    peak_hoisted (optimizer updates moved up, nothing recomputed), peak_greedy (the threshold
    search's best), recomputed_ops, extra_flops, checkpoints, candidates (plans scored), peak_bfs
    and peak_dfs (the graph planned in either exec_order) and constant_bytes."""

    def __init__(self, name, backend, plan, measured=None, eager=None, recompute=None):
        self.name, self.backend = name, backend
        self.arena_bytes, self.output_bytes = plan["arena_bytes"], plan["output_bytes"]
        self.live_bytes, self.peak_step, self.steps = plan["live_bytes"], plan["peak_step"], plan["steps"]
        self.buffers = plan["buffers"]
        self.planned_peak_bytes = self.arena_bytes + self.output_bytes
        self.measured_peak_bytes, self.eager_peak_bytes = measured, eager
        self.recompute = recompute or {}

    def __getitem__(self, key):
        return self.recompute[key]

    def __str__(self):
        lines = [f"memory of {self.name} ({self.backend}, {self.steps} steps)",
                 f"  arena          {self.arena_bytes:>14,} bytes  (planned intermediates; {self.live_bytes:,} "
                 f"live at step {self.peak_step})",
                 f"  outputs        {self.output_bytes:>14,} bytes  per call",
                 f"  planned peak   {self.planned_peak_bytes:>14,} bytes  (arena + outputs)"]
        if self.measured_peak_bytes is not None:
            lines.append(f"  measured peak  {self.measured_peak_bytes:>14,} bytes  (allocator: one compiled call "
                         "and the arena)")
        if self.eager_peak_bytes is not None:
            lines.append(f"  eager peak     {self.eager_peak_bytes:>14,} bytes  (allocator: the same call run eagerly)")
        if self.buffers:
            lines.append(f"  largest buffers live at step {self.peak_step}:")
            for b in self.buffers[:10]:
                shape = "[" + ",".join(map(str, b["shape"])) + "]"
                lines.append(f"    {b['bytes']:>12,} bytes  {b['dtype']}{shape:<16} {b['op']:<18} {b['loc'] or '?'}")
        r = self.recompute
        if r.get("recompute", "none") != "none":
            lines.append(f"  recompute ({r['recompute']}): arena {r['peak_before']:,} -> {r['peak_after']:,} bytes, "
                         f"{r['recomputed_ops']} ops recomputed, {r['extra_flops']:,} extra FLOPs")
        return "\n".join(lines)

    __repr__ = __str__


def _peak_of(run):
    """The allocator's peak bytes over run() above what was in use before it."""
    before = _C.memory_stats()[0]
    _C.reset_peak_memory()
    result = run()
    peak = _C.memory_stats()[1] - before
    del result
    return peak


def memory_report(f, *args, **kwargs):
    """The MemoryReport of f (kiln.jit function or kiln.trace) for these arguments (compiling
    them if needed; measured and eager peaks too), or for its last call (the plan only)."""
    exe, leaves, eager = f._memory_target(args, kwargs)
    plan = exe.memory_report()
    measured = eager_peak = None
    if leaves is not None:
        measured = _peak_of(lambda: exe(*leaves)) + exe.arena_bytes
        prev = _C.set_grad_enabled(False)
        try:
            eager_peak = _peak_of(eager)
        finally:
            _C.set_grad_enabled(prev)
    return MemoryReport(getattr(f, "__qualname__", "?"), exe.backend, plan, measured, eager_peak,
                        exe.recompute_report())
