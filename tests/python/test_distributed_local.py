"""Communication in a process started alone (the local backend, no MPI at run time): rank 0 of
1, every collective the identity, compiled like any op; the settings and helpers of data
parallelism that need no peers (auto-parallel context, gradient buckets, DistributedSampler)."""
import subprocess
import sys
import os

import numpy as np
import pytest

import kiln
from kiln import communication, nn
from kiln.nn import grad_reduce
from kiln.ops import collective as C

from compiled_equal import assert_compiled_equal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module", autouse=True)
def local_communication():
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        pytest.skip("runs in a process started alone, not under mpirun")
    assert communication.init("local") == "local"
    yield


def test_a_process_alone_is_rank_0_of_1():
    assert communication.get_backend() == "local"
    assert (communication.get_rank(), communication.get_group_size()) == (0, 1)
    assert (kiln.distributed.get_rank(), kiln.distributed.get_world_size()) == (0, 1)
    assert not kiln.distributed.is_distributed()
    assert communication.init("local") == "local"  # again: nothing
    with pytest.raises(ValueError, match="already initialized with the local backend, not mpi"):
        communication.init("mpi")
    assert set(kiln._C.comm_backend_names()) == {"local", "mpi"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_every_collective_of_one_rank_is_the_identity(dtype):
    a = (np.arange(12).reshape(4, 3) % 5 + 1).astype(dtype)
    x = kiln.tensor(a)
    ops = ["sum", "max", "min", "prod"] + (["mean"] if dtype != np.int32 else [])
    for op in ops:
        for got in (C.all_reduce(x, op), C.reduce_scatter(x, op), C.reduce(x, 0, op)):
            assert got.numpy().dtype == a.dtype
            np.testing.assert_array_equal(got.numpy(), a)
    np.testing.assert_array_equal(C.all_gather(x).numpy(), a)
    np.testing.assert_array_equal(C.broadcast(x, 0).numpy(), a)
    C.barrier()


def test_local_errors():
    x = kiln.tensor(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="the destination must be another rank"):
        C.send(x, 0)
    with pytest.raises(ValueError, match="root 1 is not a rank of the group"):
        C.broadcast(x, 1)
    with pytest.raises(ValueError, match="rank 1 is not in"):
        communication.create_group("g", [0, 1])
    with pytest.raises(ValueError, match="all_gather: the tensor must have at least one axis"):
        C.all_gather(kiln.tensor(1.0))
    with pytest.raises(TypeError, match="reductions take int8, int32, int64, float32 or float64"):
        C.all_reduce(kiln.tensor(np.ones(2, np.float16)))
    with pytest.raises(ValueError, match="no communication group 5"):
        C.all_reduce(x, group=5)
    g = communication.create_group("me", [0])
    assert communication.get_group_size("me") == 1 and g > 0
    np.testing.assert_array_equal(C.all_reduce(x, group="me").numpy(), x.numpy())
    communication.destroy_group("me")
    with pytest.raises(ValueError, match="no communication group named 'me'"):
        C.all_reduce(x, group="me")


def test_collectives_need_init_first():
    code = ("import numpy as np, kiln\nfrom kiln.ops import collective as C\n"
            "try:\n    C.all_reduce(kiln.tensor(np.ones(2)))\nexcept RuntimeError as e:\n    print(e)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    env.pop("OMPI_COMM_WORLD_SIZE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "all_reduce: communication is not initialized (call kiln.communication.init()" in out, out


def _step(x, w):
    y = C.all_reduce(x * w, "sum")
    z = C.all_gather(y.sin())
    return (C.reduce_scatter(z, "mean") * w).sum() + C.broadcast(x, 0).sum() + C.all_reduce(x, "prod").sum()


def test_collectives_compile_in_every_variant_with_their_gradients():
    x = kiln.tensor(np.random.RandomState(0).randn(4, 3).astype(np.float32))
    w = kiln.tensor(np.random.RandomState(1).randn(4, 3).astype(np.float32))
    assert_compiled_equal(_step, (x, w), (x * 2, w))
    assert_compiled_equal(_step, (x, w), grad=True)


def _unused_collective(x):
    C.all_reduce(x)  # its result unused: an effect, never removed
    C.all_reduce(x)  # the same twice: never merged
    return x * 2


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_collectives_are_never_removed_or_merged(mode):
    x = kiln.tensor(np.ones(3, np.float32))
    f = kiln.jit(_unused_collective, capture_mode=mode, jit_level="O1")
    np.testing.assert_array_equal(f(x).numpy(), 2 * np.ones(3))
    assert f.graph_str(x).count("all_reduce") == 2, f.graph_str(x)


def test_auto_parallel_context():
    try:
        kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True,
                                       all_reduce_fusion_config=[3, 5])
        assert kiln.get_auto_parallel_context("parallel_mode") == kiln.ParallelMode.DATA_PARALLEL
        assert kiln.get_auto_parallel_context("gradients_mean") is True
        for bad in ({"parallel_mode": "auto_parallel"}, {"gradients_mean": 1}, {"all_reduce_fusion_config": [5, 3]},
                    {"comm_fusion": {"allreduce": {"mode": "size", "config": 0}}}, {"unknown": 1}):
            with pytest.raises(ValueError):
                kiln.set_auto_parallel_context(**bad)
        assert kiln.get_auto_parallel_context("all_reduce_fusion_config") == [3, 5]
    finally:
        kiln.reset_auto_parallel_context()
    assert kiln.get_auto_parallel_context("parallel_mode") == "stand_alone"
    with pytest.raises(ValueError, match="unknown setting"):
        kiln.get_auto_parallel_context("nope")


def test_gradient_buckets():
    grads = [kiln.ops.zeros((256,), kiln.float32) for _ in range(5)] + [kiln.ops.zeros((8,), kiln.float64)]
    # last first; one dtype per bucket; at most 2 KB (two of the float32 gradients) each
    assert grad_reduce.gradient_buckets(grads, 2048) == [[5], [4, 3], [2, 1], [0]]
    assert grad_reduce.gradient_buckets(grads, 1 << 20) == [[5], [4, 3, 2, 1, 0]]
    assert grad_reduce.gradient_buckets(grads, 1 << 20, split_indices=[2]) == [[5], [4, 3, 2], [1, 0]]
    reduced = grad_reduce.reduce_gradients([kiln.ops.ones((2, 3)), kiln.ops.ones((4,)) * 2], bucket_bytes=1 << 20)
    np.testing.assert_array_equal(reduced[0].numpy(), np.ones((2, 3)))
    np.testing.assert_array_equal(reduced[1].numpy(), np.full(4, 2.0))


def test_train_one_step_cell_in_data_parallel_mode_on_one_rank_trains_as_alone():
    def run(parallel):
        kiln.manual_seed(1)
        net = nn.Dense(3, 2)
        if parallel:
            kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
        try:
            train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
        finally:
            kiln.reset_auto_parallel_context()
        x, y = kiln.tensor(np.ones((4, 3), np.float32)), kiln.tensor(np.zeros((4, 2), np.float32))
        return [train(x, y).item() for _ in range(3)]

    assert run(True) == run(False)


def test_distributed_sampler_gives_disjoint_shards_of_one_order():
    shards = [list(kiln.dataset.DistributedSampler(10, num_replicas=3, rank=k, seed=4)) for k in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    flat = [i for s in shards for i in s]
    assert sorted(set(flat)) == list(range(10))  # every index, two of them twice (padding)
    whole = list(kiln.dataset.DistributedSampler(10, num_replicas=1, rank=0, seed=4))
    for k in range(3):
        assert shards[k] == (whole + whole[:2])[k::3]
    # a new order each epoch, the same on every rank; set_epoch chooses it
    s = kiln.dataset.DistributedSampler(10, num_replicas=2, rank=1, seed=4)
    first, second = list(s), list(s)
    assert first != second
    s.set_epoch(0)
    assert list(s) == first
    dropped = [list(kiln.dataset.DistributedSampler(10, num_shards=3, shard_id=k, shuffle=False, drop_last=True))
               for k in range(3)]
    assert dropped == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    batched = kiln.dataset.DistributedSampler(10, num_replicas=2, rank=0, shuffle=False, batch_size=2)
    assert list(batched) == [[0, 2], [4, 6], [8]] and len(batched) == 3
    for bad in ({"num_replicas": 0}, {"num_replicas": 2, "rank": 2}, {"seed": 1.5}):
        with pytest.raises(ValueError):
            kiln.dataset.DistributedSampler(10, **bad)


def test_mpirun_command_adds_what_containers_need():
    from kiln.distributed import mpirun

    if mpirun.shutil.which("mpirun") is None:
        pytest.skip("needs mpirun")
    cmd = mpirun.mpirun_command(2, ["python3", "t.py"], threads=1)
    assert cmd[1:3] == ["-n", "2"] and cmd[-2:] == ["python3", "t.py"]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    assert "btl_vader_single_copy_mechanism" in cmd and "OMP_NUM_THREADS=1" in cmd
    hosts = mpirun.mpirun_command(4, ["x"], hosts="a,b")
    assert hosts[hosts.index("--host") + 1] == "a,b"
    assert f"OMP_NUM_THREADS={max(1, (os.cpu_count() or 1) // 2)}" in hosts
    with pytest.raises(ValueError, match="nproc must be an int >= 1"):
        mpirun.mpirun_command(0, ["x"])
