"""kiln.jit.explain: what kiln.jit made of a function — graphs and their ops, graph breaks with
their reason and source line, the guards of each compiled entry, and each recompile with what
changed (the guard that failed, or the argument signature), the cost model's reason for each
fused attention op, how each compiled loop's gradient keeps its residuals, and the algorithm of
each convolution (direct, or Winograd: infer_boost, or the O1 pass conv_algorithm in training
graphs) — for every capture mode (ast and trace report their fallbacks to trace capture or eager execution)."""
import math
import re

from .. import _C

_WHILE_GRAD = re.compile(r"= while_grad\([^)]*\) \{([-0-9, ]*)\}(?:  # (.*))?")


class ExplainOutput:
    """The report of kiln.jit.explain / JitFunction.explain(); str() is the printed text."""

    def __init__(self, name, capture_mode, graphs, breaks, recompiles, fallback, recomputed=None, attention=None,
                 buckets=None, loop_gradients=(), phases=(), convolutions=()):
        self.name = name
        self.capture_mode = capture_mode
        self.graphs = graphs  # [(op count, guard descriptions)] per compiled graph
        self.graph_count = len(graphs)
        self.op_count = sum(n for n, _ in graphs)
        self.breaks = breaks  # [(reason, "file:line")]
        self.graph_break_count = len(breaks)
        self.recompiles = recompiles  # [what changed]
        self.fallback = fallback  # why the function (or a part of it) runs in Python, or None
        # per graph: what recomputation (kiln.recompute, Cell.recompute, SublinearMemoryConfig) did, or None
        self.recomputed = list(recomputed) if recomputed is not None else [None] * len(graphs)
        # per graph: a line per fused attention op, with the cost model's reason
        self.attention = list(attention) if attention is not None else [[] for _ in graphs]
        # per graph: its gradient buckets (the bucket_all_reduce pass's all_reduce_bucket nodes), or None
        self.buckets = list(buckets) if buckets is not None else [None] * len(graphs)
        # per compiled loop gradient (while_grad node) of this function and of kiln.grad of it: a dict
        # strategy ("stored" or "recomputed"), trips (0: unknown), residuals (per step),
        # bytes_per_step (-1: not measured), where ("file:line" or None)
        self.loop_gradients = list(loop_gradients)
        # the compile phases kiln's profiler recorded in its captures and compiles (kiln.profiler's
        # names: capture, record, gradient, split, each pass, plan, prepare, codegen, ...): per name
        # (name, how many, total seconds)
        self.phases = list(phases)
        # each convolution of the compiled graphs (gradient graphs included): a dict op, input
        # (its shape), algorithm ("direct" or "winograd F(4x4, 3x3)"), where ("file:line" or None),
        # dtype (of its result: "float32", or "bfloat16" / "float16" under amp)
        self.convolutions = list(convolutions)

    def __str__(self):
        lines = [f"kiln.jit.explain: {self.name} (capture_mode={self.capture_mode!r})",
                 f"  graphs: {self.graph_count}, ops: {self.op_count}, graph breaks: {self.graph_break_count}"]
        for k, (reason, where) in enumerate(self.breaks):
            lines.append(f"  break {k + 1}: {reason} at {where}")
        for k, (ops, guard_names) in enumerate(self.graphs):
            lines.append(f"  graph {k + 1}: {ops} ops, {len(guard_names)} guards")
            if self.recomputed[k]:
                lines.append(f"    {self.recomputed[k]}")
            lines.extend(f"    {a}" for a in self.attention[k])
            if self.buckets[k]:
                lines.append(f"    {self.buckets[k]}")
            lines.extend(f"    guard: {g}" for g in guard_names)
        for k, g in enumerate(self.loop_gradients):
            lines.append(f"  loop gradient {k + 1}: {_describe_loop(g)}")
        for k, c in enumerate(self.convolutions):
            where = f" at {c['where']}" if c["where"] else ""
            note = (f" ({_WINOGRAD_16BIT})" if c["algorithm"] == _WINOGRAD and c.get("dtype") in ("bfloat16", "float16")
                    else "")
            lines.append(f"  convolution {k + 1}: {c['op']} {c['input']}{where}: {c['algorithm']}{note}")
        for k, what in enumerate(self.recompiles):
            lines.append(f"  recompile {k + 1}: {what}")
        if self.fallback:
            lines.append(f"  runs in Python: {self.fallback}")
        if self.phases:
            lines.append("  compile phases (ms): " + ", ".join(
                f"{name} {seconds * 1e3:.1f}" + (f" ({n}x)" if n > 1 else "") for name, n, seconds in self.phases))
        return "\n".join(lines)

    __repr__ = __str__


def _describe_loop(g):
    where = f" at {g['where']}" if g["where"] else ""
    mb = g["bytes_per_step"] * g["trips"] / (1 << 20)
    if g["strategy"] == "stored":
        by = "by the loop itself" if g.get("single_forward") else "by a rerun of the loop"
        return (f"residuals stored {by} ({g['residuals']} per step, {g['bytes_per_step']:,} bytes x {g['trips']} "
                f"steps = {mb:.1f} MB){where}")
    if g["trips"] <= 0:
        why = "trip count unknown"
    elif g["bytes_per_step"] < 0:
        why = "loop_residual_budget 0, or sizes not static"
    elif g["bytes_per_step"] == 0:
        why = "the backward reads no value the body computes"
    else:
        why = f"{g['bytes_per_step']:,} bytes x {g['trips']} steps = {mb:.1f} MB over loop_residual_budget"
    return f"residuals recomputed from each step's carry ({why}){where}"


def _loop_gradients(texts):
    """The while_grad nodes of graph texts (attrs: cond, body, nout, backward, trips, nres,
    res_bytes, given; src/ops/ops.def). single_forward: the loop's forward node stored the
    residuals as it ran (no rerun of the loop in the gradient)."""
    found = []
    for text in texts:
        for m in _WHILE_GRAD.finditer(text or ""):
            a = [int(v) for v in m.group(1).replace(" ", "").split(",") if v]
            trips, nres, nbytes, given = (a[4:8] + [0, 0, -1, 0][len(a[4:8]):]) if len(a) >= 4 else (0, 0, -1, 0)
            found.append({"strategy": "stored" if nres > 0 else "recomputed", "trips": trips, "residuals": nres,
                          "bytes_per_step": nbytes, "single_forward": bool(given), "where": m.group(2)})
    return found


_CONV = re.compile(r"%\d+: ([a-z0-9]+)(\[[^\]]*\]) = (conv2d|conv2d_fused|conv2d_backward_input|conv2d_backward_weight)"
                   r"\(([^)]*)\)(?: \{([^}]*)\})?(?:  # (.*))?$")
_WINOGRAD = "winograd F(4x4, 3x3)"
# a 16-bit convolution with Winograd chosen (amp, issue 31): the fp32-compute fallback widens its
# operands and runs the float32 Winograd; oneDNN's bf16 primitives have no Winograd and run it direct
_WINOGRAD_16BIT = "16-bit: the fp32-compute fallback runs it; oneDNN's bf16 primitives run it direct"


def _convolutions(texts):
    """Each convolution of graph texts with its algorithm: conv2d_fused's i[13] and the backward
    ops' optional i[13] (src/ops/ops.def) say Winograd; anything else is direct. input: the
    shape of the op's first operand."""
    found = []
    for text in texts:
        body = (text or "").split("\nsubgraph")[0]
        shapes = dict(re.findall(r"(%\d+): [a-z0-9]+(\[[^\]]*\])", body))
        for line in body.splitlines():
            m = _CONV.search(line)
            if not m:
                continue
            dtype, op, operands = m.group(1), m.group(3), [o.strip() for o in m.group(4).split(",")]
            ints = [v.strip() for v in (m.group(5) or "").split(";")[0].split(",")]
            winograd = op != "conv2d" and len(ints) > 13 and ints[13] == "1"
            found.append({"op": op, "input": shapes.get(operands[0], "?"), "where": m.group(6), "dtype": dtype,
                          "algorithm": _WINOGRAD if winograd else "direct"})
    return found


def _grad_texts(jf):
    """The graph texts of kiln.grad / value_and_grad of jf (their forward-and-backward graphs)."""
    return [e.graph_text for v in getattr(jf, "_grad_variants", {}).values() for entries in v._entries.exact.values()
            for e in entries]


def _ops(graph_text):
    """The ops of a graph's text (not its captures: constants, parameters, captured tensors)."""
    rhs = [line.partition(" = ")[2] for line in graph_text.split("\nsubgraph")[0].splitlines()]
    return sum(1 for r in rhs if "(" in r and not r.startswith("constant("))


_VALUE = re.compile(r"%(\d+): ([a-z0-9]+)\[([^\]]*)\]")
_ATTENTION = re.compile(r"= attention\(([^)]*)\)(?: \{([^}]*)\})?(?:  # (.*))?$")


def _attention(graph_text):
    """A line per attention op of a graph's text: fused, where, and the cost model's reason
    (kiln._C.attention_choice on its operands' shapes, as the eager entry and the O1 pass
    fuse_attention decide)."""
    metas = {int(n): (dt, [int(x) for x in dims.split(", ") if x.strip().lstrip("-").isdigit()])
             for n, dt, dims in _VALUE.findall(graph_text)}
    backward = "attention_backward(" in graph_text
    notes = []
    for line in graph_text.split("\nsubgraph")[0].splitlines():
        m = _ATTENTION.search(line)
        if not m:
            continue
        operands = [int(x.strip().lstrip("%")) for x in m.group(1).split(",")]
        attrs = (m.group(2) or "").split(";")[0].strip()
        causal = attrs not in ("", "0")
        where = f" at {m.group(3)}" if m.group(3) else ""
        try:
            (dt, q), (_, k), (_, v) = (metas[o] for o in operands[:3])
            why = _C.attention_choice(math.prod(q[:-2]), q[-2], k[-2], q[-1], v[-1], dt, causal, len(operands) > 3,
                                      False, backward)[3]
        except (KeyError, ValueError, TypeError, IndexError):
            why = "shapes not known"
        notes.append(f"attention: fused{where} ({why})")
    return notes


def _dynamic_graph(graph_text, guard_names, d):
    """(op count, guards) of a dynamic entry (kiln.jit.dynamic.DynamicEntry): one graph for many
    sizes, with its symbols and shape guards after the guards on Python state."""
    info = d.describe()
    shapes = [f"size {name}: {what}" for name, what in info["symbols"].items()]
    shapes += [f"shapes: {g}" for g in info["guards"]]
    return _ops(graph_text), list(guard_names) + shapes


def _buckets(exe):
    """The gradient buckets of a compiled graph's plan (all_reduce_bucket nodes, or all_reduce_start
    with overlap), as a line, or None. Each says whether the plan laid its gradients out in the
    bucket's own memory (reduced in place) or the bucket packs them."""
    if exe is None or not hasattr(exe, "plan_str"):
        return None
    found = [(line.partition(op)[2].partition(")")[0], "{inputs in place}" in line)
             for line in exe.plan_str().splitlines() for op in ("all_reduce_bucket(", "all_reduce_start(") if op in line]
    if not found:
        return None
    overlapped = " started after their last gradient, waited for at the first use" if \
        "all_reduce_start(" in exe.plan_str() else ""
    return (f"{len(found)} gradient bucket{'s' if len(found) > 1 else ''} (one all-reduce each{overlapped}): "
            + "; ".join(f"{len(args.split(','))} tensors ({args}) {'in place' if in_place else 'packed'}"
                        for args, in_place in found))


def _recomputed(exe):
    """What recomputation did to a compiled graph, as a line, or None when it did not run."""
    r = exe.recompute_report() if exe is not None and hasattr(exe, "recompute_report") else {}
    mode = r.get("recompute", "none")
    if mode == "none":
        return None
    why = ("kiln.recompute / Cell.recompute" if mode == "cell" else "SublinearMemoryConfig")
    return (f"recompute ({why}): {r['recomputed_ops']} ops recomputed for the backward, {r['extra_flops']} extra "
            f"FLOPs; arena {r['peak_before']:,} -> {r['peak_after']:,} bytes")


def report(jf):
    """The ExplainOutput of a JitFunction after its calls."""
    mode = jf.options.capture_mode
    fallback = jf._eager_reason
    if mode == "bytecode":
        pieces = jf._pieces
        graphs, breaks, recompiles, recomputed, attention, buckets = [], [], [], [], [], []
        texts = []
        if pieces is not None:
            for entries in pieces.cache.values():
                graphs.extend((_ops(p.graph_text), list(p.guard_names)) for p in entries)
                attention.extend(_attention(p.graph_text) for p in entries)
                texts.extend(p.graph_text for p in entries)
                texts.extend(p.extra.grad.backward_text() for p in entries if p.extra.grad is not None)
                recomputed.extend(_recomputed(p.executable) for p in entries)
                buckets.extend(_buckets(p.executable) for p in entries)
            for entries in pieces.entries.dynamic.values():  # pieces captured with symbolic sizes
                graphs.extend(_dynamic_graph(p.graph_text, p.guard_names, p.dyn) for p in entries)
                attention.extend(_attention(p.graph_text) for p in entries)
                recomputed.extend(None for _ in entries)
                buckets.extend(None for _ in entries)
            breaks = list(pieces.breaks)
            recompiles = [f"the value of {g} changed" if g else "a guard failed" for _, g in pieces.recompiles]
            recompiles += pieces.new_signatures
            fallback = fallback or pieces.given_up
    else:
        exact = [e for entries in jf._entries.exact.values() for e in entries]
        graphs = [(_ops(e.graph_text), list(e.guard_names)) for e in exact]
        attention = [_attention(e.graph_text) for e in exact]
        texts = [e.graph_text for e in exact]
        recomputed = [_recomputed(e.executable) for e in exact]
        buckets = [_buckets(e.executable) for e in exact]
        for es in jf._entries.dynamic.values():  # dynamic shapes: one graph for many sizes, its symbols and shape guards
            graphs.extend(_dynamic_graph(e.graph_text, e.guard_names, e.dyn) for e in es)
            attention.extend(_attention(e.graph_text) for e in es)
            recomputed.extend(None for _ in es)
            buckets.extend(None for _ in es)
        breaks = []
        recompiles = list(jf._recompiles)
        if jf._ast_fallback is not None:
            fallback = (f"{jf._ast_fallback.msg}; captured by trace instead" if not fallback
                        else f"{fallback} (after: {jf._ast_fallback.msg})")
    loops = _loop_gradients(texts + _grad_texts(jf))
    convolutions = _convolutions(texts + _grad_texts(jf))
    phases = jf._phases.merged(v._phases for v in getattr(jf, "_grad_variants", {}).values())
    return ExplainOutput(jf.__qualname__, mode, graphs, breaks, recompiles, fallback, recomputed, attention, buckets,
                         loops, phases, convolutions)
