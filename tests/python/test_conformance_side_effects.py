"""Conformance: Python side effects of compiled code happen at every call, in eager's order --
prints, appends to global lists, attribute writes on objects and Cells, tensors written in place
(arguments, globals, Cell parameters) -- and state read back after the call agrees with eager."""
import io

import pytest

import kiln
from kiln import nn
from conformance import Call, rand, run_all_modes, t

OUT = io.StringIO()
EVENTS = []
W = t(1.0, 1.0, 1.0)


class Stats:
    def __init__(self):
        self.calls = 0
        self.last = None


STATS = Stats()


def _reset():
    global OUT, W
    OUT = io.StringIO()
    EVENTS.clear()
    W = t(1.0, 1.0, 1.0)
    STATS.calls, STATS.last = 0, None


def test_print_each_call():
    def f(x):
        y = x * 2
        print("step", y.shape, file=OUT)
        return y + 1

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(3),), reset=_reset, observe=lambda: OUT.getvalue())


def test_append_to_global_list_each_call():
    def f(x):
        loss = (x * x).sum()
        EVENTS.append("called")
        return loss

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=_reset, observe=lambda: list(EVENTS))


def test_attribute_write_on_global_object():
    def f(x):
        STATS.calls += 1
        STATS.last = x.shape[0]
        return x * STATS.calls

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(3),), reset=_reset,
                  observe=lambda: (STATS.calls, STATS.last))


def test_side_effect_order_between_tensor_ops():
    def f(x):
        EVENTS.append(0)
        y = x.exp()
        EVENTS.append(len(EVENTS))
        z = y * 2
        EVENTS.append(len(EVENTS))
        return z

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), reset=_reset, observe=lambda: list(EVENTS))


def test_global_tensor_written_in_place():
    def f(x):
        W[0] = x.sum()
        return W * 2

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(4),), reset=_reset, observe=lambda: W)


def test_argument_object_attribute_written():
    class Ctx:
        def __init__(self):
            self.seen = 0

    def f(ctx, x):
        ctx.seen = ctx.seen + x.shape[0]
        return x + ctx.seen

    run_all_modes(f, (Ctx(), rand(2)), (Ctx(), rand(3)), observe=None)


class Counter(nn.Cell):
    def __init__(self):
        super().__init__()
        self.steps = 0
        self.scale = 1.0

    def construct(self, x):
        self.steps += 1
        return x * self.scale + self.steps


def test_cell_attribute_written_in_construct():
    net = Counter()

    def reset():
        net.steps, net.scale = 0, 1.0

    def f(x):
        return net(x)

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), Call((rand(2, seed=2),), before=lambda: setattr(net, "scale", 3.0)),
                  reset=reset, observe=lambda: net.steps)


def test_side_effect_under_tensor_condition():
    def f(x):
        if x.sum() > 0:
            EVENTS.append("pos")
            x = x * 2
        else:
            EVENTS.append("neg")
        return x

    run_all_modes(f, (t(1.0),), (t(-1.0),), (t(2.0),), reset=_reset, observe=lambda: list(EVENTS))


def test_print_to_stdout_each_call(capfd):
    def f(x):
        y = x + 1
        print("value", y)
        return y

    outputs = []

    def observe():
        outputs.append(capfd.readouterr().out)
        return outputs[-1]

    # values whose text is the same in NumPy's layout and kiln.ops.print_'s 6 significant digits
    # (print_ writes an integral float as "2" where NumPy writes "2.", and pads no columns)
    run_all_modes(f, (t(0.5, 1.5),), (t(2.25, 3.25),), reset=lambda: capfd.readouterr(), observe=observe)


class Registry:
    """Class attributes written by compiled code (not an instance's)."""
    count = 0
    names = ()

    def record(self, name):
        Registry.count += 1
        Registry.names = Registry.names + (name,)


def _reset_registry():
    Registry.count, Registry.names = 0, ()


def test_class_attribute_written_in_the_function():
    def f(x):
        Registry.count += 1
        return x * 2

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=_reset_registry,
                  observe=lambda: Registry.count)


def test_class_attribute_written_in_a_called_method():
    reg = Registry()

    def f(x):
        reg.record("step")
        return x + 1

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=_reset_registry,
                  observe=lambda: (Registry.count, Registry.names))


ITEMS = iter(())


def _reset_items():
    global ITEMS
    ITEMS = iter([1.0, 2.0, 3.0, 4.0, 5.0])


def test_next_on_a_global_iterator_each_call():
    def f(x):
        return x + next(ITEMS)

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=_reset_items)


def _numbers():
    for k in range(10):
        yield float(k)


GEN = _numbers()


def _reset_gen():
    global GEN
    GEN = _numbers()


def test_next_on_a_global_generator_each_call():
    def f(x):
        return x * next(GEN)

    run_all_modes(f, (rand(2),), (rand(2, seed=1),), (rand(2, seed=2),), reset=_reset_gen)


def test_iterator_made_in_the_function_across_a_break():
    def f(x, ks):
        it = iter(ks)
        first = next(it)
        print("between", file=OUT)
        out = x * first
        for k in reversed(list(it)):
            out = out * 0.5 + k
        return out

    run_all_modes(f, (rand(2), [3, -1, 2]), (rand(2, seed=1), [3, -1, 2]), (rand(2, seed=2), [1, 5]),
                  reset=_reset)


def test_list_only_appended_to_keeps_its_graph():
    log = []

    def f(x):
        y = (x * x).sum()
        log.append(y)
        return y * 2

    jf = kiln.jit(f, capture_mode="bytecode")
    for s in range(4):
        jf(rand(3, seed=s))
    assert len(log) == 4
    assert jf.stats.compiles <= 2, jf.explain()  # appending reads nothing of the list: no recompile per length


class _Counters:
    """A plain object outside the function whose attributes it writes."""


COUNTERS = _Counters()


def _attribute_write_in_an_untaken_branch(x):
    y = x * 2.0
    if y.sum() > 100.0:  # never taken with these inputs
        COUNTERS.hits = getattr(COUNTERS, "hits", 0) + 1
    return y


def _attribute_write_in_a_loop_that_never_runs(x):
    c = 0
    while c < 2 and x.sum() > 100.0:
        c = c + 1
        COUNTERS.last = c
    return x + 1.0


@pytest.mark.parametrize("fn", [_attribute_write_in_an_untaken_branch, _attribute_write_in_a_loop_that_never_runs],
                         ids=lambda f: f.__name__)
def test_attribute_write_under_a_tensor_condition_happens_only_when_taken(fn):
    """ast capture builds both paths of an if (and a loop body) on a tensor by running them: an
    attribute write there was made at capture whatever the condition, and the capture's run stood
    as the first call's. It is now undone and the call runs eagerly, as a list change there is."""
    def observe():
        return sorted(vars(COUNTERS).items())

    run_all_modes(fn, Call((rand(2, 3, seed=1),)), Call((rand(2, 3, seed=2),)),
                  reset=lambda: vars(COUNTERS).clear(), observe=observe)


def test_cell_counter_under_a_tensor_condition():
    """The same in a Cell: `self.hits += 1` under an if on a tensor that is not taken."""
    from kiln import nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.hits = 0
            self.dense = nn.Dense(3, 3)

        def construct(self, x):
            y = self.dense(x)
            if y.sum() > 100.0:
                self.hits = self.hits + 1
            return y

    kiln.manual_seed(0)
    net = Net()

    def reset():
        net.hits = 0

    run_all_modes(lambda x: net(x), Call((rand(2, 3, seed=1),)), Call((rand(2, 3, seed=3),)), reset=reset,
                  observe=lambda: net.hits)
