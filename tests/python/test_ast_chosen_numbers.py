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
