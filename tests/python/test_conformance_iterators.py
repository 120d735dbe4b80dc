"""Conformance: one-pass iterators (map, filter, itertools objects, a user's iterator class, an
iterator argument) alive at a graph break. Bytecode capture used to keep such an iterator in a
graph's state by identity: every call after the first got it back exhausted, as the capture left it,
and computed with nothing (a sum of 0). And a capture that consumed an iterator a Python step had
made, then gave up, finished the call in Python from a state whose iterator was already used up.
Each case runs eagerly and in every variant over calls with new values; the appends to LOG are the
side effects that split the function."""
import itertools

import numpy as np

import kiln
from conformance import Call, VARIANTS, rand, run_all_modes

LOG = []


def _calls():
    return [Call((rand(2, 3, seed=s),)) for s in (1, 2, 3)]


def _run(fn):
    run_all_modes(fn, *_calls(), reset=LOG.clear, observe=lambda: list(LOG), variants=VARIANTS)


class Countdown:
    """A user's iterator class."""

    def __init__(self, items):
        self.items = list(items)

    def __iter__(self):
        return self

    def __next__(self):
        if not self.items:
            raise StopIteration
        return self.items.pop()


def test_map_alive_across_a_break():
    def f(x):
        m = map(lambda t: t * 2.0, [x, x + 1.0])
        LOG.append(len(LOG))
        return sum(v.sum() for v in m)

    _run(f)


def test_filter_alive_across_a_break():
    def f(x):
        kept = filter(lambda t: t is not None, [x, None, x * 3.0])
        LOG.append("filtered")
        out = x * 0.0
        for t in kept:
            out = out + t
        return out

    _run(f)


def test_itertools_made_at_a_break_then_consumed():
    """Returning the caller's dict makes the capture after the break give up (a compiled call would
    return a copy), after it consumed the chain: the call used to finish with an empty one."""
    def f(x, d):
        xs = [x, x * 2.0]
        LOG.append("chain")
        chained = list(itertools.chain(xs, xs))
        return len(chained), chained[-1] + 1.0, d

    calls = [Call((rand(2, 3, seed=s), {"a": s})) for s in (1, 2, 3)]
    run_all_modes(f, *calls, reset=LOG.clear, observe=lambda: list(LOG), variants=VARIANTS)


def test_islice_of_a_count_across_a_break():
    def f(x):
        steps = itertools.islice(itertools.count(1), 3)
        LOG.append("count")
        for k in steps:
            x = x * 0.5 + k
        return x

    _run(f)


def test_a_user_iterator_across_a_break():
    def f(x):
        it = Countdown([1.0, 2.0, 3.0])
        LOG.append("countdown")
        return sum(x * k for k in it)

    _run(f)


def test_an_iterator_argument():
    """(each run gets fresh iterators: the harness would hand one object to every variant)"""
    def f(x, it):
        first = next(it)
        LOG.append(first)
        return x * first + sum(it)

    xs = [rand(2, 3, seed=s) for s in (1, 2, 3)]
    want = []
    for k, x in enumerate(xs):
        LOG.clear()
        want.append((f(x, iter([1.0 + k, 2.0, 3.0])).asnumpy(), list(LOG)))
    for v in VARIANTS:
        jf = v.wrap(f)
        for k, x in enumerate(xs):
            LOG.clear()
            got = jf(x, iter([1.0 + k, 2.0, 3.0]))
            np.testing.assert_allclose(got.asnumpy(), want[k][0], rtol=1e-6, err_msg=f"{v.name} call {k}")
            assert LOG == want[k][1], (v.name, k, LOG)
