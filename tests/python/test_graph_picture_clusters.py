"""Graph pictures (kiln_graph_to_dot, kiln.tools.draw): a fused group's box holds its own ops only.
Graphviz puts every node an edge inside a cluster names into that cluster, so an edge from the
producer of a group's input written inside the group's cluster drew the producer in the box
(issue 27)."""
import re

import numpy as np

import kiln
from kiln import ops


def clusters_of(text):
    """{node id: the clusters (outermost first) it is declared in}, and the edges with the clusters
    each is written in."""
    stack, declared, edges = [], {}, []
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"subgraph (cluster_\w+) \{", s)
        if m:
            stack.append(m.group(1))
        elif s == "}":
            if stack:
                stack.pop()
        elif "->" in s:
            a, b = s.rstrip(";").split(" -> ")
            edges.append((a, b, tuple(stack)))
        else:
            m = re.match(r"(d\d+) \[", s)
            if m:
                declared[m.group(1)] = tuple(stack)
    return declared, edges


def check_no_node_pulled_into_a_cluster(text):
    declared, edges = clusters_of(text)
    for a, b, where in edges:
        for node in (a, b):
            home = declared[node]
            # the edge's cluster must be one the node is declared in (or above it)
            assert home[:len(where)] == where, (f"edge {a} -> {b} written in {where} pulls {node} "
                                                f"(declared in {home}) into it")


def producer_and_group(x, w):
    h = x @ w  # not fusable: drawn outside the group
    return ((h * 2.0 + 1.0).tanh() * h).exp()


def test_fused_group_inputs_are_drawn_outside_its_box():
    x = kiln.tensor(np.ones((4, 4), np.float32))
    w = kiln.tensor(np.ones((4, 4), np.float32))
    jf = kiln.jit(producer_and_group, jit_level="O1")
    jf(x, w)
    text = jf.graph_dot()
    assert 'label="fused group' in text
    check_no_node_pulled_into_a_cluster(text)
    declared, _ = clusters_of(text)
    matmul = [n for n, where in declared.items() if re.search(rf'{n} \[shape=box, label="matmul', text)]
    assert matmul and all(declared[n] == () for n in matmul)


def fused_in_a_branch(a):
    b = a @ a
    return ops.cond(b.sum() > 0, lambda v: (v.sin() + 1.0) * v, lambda v: v * 3.0, (b,))


def test_fused_group_inside_a_control_flow_body():
    x = kiln.tensor(np.ones((4, 4), np.float32))
    jf = kiln.jit(fused_in_a_branch, jit_level="O1")
    jf(x)
    text = jf.graph_dot()
    assert 'label="then"' in text
    check_no_node_pulled_into_a_cluster(text)
