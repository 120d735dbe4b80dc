"""Randomized differential tests over the ops real models use (modelops_gen.py): for each seed's
program, every capture mode (ast, bytecode, trace) at O0 / O1 kernel by kernel, O1 sunk and O2
agrees with eager on the tracing call and on a replay with new values, and leaves its inputs as
they were; for a third of the seeds, value_and_grad of the jitted function agrees with eager's;
with dynamic=1, calls at other sizes (every size one and two larger, then the first again) agree.

    KILN_MODELOPS_SEEDS=N   seeds 0..N-1 (default 60)
A failure prints the seed, the variant and the program. Print one with
    PYTHONPATH=python:tests/python python3 tests/python/modelops_gen.py SEED
"""
import os

import numpy as np
import pytest

import kiln

import modelops_gen

SEEDS = range(int(os.environ.get("KILN_MODELOPS_SEEDS", "60")))
GRAD_SEEDS = [s for s in SEEDS if s % 3 == 0]
# (capture_mode, jit_level, backend); native code for the sunk variants only every 4th seed
VARIANTS = [(mode, level, backend) for mode in ("ast", "bytecode", "trace")
            for level, backend in (("O0", "kbk"), ("O1", "kbk"), ("O1", "sink"), ("O2", "sink"))]
TOL = dict(rtol=2e-5, atol=2e-5)


def leaves(r):
    return [x for y in (r if isinstance(r, (tuple, list)) else (r,))
            for x in (leaves(y) if isinstance(y, (tuple, list)) else (y,))]


def check(prog, what, variant, got, expected):
    got, expected = leaves(got), leaves(expected)
    assert len(got) == len(expected), f"{variant} {what}: {len(got)} results, eager {len(expected)}\n{prog}"
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g.asnumpy()), np.asarray(e.asnumpy())
        assert g.shape == e.shape and g.dtype == e.dtype, \
            f"{variant} {what}: result {k} is {g.dtype}{g.shape}, eager {e.dtype}{e.shape}\n{prog}"
        np.testing.assert_allclose(g, e, err_msg=f"{variant} {what}: result {k}\n{prog}", **TOL)


def jitted(fn, variant, seed):
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


def interpreted(variant, seed):
    """Generated native code for sunk graphs on every 4th seed (a cold build costs tenths of a second)."""
    return variant[2] == "sink" and seed % 4 != 0


def run(seed, variant, monkeypatch, make_fn):
    prog = modelops_gen.generate(seed, grad_safe=make_fn is not None)
    if interpreted(variant, seed):
        monkeypatch.setenv("KILN_DISABLE_CODEGEN", "1")
    fn = prog.fn if make_fn is None else make_fn(prog)
    jf = jitted(fn, variant, seed)
    for k in (0, 1):
        arrays = prog.inputs(k)
        expected = fn(*[kiln.Tensor(a) for a in arrays])
        args = [kiln.Tensor(a) for a in arrays]
        got = jf(*args)
        check(prog, "tracing call" if k == 0 else "replay with new values", variant, got, expected)
        for a, t in zip(arrays, args):
            assert np.array_equal(a, t.asnumpy(), equal_nan=True), f"{variant}: an input was modified\n{prog}"
    info = jf.cache_info()  # compiled once and replayed: the comparison was not eager against eager
    assert (info.compiles, info.eager_calls, info.hits) == (1, 0, 1), f"{variant}: {info}\n{prog}"


@pytest.mark.parametrize("variant", VARIANTS, ids="-".join)
@pytest.mark.parametrize("seed", SEEDS)
def test_forward(seed, variant, monkeypatch):
    run(seed, variant, monkeypatch, None)


def value_and_grad_of(prog):
    n = len(prog.shapes)

    def loss(*xs):
        total = None
        for k, o in enumerate(leaves(prog.fn(*xs))):
            term = (o * (0.5 + 0.25 * k)).sum()
            total = term if total is None else total + term
        return total

    def vg(*xs):
        return kiln.value_and_grad(loss, grad_position=tuple(range(n)))(*xs)

    return vg


@pytest.mark.parametrize("variant", VARIANTS, ids="-".join)
@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_value_and_grad(seed, variant, monkeypatch):
    run(seed, variant, monkeypatch, value_and_grad_of)


def test_generator_covers_every_step():
    """Over the seeds run here, every step of the generator appears (none is dead weight)."""
    seen = set()
    for s in SEEDS:
        src = modelops_gen.generate(s).source
        seen |= {name for name, _, _ in modelops_gen.STEPS if f"# {name}\n" in src}
    missing = {name for name, _, _ in modelops_gen.STEPS} - seen
    assert not missing or len(SEEDS) < 60, f"steps never generated: {sorted(missing)}"


DYNAMIC_SEEDS = [s for s in SEEDS if s % 2 == 0]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[1:] in (("O0", "kbk"), ("O1", "sink"))], ids="-".join)
@pytest.mark.parametrize("seed", DYNAMIC_SEEDS)
def test_dynamic_sizes(seed, variant, monkeypatch):
    prog = modelops_gen.generate(seed)
    if interpreted(variant, seed):
        monkeypatch.setenv("KILN_DISABLE_CODEGEN", "1")
    mode, level, backend = variant
    jf = kiln.jit(prog.fn, capture_mode=mode, jit_level=level, backend=backend, dynamic=1)
    for k, grow in enumerate((0, 1, 2, 0)):
        arrays = prog.inputs(k, grow)
        expected = prog.fn(*[kiln.Tensor(a) for a in arrays])
        check(prog, f"call at sizes {[a.shape for a in arrays]}", variant, jf(*[kiln.Tensor(a) for a in arrays]),
              expected)
    assert jf.cache_info().eager_calls == 0, f"{variant}: {jf.cache_info()}\n{prog}"
