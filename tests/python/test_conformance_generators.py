"""Conformance: generators and generator expressions under capture -- one kept in a name and run
later (it reads its free variables when it runs), one consumed by a builtin that stops early (any,
all, next: later values are never computed, their side effects and errors never happen), generator
functions with `yield from` consumed by builtins around a later graph break; each run eagerly and
under every kiln.jit variant and kiln.trace, over calls with new inputs."""
import contextlib

import kiln
from conformance import TRACE_VARIANTS, VARIANTS, Call, rand, run_all_modes

ALL = VARIANTS + TRACE_VARIANTS
LOG = []


def _scaled_rows(x, k):
    for i in range(x.shape[0]):
        if i % 2 == k % 2:
            yield x[i] * (i + k)
    yield x.sum()


def _chain(x, k):
    yield x
    yield from _scaled_rows(x, k)
    return  # the generator's end


def test_generator_function_with_yield_from_consumed_by_builtins():
    # (bytecode: the second generator's call restarted the capture with its scalar specialized,
    # after list() had run the first generator to its end: the capture saw it empty)
    def f(x, k):
        parts = list(_chain(x, k))
        total = sum(p.sum() for p in parts)
        first = next(iter(_scaled_rows(x, k)))
        return total, first, len(parts)

    run_all_modes(f, (rand(3, 2), 0), (rand(3, 2, seed=1), 1), (rand(4, 2, seed=2), 1), (rand(1, 2, seed=3), 0),
                  variants=ALL)


def test_generator_expression_reads_a_variable_changed_before_it_runs():
    def f(x):
        k = 1
        gen = (x * k for _ in range(2))
        k = 3  # a generator expression reads k when it runs, not when it is made
        return list(gen)

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), variants=ALL)


def test_generator_expression_kept_then_advanced_by_a_loop_that_breaks():
    def f(xs):
        gen = (LOG.append(x.shape[0]) or x * 2 for x in xs)
        out = []
        for v in gen:
            out.append(v)
            if len(out) == 2:
                break
        return out, next(gen, None) is None

    run_all_modes(f, ([rand(1), rand(2), rand(3), rand(4)],), ([rand(2), rand(3)],), reset=LOG.clear,
                  observe=lambda: list(LOG))


def _check(v):
    LOG.append(v.shape[0])
    return v.shape[0] > 1


def test_any_and_all_stop_at_the_deciding_value():
    def f(xs):
        a = any(_check(v) for v in xs)
        b = all(v.shape[0] < 3 for v in xs)
        return a, b, xs[0] * len(LOG)

    run_all_modes(f, ([rand(1), rand(2), rand(3)],), ([rand(2), rand(1)],), ([rand(1), rand(1)],),
                  reset=LOG.clear, observe=lambda: list(LOG))


def test_next_of_a_generator_expression_computes_only_the_first_value():
    def f(keys, d):
        return next(d[k] * 2 for k in keys if k in d or k == "z"), next((k for k in keys if k == "q"), "none")

    run_all_modes(f, (["a", "z"], {"a": rand(2)}), (["b", "a"], {"a": rand(2, seed=1), "b": rand(2, seed=2)}),
                  variants=ALL)


def test_sum_and_sorted_of_generator_expressions_stay_exact():
    def f(xs, w):
        return sum(x * w for x in xs), sorted((x.shape[0] for x in xs), reverse=True), "".join(str(i) for i in range(3))

    run_all_modes(f, ([rand(2), rand(2, seed=1)], 2.0), ([rand(2, seed=2)], -1.0), variants=ALL)


def test_grad_through_a_kept_generator_expression():
    def f(w, xs):
        k = 1.0
        gen = (x * w * k for x in xs)
        k = 3.0
        return sum(gen).sum()

    run_all_modes(f, (rand(3), [rand(3, seed=1), rand(3, seed=2)]), (rand(3, seed=3), [rand(3, seed=4)]),
                  around=lambda fn: kiln.value_and_grad(fn))


def test_grad_with_any_short_circuit_and_getattr_default():
    class Cfg:
        pass

    cfg = Cfg()

    def f(w, xs):
        scale = getattr(cfg, "scale", 1.0)
        if any(x.shape[0] > 2 for x in xs):
            scale = scale * 2
        return (w * scale).sum()

    def set_scale():
        cfg.scale = 5.0

    def reset():
        cfg.__dict__.pop("scale", None)

    run_all_modes(f, (rand(3), [rand(1), rand(3)]), Call((rand(3), [rand(1)]), before=set_scale),
                  (rand(3), [rand(4)]), reset=reset, around=lambda fn: kiln.value_and_grad(fn))


def _rows(x):
    for i in range(x.shape[0]):
        LOG.append(i)
        yield x[i] * (i + 1)


def test_generator_function_loop_that_breaks_early():
    # (bytecode: a loop over a generator, run in Python between graphs, took all its values first:
    # side effects of rows never reached)
    def f(x):
        out = []
        for r in _rows(x):
            out.append(r)
            if len(out) == 2:
                break
        return out, len(LOG)

    run_all_modes(f, (rand(4, 2),), (rand(3, 2),), (rand(5, 2),), reset=LOG.clear, observe=lambda: list(LOG),
                  variants=ALL)


def test_zip_of_a_generator_and_a_short_list():
    # (bytecode: zip advanced the generator inside the capture, which restarted: other values, silently)
    def f(x):
        pairs = list(zip([10.0, 20.0], _rows(x)))
        return [a * b for a, b in pairs]

    run_all_modes(f, (rand(4, 2),), (rand(3, 2),), reset=LOG.clear, observe=lambda: list(LOG), variants=ALL)


@contextlib.contextmanager
def _tag(name):
    LOG.append("in " + name)
    try:
        yield name
    finally:
        LOG.append("out " + name)


def test_return_and_break_from_inside_with_blocks_in_loops():
    def f(x, n):
        for i in range(n):
            with _tag(str(i)) as tag:
                x = x + len(tag)
                if i == 1:
                    break
        with _tag("r"):
            if n > 2:
                return x * 2
        return x

    run_all_modes(f, (rand(2), 1), (rand(2), 3), (rand(2), 2), reset=LOG.clear, observe=lambda: list(LOG),
                  variants=ALL)


def test_exception_raised_in_a_helper_caught_two_frames_up():
    def inner(d, k):
        return d[k]

    def middle(x, d, k):
        return x * inner(d, k)

    def f(x, d, k):
        try:
            y = middle(x, d, k)
        except KeyError as e:
            LOG.append(str(e))
            y = x
        return y

    run_all_modes(f, (rand(2), {"a": 2.0}, "a"), (rand(2), {"a": 2.0}, "b"), (rand(2), {"b": 3.0}, "b"),
                  reset=LOG.clear, observe=lambda: list(LOG), variants=ALL)


def test_generator_with_send_and_close_inside():
    def acc():
        total = 0.0
        while True:
            v = yield total
            if v is None:
                break
            total += v

    def f(x, vals):
        g = acc()
        next(g)
        for v in vals:
            s = g.send(v)
        g.close()
        return x * s

    run_all_modes(f, (rand(2), [1.0, 2.0]), (rand(2), [5.0]), variants=ALL)
