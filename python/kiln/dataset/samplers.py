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


class DistributedSampler(Sampler):
    """The shard of the dataset one rank of a data-parallel job reads: every rank draws the same
    order (the same seed; a new one each epoch, or set_epoch), pads it to a multiple of the ranks
    by repeating its first indices (drop_last: drops the tail instead), and takes the indices
    rank, rank + num_replicas, ...: disjoint shards of one size, whose k-th batches together are
    the k-th batch of num_replicas times the size from one process reading the whole order.

    num_replicas and rank default to the job's (kiln.communication; 1 and 0 before init);
    MindSpore's num_shards and shard_id name them too. shuffle=False keeps the dataset's order."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False,
                 batch_size=None, num_shards=None, shard_id=None):
        super().__init__(dataset, batch_size, drop_last)
        from .. import _C

        num_replicas = num_shards if num_replicas is None else num_replicas
        rank = shard_id if rank is None else rank
        if num_replicas is None:
            num_replicas = _C.comm_size() if _C.comm_initialized() else 1
        if rank is None:
            rank = _C.comm_rank() if _C.comm_initialized() else 0
        for name, v, low in (("num_replicas", num_replicas, 1), ("rank", rank, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"kiln.dataset.DistributedSampler: {name} must be an int >= {low}, got {v!r}")
        if rank >= num_replicas:
            raise ValueError(f"kiln.dataset.DistributedSampler: rank {rank} is not below num_replicas {num_replicas}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"kiln.dataset.DistributedSampler: seed must be an int, got {seed!r}")
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), 0
        self._epoch_set = False
        if self.drop_last:
            self.num_samples = self.num // self.num_replicas
        else:
            self.num_samples = -(-self.num // self.num_replicas)

    def set_epoch(self, epoch):
        """The order of this epoch (every rank must set the same)."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def _order(self):
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num).tolist()
        else:
            order = list(range(self.num))
        if not self._epoch_set:
            self.epoch += 1
        self._epoch_set = False
        total = self.num_samples * self.num_replicas
        if total > len(order):
            order += (order * (-(-total // max(len(order), 1))))[:total - len(order)]
        order = order[:total]
        return order[self.rank::self.num_replicas]

    def __len__(self):
        n = self.num_samples
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
