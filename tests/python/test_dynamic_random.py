"""Randomized differential testing of dynamic shapes: seeded random straight-line programs over a
(batch, seq, 3) tensor and a (seq, 3) one, built from steps that read and use the symbolic sizes
(reshapes by products of them, narrow by halves, broadcast_to, reductions and softmax over symbolic
axes, a matmul against a fixed weight, flatten/unsqueeze), each compiled once with dynamic=True and
run over several shapes against eager execution (at O1 also against the instances made by
rebinding and optimizing per binding, where the recording was made symbolic and optimized once). A failure prints the program:
    PYTHONPATH=python:tests/python python3 -c "import test_dynamic_random as t; print(t.source(SEED))"
"""
import linecache
import random

import numpy as np
import pytest

import astgen
import kiln
from kiln import ops
from kiln.jit import dynamic

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


@pytest.mark.parametrize("seed", range(0, 24, 3))
def test_programs_optimized_once_agree_with_eager_and_with_rebinding(seed):
    """At O1 (fusion, cse, simplify, epilogues): an entry whose recording becomes symbolic is
    optimized once and instantiated per binding; each agrees with eager and with the instances made
    by rebinding and optimizing per binding (dynamic.symbolic_instances off)."""
    fn = program(seed)
    results = {}
    for once in (True, False):
        dynamic.symbolic_instances = once
        try:
            jf = kiln.jit(fn, dynamic=True, jit_level="O1")
            rng = np.random.default_rng(seed)
            got = []
            for b, s in SHAPES:
                x = kiln.Tensor(rng.standard_normal((b, s, 3)).astype(np.float32))
                y = kiln.Tensor(rng.standard_normal((s, 3)).astype(np.float32))
                out = jf(x, y)
                for g, w in zip(out, fn(x, y)):
                    np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-4, err_msg=source(seed))
                got.append([g.asnumpy() for g in out])
            info = jf.cache_info()
            assert info.compiles == 1 and info.instances == len(SHAPES) - 1, (info, source(seed))
            results[once] = (got, info.dynamic[0]["optimized_once"])
        finally:
            dynamic.symbolic_instances = True
    for a, b in zip(results[True][0], results[False][0]):
        for g, w in zip(a, b):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=source(seed))
    assert results[False][1] is None  # never asked for the symbolic recording


def test_narrow_by_halves_and_reshapes_by_products_are_optimized_once():
    def fn(x):
        h = ops.concat((ops.narrow(x, 1, 0, x.shape[1] // 2) * 2, ops.narrow(x, 1, x.shape[1] // 2,
                                                                                x.shape[1] - x.shape[1] // 2)), 1)
        h = ops.reshape(ops.softmax(ops.reshape(h, (x.shape[0] * x.shape[1], x.shape[2])), -1), x.shape)
        return ops.tanh(h + ops.broadcast_to(h.max(0, keepdims=True), h.shape))

    jf = kiln.jit(fn, dynamic=True, jit_level="O1")
    rng = np.random.default_rng(5)
    for shape in ((2, 5, 4), (3, 6, 4), (4, 3, 7), (2, 9, 2)):
        x = kiln.Tensor(rng.standard_normal(shape).astype(np.float32))
        np.testing.assert_allclose(jf(x).asnumpy(), fn(x).asnumpy(), rtol=1e-5, atol=1e-5)
    info = jf.cache_info()
    assert info.compiles == 1 and info.instances == 3, info
    assert info.dynamic[0]["optimized_once"] is True, info.dynamic


@pytest.mark.parametrize("seed", [30] + list(range(0, 48, 4)))
def test_ast_programs_with_control_flow_agree_with_eager_over_shapes(seed):
    """astgen's programs (tensor if/while, loops, early returns, a branch on x.shape[0] inside a
    loop body) with every size symbolic: right at every shape. Shape reads inside converted bodies
    specialize, so these may compile per shape; seed 30 once broke out of a loop on a shape baked
    into its body."""
    fn = astgen.program(seed)
    jf = kiln.jit(fn, dynamic=True)
    rng = np.random.default_rng(seed)
    for shape in ((2, 3), (4, 5), (3, 7), (2, 6)):
        x = kiln.tensor(rng.standard_normal(shape).astype(np.float32))
        for g, w in zip(jf(x), fn(x)):
            g = np.asarray(g.asnumpy() if isinstance(g, kiln.Tensor) else g, np.float64)
            w = np.asarray(w.asnumpy() if isinstance(w, kiln.Tensor) else w, np.float64)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=astgen.source(seed))


def test_cond_and_while_loop_graphs_compile_once_over_shapes():
    def fn(x):
        y = ops.cond(x.sum() > 0, lambda a: a * 2, lambda a: ops.tanh(a) - 1, (x,))
        _, z = ops.while_loop(lambda i, z: i < 3, lambda i, z: (i + 1, z * 0.5 + x),
                              (kiln.tensor(np.int64(0)), y))
        return z

    rng = np.random.default_rng(3)
    for mode in ("trace", "ast"):
        jf = kiln.jit(fn, dynamic=True, capture_mode=mode)
        for shape in ((2, 3), (4, 5), (3, 7)):
            for sign in (1, -1):
                x = kiln.tensor(sign * np.abs(rng.standard_normal(shape)).astype(np.float32))
                np.testing.assert_allclose(jf(x).asnumpy(), fn(x).asnumpy(), rtol=1e-5, atol=1e-6)
        info = jf.cache_info()
        assert info.compiles == 1 and info.instances == 2, (mode, info)
