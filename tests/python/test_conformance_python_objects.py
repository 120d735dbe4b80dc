"""Conformance: Python objects as users write them around tensors, each run eagerly and under every
kiln.jit variant and kiln.trace over calls with new inputs and new outer state: a Cell subclass
overriding __call__ (called from the function, and jitted itself), class and instance attributes
shadowing each other, super() in Cell subclasses, properties with side effects, dataclasses and
namedtuples holding tensors as arguments (written by the function) and as results."""
import collections
import dataclasses
import typing

import kiln
from kiln import nn
from conformance import TRACE_VARIANTS, VARIANTS, Call, rand, run_all_modes

ALL = VARIANTS + TRACE_VARIANTS


class Shifted(nn.Cell):
    """A Cell whose __call__ adds to what construct gives: eager calls run the override."""

    def __init__(self):
        super().__init__()
        self.k = 1.0

    def construct(self, x):
        return x * self.k

    def __call__(self, x, shift=1.0):
        return super().__call__(x) + shift


def test_cell_with_its_own_call_called_from_the_function():
    cell = Shifted()

    def reset():
        cell.k = 1.0

    for fn in (lambda x: cell(x), lambda x: cell(x, shift=2.0) * cell(x)):
        run_all_modes(fn, (rand(2),), Call((rand(2, seed=1),), before=lambda: setattr(cell, "k", 3.0)),
                      (rand(3, seed=2),), reset=reset, variants=ALL)


def test_cell_with_its_own_call_jitted_itself():
    cell = Shifted()

    def reset():
        cell.k = 1.0

    run_all_modes(cell, (rand(2),), Call((rand(2, seed=1),), before=lambda: setattr(cell, "k", 3.0)),
                  (rand(3, seed=2),), reset=reset, variants=ALL)


def test_class_attribute_shadowed_by_instance_attribute_and_back():
    class Scaled(nn.Cell):
        scale = 2.0

        def construct(self, x):
            return x * self.scale

    cell = Scaled()

    def reset():
        Scaled.scale = 2.0
        if "scale" in vars(cell):
            del cell.scale

    run_all_modes(lambda x: cell(x), (rand(2),), Call((rand(2),), before=lambda: setattr(cell, "scale", 5.0)),
                  Call((rand(2),), before=lambda: setattr(Scaled, "scale", 7.0)),
                  Call((rand(2),), before=lambda: delattr(cell, "scale")),
                  Call((rand(2),), before=lambda: setattr(Scaled, "scale", 1.0)), reset=reset, variants=ALL)


def test_super_construct_in_a_cell_subclass():
    class Base(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(2, 2)

        def construct(self, x):
            return self.fc(x)

    class Child(Base):
        def construct(self, x):
            return super().construct(x) * 2 + super(Child, self).construct(x)

    kiln.manual_seed(0)
    cell = Child()
    run_all_modes(lambda x: cell(x), (rand(3, 2),), (rand(3, 2, seed=1),), variants=ALL)


def test_property_with_a_side_effect_read_each_call():
    class Counter:
        def __init__(self):
            self.n = 0

        @property
        def value(self):
            self.n += 1
            return self.n

    counter = Counter()

    def reset():
        counter.n = 0

    run_all_modes(lambda x: x * counter.value, (rand(2),), (rand(2),), (rand(2),), reset=reset,
                  observe=lambda: counter.n, variants=ALL)


# ---- dataclasses and namedtuples as arguments and results ------------------------------------------


@dataclasses.dataclass
class Batch:
    x: object
    scale: float = 1.0


Pair = collections.namedtuple("Pair", "a b")


class Weighted(typing.NamedTuple):
    w: object
    n: int = 1


def test_dataclass_argument_attributes_written_by_the_function():
    # eagerly the caller's object sees the writes (the compiled call must not write a rebuilt copy)
    def f(batch):
        batch.scale = batch.scale + 1
        batch.x = batch.x * 2
        batch.seen = True
        return batch.x.sum() * batch.scale

    run_all_modes(f, (Batch(rand(2), 2.0),), (Batch(rand(2, seed=1), 3.0),), (Batch(rand(3, seed=2)),), variants=ALL)


def test_dataclass_argument_returned_and_read():
    def f(batch, y):
        return batch, y + batch.x * batch.scale

    run_all_modes(f, (Batch(rand(2), 2.0), rand(2, seed=1)), (Batch(rand(2, seed=2), -1.0), rand(2, seed=3)),
                  variants=ALL)


def test_namedtuples_and_dataclasses_in_and_out():
    def f(p, w, batch):
        return (Pair(p.a + w.w * w.n, p.b * batch.scale), Batch(batch.x * p.a, batch.scale + 1),
                Weighted(w.w - 1, w.n + 1))

    run_all_modes(f, (Pair(rand(2), rand(2, seed=1)), Weighted(rand(2, seed=2), 2), Batch(rand(2, seed=3), 2.0)),
                  (Pair(rand(2, seed=4), rand(2, seed=5)), Weighted(rand(2, seed=6), 3), Batch(rand(2, seed=7), -1.0)),
                  variants=ALL)
