"""PyTorch's and MegEngine's data loading: Dataset / ArrayDataset / TensorDataset, samplers and
DataLoader(dataset, batch_size, shuffle, sampler, num_workers, collate_fn, drop_last,
prefetch_factor, seed). With num_workers > 0 each batch is fetched and collated in a worker process
(kiln.dataset.workers), at most prefetch_factor * num_workers batches ahead, in order; the
results equal num_workers=0's. A sampler that yields lists of indices (MegEngine's, or a
BatchSampler) gives the batches itself."""
import numpy as np

from . import config


class Dataset:
    """A map-style dataset: __getitem__(index) -> a sample, __len__."""

    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError


class ArrayDataset(Dataset):
    """Samples are the index-th rows of arrays of one length (MegEngine's ArrayDataset)."""

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("ArrayDataset: give at least one array")
        self.arrays = [np.asarray(a) if not hasattr(a, "asnumpy") else a.asnumpy() for a in arrays]
        if len({len(a) for a in self.arrays}) != 1:
            raise ValueError(f"ArrayDataset: arrays of different lengths {[len(a) for a in self.arrays]}")

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])


TensorDataset = ArrayDataset  # (PyTorch's name)


class SequentialSampler:
    def __init__(self, data_source):
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class RandomSampler:
    """Indices in a random order, a new one each epoch (seed: repeatable; else kiln.dataset.config's
    seed). batch_size (MegEngine's form): yields lists of that many indices."""

    def __init__(self, data_source, batch_size=None, drop_last=False, seed=None):
        self.n, self.batch_size, self.drop_last = len(data_source), batch_size, drop_last
        self.seed = seed
        self.epoch = 0

    def _order(self):
        seed = self.seed if self.seed is not None else config.get_seed()
        rng = np.random.default_rng(None if seed is None else [seed, self.epoch])
        self.epoch += 1
        return rng.permutation(self.n).tolist()

    def __iter__(self):
        order = self._order()
        if self.batch_size is None:
            return iter(order)
        return iter(_batches(order, self.batch_size, self.drop_last))

    def __len__(self):
        if self.batch_size is None:
            return self.n
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)


class SequentialBatchSampler(RandomSampler):  # (MegEngine's SequentialSampler with a batch size)
    def _order(self):
        return list(range(self.n))


class BatchSampler:
    def __init__(self, sampler, batch_size, drop_last=False):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        return iter(_batches(list(iter(self.sampler)), self.batch_size, self.drop_last))

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def _batches(order, size, drop_last):
    out = [order[k:k + size] for k in range(0, len(order), size)]
    if drop_last and out and len(out[-1]) < size:
        out.pop()
    return out


def default_collate(samples):
    """A list of samples (arrays, numbers, or tuples/dicts of them) stacked along a new first axis."""
    first = samples[0]
    if isinstance(first, tuple) or isinstance(first, list):
        return type(first)(default_collate([s[k] for s in samples]) for k in range(len(first)))
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    return np.stack([np.asarray(s.asnumpy() if hasattr(s, "asnumpy") else s) for s in samples])


class DataLoader:
    """Batches of a map-style dataset, as kiln Tensors (collate_fn's structure kept)."""

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, drop_last=False, prefetch_factor=2, seed=None, **kwargs):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError("DataLoader: the dataset needs __getitem__ and __len__")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be an int >= 0, got {num_workers!r}")
        if batch_sampler is None:
            if sampler is None:
                sampler = RandomSampler(dataset, seed=seed) if shuffle else SequentialSampler(dataset)
            elif shuffle:
                raise ValueError("DataLoader: give either shuffle=True or a sampler")
            batch_sampler = sampler if getattr(sampler, "batch_size", None) else \
                BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.num_workers, self.prefetch = num_workers, max(1, int(prefetch_factor))
        self.collate_fn = collate_fn or default_collate

    def __len__(self):
        return len(self.batch_sampler)

    def _fetch(self, indices):
        return self.collate_fn([self.dataset[int(i)] for i in indices])

    def __iter__(self):
        from . import workers

        batches = iter(self.batch_sampler)
        if self.num_workers > 0:
            results = workers.ordered_map(self._fetch, batches, self.num_workers, self.prefetch * self.num_workers)
        else:
            results = map(self._fetch, batches)
        for b in results:
            yield _to_tensors(b)


def _to_tensors(x):
    from .._tensor import Tensor

    if isinstance(x, np.ndarray):
        return Tensor(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_tensors(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_tensors(v) for k, v in x.items()}
    return x
