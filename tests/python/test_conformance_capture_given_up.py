"""Conformance: a first call whose capture kiln gives up part-way and runs again -- ast capture
falling back to trace capture (a tensor if whose branch draws random numbers or writes in place),
or running the call eagerly (a branch reading a tensor's value into Python). The given-up run had
already written arguments in place, drawn random numbers and appended to a global list; eager
does each once, so the compiled call must too (the writes once applied twice: x.mul_(2) gave 4x)."""
import kiln
from conformance import VARIANTS, rand, run_all_modes, t

LOG = []


def reset(seed=7):
    LOG.clear()
    kiln.manual_seed(seed)


def observe():
    """The global list, and the generator's state seen as its next draw."""
    return list(LOG), kiln.ops.rand((2,))


def test_argument_written_in_place_before_a_tensor_if_that_writes_in_place():
    def f(x):
        x.mul_(2.0)
        if x.sum() > 0:
            x.add_(1.0)
        return x

    run_all_modes(f, (t(1.0, 2.0),), (t(-5.0, -2.0),), (t(1.0, 2.0),))


def test_writes_and_draws_before_a_tensor_if_that_draws():
    def f(x, k):
        x.add_(1.0)
        LOG.append(k)
        z = kiln.ops.rand(x.shape)
        if x.sum() > 0:
            y = x + kiln.ops.rand(x.shape) + z
        else:
            y = x - kiln.ops.randn(x.shape)
        return y

    run_all_modes(f, (t(1.0, 2.0), 1), (t(-5.0, -2.0), 2), (t(1.0, 2.0), 3), (rand(2, seed=1), 4),
                  reset=reset, observe=observe, variants=VARIANTS)


def test_writes_and_draws_before_a_branch_reading_a_value_into_python():
    def f(x, k):
        x.add_(1.0)
        LOG.append(k)
        z = kiln.ops.rand(x.shape)
        if x.sum() > 0:
            y = x * float(x[0]) + z
        else:
            y = x * 2
        return y

    run_all_modes(f, (t(1.0, 2.0), 1), (t(-5.0, -2.0), 2), (t(1.0, 2.0), 3),
                  reset=reset, observe=observe, variants=VARIANTS)


def test_a_cell_updating_a_buffer_before_a_tensor_if_that_draws():
    class Net(kiln.nn.Cell):
        def __init__(self):
            super().__init__()
            self.steps = kiln.Parameter(kiln.ops.zeros((1,)), requires_grad=False)

        def construct(self, x):
            self.steps.add_(1.0)
            if x.sum() > 0:
                x = x + kiln.ops.rand(x.shape)
            return x * self.steps

    net = Net()

    def restart():
        reset()
        net.steps.set_data(kiln.ops.zeros((1,)))

    run_all_modes(net, (t(1.0, 2.0),), (t(-5.0, -2.0),), (t(1.0, 2.0),), reset=restart,
                  observe=lambda: (observe(), net.steps * 1), variants=VARIANTS)


def test_draws_from_python_and_numpy_global_generators_inside():
    """random.random() and numpy.random.rand() inside the function: eager draws anew at every call;
    trace and ast capture once baked the captured call's draws into the graph (every later call
    returned them). Such a recording is not replayed: the function runs eagerly."""
    import random

    import numpy as np

    def f(x, n):
        noise = kiln.Tensor(np.random.rand(2).astype(np.float32))
        return x * random.random() + noise + random.randint(0, n)

    def seed():
        random.seed(0)
        np.random.seed(0)

    run_all_modes(f, (t(1.0, 2.0), 3), (t(1.0, 2.0), 3), (t(3.0, 2.0), 5), reset=seed,
                  observe=lambda: (random.random(), float(np.random.rand())), variants=VARIANTS)


def test_draws_from_generators_the_function_reaches():
    """A NumPy Generator in a global dict, a random.Random in a closure and a RandomState on a Cell:
    the graph would replay the captured call's draws, as with the global generators."""
    import random

    import numpy as np

    state = {}

    def fresh():
        state.update(np=np.random.default_rng(0), py=random.Random(0))
        net.rs = np.random.RandomState(0)

    class Net(kiln.nn.Cell):
        def construct(self, x):
            return x * float(self.rs.rand())

    net = Net()
    fresh()
    py = state["py"]

    def f(x):
        noise = kiln.Tensor(state["np"].standard_normal(2).astype(np.float32))
        return net(x) + noise * py.random()

    def reset():
        fresh()
        nonlocal py
        py = state["py"]

    run_all_modes(f, (t(1.0, 2.0),), (t(1.0, 2.0),), (t(3.0, 2.0),), reset=reset, variants=VARIANTS)
