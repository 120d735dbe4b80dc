"""Training steps for the sublinear-memory benchmark and tests (issue 15): forward, backward and an
SGD update compiled into one graph by kiln.jit, built the same way with and without recomputation
so that their losses, parameters and memory plans can be compared."""
import numpy as np

import kiln
from kiln import models, nn, ops


class ResidualBlock(nn.Cell):
    """x + relu(dense(x)), optionally with dropout after the activation."""

    def __init__(self, width, dropout=0.0):
        super().__init__()
        self.fc = nn.Dense(width, width)
        self.drop = nn.Dropout(p=dropout) if dropout else None

    def construct(self, x):
        h = ops.relu(self.fc(x))
        if self.drop is not None:
            h = self.drop(h)
        return x + h


def residual_mlp(nblocks, width, dropout=0.0):
    return nn.SequentialCell([ResidualBlock(width, dropout) for _ in range(nblocks)])


def basicblock_stack(nblocks, channels):
    """nblocks seed BasicBlocks (kiln.models) in a row, then a global average pool."""
    return nn.SequentialCell([models.BasicBlock(channels) for _ in range(nblocks)])


class Step:
    """One training step of `net` on the mean square of its output, jitted; `jit_options` go to
    kiln.jit (sublinear_memory_config, exec_order, ...). The network is made under
    kiln.manual_seed(seed), so two Steps of the same builder start from the same parameters."""

    def __init__(self, build, seed=0, lr=0.01, recompute_cells=False, **jit_options):
        kiln.manual_seed(seed)
        self.net = build()
        if recompute_cells:
            for cell in self.net.cells():
                cell.recompute()
        self.net.set_train(True)
        self.opt = nn.SGD(self.net.trainable_params(), learning_rate=lr)
        net = self.net
        grad_fn = kiln.value_and_grad(lambda x: (net(x) ** 2).mean(), None, self.opt.parameters)

        def step(x):
            loss, grads = grad_fn(x)
            self.opt(grads)
            return loss

        self.step = kiln.jit(step, jit_level="O1", capture_mode="trace", **jit_options)

    def __call__(self, x):
        return self.step(x)

    def parameters(self):
        return [p.asnumpy().copy() for p in self.net.trainable_params()]

    def report(self):
        return self.step.memory_report()

    def first_call(self, x):
        """The first call (it traces and compiles); notes what kiln's allocator held before it."""
        import gc

        gc.collect()
        self._held_before = kiln._C.memory_stats()[0]
        return self.step(x)

    def measured_peak(self, x):
        """Bytes kiln's allocator held at its high-water mark during a call of the compiled step,
        beyond what it held before the first call: the arena the compile allocated, the outputs,
        and whatever else a call or the compiled graph holds."""
        kiln._C.reset_peak_memory()
        self.step(x)
        return kiln._C.memory_stats()[1] - self._held_before


def inputs(shape, seed=1):
    return kiln.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
