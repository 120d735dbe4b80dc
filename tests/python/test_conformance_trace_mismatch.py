"""Conformance: a traced function whose later call does something else than the recorded one --
other shapes, another Python branch, another number of outputs, changed constants (Python numbers,
tensors rebound or written in place, captured constants), another operator, a branch on a tensor's
value -- must raise (kiln.TraceMismatchError) or record again, never return the recording's stale
result. Run under MegEngine's kiln.trace (symbolic or not, opt levels, symbolic_shape on / off) and
every kiln.jit variant."""
import kiln
from conformance import TRACE_VARIANTS, VARIANTS, Call, rand, run_all_modes, t

ALL = VARIANTS + TRACE_VARIANTS
FLAGS = {"branch": True, "outputs": 1, "k": 2.0, "expr": "a + b"}
CONST = t(1.0, 2.0, 3.0)


def _reset():
    global CONST
    FLAGS.update(branch=True, outputs=1, k=2.0, expr="a + b")
    CONST = t(1.0, 2.0, 3.0)


def _flag(name, value):
    def before():
        FLAGS[name] = value
    return before


def test_other_shapes():
    def f(x, y):
        return (x * y).sum(axis=0), x.shape[0]

    run_all_modes(f, (rand(2, 3), rand(2, 3, seed=1)), (rand(4, 3), rand(4, 3, seed=2)), (rand(2, 3, seed=3), rand(2, 3)),
                  (rand(2, 5), rand(2, 5, seed=1)), variants=ALL)


def test_other_python_branch():
    def f(x):
        if FLAGS["branch"]:
            return x + 1
        return x * 3

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=_flag("branch", False)), (x,), Call((x,), before=_flag("branch", True)),
                  reset=_reset, variants=ALL)


def test_other_number_of_outputs():
    def f(x):
        outs = [x * (i + 1) for i in range(FLAGS["outputs"])]
        return tuple(outs)

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=_flag("outputs", 3)), Call((x,), before=_flag("outputs", 2)),
                  reset=_reset, variants=ALL)


def test_changed_python_constant():
    def f(x):
        return x * FLAGS["k"] + 1

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=_flag("k", -4.0)), Call((x,), before=_flag("k", 0.5)),
                  reset=_reset, variants=ALL)


def test_global_tensor_rebound_and_written_in_place():
    def f(x):
        return x + CONST

    def rebind():
        global CONST
        CONST = t(-1.0, -1.0, -1.0)

    def write():
        CONST[0] = 100.0

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=rebind), Call((x,), before=write), (x,), reset=_reset, variants=ALL)


def test_captured_constant_written_in_place():
    def f(x):
        return x * CONST

    def write():
        CONST[1] = -7.0

    x = rand(3)
    run_all_modes(f, (x,), (x,), Call((x,), before=write), (x,), reset=_reset, variants=TRACE_VARIANTS,
                  options=dict(capture_as_const=True))


def test_other_operator():
    def f(a, b, c):
        if FLAGS["expr"] == "a + b":
            return a + b + c
        if FLAGS["expr"] == "a - b":
            return a - b + c
        return (a + b) * c

    a, b, c = rand(3), rand(3, seed=1), rand(3, seed=2)
    run_all_modes(f, (a, b, c), (a, b, c), Call((a, b, c), before=_flag("expr", "a - b")),
                  Call((a, b, c), before=_flag("expr", "mul")), (a, b, c), reset=_reset, variants=ALL)


def test_branch_on_tensor_value():
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x - 5

    run_all_modes(f, (t(1.0, 2.0),), (t(1.0, 3.0),), (t(-1.0, -2.0),), (t(4.0, 2.0),), variants=ALL)


def test_value_read_into_python_number():
    def f(x):
        return x * float(x.max())

    run_all_modes(f, (t(1.0, 2.0),), (t(3.0, -1.0),), (t(0.5, 0.25),), variants=ALL)


def test_other_input_structure():
    def f(xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    run_all_modes(f, ([rand(2), rand(2, seed=1)],), ([rand(2), rand(2, seed=1), rand(2, seed=2)],),
                  ((rand(2), rand(2, seed=3)),), variants=ALL)


def test_sub_cell_parameter_and_dict_tensor_replaced_between_calls():
    """The same ops on another tensor of the same type -- a sub-Cell replaced (net.fc = Dense(...)), a
    Parameter attribute replaced, a tensor in a dict replaced: kiln.trace replayed the recorded
    tensors (the old weights) without a word; it must raise or follow the new ones."""
    kiln.manual_seed(0)

    class Net(kiln.nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = kiln.nn.Dense(3, 2)
            self.scale = kiln.Parameter(t(2.0))

        def construct(self, x):
            return self.fc(x) * self.scale + TENSORS["bias"]

    cell = Net()
    fc, scale = cell.fc, cell.scale
    other_fc, other_scale = kiln.nn.Dense(3, 2), kiln.Parameter(t(-3.0))

    def restore():
        cell.fc, cell.scale = fc, scale
        TENSORS["bias"] = t(0.5, -0.5)

    def replace(name, value):
        return lambda: setattr(cell, name, value)

    run_all_modes(cell, (rand(2, 3),), Call((rand(2, 3, seed=1),), before=replace("fc", other_fc)),
                  (rand(2, 3, seed=2),), Call((rand(2, 3, seed=3),), before=replace("scale", other_scale)),
                  Call((rand(2, 3, seed=4),), before=lambda: TENSORS.update(bias=t(7.0, 8.0))),
                  reset=restore, variants=ALL)


TENSORS = {"bias": t(0.5, -0.5)}


def test_tensor_made_from_numpy_data_inside_the_function():
    """A tensor the function makes at each call from NumPy data (or a Python value): kiln.trace
    replayed the values of the recording's; made with other values it must raise or follow them."""
    import numpy as np

    def f(x, v):
        return x * kiln.Tensor(np.array([v, -v], np.float32)) + kiln.Tensor(np.array([1.0, 2.0], np.float32))

    run_all_modes(f, (t(1.0, 2.0), 2.0), (t(3.0, 2.0), 2.0), (t(1.0, 2.0), 5.0), (t(1.0, 2.0), 2.0), variants=ALL)
