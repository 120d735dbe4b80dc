"""Randomized differential testing of dynamic shapes: seeded random straight-line programs over a
(batch, seq, 3) tensor and a (seq, 3) one, built from steps that read and use the symbolic sizes
(reshapes by products of them, narrow by halves, broadcast_to, reductions and softmax over symbolic
axes, a matmul against a fixed weight, flatten/unsqueeze), each compiled once with dynamic=True and
run over several shapes against eager execution. A failure prints the program:
    PYTHONPATH=python:tests/python python3 -c "import test_dynamic_random as t; print(t.source(SEED))"
"""
import linecache
import random

import numpy as np
import pytest

import kiln
from kiln import ops

STEPS = (
    "h = ops.tanh(h * {a} + {b})",
    "h = h + y * {a}",
    "h = h * ops.softmax(h, -1)",
    "h = h - h.mean(1, keepdims=True)",
    "h = ops.tanh(h + h.sum(0) * {a})",
    "h = ops.reshape(ops.reshape(h, (h.shape[0] * h.shape[1], 3)) * {a}, h.shape)",
    "h = ops.swapaxes(ops.swapaxes(h, 0, 1) * {a}, 0, 1)",
    "h = ops.concat((ops.narrow(h, 1, 0, h.shape[1] // 2) * {a}, ops.narrow(h, 1, h.shape[1] // 2, "
    "h.shape[1] - h.shape[1] // 2)), 1)",
    "h = ops.tanh(h @ W)",
    "h = ops.broadcast_to(h.max(0, keepdims=True), h.shape) * {a} + h",
    "h = ops.unsqueeze(h, 0).sum(0) * {a}",
    "h = ops.reshape(ops.flatten(h, 0, 1), h.shape) + {b}",
    "h = ops.softmax(h, 1) * h.shape[2]",
)
SHAPES = ((2, 5), (3, 6), (4, 7), (5, 2))


def source(seed):
    r = random.Random(seed)
    lines = ["def f(x, y):", "    h = x"]
    for _ in range(r.randint(3, 7)):
        lines.append("    " + r.choice(STEPS).format(a=f"{r.uniform(0.3, 1.2):.2f}", b=f"{r.uniform(-0.5, 0.5):.2f}"))
    lines.append("    return h, h.sum((0, 1))")
    return "\n".join(lines) + "\n"


def program(seed):
    text = source(seed)
    filename = f"<dynamic program {seed}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    w = np.random.default_rng(seed).standard_normal((3, 3)).astype(np.float32) * 0.5
    namespace = {"ops": ops, "W": kiln.Tensor(w)}
    exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - our own generated source
    return namespace["f"]


@pytest.mark.parametrize("seed", range(24))
def test_one_dynamic_compile_agrees_with_eager_over_shapes(seed):
    fn = program(seed)
    jf = kiln.jit(fn, dynamic=True)
    rng = np.random.default_rng(seed)
    for b, s in SHAPES:
        x = kiln.Tensor(rng.standard_normal((b, s, 3)).astype(np.float32))
        y = kiln.Tensor(rng.standard_normal((s, 3)).astype(np.float32))
        got, want = jf(x, y), fn(x, y)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-4, err_msg=source(seed))
    info = jf.cache_info()
    assert info.compiles == 1 and info.instances == len(SHAPES) - 1, (info, source(seed))
