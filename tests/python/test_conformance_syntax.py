"""Conformance: Python syntax around tensor code that capture modes treat specially -- try/except,
with blocks, assert on tensors, del, the walrus operator, nested functions and lambdas made inside
the compiled function (closing over loop variables), generators, f-strings of sizes, and global
statements -- each compiled call agrees with eager or raises a clear kiln error."""
import kiln
from conformance import Call, rand, run_all_modes, t

TOTAL = 0.0


def test_try_except_on_python_index():
    def f(xs, i):
        try:
            y = xs[i] * 2
        except IndexError:
            y = xs[0] * 0
        return y

    run_all_modes(f, ([rand(2), rand(2, seed=1)], 1), ([rand(2), rand(2, seed=1)], 5), ([rand(2)], 0))


def test_assert_on_tensor_condition():
    def f(x):
        assert (x > -10).all(), "too small"
        return x * 2

    run_all_modes(f, (t(1.0, 2.0),), (t(3.0, -1.0),))


def test_assert_on_tensor_condition_failing_later():
    def f(x):
        assert x.min() > 0, "non-positive input"
        return x.log()

    run_all_modes(f, (t(1.0, 2.0),), (t(3.0, 5.0),), (t(-1.0, 2.0),), raises=True)


def test_del_and_walrus():
    def f(x):
        y = x * 2
        z = y + 1
        del y
        if (n := x.shape[0]) > 2:
            z = z * n
        return z, n

    run_all_modes(f, (rand(2),), (rand(3),), (rand(2, seed=1),))


def test_nested_functions_and_lambdas_over_loop_variables():
    def f(x):
        fns = []
        for k in range(3):
            fns.append(lambda v, k=k: v * (k + 1))

        def combine(a, b):
            return a + b * 0.5
        out = x
        for g in fns:
            out = combine(out, g(x))
        return out

    run_all_modes(f, (rand(3),), (rand(3, seed=1),), (rand(4),))


def _pairs(xs):
    for i in range(len(xs) - 1):
        yield xs[i], xs[i + 1]


def test_generator_helper():
    def f(xs):
        acc = xs[0] * 0
        for a, b in _pairs(xs):
            acc = acc + a * b
        return acc

    run_all_modes(f, ([rand(2), rand(2, seed=1), rand(2, seed=2)],), ([rand(2, seed=3), rand(2, seed=4)],))


def test_fstring_of_sizes_and_python_values():
    def f(x, tag):
        return x + 1, f"{tag}:{x.shape[0]}x{x.shape[1]}:{x.dtype}"

    run_all_modes(f, (rand(2, 3), "a"), (rand(2, 3, seed=1), "a"), (rand(4, 3), "b"), (rand(5, 3), "b"))


def test_global_statement_accumulates():
    def f(x):
        global TOTAL
        TOTAL = TOTAL + 1.5
        return x * TOTAL

    def reset():
        global TOTAL
        TOTAL = 0.0

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), reset=reset, observe=lambda: TOTAL)


class _Counting:
    """A context manager counting entries and exits (state compared after every call)."""
    entered = 0
    exited = 0

    def __enter__(self):
        _Counting.entered += 1
        return self

    def __exit__(self, *exc):
        _Counting.exited += 1
        return False


def _reset_counting():
    _Counting.entered = _Counting.exited = 0


def test_with_blocks_nested_in_loops_restore_state_each_call():
    def f(x, w):
        out = x
        for k in range(2):
            with kiln.no_grad(), _Counting():
                frozen = w * (k + 1)
            with _Counting() as c:
                with kiln.no_grad():
                    out = out + frozen
                out = out * w + (1 if c else 0)
        return out

    w = rand(3, seed=1)
    w.requires_grad_(True)
    run_all_modes(f, (rand(3), w), (rand(3, seed=2), w), (rand(3, seed=3), w), reset=_reset_counting,
                  observe=lambda: (kiln.is_grad_enabled(), _Counting.entered, _Counting.exited), check_requires_grad=True)


def test_exception_leaving_a_with_block():
    def f(x, bad):
        try:
            with _Counting():
                if bad:
                    raise KeyError("bad")
                y = x * 2
        except KeyError:
            y = x - 1
        return y

    run_all_modes(f, (rand(2), False), (rand(2, seed=1), True), (rand(2, seed=2), False), reset=_reset_counting,
                  observe=lambda: (_Counting.entered, _Counting.exited))
