"""Conformance: the kinds of callables compiled code calls or is -- decorated functions
(functools.wraps, __wrapped__), staticmethods, classmethods, properties, bound methods, Cells
calling Cells, lambdas and functools.partial, jitted functions called from compiled code, a
construct decorated with kiln.jit -- agree with eager under every kiln.jit variant."""
import functools

import kiln
from kiln import nn
from conformance import Call, rand, run_all_modes, t


def doubled(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * 2
    return wrapper


@doubled
def _decorated(x, y):
    return x + y


def test_decorated_function_is_compiled():
    run_all_modes(_decorated, (rand(3), rand(3, seed=1)), (rand(3, seed=2), rand(3, seed=3)))


def test_calls_a_decorated_helper():
    def f(x):
        return _decorated(x, x * 3) - 1

    run_all_modes(f, (rand(3),), (rand(3, seed=1),))


class Ops:
    factor = 3.0

    def __init__(self, bias):
        self.bias = bias

    @staticmethod
    def scale(x, k):
        return x * k

    @classmethod
    def triple(cls, x):
        return x * cls.factor

    @property
    def shift(self):
        return self.bias + 1

    def apply(self, x):
        return self.scale(x, 2.0) + self.triple(x) + self.shift


def test_staticmethod_classmethod_property_bound_method():
    ops = Ops(0.5)

    def f(x):
        return ops.apply(x), Ops.scale(x, -1.0)

    run_all_modes(f, (rand(3),), (rand(3, seed=1),), Call((rand(3, seed=2),), before=lambda: setattr(ops, "bias", 2.0)),
                  reset=lambda: setattr(ops, "bias", 0.5))


def test_bound_method_compiled_directly():
    ops = Ops(1.5)
    run_all_modes(ops.apply, (rand(3),), (rand(3, seed=1),))


def test_lambda_and_partial():
    scale = functools.partial(lambda x, k, b: x * k + b, b=0.5)
    square = lambda x: x * x  # noqa: E731

    def f(x):
        return scale(square(x), 2.0), list(map(square, [x, x + 1]))

    run_all_modes(f, (rand(3),), (rand(3, seed=1),))


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.gain = 1.0

    def construct(self, x):
        return self.fc(x).relu() * self.gain


class Stack(nn.Cell):
    def __init__(self):
        super().__init__()
        self.blocks = nn.CellList([Block(), Block()])

    def construct(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


def test_cells_calling_cells_with_attribute_change():
    kiln.manual_seed(0)
    net = Stack()

    def reset():
        net.blocks[1].gain = 1.0

    run_all_modes(net, (rand(2, 3),), (rand(2, 3, seed=1),),
                  Call((rand(2, 3, seed=2),), before=lambda: setattr(net.blocks[1], "gain", -2.0)), (rand(4, 3),),
                  reset=reset)


def test_recursion_on_python_depth():
    def f(x, depth):
        if depth == 0:
            return x
        return f(x * 0.5 + 1, depth - 1)

    run_all_modes(f, (rand(3), 2), (rand(3, seed=1), 2), (rand(3, seed=2), 4))


def test_jitted_function_calling_jitted_functions_of_other_modes():
    inner_ast = kiln.jit(lambda v: v * 2 + 1, capture_mode="bytecode")

    def helper(v):
        if v.sum() > 0:
            return v - 1
        return v + 1

    inner_helper = kiln.jit(helper)

    def f(x):
        return inner_ast(x) + inner_helper(x)

    run_all_modes(f, (t(1.0, 2.0),), (t(-1.0, -2.0),), (t(3.0, -1.0),))


class Head(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 2)
        self.temperature = 1.0

    @kiln.jit
    def construct(self, x):
        return (self.fc(x) / self.temperature).softmax(axis=-1)


def test_cell_with_jitted_construct_and_attribute_change():
    """A construct decorated with kiln.jit follows attribute writes and new shapes as the same
    computation written out eagerly does."""
    import numpy as np

    kiln.manual_seed(1)
    head = Head()
    for k, (temperature, rows) in enumerate([(1.0, 2), (1.0, 2), (0.25, 2), (0.25, 4), (2.0, 3)]):
        head.temperature = temperature
        x = rand(rows, 3, seed=k)
        want = (head.fc(x) / temperature).softmax(axis=-1)
        np.testing.assert_allclose(head(x).asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=f"call {k}")
