"""Data-parallel training on 2 ranks with batch B each gives the loss curve and the parameters
of one process training on batch 2B: an MLP, MindSpore-style (TrainOneStepCell in data_parallel
mode, DistributedSampler shards) and MegEngine-style (GradManager with make_allreduce_cb),
eagerly and jitted (capture modes x O0 / O1 x kbk / sink)."""
from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

COMMON = """
import numpy as np
import kiln
from kiln import nn

STEPS, B = 5, 4


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(5, 8)
        self.fc2 = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc2(self.fc1(x).tanh())


def fresh_net(seed):
    kiln.manual_seed(seed)
    return MLP()


def assert_same_training(losses, net, ref_losses, ref_net, what):
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6, atol=1e-7, err_msg=what)
    for p, q in zip(net.trainable_params(), ref_net.trainable_params()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{what}: {p.name}")
"""

MINDSPORE = COMMON + """
from kiln import communication
from kiln.ops import collective as C

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
rng = np.random.RandomState(0)
X = rng.randn(STEPS * n * B, 5).astype(np.float32)
Y = rng.randn(STEPS * n * B, 3).astype(np.float32)


def train_cell(net):
    return nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1, momentum=0.9))


# one process, batch n * B, the shared order of the sampler
kiln.reset_auto_parallel_context()
ref_net = fresh_net(3)
ref = train_cell(ref_net)
order = list(kiln.dataset.DistributedSampler(len(X), num_replicas=1, rank=0, seed=5))
ref_losses = [ref(kiln.tensor(X[order[s * n * B:(s + 1) * n * B]]), kiln.tensor(Y[order[s * n * B:(s + 1) * n * B]])).item()
              for s in range(STEPS)]

VARIANTS = ["eager"] + [(m, lv, be) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1")
                        for be in ("kbk", "sink")]
for variant in VARIANTS:
    kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True, parameter_broadcast=True)
    # each rank starts from other parameters: parameter_broadcast gives every rank rank 0's
    net = fresh_net(3 if r == 0 else 100 + r)
    train = train_cell(net)
    kiln.reset_auto_parallel_context()
    if variant == "eager":
        step = train
    else:
        step = kiln.jit(lambda x, y: train(x, y), capture_mode=variant[0], jit_level=variant[1], backend=variant[2])
    shard = list(kiln.dataset.DistributedSampler(len(X), seed=5))
    assert len(shard) == STEPS * B
    losses = []
    for s in range(STEPS):
        idx = shard[s * B:(s + 1) * B]
        loss = step(kiln.tensor(X[idx]), kiln.tensor(Y[idx]))
        losses.append(C.all_reduce(loss, "mean").item())  # the mean over the global batch
    assert_same_training(losses, net, ref_losses, ref_net, str(variant))
    if variant != "eager":
        info = step.cache_info()
        assert info.eager_calls == 0 and info.compiles == 1, (variant, info)

# DistributedGradReducer by hand, with buckets split by all_reduce_fusion_config and a small size
kiln.set_auto_parallel_context(all_reduce_fusion_config=[2], comm_fusion={"allreduce": {"mode": "size", "config": 1}})
net = fresh_net(3)
opt = nn.SGD(net.trainable_params(), 0.1, momentum=0.9)
grad_fn = kiln.value_and_grad(lambda x, y: nn.MSELoss()(net(x), y), None, opt.parameters)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=n)
losses = []
for s in range(STEPS):
    idx = shard[s * B:(s + 1) * B]
    loss, grads = grad_fn(kiln.tensor(X[idx]), kiln.tensor(Y[idx]))
    opt(reducer(grads))
    losses.append(C.all_reduce(loss, "mean").item())
assert_same_training(losses, net, ref_losses, ref_net, "DistributedGradReducer")
# mean=False sums: twice the averaged gradient
g = [kiln.tensor(np.full((2, 2), 1.0 + r, np.float32))]
summed = nn.DistributedGradReducer(g, mean=False)(g)[0].numpy()
np.testing.assert_array_equal(summed, np.full((2, 2), sum(1.0 + q for q in range(n)), np.float32))
kiln.reset_auto_parallel_context()
print(f"rank {r} ok", flush=True)
"""

MEGENGINE = COMMON + """
import kiln.distributed as dist
from kiln.autodiff import GradManager

dist.init_process_group()
r, n = dist.get_rank(), dist.get_world_size()
rng = np.random.RandomState(1)
X = rng.randn(STEPS, n * B, 5).astype(np.float32)
Y = rng.randn(STEPS, n * B, 3).astype(np.float32)


def train(net, batches, callbacks, jitted):
    opt = nn.SGD(net.trainable_params(), 0.1)
    gm = GradManager().attach(net.trainable_params(), callbacks=callbacks)

    def step(x, y):
        with gm:
            loss = nn.MSELoss()(net(x), y)
            gm.backward(loss)
        opt([p.grad for p in net.trainable_params()])
        for p in net.trainable_params():
            p.grad = None
        return loss

    if jitted:
        step = kiln.trace(step)
    return [dist.functional.all_reduce_mean(step(kiln.tensor(x), kiln.tensor(y))).item() for x, y in batches]


ref_net = fresh_net(4)
ref_losses = train(ref_net, [(X[s], Y[s]) for s in range(STEPS)], [], False)
for jitted in (False, True):
    net = fresh_net(4)
    losses = train(net, [(X[s, r::n], Y[s, r::n]) for s in range(STEPS)], [dist.make_allreduce_cb("mean")], jitted)
    assert_same_training(losses, net, ref_losses, ref_net, f"megengine jitted={jitted}")
print(f"rank {r} ok", flush=True)
"""


def test_mindspore_data_parallel_equals_one_process_with_the_whole_batch():
    run_ranks(2, MINDSPORE, timeout=500)


def test_megengine_data_parallel_equals_one_process_with_the_whole_batch():
    run_ranks(2, MEGENGINE)
