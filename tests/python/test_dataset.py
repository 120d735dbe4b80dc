"""kiln.dataset: the pipelines users write, in both API styles, with and without workers."""
import gc
import os
import multiprocessing
import time

import numpy as np
import pytest

import kiln
from kiln import dataset as ds
from kiln import nn


@pytest.fixture(autouse=True)
def _restore_seed():
    saved = ds.config._seed
    yield
    ds.config._seed = saved


def _workers_left(timeout=10.0):
    """The worker processes still alive once the collector has run. A pool is closed when the
    generator that owns it is finalized, whose timing depends on the collector (a generator in a
    reference cycle goes at a later collection): a leaked worker is one still alive after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        alive = multiprocessing.active_children()
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _xy(n=10):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.int32)
    return x, y


def _rows(dataset):
    return [[np.array(v) for v in row] for row in dataset.create_tuple_iterator(output_numpy=True)]


def _same(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert len(ra) == len(rb)
        for va, vb in zip(ra, rb):
            np.testing.assert_array_equal(va, vb)
            assert va.dtype == vb.dtype


class RandomAccess:
    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return np.full((2,), i, np.float32), np.int64(i * 10)

    def __len__(self):
        return self.n


def test_generator_dataset_keeps_source_order_without_shuffle():
    rows = _rows(ds.GeneratorDataset(RandomAccess(5), ["a", "b"], shuffle=False))
    assert [int(r[1]) for r in rows] == [0, 10, 20, 30, 40]
    np.testing.assert_array_equal(rows[3][0], [3, 3])

    def gen():
        for i in range(4):
            yield (np.array([i, -i]),)
    g = ds.GeneratorDataset(gen, ["v"])
    assert [r[0].tolist() for r in _rows(g)] == [[0, 0], [1, -1], [2, -2], [3, -3]]
    assert g.get_dataset_size() == 4
    # a generator function is called anew each epoch
    assert [r[0].tolist() for r in _rows(g)] == [[0, 0], [1, -1], [2, -2], [3, -3]]


def test_tuple_iterator_gives_tensors_and_dict_iterator_names_columns():
    x, y = _xy(4)
    d = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
    rows = list(d.create_tuple_iterator())
    assert all(isinstance(v, kiln.Tensor) for r in rows for v in r)
    np.testing.assert_array_equal(rows[2][0].asnumpy(), x[2])
    dicts = list(d.create_dict_iterator(output_numpy=True))
    assert list(dicts[1]) == ["x", "y"] and int(dicts[1]["y"]) == 1
    direct = [[v.asnumpy() for v in r] for r in d]
    _same(direct, [[x[i], y[i]] for i in range(4)])


def test_numpy_slices_dict_and_single_array():
    d = ds.NumpySlicesDataset({"a": np.arange(3), "b": np.arange(3) * 2.0}, shuffle=False)
    assert d.get_col_names() == ["a", "b"]
    assert [float(r[1]) for r in _rows(d)] == [0.0, 2.0, 4.0]
    one = ds.NumpySlicesDataset(np.arange(6).reshape(3, 2), column_names=["m"], shuffle=False)
    assert [r[0].tolist() for r in _rows(one)] == [[0, 1], [2, 3], [4, 5]]


def test_batch_sizes_and_drop_remainder():
    x, y = _xy(10)
    base = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
    kept = base.batch(4)
    assert kept.get_dataset_size() == 3
    rows = _rows(kept)
    assert [r[0].shape for r in rows] == [(4, 3), (4, 3), (2, 3)]
    np.testing.assert_array_equal(rows[2][1], [8, 9])
    np.testing.assert_array_equal(np.concatenate([r[0] for r in rows]), x)
    dropped = base.batch(4, drop_remainder=True)
    assert dropped.get_dataset_size() == 2
    assert [r[1].tolist() for r in _rows(dropped)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_map_repeat_take_skip_project():
    x, y = _xy(6)
    d = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
    m = d.map([lambda a: a + 1, lambda a: a * 2], input_columns="x")
    _same(_rows(m), [[(x[i] + 1) * 2, y[i]] for i in range(6)])
    split = d.map(lambda a: (a.sum(), a.max()), input_columns=["x"], output_columns=["s", "m"])
    assert split.get_col_names() == ["s", "m", "y"]
    _same(_rows(split), [[x[i].sum(), x[i].max(), y[i]] for i in range(6)])
    assert [int(r[0]) for r in _rows(d.project("y").skip(2).take(3))] == [2, 3, 4]
    r = d.project(["y"]).repeat(2)
    assert r.get_dataset_size() == 12
    assert [int(v[0]) for v in _rows(r)] == list(range(6)) * 2
    swapped = d.project(["y", "x"])
    assert swapped.get_col_names() == ["y", "x"]
    _same(_rows(swapped), [[y[i], x[i]] for i in range(6)])


def test_shuffle_is_a_permutation_and_deterministic_with_seed():
    def order(d):
        return [int(r[0]) for r in _rows(d)]

    ds.config.set_seed(7)
    a = ds.GeneratorDataset([(i,) for i in range(50)], ["v"], shuffle=True)
    first = order(a)
    second = order(a)  # the next epoch is reshuffled
    assert sorted(first) == list(range(50)) and first != list(range(50)) and first != second
    ds.config.set_seed(7)
    b = ds.GeneratorDataset([(i,) for i in range(50)], ["v"], shuffle=True)
    assert order(b) == first and order(b) == second

    ds.config.set_seed(7)
    buf = ds.NumpySlicesDataset(np.arange(30), ["v"], shuffle=False).shuffle(8)
    o1 = order(buf)
    assert sorted(o1) == list(range(30)) and o1 != list(range(30))
    ds.config.set_seed(7)
    assert order(ds.NumpySlicesDataset(np.arange(30), ["v"], shuffle=False).shuffle(8)) == o1
    kiln.set_seed(8)
    assert ds.config.get_seed() == 8


def _augment(a):
    # real per-sample work: a noise draw seeded by the sample's own content
    rng = np.random.default_rng(int(a.sum()))
    return (a * 2 + rng.standard_normal(a.shape)).astype(np.float32)


@pytest.mark.parametrize("workers", [2, 3])
def test_map_and_batch_in_worker_processes_equal_no_workers(workers):
    x, y = _xy(23)

    def build(n):
        d = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
        return d.map(_augment, input_columns="x", num_parallel_workers=n).batch(5, num_parallel_workers=n)
    _same(_rows(build(1)), _rows(build(workers)))
    g0 = ds.GeneratorDataset(RandomAccess(17), ["a", "b"], shuffle=False)
    g2 = ds.GeneratorDataset(RandomAccess(17), ["a", "b"], shuffle=False, num_parallel_workers=workers)
    _same(_rows(g0), _rows(g2))
    assert not _workers_left()


def test_dataloader_workers_equal_no_workers_and_shuffle_seeded():
    x, y = _xy(21)
    data = ds.ArrayDataset(x, y)

    def batches(**kw):
        return [[t.asnumpy() for t in b] for b in ds.DataLoader(data, batch_size=4, **kw)]
    plain = batches()
    assert len(plain) == 6 and plain[-1][0].shape == (1, 3)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in plain]), x)
    _same(plain, batches(num_workers=2))
    _same(plain, batches(num_workers=2, worker_mode="thread"))
    assert len(batches(drop_last=True)) == 5
    s0 = batches(shuffle=True, seed=3)
    _same(s0, batches(shuffle=True, seed=3, num_workers=2))
    assert sorted(np.concatenate([b[1] for b in s0]).tolist()) == list(range(21))
    assert np.concatenate([b[1] for b in s0]).tolist() != list(range(21))


def test_dataloader_megengine_batch_sampler_and_torch_samplers():
    x, y = _xy(10)
    data = ds.ArrayDataset(x, y)
    loader = ds.DataLoader(data, sampler=ds.RandomSampler(data, batch_size=4, drop_last=True, seed=1))
    got = [b[1].asnumpy().tolist() for b in loader]
    assert len(got) == len(loader) == 2 and all(len(b) == 4 for b in got)
    assert len(set(sum(got, []))) == 8
    seq = ds.DataLoader(data, sampler=ds.BatchSampler(ds.SequentialSampler(data), 3))
    assert [b[1].asnumpy().tolist() for b in seq] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    td = ds.TensorDataset(kiln.Tensor(x), kiln.Tensor(y))
    first = next(iter(ds.DataLoader(td, batch_size=2, collate_fn=lambda s: s)))
    assert len(first) == 2 and first[1][1] == 1


def test_early_break_leaves_no_worker_processes():
    x, y = _xy(200)
    d = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
    pipeline = d.map(_augment, input_columns="x", num_parallel_workers=2).batch(2)
    for i, _ in enumerate(pipeline.create_tuple_iterator(output_numpy=True)):
        if i == 3:
            break
    loader = ds.DataLoader(ds.ArrayDataset(x, y), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    assert _workers_left() == []

    def train_until_it_fails():
        for i, _ in enumerate(ds.DataLoader(ds.ArrayDataset(x, y), batch_size=2, num_workers=2)):
            if i == 2:
                raise FloatingPointError("loss is nan")
    with pytest.raises(FloatingPointError):
        train_until_it_fails()
    gc.collect()
    assert _workers_left() == []


class Broken(RandomAccess):
    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"sample {i} is corrupt")
        return super().__getitem__(i)


def _fails_on_seven(a):
    if int(a) == 7:
        raise ValueError("bad pixel in sample 7")
    return a


def test_worker_exceptions_reach_the_main_process_with_traceback():
    with pytest.raises(ds.WorkerError, match=r"KeyError.*sample 5 is corrupt(.|\n)*__getitem__"):
        list(ds.DataLoader(Broken(12), batch_size=2, num_workers=2))
    d = ds.NumpySlicesDataset(np.arange(12), ["v"], shuffle=False)
    with pytest.raises(ds.WorkerError, match=r"bad pixel in sample 7(.|\n)*_fails_on_seven"):
        list(d.map(_fails_on_seven, num_parallel_workers=2).create_tuple_iterator())
    with pytest.raises(ds.WorkerError, match="could not be sent back"):
        list(d.map(lambda v: (v, lambda: 1), output_columns=["a", "b"], num_parallel_workers=2)
             .create_tuple_iterator(output_numpy=True))
    # without workers the user's own exception comes through unchanged
    with pytest.raises(ValueError, match="bad pixel"):
        list(d.map(_fails_on_seven).create_tuple_iterator())
    assert _workers_left() == []


def test_bad_arguments_are_refused_clearly():
    x, y = _xy(4)
    with pytest.raises(ValueError, match="column_names"):
        ds.GeneratorDataset(RandomAccess(3), [])
    with pytest.raises(ValueError, match="2 values but column_names names 1"):
        list(ds.GeneratorDataset(RandomAccess(3), ["a"]).create_tuple_iterator())
    with pytest.raises(ValueError, match="different lengths"):
        ds.NumpySlicesDataset((x, y[:3]))
    with pytest.raises(ValueError, match="batch_size"):
        ds.NumpySlicesDataset(x).batch(0)
    with pytest.raises(ValueError, match="no column"):
        ds.NumpySlicesDataset(x, ["x"]).map(lambda a: a, input_columns="z")
    with pytest.raises(ValueError, match="different shapes"):
        list(ds.GeneratorDataset([(np.zeros(2),), (np.zeros(3),)], ["v"]).batch(2).create_tuple_iterator())
    with pytest.raises(ValueError, match="num_workers"):
        ds.DataLoader(ds.ArrayDataset(x), num_workers=-1)
    with pytest.raises(TypeError, match="__getitem__"):
        ds.DataLoader(object())
    with pytest.raises(ValueError, match="seed"):
        ds.config.set_seed(-1)


def test_progress_draws_only_when_asked(capsys):
    assert list(ds.progress(range(5), desc="epoch")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""  # stderr is not a terminal under pytest
    assert list(ds.progress(range(5), desc="epoch", enabled=True)) == [0, 1, 2, 3, 4]
    assert "epoch: 5/5" in capsys.readouterr().err


def _train(capture_mode, jit_level, backend, num_workers):
    """Three epochs of a small jitted SGD loop on a DataLoader; the final weights."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 4)).astype(np.float32)
    w_true = np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    y = x @ w_true
    kiln.manual_seed(0)
    net = nn.Dense(4, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad_fn = kiln.value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, opt.parameters)

    def step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss
    if capture_mode is not None:
        step = kiln.jit(step, capture_mode=capture_mode, jit_level=jit_level, backend=backend)
    loader = ds.DataLoader(ds.ArrayDataset(x, y), batch_size=8, shuffle=True, seed=5, num_workers=num_workers)
    losses = [float(step(a, b).asnumpy()) for _ in range(3) for a, b in loader]
    return np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()]), losses


def test_jitted_training_loop_over_a_dataloader_equals_eager():
    eager_w, eager_losses = _train(None, None, None, 0)
    assert eager_losses[-1] < eager_losses[0]
    # the NumPy reference of the same loop: plain SGD on mean square error
    kiln.manual_seed(0)
    ref = nn.Dense(4, 1)
    w, b = ref.weight.asnumpy().astype(np.float64), ref.bias.asnumpy().astype(np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 4)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    sampler = ds.RandomSampler(24, seed=5)  # the order DataLoader(shuffle=True, seed=5) reads
    for _ in range(3):
        order = list(sampler)
        for s in range(0, 24, 8):
            idx = order[s:s + 8]
            a, t = x[idx].astype(np.float64), y[idx].astype(np.float64)
            err = a @ w.T + b - t
            gw = 2 * err.T @ a / len(idx)
            gb = 2 * err.sum(0) / len(idx)
            w, b = w - 0.1 * gw, b - 0.1 * gb
    np.testing.assert_allclose(eager_w, np.concatenate([w.ravel(), b.ravel()]), rtol=1e-4, atol=1e-5)
    variants = [("trace", "O0", "kbk", 2), ("ast", "O1", "kbk", 0), ("bytecode", "O1", "sink", 0),
                ("trace", "O1", "sink", 0), ("ast", "O0", "kbk", 2), ("bytecode", "O0", "kbk", 0)]
    for mode, level, backend, workers in variants:
        got_w, got_losses = _train(mode, level, backend, workers)
        np.testing.assert_allclose(got_w, eager_w, rtol=1e-5, atol=1e-6, err_msg=f"{mode} {level} {backend}")
        np.testing.assert_allclose(got_losses, eager_losses, rtol=1e-5, atol=1e-6)
    assert not _workers_left()


def _with_pid(a):
    return a, np.array(os.getpid())


def test_pipeline_workers_serve_every_epoch_and_end_with_the_pipeline():
    x, y = _xy(40)
    d = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False)
    pipeline = d.map(_with_pid, input_columns="x", output_columns=["x", "pid"], num_parallel_workers=2).batch(4)
    it = pipeline.create_tuple_iterator(output_numpy=True)
    epochs = [[(b[0], b[1].tolist()) for b in it] for _ in range(3)]
    for rows in epochs:
        np.testing.assert_array_equal(np.concatenate([r[0] for r in rows]), x)
    pids = [set(sum((r[1] for r in rows), [])) for rows in epochs]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2] and os.getpid() not in pids[0]
    for i, _ in enumerate(it):  # an epoch broken off: its workers end, the next epoch starts afresh
        if i == 2:
            break
    again = [b for b in it]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in again]), x)
    del it, pipeline, again, epochs
    gc.collect()
    assert _workers_left() == []


def test_dataloader_persistent_workers_keep_their_processes():
    x, y = _xy(30)
    loader = ds.DataLoader(ds.ArrayDataset(x, y), batch_size=4, num_workers=2, persistent_workers=True)
    first = [[t.asnumpy() for t in b] for b in loader]
    alive = {p.pid for p in multiprocessing.active_children()}
    second = [[t.asnumpy() for t in b] for b in loader]
    _same(first, second)
    assert len(alive) == 2 and {p.pid for p in multiprocessing.active_children()} == alive
    del loader
    gc.collect()
    assert _workers_left() == []
