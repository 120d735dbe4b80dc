"""Conformance, randomized: seeded random Python programs (pygen.py: containers, a closure,
builtins, and/or, nested control flow on tensor and Python conditions, side effects on a global
list) run eagerly and under every kiln.jit variant over calls with new values, other Python
arguments (taking other paths), items lists of other lengths and a new shape, and the same code
closed over another value; every compiled call must equal eager (result, LOG) or raise a clear
kiln error. Reproduce a seed's program with
    PYTHONPATH=python:tests/python python3 tests/python/pygen.py SEED"""
import pytest

import pygen
from conformance import Call, rand, run_all_modes

SEEDS = range(120)


def calls():
    x, y = rand(2, 3, seed=1), rand(2, 3, seed=2)
    return [(x, y, 0, True, [rand(2, 3, seed=3)]),
            (rand(2, 3, seed=4), rand(2, 3, seed=5), 0, True, [rand(2, 3, seed=6)]),
            (x * -2.0, y * 3.0, 2, False, [rand(2, 3, seed=7), rand(2, 3, seed=8)]),
            (rand(4, 3, seed=9), rand(4, 3, seed=10), 1, True, [])]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_program_agrees_with_eager(seed):
    fn = pygen.program(seed)
    try:
        run_all_modes(fn, *calls(), reset=pygen.LOG.clear, observe=lambda: list(pygen.LOG))
    except AssertionError as e:
        raise AssertionError(f"seed {seed}:\n{pygen.source(seed)}\n{e}") from None


@pytest.mark.parametrize("seed", SEEDS[::4])
def test_random_program_closure_made_again(seed):
    """The same code closed over another value (bytecode capture keeps pieces per code object)."""
    make = pygen.maker(seed)
    try:
        for scale in (0.75, -1.25):
            run_all_modes(make(scale), *calls()[:2], reset=pygen.LOG.clear, observe=lambda: list(pygen.LOG))
    except AssertionError as e:
        raise AssertionError(f"seed {seed}:\n{pygen.source(seed)}\n{e}") from None


@pytest.mark.parametrize("seed", range(40))
def test_random_program_handing_containers_out(seed):
    """pygen's programs that also hand their own list, dict and set to objects outside them (LOG,
    a global dict, an attribute) and change them afterwards: the outside objects must see every
    change, as eagerly (compared deep after each call)."""
    fn = pygen.program(seed, escapes=True)
    try:
        run_all_modes(fn, *calls(), reset=pygen.reset, observe=pygen.snapshot)
    except AssertionError as e:
        raise AssertionError(f"seed {seed} (escapes):\n{pygen.source(seed, True)}\n{e}") from None
