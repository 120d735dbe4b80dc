"""Conformance: with blocks. A context manager's __exit__ changes state the caller sees (kiln's grad
mode, a log), so a compiled call must run it at every call, wherever the block ends: after a loop
(CPython 3.11 puts a NOP before the exit call there), at a return, break or continue inside it,
nested. A bytecode capture once held the exit after a loop in its graph as a call run at capture
only: from the first call served by that graph on, grad mode stayed disabled after the call, and
every eager computation after it lost its gradients. Each case runs eagerly and in every variant,
and observes grad mode and the log after each call."""
import pytest

import kiln
from conformance import Call, TRACE_VARIANTS, VARIANTS, rand, run_all_modes

LOG = []


class Logged:
    """A user context manager whose enter and exit are side effects."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        LOG.append(f"enter {self.name}")
        return self

    def __exit__(self, *exc):
        LOG.append(f"exit {self.name}")
        return False


def _observe():
    return (kiln._C.is_grad_enabled(), list(LOG))


def _calls():
    return [Call((rand(2, 3, seed=s), rand(2, 3, seed=s + 1))) for s in (1, 3, 5, 7)]


def no_grad_after_a_loop(x, y):
    acc = x * 2.0
    with kiln.no_grad():
        for t in (x, y):
            acc = acc + t
    return acc * y


def logged_after_a_loop(x, y):
    with Logged("a"):
        for k in range(2):
            x = x + y * k
    return x.sum()


def return_inside(x, y):
    with Logged("b"):
        if x.shape[0] == 2:
            return x * y
        x = x + 1.0
    return x


def break_and_continue_inside(x, y):
    out = x
    for k in range(4):
        with Logged(f"c{k}"):
            if k == 1:
                continue
            if k == 3:
                break
            out = out + y
    return out


def nested(x, y):
    with kiln.no_grad():
        with Logged("d"):
            for t in (x, y):
                x = x * t
    with kiln.enable_grad():
        y = y + 1.0
    return x + y


CASES = [no_grad_after_a_loop, logged_after_a_loop, return_inside, break_and_continue_inside, nested]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_with_block_exits_run_at_every_call(fn):
    assert kiln._C.is_grad_enabled()
    run_all_modes(fn, *_calls(), reset=LOG.clear, observe=_observe, variants=VARIANTS + TRACE_VARIANTS)
    assert kiln._C.is_grad_enabled()


def test_grad_mode_is_restored_after_a_jitted_training_step_with_a_manual_update():
    """The step that showed it: SGD written by hand under no_grad, bytecode capture, a layer frozen
    and unfrozen between calls (the third call is served by the graphs of the first); the eager
    gradient computed after the jitted calls must still exist."""
    from kiln import nn

    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(3, 4), nn.ReLU(), nn.Dense(4, 1)])

    def step(x, y):
        params = net.trainable_params()
        loss, grads = kiln.value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, params)(x, y)
        with kiln.no_grad():
            for p, g in zip(params, grads):
                p -= 0.1 * g
        return loss, len(params)

    js = kiln.jit(step, capture_mode="bytecode")
    for call, frozen in enumerate((False, True, False, False)):
        net[0].weight.requires_grad = not frozen
        js(rand(2, 3, seed=call), rand(2, 1, seed=call + 10))
        enabled = kiln._C.is_grad_enabled()
        kiln._C.set_grad_enabled(True)
        assert enabled, f"grad mode left disabled after call {call}"
    assert net(rand(2, 3)).sum().requires_grad
