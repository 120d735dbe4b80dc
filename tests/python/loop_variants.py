"""The compiled variants the tests of kiln.ops' loops (test_loops_*.py) compare with eager: every
kiln.jit capture mode at jit levels O0/O1 (and O2 for the main checks) on the kbk and sink
backends, and kiln.trace; and the
check that a compiled graph holds the loop as ONE node."""
import re

import kiln

JIT_VARIANTS = [(mode, level, backend) for mode in ("ast", "bytecode", "trace") for level in ("O0", "O1")
                for backend in ("kbk", "sink")]
JIT_IDS = [f"{m}-{l}-{b}" for m, l, b in JIT_VARIANTS]
# O2 (sinks by default), each capture mode on each backend: the loop tests' main checks run here too
O2_VARIANTS = [(mode, "O2", backend) for mode in ("ast", "bytecode", "trace") for backend in ("kbk", "sink")]
O2_IDS = [f"{m}-O2-{b}" for m, _, b in O2_VARIANTS]


def jitted(fn, variant):
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


def top_level_ops(graph_text):
    """The op names of the nodes of a graph's text, its subgraphs (loop and branch bodies) left out."""
    main = graph_text.split("\nsubgraph")[0]
    return re.findall(r"= ([a-z_0-9]+)\(", main)


def assert_one_node(graph_text, *want):
    """The graph's control-flow nodes are exactly want (one op name: the loop or the switch; a
    gradient's graph: its forward `while` and its `while_grad`)."""
    loops = [o for o in top_level_ops(graph_text) if o in ("while", "if", "while_grad")]
    assert loops == list(want), (loops, graph_text)
