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


class TanhResidualBlock(nn.Cell):
    """x + tanh(dense(x)): the backward reads the block's input and its tanh."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Dense(width, width)

    def construct(self, x):
        return x + ops.tanh(self.fc(x))


def tanh_residual_mlp(nblocks, width):
    return nn.SequentialCell([TanhResidualBlock(width) for _ in range(nblocks)])


class ConvResidualBlock(nn.Cell):
    """x + relu(batchnorm(conv3x3(x))), channels and size kept."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def construct(self, x):
        return x + ops.relu(self.bn(self.conv(x)))


def conv_residual_cnn(nblocks, channels):
    return nn.SequentialCell([ConvResidualBlock(channels) for _ in range(nblocks)])


def basicblock_stack(nblocks, channels):
    """nblocks seed BasicBlocks (kiln.models) in a row, then a global average pool."""
    return nn.SequentialCell([models.BasicBlock(channels) for _ in range(nblocks)])


class Step:
    """One training step of `net` on the mean square of its output, jitted; `jit_options` go to
    kiln.jit (sublinear_memory_config, exec_order, ...), or with entry="trace" to
    kiln.trace(symbolic=True, verify=False, ...) (MegEngine's spelling; verify=True would also run
    the step eagerly on every call, and hold what eager holds). The network is made under
    kiln.manual_seed(seed), so two Steps of the same builder start from the same parameters."""

    def __init__(self, build, seed=0, lr=0.01, recompute_cells=False, entry="jit", **jit_options):
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

        if entry == "trace":
            self.step = kiln.trace(step, symbolic=True, verify=False, **jit_options)
        else:
            jit_options.setdefault("jit_level", "O1")
            self.step = kiln.jit(step, capture_mode="trace", **jit_options)

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
