"""Attributes whose reads run the user's code: properties, descriptor classes and __getattr__.
Capture must not evaluate them an extra time (a guard re-reading `self.scale` ran its getter, so a
counting property advanced twice per call), and must follow what the getter reads and writes
(bytecode capture ran getters natively, baking in their result). Each case runs eagerly and under
every kiln.jit variant, the Python state observed after each call."""
import numpy as np

import kiln
from conformance import Call, rand, run_all_modes
from kiln import nn


class Alternating(nn.Cell):
    """A property with an effect: each read advances a counter and picks a scale."""

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.scales = [1.0, 2.0, -3.0]

    @property
    def scale(self):
        self.reads += 1
        return self.scales[self.reads % 3]

    def construct(self, x):
        return x * self.scale


ALT = Alternating()


def _reset_alt():
    ALT.reads = 0
    ALT.scales[:] = [1.0, 2.0, -3.0]


def use_alternating(x):
    return ALT(x)


def test_counting_property_read_once_per_call():
    run_all_modes(use_alternating, (rand(3),), (rand(3),), (rand(3),), (rand(3),),
                  reset=_reset_alt, observe=lambda: ALT.reads)


class Configured:
    def __init__(self):
        self.table = {"gain": 2.0}

    @property
    def gain(self):  # no effect: reads a dict the caller changes
        return self.table["gain"]

    @property
    def activation(self):  # returns a callable: called as obj.activation(x)
        return kiln.ops.tanh if self.table["gain"] > 0 else kiln.ops.sigmoid


CFG = Configured()


def use_configured(x):
    return CFG.activation(x) * CFG.gain


def test_property_reading_state_the_caller_changes():
    run_all_modes(use_configured, (rand(3),), Call((rand(3),), before=lambda: CFG.table.update(gain=-1.5)),
                  (rand(3),), reset=lambda: CFG.table.update(gain=2.0))


class Counted:
    """A descriptor class written in Python, counting its reads."""

    def __init__(self):
        self.reads = 0

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        self.reads += 1
        return float(self.reads)


class Holder:
    offset = Counted()

    def __init__(self):
        self.misses = []

    def __getattr__(self, name):  # called for names found nowhere else
        self.misses.append(name)
        return 0.5


HOLD = Holder()


def _reset_hold():
    Holder.offset.reads = 0
    HOLD.misses.clear()


def use_holder(x):
    return x + HOLD.offset + HOLD.missing_bias


def test_descriptor_and_getattr_run_once_per_call():
    run_all_modes(use_holder, (rand(2),), (rand(2),), (rand(2),), reset=_reset_hold,
                  observe=lambda: (Holder.offset.reads, list(HOLD.misses)))


def test_property_counter_under_kiln_trace_verified():
    _reset_alt()
    eager = [use_alternating(x).numpy() for x in (rand(2), rand(2), rand(2))]
    reads = ALT.reads
    _reset_alt()
    traced = kiln.trace(use_alternating)
    got = []
    for x in (rand(2), rand(2), rand(2)):
        try:
            got.append(traced(x).numpy())
        except kiln.jit.TraceMismatchError:  # (the scale differs from call to call: a clear refusal)
            return
    for g, e in zip(got, eager):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    assert ALT.reads == reads
