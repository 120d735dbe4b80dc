"""The seed's two blocks (kiln.models.BasicBlock, kiln.models.LlamaAttention) at small sizes, with
data and training steps, for the rank programs of tests/python/test_distributed_equivalence.py,
test_distributed_deterministic.py and test_distributed_restart.py (imported on each rank; the
tests directory is on their path).

A step trains on (x, y) with MSE loss and SGD with momentum; `variant` is "eager",
(capture_mode, jit_level, backend) for kiln.jit (MindSpore-style steps) or ("trace", opt_level,
symbolic) for kiln.trace (MegEngine-style steps: kiln.jit runs a step whose GradManager assigns
.grad eagerly; kiln.trace compiles it; opt_level 0 is O0, 2 is O1; it has one backend). Data-parallel steps all-reduce the gradients
(mean) across the ranks: MindSpore-style through TrainOneStepCell in data_parallel mode,
MegEngine-style through GradManager with make_allreduce_cb("mean")."""
import numpy as np

import kiln
from kiln import models, nn

B = 2                    # per-rank batch
CHANNELS, SIZE = 4, 5    # BasicBlock: (B, 4, 5, 5)
HIDDEN, HEADS, KV_HEADS, SEQ = 16, 4, 2, 5
LR, MOMENTUM = 0.05, 0.9
JIT_VARIANTS = [("ast", lv, be) for lv in ("O0", "O1") for be in ("kbk", "sink")]
TRACE_VARIANTS = [("trace", level, symbolic) for level in (0, 2) for symbolic in (False, True)]


class AttentionNet(nn.Cell):
    """The seed's Llama attention block on positions 0..SEQ-1 (one row of position ids,
    broadcast over the batch)."""

    def __init__(self):
        super().__init__()
        self.attention = models.LlamaAttention(HIDDEN, HEADS, KV_HEADS)
        self.position_ids = kiln.tensor(np.arange(SEQ, dtype=np.int64)[None, :])

    def construct(self, x):
        return self.attention(x, self.position_ids)


def make_net(block, seed=0, train_bn=False):
    """The block with seeded parameters. BasicBlock's batch norms normalize with their running
    statistics unless train_bn: in training mode each rank normalizes its own shard (no
    SyncBatchNorm), which one process on the whole batch does not."""
    kiln.manual_seed(seed)
    if block == "basic":
        net = models.BasicBlock(CHANNELS)
        net.set_train(train_bn)
        return net
    return AttentionNet()


def input_shape(block, batch):
    return (batch, CHANNELS, SIZE, SIZE) if block == "basic" else (batch, SEQ, HIDDEN)


def global_batches(block, steps, ranks, seed=1):
    """steps global batches of ranks * B samples: [(x, y)] float32 arrays."""
    rng = np.random.RandomState(seed)
    shape = input_shape(block, ranks * B)
    return [(rng.randn(*shape).astype(np.float32), rng.randn(*shape).astype(np.float32)) for _ in range(steps)]


def shard(batch, rank, ranks):
    """Rank `rank`'s contiguous B samples of a global batch."""
    x, y = batch
    return x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]


def optimizer(net):
    return nn.SGD(net.trainable_params(), LR, momentum=MOMENTUM)


def _jit(fn, variant):
    if variant == "eager":
        return fn
    mode, level, backend = variant
    if mode == "trace":
        return kiln.trace(fn, opt_level=level, symbolic=backend)
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


def mindspore_step(net, opt, variant, data_parallel):
    """TrainOneStepCell (in data_parallel mode when asked: gradients all-reduced, averaged)."""
    if data_parallel:
        kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    kiln.reset_auto_parallel_context()
    return _jit(lambda x, y: train(x, y), variant)


def megengine_step(net, opt, variant, data_parallel):
    """GradManager (with make_allreduce_cb("mean") when data_parallel) and the optimizer."""
    from kiln.autodiff import GradManager

    callbacks = []
    if data_parallel:
        import kiln.distributed as dist

        callbacks = [dist.make_allreduce_cb("mean")]
    params = net.trainable_params()
    gm = GradManager().attach(params, callbacks=callbacks)
    loss_fn = nn.MSELoss()

    def step(x, y):
        with gm:
            loss = loss_fn(net(x), y)
            gm.backward(loss)
        opt([p.grad for p in params])
        for p in params:
            p.grad = None
        return loss

    return _jit(step, variant)


STYLES = {"mindspore": mindspore_step, "megengine": megengine_step}


def train(step, batches):
    """The step's loss on each (x, y)."""
    return [step(kiln.tensor(x), kiln.tensor(y)) for x, y in batches]


def per_shard_reference(net, batches, ranks):
    """One process's training that computes what data-parallel training on `ranks` ranks
    computes, in the same order: each shard's loss and gradients (the mean over its B samples),
    summed in rank order and multiplied by 1 / ranks (as the deterministic all-reduce's mean does
    for a power-of-two number of ranks), then the optimizer. Returns the losses."""
    assert ranks & (ranks - 1) == 0, "the mean's product by 1 / ranks is exact for a power of two only"
    opt = optimizer(net)
    loss_fn = nn.MSELoss()
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    losses = []
    for batch in batches:
        total_loss, total = None, None
        for r in range(ranks):
            x, y = shard(batch, r, ranks)
            loss, grads = grad_fn(kiln.tensor(x), kiln.tensor(y))
            total_loss = loss if total_loss is None else total_loss + loss
            total = list(grads) if total is None else [a + g for a, g in zip(total, grads)]
        opt([g * (1.0 / ranks) for g in total])
        losses.append((total_loss * (1.0 / ranks)).numpy())
    return losses


def parameters(net):
    """{name: array} of the trainable parameters."""
    return {p.name: p.numpy().copy() for p in net.trainable_params()}


def digest(arrays):
    """A hex digest of the exact bits of a list of arrays (or a {name: array})."""
    import hashlib

    h = hashlib.sha256()
    items = sorted(arrays.items()) if isinstance(arrays, dict) else enumerate(arrays)
    for name, a in items:
        h.update(str(name).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
