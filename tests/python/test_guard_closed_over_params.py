"""Guards on what a function reads through a parameter that a nested function closes over (a
lambda using `self`, or the ast mode's converted if/while, whose branch functions close over
every name they use): such a parameter is read through its cell (LOAD_DEREF), and the chains
read from it -- self.table["k"], self.cfg.scale, opts["mode"] -- must be guarded as any
parameter's are, so a compiled call sees a change made between calls."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["-".join(v) for v in VARIANTS]


class Config:
    def __init__(self):
        self.scale = 1.0


class WithBranch(nn.Cell):
    """An if on a Python attribute: the ast mode turns it into branch functions closing over self."""

    def __init__(self):
        super().__init__()
        self.extra = None
        self.table = {"k": 1.0}
        self.cfg = Config()
        self.sizes = [1]

    def construct(self, x):
        y = x * self.cfg.scale
        if self.extra is not None:
            y = y + self.extra
        return y * self.table["k"] + self.sizes[0]


class WithLambda(nn.Cell):
    def __init__(self):
        super().__init__()
        self.table = {"k": 1.0}
        self.cfg = Config()

    def construct(self, x):
        shift = lambda v: v + self.cfg.scale  # noqa: E731 - closes over self
        return shift(x) * self.table["k"]


def with_options(x, opts):
    pick = lambda v: v * 2  # noqa: E731
    if opts["mode"] == "double":
        return pick(x) + opts["bias"].sum()
    return x + opts["bias"].sum()


def run(jf, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jf(*args).numpy()


def changes(net):
    yield lambda: None
    yield lambda: net.table.__setitem__("k", 3.0)
    yield lambda: setattr(net.cfg, "scale", 2.5)
    if hasattr(net, "extra"):
        yield lambda: setattr(net, "extra", kiln.tensor(np.array([10.0, 20.0], np.float32)))
        yield lambda: net.table.__setitem__("k", -1.0)
        yield lambda: net.sizes.__setitem__(0, 7)
        yield lambda: setattr(net.cfg, "scale", 0.5)


@pytest.mark.parametrize("cls", [WithBranch, WithLambda])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_cell_state_read_through_a_closed_over_self(cls, variant):
    mode, level, backend = variant
    net = cls()
    jf = kiln.jit(net, capture_mode=mode, jit_level=level, backend=backend)
    x = kiln.tensor(np.array([1.0, -2.0], np.float32))
    for k, change in enumerate(changes(net)):
        change()
        np.testing.assert_array_equal(run(jf, x), net(x).numpy(), err_msg=f"after change {k}")


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_a_dict_argument_read_through_a_closure_cell(variant):
    mode, level, backend = variant
    jf = kiln.jit(with_options, capture_mode=mode, jit_level=level, backend=backend)
    x = kiln.tensor(np.array([1.0, 2.0], np.float32))
    opts = {"mode": "double", "bias": kiln.tensor(np.array([1.0], np.float32))}
    for k in range(4):
        if k == 2:
            opts["mode"] = "plain"
        np.testing.assert_array_equal(run(jf, x, opts), with_options(x, opts).numpy(), err_msg=f"call {k}")
