"""Gradient accumulation (issue 32, nn.GradientAccumulation): k micro-batches of B on 2 ranks train
as one process on the 2 x k x B batch, the ranks all-reducing once per bucket every k micro-batches
(collectives counted), eagerly and with the accumulate / apply steps compiled (capture modes x
O0 / O1 x kbk / sink); bad settings raise."""
import pytest

import kiln
from distributed_util import needs_mpi, run_ranks
from kiln import nn

PROGRAM = """
import numpy as np
import kiln
from kiln import _C, communication, nn
from kiln.nn import grad_reduce

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
K, B, CYCLES = 3, 2, 2


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 6)
        self.fc2 = nn.Dense(6, 2)

    def construct(self, x):
        return self.fc2(self.fc1(x).tanh())


rng = np.random.RandomState(0)
X = rng.randn(CYCLES, n * K * B, 4).astype(np.float32)
Y = rng.randn(CYCLES, n * K * B, 2).astype(np.float32)


def fresh(parallel):
    kiln.reset_auto_parallel_context()
    if parallel:
        kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    kiln.manual_seed(7)
    net = Net()
    opt = nn.SGD(net.trainable_params(), 0.1, momentum=0.9)
    loss_fn = nn.MSELoss()
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    return net, opt, grad_fn


# one process, one step per cycle on the whole batch of n * K * B
net, opt, grad_fn = fresh(False)
for c in range(CYCLES):
    opt(grad_fn(kiln.tensor(X[c]), kiln.tensor(Y[c]))[1])
ref = [p.numpy() for p in net.trainable_params()]
kiln.reset_auto_parallel_context()

# this rank's micro-batch m of cycle c: rows of its share of the batch
rows = lambda m: slice(r * K * B + m * B, r * K * B + (m + 1) * B)  # noqa: E731
buckets = len(grad_reduce.gradient_buckets([p for p in Net().trainable_params()], kiln.context.gradient_bucket_bytes()))
assert buckets == 1


def run(variant):
    net, opt, grad_fn = fresh(True)
    acc = nn.GradientAccumulation(K, opt)
    kiln.reset_auto_parallel_context()
    if variant == "eager":
        def micro(x, y, last):
            loss, grads = grad_fn(x, y)
            return acc(loss, grads)
    else:
        jit = lambda f: kiln.jit(f, capture_mode=variant[0], jit_level=variant[1], backend=variant[2])  # noqa: E731
        accumulate = jit(lambda x, y: acc.accumulate(grad_fn(x, y)[1]))
        apply = jit(lambda x, y: acc.apply(grad_fn(x, y)[1]))
        micro = lambda x, y, last: (apply if last else accumulate)(x, y)  # noqa: E731
    per_cycle = []
    for c in range(CYCLES):
        before = _C.comm_collective_count()
        for m in range(K):
            micro(kiln.tensor(X[c, rows(m)]), kiln.tensor(Y[c, rows(m)]), m == K - 1)
        per_cycle.append(_C.comm_collective_count() - before)
    # one all-reduce per bucket per K micro-batches (O0: one per gradient, unbucketed)
    want = len(ref) if variant != "eager" and variant[1] == "O0" else buckets
    assert per_cycle[-1] == want, (variant, per_cycle)
    for p, q in zip(net.trainable_params(), ref):
        np.testing.assert_allclose(p.numpy(), q, rtol=1e-5, atol=1e-6, err_msg=f"{variant}: {p.name}")
    if variant != "eager":
        for f in (accumulate, apply):
            info = f.cache_info()
            assert info.eager_calls == 0 and info.compiles == 1, (variant, info)


run("eager")
for variant in [(m, lv, be) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for be in ("kbk", "sink")]:
    run(variant)
print(f"rank {r} ok", flush=True)
"""


@needs_mpi
def test_k_micro_batches_on_two_ranks_train_as_one_process_on_the_whole_batch_syncing_once():
    run_ranks(2, PROGRAM, timeout=600)


def test_bad_accumulation_settings_raise():
    opt = nn.SGD(nn.Dense(2, 2).trainable_params(), 0.1)
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="max_accumulation_step"):
            nn.GradientAccumulation(bad, opt)
    with pytest.raises(TypeError, match="optimizer must be an optimizer"):
        nn.GradientAccumulation(2, kiln.ops.zeros((2, 3)))
    acc = nn.GradientAccumulation(2, opt)
    with pytest.raises(ValueError, match="1 gradients for 2 parameters"):
        acc(kiln.ops.zeros(()), [kiln.ops.zeros((2, 2))])


def test_one_process_accumulation_equals_one_step_on_the_whole_batch():
    import numpy as np

    rng = np.random.RandomState(1)
    x, y = rng.randn(6, 3).astype(np.float32), rng.randn(6, 2).astype(np.float32)

    def fresh():
        kiln.manual_seed(2)
        net = nn.Dense(3, 2)
        opt, loss_fn = nn.SGD(net.trainable_params(), 0.1), nn.MSELoss()
        return net, opt, kiln.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)

    net, opt, grad_fn = fresh()
    opt(grad_fn(kiln.tensor(x), kiln.tensor(y))[1])
    want = [p.numpy() for p in net.trainable_params()]
    net, opt, grad_fn = fresh()
    acc = nn.GradientAccumulation(3, opt)
    for m in range(3):
        before = [p.numpy() for p in net.trainable_params()]
        acc(*grad_fn(kiln.tensor(x[2 * m:2 * m + 2]), kiln.tensor(y[2 * m:2 * m + 2])))
        if m < 2:  # nothing applied before the third micro-batch
            for p, q in zip(net.trainable_params(), before):
                np.testing.assert_array_equal(p.numpy(), q)
    for p, q in zip(net.trainable_params(), want):
        np.testing.assert_allclose(p.numpy(), q, rtol=1e-5, atol=1e-6)
