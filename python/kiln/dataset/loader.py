"""PyTorch/MegEngine-style loading: Dataset, ArrayDataset, TensorDataset and DataLoader."""
import numpy as np

from ._rows import stack, to_numpy, to_tensor
from .samplers import BatchSampler, RandomSampler, SequentialSampler
from .workers import KeptWorkers, ordered_map


class Dataset:
    """A map-style dataset: subclasses give __getitem__(index) and __len__."""

    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError


class ArrayDataset(Dataset):
    """Samples are tuples (arrays[0][i], arrays[1][i], ...) of NumPy arrays of one length."""

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("kiln.dataset.ArrayDataset: give at least one array")
        self.arrays = [to_numpy(a) for a in arrays]
        if any(a.ndim == 0 for a in self.arrays):
            raise ValueError("kiln.dataset.ArrayDataset: every array needs a first axis to index")
        lengths = [len(a) for a in self.arrays]
        if len(set(lengths)) != 1:
            raise ValueError(f"kiln.dataset.ArrayDataset: arrays have different lengths {lengths}")

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])


class TensorDataset(ArrayDataset):
    """ArrayDataset over kiln Tensors (kept as NumPy copies; batches come back as Tensors)."""


def default_collate(samples):
    """Stacks samples into a batch: tuples/lists column by column, dicts key by key, arrays and
    numbers by np.stack (NumPy; the loader turns the arrays into Tensors)."""
    first = samples[0]
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in samples):
            raise ValueError("kiln.dataset.default_collate: samples have different numbers of fields")
        return tuple(default_collate([s[i] for s in samples]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    return stack(samples, "DataLoader samples")


def _tensors(batch):
    if isinstance(batch, tuple):
        return tuple(_tensors(b) for b in batch)
    if isinstance(batch, list):
        return [_tensors(b) for b in batch]
    if isinstance(batch, dict):
        return {k: _tensors(v) for k, v in batch.items()}
    if isinstance(batch, np.ndarray):
        return to_tensor(batch)
    return batch


class _Fetch:
    """The per-batch work done in a worker: read the samples (and collate with the default)."""

    def __init__(self, dataset, collate):
        self.dataset, self.collate = dataset, collate

    def __call__(self, indices):
        samples = [self.dataset[int(i)] for i in indices]
        return default_collate(samples) if self.collate else samples


class DataLoader:
    """Batches of a map-style dataset (__getitem__, __len__) as kiln Tensors.

    sampler yields indices (grouped by batch_size and drop_last) or lists of indices (MegEngine's
    batch samplers, e.g. RandomSampler(dataset, batch_size=32)); shuffle=True without a sampler
    is RandomSampler(dataset, seed=seed). num_workers > 0 reads and collates batches in worker
    processes, prefetch_factor batches ahead per worker, in the same order and values as with 0.
    collate_fn (run in the main process on the list of samples) replaces the default stacking;
    its result is returned as it gives it. persistent_workers=True keeps the worker processes from one
    epoch to the next (they read the dataset as it was when they started)."""

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, num_workers=0, collate_fn=None,
                 drop_last=False, prefetch_factor=2, seed=None, worker_mode=None, persistent_workers=False):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"kiln.dataset.DataLoader: dataset must have __getitem__ and __len__, "
                            f"got {type(dataset).__name__}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError(f"kiln.dataset.DataLoader: num_workers must be an int >= 0, got {num_workers!r}")
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, (int, np.integer)) \
                or prefetch_factor < 1:
            raise ValueError(f"kiln.dataset.DataLoader: prefetch_factor must be an int >= 1, got {prefetch_factor!r}")
        if sampler is not None and shuffle:
            raise ValueError("kiln.dataset.DataLoader: give shuffle=True or a sampler, not both")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError("kiln.dataset.DataLoader: collate_fn must be callable")
        self.dataset = dataset
        if sampler is None:
            sampler = RandomSampler(dataset, seed=seed) if shuffle else SequentialSampler(dataset)
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_workers = int(num_workers)
        self.prefetch_factor = int(prefetch_factor)
        self.collate_fn = collate_fn
        self.worker_mode = worker_mode
        # PyTorch's persistent_workers: the workers (and the dataset copy they forked) serve every epoch
        self._kept = KeptWorkers() if persistent_workers and self.num_workers > 0 else None
        self._fetch = _Fetch(dataset, collate_fn is None)
        self.batch_sampler = None
        if getattr(sampler, "batch_size", None) is None:
            if batch_size is None or isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                    or batch_size < 1:
                raise ValueError(f"kiln.dataset.DataLoader: batch_size must be an int >= 1, got {batch_size!r}")

    def _batches(self):
        """Lists of indices: the sampler's own when it yields lists, else grouped here."""
        it = iter(self.sampler)
        first = next(it, None)
        if first is None:
            return iter(())
        import itertools
        chain = itertools.chain([first], it)
        if isinstance(first, (list, tuple, np.ndarray)):
            return chain
        return iter(BatchSampler(chain, self.batch_size, self.drop_last))

    def __len__(self):
        if getattr(self.sampler, "batch_size", None) is not None or isinstance(self.sampler, BatchSampler):
            return len(self.sampler)
        return len(BatchSampler(self.sampler, self.batch_size, self.drop_last))

    def __iter__(self):
        batches = ordered_map(self._fetch, self._batches(), self.num_workers, self.prefetch_factor,
                              mode=self.worker_mode, what="DataLoader", kept=self._kept)
        try:
            for batch in batches:
                yield _tensors(batch) if self.collate_fn is None else self.collate_fn(batch)
        finally:
            batches.close()
