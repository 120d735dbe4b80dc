"""Conformance: more Python state a compiled function reads or changes between calls -- mutable
default arguments, global dicts read by key, class attributes, a config module's attributes,
enum and string arguments, dtypes and layouts of tensor arguments changing between calls."""
import enum
import types

import numpy as np

import kiln
from conformance import Call, rand, run_all_modes, t

SETTINGS = {"gain": 2.0, "act": "tanh"}
CONFIG = types.ModuleType("config")
CONFIG.depth = 2


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


class Scaler:
    factor = 3.0

    def __call__(self, x):
        return x * self.factor


def _reset():
    SETTINGS.update(gain=2.0, act="tanh")
    CONFIG.depth = 2
    Scaler.factor = 3.0


def test_mutable_default_argument_grows():
    def f(x, seen=[]):  # noqa: B006 -- the point of the case
        seen.append(x.shape[0])
        return x * len(seen)

    def reset():
        f.__defaults__[0].clear()

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(3),), reset=reset, observe=lambda: list(f.__defaults__[0]))


def test_global_dict_values_changed_between_calls():
    def f(x):
        y = x * SETTINGS["gain"]
        return y.tanh() if SETTINGS["act"] == "tanh" else y.relu()

    def relu():
        SETTINGS["act"] = "relu"

    def gain():
        SETTINGS["gain"] = -1.0

    x = t(-1.0, 0.5, 2.0)
    run_all_modes(f, (x,), Call((x,), before=gain), Call((x,), before=relu), (x,), reset=_reset)


def test_class_attribute_changed_between_calls():
    s = Scaler()

    def f(x):
        return s(x) + Scaler.factor

    def change():
        Scaler.factor = -2.0

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=change), (x,), reset=_reset)


def test_config_module_attribute_changed_between_calls():
    def f(x):
        for _ in range(CONFIG.depth):
            x = x * 0.5 + 1
        return x

    def deeper():
        CONFIG.depth = 4

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=deeper), (x,), reset=_reset)


def test_enum_and_string_arguments():
    def f(x, mode, name):
        y = x * 2 if mode is Mode.FAST else x / 2
        if name.startswith("neg"):
            y = -y
        return y, mode.name, name.upper()

    x = rand(3)
    run_all_modes(f, (x, Mode.FAST, "pos"), (x, Mode.SLOW, "pos"), (x, Mode.FAST, "negative"), (x, Mode.SLOW, "neg"))


def test_dtype_of_arguments_changes_between_calls():
    def f(x, y):
        return x * y + 1, (x * y).dtype == kiln.float64

    run_all_modes(f, (rand(3), rand(3, seed=1)), (rand(3, dtype=kiln.float64), rand(3, seed=1, dtype=kiln.float64)),
                  (rand(3), rand(3, seed=1, dtype=kiln.float64)),
                  (kiln.Tensor(np.array([1, 2, 3], np.int64)), kiln.Tensor(np.array([4, 5, 6], np.int64))))


def test_layout_of_arguments_changes_between_calls():
    def f(x):
        return x * 2 + x.sum(axis=0), x.is_contiguous()

    base = rand(3, 4)
    run_all_modes(f, (rand(4, 3),), (rand(4, 3, seed=1),), (base.transpose(1, 0),), (rand(8, 6)[::2, ::2],),
                  (rand(4, 3, seed=2),))
