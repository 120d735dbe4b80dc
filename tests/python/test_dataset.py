"""kiln.dataset (issue 30): MindSpore's GeneratorDataset / NumpySlicesDataset with shuffle, map,
batch, repeat, take/skip/project and their iterators; PyTorch's and MegEngine's DataLoader with
samplers; worker processes giving the results of zero workers in order, repeatable with a seed,
shutting down when a loop breaks, and re-raising a worker's error; a jitted training loop over it."""
import multiprocessing
import os
import time

import numpy as np
import pytest

import kiln
from kiln import dataset as ds
from kiln import nn


@pytest.fixture(autouse=True)
def seeded():
    ds.config.set_seed(1234)
    yield


def rows(it):
    return [[np.asarray(v).tolist() for v in r] for r in it]


def test_numpy_slices_batch_map_repeat_take():
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    y = np.arange(5, dtype=np.int64)
    d = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
    assert d.get_dataset_size() == 5 and d.get_col_names() == ["x", "y"]
    b = d.map(lambda v: v * 2, input_columns="x").batch(2, drop_remainder=False)
    got = rows(b.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert got == [[[[0, 2], [4, 6]], [0, 1]], [[[8, 10], [12, 14]], [2, 3]], [[[16, 18]], [4]]]
    assert b.get_dataset_size() == 3 and d.batch(2, drop_remainder=True).get_dataset_size() == 2
    assert [r["y"].tolist() for r in d.repeat(2).take(7).create_dict_iterator(num_epochs=1, output_numpy=True)] \
        == [0, 1, 2, 3, 4, 0, 1]
    assert rows(d.skip(3).project("y").create_tuple_iterator(num_epochs=1, output_numpy=True)) == [[3], [4]]
    t = next(iter(d.create_tuple_iterator()))
    assert isinstance(t[0], kiln.Tensor) and t[0].dtype == kiln.float32


def test_shuffle_is_repeatable_with_a_seed_and_new_each_epoch():
    d = ds.NumpySlicesDataset(np.arange(20), column_names=["v"])  # shuffled by default, as MindSpore's

    def epochs():
        it = iter(d.create_tuple_iterator(num_epochs=2, output_numpy=True))
        return [int(next(it)[0]) for _ in range(40)]

    a, b = epochs(), epochs()
    assert a == b and sorted(a[:20]) == list(range(20)) and a[:20] != a[20:] and a[:20] != list(range(20))
    ds.config.set_seed(99)
    assert epochs() != a


class Squares:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full(3, i, np.float32), np.int64(i * i)


def burn(v):
    return np.sin(v) + v  # real work in the worker


def test_workers_give_zero_workers_results_in_order():
    one = ds.GeneratorDataset(Squares(), ["x", "y"], shuffle=False).map(burn, "x").batch(4)
    many = ds.GeneratorDataset(Squares(), ["x", "y"], shuffle=False, num_parallel_workers=2) \
        .map(burn, "x", num_parallel_workers=2).batch(4)
    a = rows(one.create_tuple_iterator(num_epochs=1, output_numpy=True))
    b = rows(many.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert a == b and len(a) == 3


def test_generator_function_and_iterable_sources():
    def gen():
        for i in range(4):
            yield np.array([i]), np.array(i % 2)

    d = ds.GeneratorDataset(gen, ["a", "b"])
    assert rows(d.create_tuple_iterator(num_epochs=1, output_numpy=True)) == [[[0], 0], [[1], 1], [[2], 0], [[3], 1]]
    assert d.get_dataset_size() == 4
    with pytest.raises(ValueError, match="a row has 2 columns, the dataset names 3"):
        list(ds.GeneratorDataset(gen, ["a", "b", "c"]).create_tuple_iterator(num_epochs=1))


def test_dataloader_samplers_and_workers():
    data = ds.ArrayDataset(np.arange(10, dtype=np.float32), np.arange(10) * 2)
    seq = [b[0].asnumpy().tolist() for b in ds.DataLoader(data, batch_size=4)]
    assert seq == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dropped = ds.DataLoader(data, batch_size=4, drop_last=True)
    assert len(dropped) == 2 and len(list(dropped)) == 2
    shuffled = [b[0].asnumpy().tolist() for b in ds.DataLoader(data, batch_size=5, shuffle=True, seed=3)]
    again = [b[0].asnumpy().tolist() for b in ds.DataLoader(data, batch_size=5, shuffle=True, seed=3)]
    assert shuffled == again and sorted(sum(shuffled, [])) == list(range(10))
    workers = [b[0].asnumpy().tolist() for b in ds.DataLoader(data, batch_size=4, num_workers=2)]
    assert workers == seq
    mge = ds.DataLoader(data, sampler=ds.RandomSampler(data, batch_size=3, seed=1))  # MegEngine's form
    assert [len(b[0].asnumpy()) for b in mge] == [3, 3, 3, 1]


class Failing:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"sample {i} is missing")
        return np.float32(i)


def test_worker_errors_reach_the_main_process():
    with pytest.raises(KeyError, match="sample 5 is missing"):
        list(ds.DataLoader(Failing(), batch_size=2, num_workers=2))
    with pytest.raises(KeyError, match="sample 5 is missing"):
        list(ds.GeneratorDataset(Failing(), ["v"], shuffle=False, num_parallel_workers=2).create_tuple_iterator(
            num_epochs=1))


def test_breaking_early_leaves_no_worker_processes():
    before = len(multiprocessing.active_children())
    loader = ds.DataLoader(ds.ArrayDataset(np.arange(1000, dtype=np.float32)), batch_size=2, num_workers=2)
    for k, _ in enumerate(loader):
        if k == 3:
            break
    import gc

    gc.collect()
    deadline = time.time() + 5
    while len(multiprocessing.active_children()) > before and time.time() < deadline:
        time.sleep(0.05)
    assert len(multiprocessing.active_children()) == before


def test_jitted_training_over_a_dataloader():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32))[:, None]
    loader = ds.DataLoader(ds.ArrayDataset(x, y), batch_size=8, shuffle=True, seed=0, num_workers=2)
    kiln.manual_seed(0)
    net = nn.Dense(4, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = kiln.value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, net.trainable_params())

    @kiln.jit
    def step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    losses = [float(step(a, b).asnumpy()) for _ in range(15) for a, b in ds.progress(loader)]
    assert losses[-1] < losses[0] * 0.2
