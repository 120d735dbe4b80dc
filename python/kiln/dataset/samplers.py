"""Samplers: which dataset indices a DataLoader (or GeneratorDataset) reads, in which order.

SequentialSampler and RandomSampler yield indices (PyTorch's form) or, given batch_size,
lists of indices (MegEngine's form); BatchSampler groups any index sampler into lists."""
import numpy as np

from . import config


def _size(dataset):
    if isinstance(dataset, (int, np.integer)) and not isinstance(dataset, bool):
        return int(dataset)
    try:
        return len(dataset)
    except TypeError:
        raise TypeError(f"kiln.dataset: a sampler needs a dataset with __len__, got {type(dataset).__name__}") from None


class Sampler:
    """Base: subclasses give __iter__ (indices, or lists of them) and __len__."""

    def __init__(self, dataset, batch_size=None, drop_last=False):
        self.num = _size(dataset)
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                                       or batch_size < 1):
            raise ValueError(f"kiln.dataset: sampler batch_size must be an int >= 1, got {batch_size!r}")
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)

    def _order(self):
        raise NotImplementedError

    def __iter__(self):
        order = self._order()
        if self.batch_size is None:
            yield from order
            return
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch

    def __len__(self):
        if self.batch_size is None:
            return self.num
        return self.num // self.batch_size if self.drop_last else -(-self.num // self.batch_size)


class SequentialSampler(Sampler):
    """0, 1, ..., len(dataset) - 1 (in lists of batch_size when given)."""

    def _order(self):
        return list(range(self.num))


class RandomSampler(Sampler):
    """A fresh permutation each epoch. seed (else kiln.dataset.config's seed, else fresh entropy)
    makes the sequence of epochs' orders reproducible."""

    def __init__(self, dataset, batch_size=None, drop_last=False, seed=None):
        super().__init__(dataset, batch_size, drop_last)
        self.seed = seed
        self.epoch = 0

    def _order(self):
        seed = self.seed if self.seed is not None else config.get_seed()
        if seed is None:
            rng = np.random.default_rng()
        else:
            rng = np.random.default_rng([int(seed), self.epoch])
        self.epoch += 1
        return rng.permutation(self.num).tolist()


class BatchSampler:
    """Lists of batch_size indices from an index sampler (the last short one kept unless drop_last)."""

    def __init__(self, sampler, batch_size, drop_last=False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"kiln.dataset.BatchSampler: batch_size must be an int >= 1, got {batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), bool(drop_last)

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
