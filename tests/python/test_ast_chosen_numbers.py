"""ast capture: a Python number an if on a tensor chooses is returned as a Python number of the
type eager gives (an int stays an int), with the value of the path each call takes, also when
both paths give the same number or a tuple holds it."""
import kiln
from conformance import rand, run_all_modes


def test_number_chosen_by_a_tensor_condition_is_returned_as_a_number():
    def f(x):
        if x.sum() > 0:
            n = 3
        else:
            n = -1
        return x * 2, n

    run_all_modes(f, (rand(3),), (rand(3) * -1.0,), (rand(3, seed=1),), (rand(3, seed=1) * -1.0,))


def test_float_chosen_in_a_nested_if_and_a_return_inside_the_if():
    def f(x, k):
        scale = 1.0
        if x.mean() > 0.1:
            if x.max() > 0.9:
                scale = 2.5
            else:
                scale = 0.5
            return x + 1, scale, k
        return x - 1, scale, k

    run_all_modes(f, (rand(4), 7), (rand(4) * -1.0, 7), (rand(4, seed=3) * 0.2, 7), (rand(4, seed=4), 8))


def test_numbers_alike_on_both_paths_stay_numbers_in_a_tuple():
    def f(x, n):
        k = 1.5
        if (x * x).sum() > 1.0:
            return x * 2, (n, k)
        return x, (n, k)

    run_all_modes(f, (rand(3), 4), (rand(3) * 0.1, 4), (rand(3, seed=2), 5))


def test_chosen_number_type_after_many_calls_and_under_grad():
    def f(x):
        n = 1 if x.sum() > 0 else 0
        return (x * x).sum(), n

    jf = kiln.jit(f, capture_mode="ast")
    for s in range(6):
        x = rand(3, seed=s) * (1.0 if s % 2 else -1.0)
        loss, n = jf(x)
        assert type(n) is int and n == (1 if float(x.sum().item()) > 0 else 0)


def test_number_computed_from_a_chosen_number_stays_a_number():
    def f(x, flag):
        k, n = 1.0, 2
        if x.sum() > 0:
            k, n = 0.5, 3
        k = k * 1.1 if flag else k + -0.25
        n = n + 1
        m = -n
        q = n / 2
        r = n // 2
        s = abs(k - 2.0)
        return x, k, n, m, q, r, s

    run_all_modes(f, (rand(3), True), (rand(3) * -1.0, True), (rand(3, seed=5), False))


def test_numbers_carried_by_a_loop_on_a_tensor_stay_numbers():
    def f(x):
        c, k, done = 0, 1.0, False
        while c < 3 and x.sum() < 10.0:
            c = c + 1
            k = abs(k - 0.3) + 0.1
            x = x * 2.0
            done = c > 1
        return x, c, k, done

    run_all_modes(f, (rand(3),), (rand(3) * 20.0,), (rand(3, seed=2) * 0.1,))


def test_int_powers_of_chosen_numbers_follow_python():
    # int ** int is an int for an exponent >= 0 and a float for a negative one: with a chosen base
    # and a literal exponent the type is known; a chosen exponent makes capture give up (eager runs)
    def f(x):
        e, b = 3, 2
        if x.sum() > 0:
            e, b = -1, 5
        return x, 2 ** e, e ** 2, b ** -2, b ** 2

    run_all_modes(f, (rand(3),), (rand(3) * -1.0,), (rand(3, seed=4),))


def test_a_global_list_appended_after_a_tensor_if_that_returns_is_not_changed_twice():
    log = []

    def f(x, n):
        if x.sum() < 0:
            return x * 2, n
        log.append(n)
        return x, n

    run_all_modes(f, (rand(3), 1), (rand(3) * -1.0, 2), (rand(3, seed=3), 3), reset=log.clear,
                  observe=lambda: list(log))


def test_chosen_numbers_in_a_decorated_function_that_fills_a_list_argument():
    import functools

    def logged(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            return fn(*args)
        return wrapper

    @logged
    def f(x, out):
        scale, count = 0.5, 1
        if x.sum() > 0:
            scale, count = 2.0, 3
        out.append(x * scale)  # the caller's list, changed in place
        out[0] = x + count
        return x * (scale + count), count * 2, scale < 1.0

    run_all_modes(f, (rand(3), [rand(3, seed=7)]), (rand(3) * -1.0, [rand(3, seed=8)]),
                  (rand(3, seed=2), [rand(3, seed=9)]))
