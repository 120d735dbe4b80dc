"""kiln.dataset's worker processes run at a lower scheduling priority than the training process
(config.set_worker_nice, default 10), so prefetching workers take the CPU the step leaves instead
of a fair share of the step's core; 0 keeps the caller's priority; bad values are refused."""
import os

import numpy as np
import pytest

from kiln import dataset as ds


def own_nice(batch):
    return np.full(batch.shape[:1], os.nice(0), np.int64)


def worker_nices(workers=2):
    data = ds.NumpySlicesDataset((np.arange(8, dtype=np.float32),), column_names=["x"], shuffle=False).batch(2)
    data = data.map(own_nice, input_columns="x", num_parallel_workers=workers)
    return {int(v) for (x,) in data.create_tuple_iterator(output_numpy=True) for v in x}


@pytest.fixture
def restore_nice():
    before = ds.config.get_worker_nice()
    yield
    ds.config.set_worker_nice(before)


def test_workers_run_nicer_than_the_caller(restore_nice):
    mine = os.nice(0)
    assert ds.config.get_worker_nice() == 10
    assert worker_nices() == {min(mine + 10, 19)}
    ds.config.set_worker_nice(3)
    assert worker_nices() == {min(mine + 3, 19)}
    ds.config.set_worker_nice(0)
    assert worker_nices() == {mine}


def test_the_caller_keeps_its_priority(restore_nice):
    mine = os.nice(0)
    worker_nices()
    assert os.nice(0) == mine


@pytest.mark.parametrize("bad", [-1, 20, 2.5, True, "5"])
def test_bad_values_are_refused(bad, restore_nice):
    with pytest.raises(ValueError, match="set_worker_nice: nice must be an int from 0 to 19"):
        ds.config.set_worker_nice(bad)
