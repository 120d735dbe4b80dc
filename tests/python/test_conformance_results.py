"""Conformance: what a compiled call hands back, as the caller then uses it: a list, dict or set the
function reached through a global, a closure or a Cell's attribute and returned (eagerly that very
object: the caller's changes reach its owner), the same tensor returned twice, an input returned
unchanged, a view of an input, Python numbers computed from tensors."""
import itertools

import numpy as np

import kiln
from kiln import nn
from conformance import ENV, TRACE_VARIANTS, VARIANTS, Call, environment, rand, run_all_modes, t

ALL = VARIANTS + TRACE_VARIANTS


def used_by_the_caller(fn, calls, use, reset, observe):
    """[per call: observe() after the caller used fn's result with use(result)] for fn run eagerly
    and under every kiln.jit variant: {name: records}. (kiln.trace is left out: it rebuilds such a
    container too, and has no guard recorder to tell where it came from.)"""
    out = {}
    with environment(ENV):
        for variant in [None] + VARIANTS:
            reset()
            f = fn if variant is None else variant.wrap(fn)
            records = []
            for args in calls:
                use(f(*args))
                records.append(observe())
            out["eager" if variant is None else variant.name] = records
    reset()
    return out


def assert_as_eager(records):
    want = records.pop("eager")
    bad = {name: got for name, got in records.items() if got != want}
    assert not bad, f"eager: {want}\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())


STORE = {"rates": [1.0, 2.0]}


def test_global_list_returned_and_appended_to_by_the_caller():
    def f(x):
        rates = STORE["rates"]
        return x * rates[0], rates

    def reset():
        STORE["rates"] = [1.0, 2.0]

    def use(result):
        result[1].append(5.0)

    assert_as_eager(used_by_the_caller(f, [(t(1.0, 2.0),)] * 3, use, reset,
                                       lambda: list(STORE["rates"])))


def test_cell_attribute_list_and_dict_returned_and_changed_by_the_caller():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.names = ["a"]
            self.cfg = {"k": 2.0}

        def construct(self, x):
            return x * self.cfg["k"], self.names, self.cfg

    net = Net()

    def reset():
        net.names = ["a"]
        net.cfg = {"k": 2.0}

    def use(result):
        result[1].append("b")
        result[2]["k"] += 1.0

    results = []

    def f(x):
        out = net(x)
        results.append(out[0])
        return out

    def observe():
        return list(net.names), dict(net.cfg), results.pop().asnumpy().tolist()

    assert_as_eager(used_by_the_caller(f, [(t(1.0, 2.0),)] * 3, use, reset, observe))


def test_closure_dict_returned_inside_a_tuple():
    seen = {"n": 0}

    def f(x):
        return (x + seen["n"], [seen])

    def reset():
        seen.clear()
        seen["n"] = 0

    def use(result):
        result[1][0]["n"] += 1

    assert_as_eager(used_by_the_caller(f, [(t(1.0),)] * 3, use, reset, lambda: dict(seen)))


def test_list_built_inside_and_returned_still_compiles():
    # a list the function makes itself is the caller's alone: returning it keeps the call compiled
    def f(x):
        out = [x * 2, x + 1]
        return out

    with environment(ENV):
        for variant in VARIANTS:
            jf = variant.wrap(f)
            for i in range(3):
                r = jf(rand(3, seed=i))
                r.append(1)
                assert len(jf(rand(3, seed=i))) == 2, variant.name
            assert jf.cache_info().eager_calls == 0, variant.name


def test_same_tensor_twice_input_and_view_written_by_the_caller():
    def f(x):
        y = x * 2
        return y, y, y[1:], x, x[:2]

    def probe(fn):
        out = []
        for i in range(3):
            x = t(1.0, 2.0, 3.0)
            r = fn(x)
            r[0][0] = 10.0
            r[1].add_(1)
            r[4][1] = -5.0
            out.append([e.asnumpy().tolist() for e in r] + [x.asnumpy().tolist()])
        return out

    want = probe(f)
    with environment(ENV):
        for variant in ALL:
            assert probe(variant.wrap(f)) == want, variant.name


def test_python_numbers_computed_from_tensors():
    def f(x):
        s = x.sum()
        return float(s), int(x.argmax()), bool((x > 0).all()), x.mean().item(), len(x), x.shape[0] * 2

    run_all_modes(f, (t(1.5, 2.0, -1.0),), (t(-1.0, -2.0, -3.0),), (rand(5, seed=2),), variants=ALL)


def test_results_used_as_the_next_calls_arguments():
    def f(x, acc):
        acc = acc + x
        return acc, [acc * 2, x]

    def chain(fn):
        acc, out = t(0.0, 0.0), []
        for i in range(4):
            acc, extra = fn(rand(2, seed=i), acc)
            extra[0][0] = 100.0  # (a result written by the caller: no later call may see it)
            out.append(acc.asnumpy().tolist())
        return out

    want = chain(f)
    with environment(ENV):
        for variant in ALL:
            assert chain(variant.wrap(f)) == want, variant.name
    assert np.isfinite(want).all()


def test_lists_made_by_library_calls_returned():
    # lists the function makes with calls run as they are are its own: returned, they stay compiled
    # values (not taken for a global's list)
    def f(xs):
        joined = list(itertools.chain(xs, reversed(xs)))
        return joined[::2], len(joined), sorted(len(x) for x in xs), joined

    run_all_modes(f, ([rand(2), rand(2, seed=1), rand(2, seed=2)],), ([rand(3, seed=3), rand(3, seed=4)],),
                  variants=ALL)
