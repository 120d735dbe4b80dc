"""Conformance: Python logic on sizes across calls of new shapes (kiln.jit makes sizes symbolic
after a second value): branches on a size crossing a threshold, sizes halved, sliced, reshaped,
compared with each other, used as loop counts and as Python numbers, and a Cell switched between
training and inference between calls."""
import kiln
from kiln import nn
from conformance import Call, rand, run_all_modes, t


def test_branch_on_size_threshold():
    def f(x):
        if x.shape[0] > 3:
            return x[:3] * 2
        return x + 1

    run_all_modes(f, (rand(2, 2),), (rand(3, 2),), (rand(4, 2),), (rand(6, 2),), (rand(1, 2),), (rand(3, 2, seed=1),))


def test_halved_sliced_reshaped_sizes():
    def f(x):
        n = x.shape[0]
        half = n // 2
        a, b = x[:half], x[half:]
        return a.sum(axis=0) - b.sum(axis=0), x.reshape(n * x.shape[1] // 2, 2), half, n % 3

    run_all_modes(f, (rand(2, 4),), (rand(4, 4),), (rand(5, 4),), (rand(7, 4),), (rand(8, 4),))


def test_size_as_loop_count_and_python_number():
    def f(x):
        acc = x[0] * 0
        for i in range(x.shape[0]):
            acc = acc + x[i] * (i + 1)
        return acc / x.shape[0], float(x.shape[0]) ** 0.5

    run_all_modes(f, (rand(2, 3),), (rand(3, 3),), (rand(4, 3),), (rand(2, 3, seed=1),))


def test_sizes_compared_with_each_other():
    def f(x, y):
        if x.shape[0] == y.shape[0]:
            return x + y
        if x.shape[0] < y.shape[0]:
            return y[: x.shape[0]] * x
        return x[: y.shape[0]] - y

    run_all_modes(f, (rand(2, 3), rand(2, 3, seed=1)), (rand(3, 3), rand(3, 3, seed=1)), (rand(2, 3), rand(4, 3)),
                  (rand(5, 3), rand(3, 3)), (rand(4, 3), rand(4, 3, seed=2)))


def test_train_and_eval_switched_between_calls():
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(4, 4), nn.BatchNorm1d(4), nn.ReLU()])
    bn = net[1]
    stats = (bn.moving_mean.asnumpy().copy(), bn.moving_variance.asnumpy().copy())

    def reset():
        net.set_train(True)
        bn.moving_mean.set_data(stats[0].copy())
        bn.moving_variance.set_data(stats[1].copy())

    run_all_modes(net, (rand(8, 4),), (rand(8, 4, seed=1),), Call((rand(8, 4, seed=2),), before=lambda: net.set_train(False)),
                  Call((rand(8, 4, seed=3),), before=lambda: net.set_train(True)), reset=reset,
                  observe=lambda: (bn.moving_mean * 1, bn.moving_variance * 1))
