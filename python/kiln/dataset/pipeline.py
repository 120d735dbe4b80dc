"""MindSpore-style dataset pipelines: sources (GeneratorDataset, NumpySlicesDataset) and the
chained operations shuffle, map, batch, repeat, take, skip, project.

Each node yields rows (tuples of NumPy arrays, one per column) for one epoch at a time;
iterators convert them to kiln Tensors at the end, in the main process."""
import functools
import itertools

import numpy as np

from . import config
from ._rows import as_row, stack, to_tensor
from .workers import KeptWorkers, ordered_map


def _workers(n, what):
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"kiln.dataset: {what} num_parallel_workers must be an int >= 1, got {n!r}")
    return 0 if n == 1 else int(n)


def _count(n, what, allow_none=False):
    if allow_none and n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"kiln.dataset: {what} must be an int, got {n!r}")
    return int(n)


class Dataset:
    """A pipeline node. Subclasses give columns, _rows(epoch) and _size()."""

    def __init__(self, children=()):
        self.children = list(children)
        self._node = 1 + max((c._node for c in self.children), default=0)  # depth: a stream per node of a chain
        self._epoch = 0

    # ---- chained operations
    def shuffle(self, buffer_size):
        return ShuffleDataset(self, buffer_size)

    def batch(self, batch_size, drop_remainder=False, num_parallel_workers=None):
        return BatchDataset(self, batch_size, drop_remainder, num_parallel_workers)

    def map(self, operations, input_columns=None, output_columns=None, num_parallel_workers=None):
        return MapDataset(self, operations, input_columns, output_columns, num_parallel_workers)

    def repeat(self, count=None):
        return RepeatDataset(self, count)

    def take(self, count=-1):
        return TakeDataset(self, count)

    def skip(self, count):
        return SkipDataset(self, count)

    def project(self, columns):
        return ProjectDataset(self, columns)

    # ---- facts
    def get_col_names(self):
        return list(self.columns)

    def get_dataset_size(self):
        """Rows (batches after .batch) in one epoch."""
        size = self._size()
        if size is None:  # an iterable source of unknown length: count one pass
            size = sum(1 for _ in self._rows(-1))
        return size

    def __len__(self):
        return self.get_dataset_size()

    # ---- iteration
    def _epoch_rows(self):
        """The rows of the next epoch; each call starts a new epoch (new shuffle order)."""
        epoch = self._epoch
        self._epoch += 1
        return self._rows(epoch)

    def create_tuple_iterator(self, columns=None, num_epochs=-1, output_numpy=False, do_copy=True):
        """An iterator of lists (one value per column) of kiln Tensors, or of NumPy arrays with
        output_numpy=True. Each `for` over it runs one epoch; at most num_epochs (-1: any)."""
        return TupleIterator(self, columns, num_epochs, output_numpy, as_dict=False)

    def create_dict_iterator(self, num_epochs=-1, output_numpy=False, do_copy=True):
        """Like create_tuple_iterator, yielding {column name: value} dicts."""
        return TupleIterator(self, None, num_epochs, output_numpy, as_dict=True)

    def __iter__(self):
        return iter(self.create_tuple_iterator())


class TupleIterator:
    def __init__(self, dataset, columns, num_epochs, output_numpy, as_dict):
        self.dataset = dataset if columns is None else dataset.project(columns)
        self.num_epochs = _count(num_epochs, "num_epochs")
        if self.num_epochs == 0 or self.num_epochs < -1:
            raise ValueError(f"kiln.dataset: num_epochs must be -1 or >= 1, got {num_epochs}")
        self.output_numpy = output_numpy
        self.as_dict = as_dict
        self.epochs = 0
        self._current = None

    def _convert(self, row):
        values = list(row) if self.output_numpy else [to_tensor(v) for v in row]
        return dict(zip(self.dataset.columns, values)) if self.as_dict else values

    def _one_epoch(self):
        if self.num_epochs != -1 and self.epochs >= self.num_epochs:
            raise RuntimeError(f"kiln.dataset: the iterator was made for num_epochs={self.num_epochs} "
                               "and all of them have been run")
        self.epochs += 1
        for row in self.dataset._epoch_rows():
            yield self._convert(row)

    def __iter__(self):
        self._current = self._one_epoch()
        return self._current

    def __next__(self):
        if self._current is None:
            self._current = self._one_epoch()
        try:
            return next(self._current)
        except StopIteration:
            self._current = None
            raise


class GeneratorDataset(Dataset):
    """Rows from a Python source: a random-access object (__getitem__ and __len__) or an
    iterable / generator function (called anew each epoch). Each item is a tuple with one value
    per column (a lone value for one column).

    shuffle: None or True shuffles a random-access source (as MindSpore does), False keeps
    order; an iterable source cannot be shuffled here (use .shuffle(buffer_size)).
    sampler: an iterable of indices (e.g. kiln.dataset.SequentialSampler/RandomSampler, or a
    list) choosing which items, in which order. num_samples: read at most that many rows.
    num_parallel_workers > 1: __getitem__ runs in worker processes (see kiln.dataset.workers)."""

    def __init__(self, source, column_names, shuffle=None, num_parallel_workers=1, sampler=None,
                 num_samples=None, python_multiprocessing=True):
        super().__init__()
        if isinstance(column_names, str):
            column_names = [column_names]
        if not column_names or not all(isinstance(c, str) for c in column_names):
            raise ValueError(f"kiln.dataset.GeneratorDataset: column_names must be a non-empty list "
                             f"of str, got {column_names!r}")
        if len(set(column_names)) != len(column_names):
            raise ValueError(f"kiln.dataset.GeneratorDataset: duplicate column names {column_names}")
        self.columns = list(column_names)
        self.source = source
        self.random_access = hasattr(source, "__getitem__") and hasattr(source, "__len__")
        if not self.random_access and not (callable(source) or hasattr(source, "__iter__")):
            raise TypeError("kiln.dataset.GeneratorDataset: source must have __getitem__ and __len__, "
                            f"or be iterable or a generator function; got {type(source).__name__}")
        if not self.random_access and (shuffle or sampler is not None):
            raise ValueError("kiln.dataset.GeneratorDataset: shuffle and sampler need a random-access "
                             "source (__getitem__ and __len__); use .shuffle(buffer_size) on an iterable")
        if shuffle is not None and sampler is not None:
            raise ValueError("kiln.dataset.GeneratorDataset: give shuffle or sampler, not both")
        self.shuffle_rows = self.random_access and sampler is None and shuffle is not False
        self.sampler = sampler
        self.num_samples = _count(num_samples, "num_samples", allow_none=True)
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"kiln.dataset.GeneratorDataset: num_samples must be >= 1, got {num_samples}")
        self.workers = _workers(num_parallel_workers, "GeneratorDataset")
        self.worker_mode = None if python_multiprocessing else "thread"

    def _indices(self, epoch):
        if self.sampler is not None:
            indices = list(self.sampler)
        elif self.shuffle_rows:
            indices = config.rng(self._node, epoch).permutation(len(self.source)).tolist()
        else:
            indices = range(len(self.source))
        return indices

    def _size(self):
        if not self.random_access:
            n = len(self.source) if hasattr(self.source, "__len__") else None
        elif self.sampler is not None:
            n = len(self.sampler) if hasattr(self.sampler, "__len__") else len(list(self.sampler))
        else:
            n = len(self.source)
        if n is not None and self.num_samples is not None:
            n = min(n, self.num_samples)
        return n

    def _rows(self, epoch):
        what = "GeneratorDataset source"
        if self.random_access:
            source = self.source
            indices = itertools.islice(self._indices(epoch), self.num_samples)
            fetch = lambda i: as_row(source[int(i)], what)  # noqa: E731
            rows = ordered_map(fetch, indices, self.workers, mode=self.worker_mode, what=what)
        else:
            items = self.source() if callable(self.source) and not hasattr(self.source, "__iter__") \
                else self.source
            rows = (as_row(item, what) for item in itertools.islice(items, self.num_samples))
        for row in rows:
            if len(row) != len(self.columns):
                raise ValueError(f"kiln.dataset.GeneratorDataset: a source item has {len(row)} values "
                                 f"but column_names names {len(self.columns)}: {self.columns}")
            yield row


class _Slices:
    def __init__(self, arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)


class NumpySlicesDataset(GeneratorDataset):
    """Rows sliced along the first axis of arrays: data is one array, a list/tuple of arrays
    (one column each) or a dict {column name: array}. shuffle as GeneratorDataset (None
    shuffles, as MindSpore does)."""

    def __init__(self, data, column_names=None, shuffle=None, num_parallel_workers=1, sampler=None,
                 num_samples=None):
        if isinstance(data, dict):
            names = list(data)
            arrays = [np.asarray(v) for v in data.values()]
            if column_names is not None and list(column_names) != names:
                names = list(column_names)
        elif isinstance(data, tuple):  # a tuple: one column per element
            arrays = [np.asarray(d) for d in data]
            names = None
        else:
            arrays = [np.asarray(data)]
            names = None
        if any(a.ndim == 0 for a in arrays):
            raise ValueError("kiln.dataset.NumpySlicesDataset: data must have at least one axis to slice")
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"kiln.dataset.NumpySlicesDataset: columns have different lengths "
                             f"{[len(a) for a in arrays]}")
        if names is None:
            names = list(column_names) if column_names is not None else \
                [f"column_{i}" for i in range(len(arrays))]
        if isinstance(names, str):
            names = [names]
        if len(names) != len(arrays):
            raise ValueError(f"kiln.dataset.NumpySlicesDataset: {len(arrays)} columns but "
                             f"column_names has {len(names)}: {names}")
        super().__init__(_Slices(arrays), names, shuffle=shuffle, num_parallel_workers=num_parallel_workers,
                         sampler=sampler, num_samples=num_samples)


class ShuffleDataset(Dataset):
    """Shuffles within a buffer of buffer_size rows (buffer_size >= the dataset size: a full shuffle)."""

    def __init__(self, child, buffer_size):
        super().__init__([child])
        self.buffer_size = _count(buffer_size, "shuffle buffer_size")
        if self.buffer_size < 2:
            raise ValueError(f"kiln.dataset: shuffle buffer_size must be >= 2, got {buffer_size}")
        self.columns = child.columns

    def _size(self):
        return self.children[0]._size()

    def _rows(self, epoch):
        rng = config.rng(self._node, epoch)
        buffer = []
        for row in self.children[0]._rows(epoch):
            if len(buffer) < self.buffer_size:
                buffer.append(row)
                continue
            j = int(rng.integers(len(buffer)))
            yield buffer[j]
            buffer[j] = row
        order = rng.permutation(len(buffer))
        for j in order:
            yield buffer[j]


class _ApplyOps:
    """The per-row work of a map, run in the workers: the operations in turn on the input columns."""

    def __init__(self, operations, in_idx, n_out, columns_in, out_names):
        self.operations, self.in_idx, self.n_out = operations, in_idx, n_out
        self.columns_in, self.out_names = columns_in, out_names

    def __call__(self, row):
        values = tuple(row[i] for i in self.in_idx)
        for op in self.operations:
            out = op(*values)
            values = tuple(out) if isinstance(out, tuple) else (out,)
        if len(values) != self.n_out:
            raise ValueError(f"kiln.dataset.map: the operations return {len(values)} values but "
                             f"{self.n_out} output column(s) {self.out_names} are expected; "
                             "give output_columns")
        values = tuple(np.asarray(v) if not hasattr(v, "asnumpy") else v.asnumpy() for v in values)
        # the input columns are replaced, in place, by the outputs
        first = min(self.in_idx)
        rest = [row[i] for i in range(len(row)) if i not in self.in_idx]
        keep_before = [row[i] for i in range(first) if i not in self.in_idx]
        return tuple(keep_before) + values + tuple(rest[len(keep_before):])


class MapDataset(Dataset):
    """Applies operations (a callable or a list of them, each taking the input columns' values as
    NumPy arrays and returning the new values) to input_columns (default: the first column).
    The outputs take the input columns' place, named output_columns (default: the input names).
    num_parallel_workers > 1 runs the operations in worker processes, in order."""

    def __init__(self, child, operations, input_columns, output_columns, num_parallel_workers):
        super().__init__([child])
        ops = list(operations) if isinstance(operations, (list, tuple)) else [operations]
        if not ops or not all(callable(op) for op in ops):
            raise TypeError(f"kiln.dataset.map: operations must be a callable or a list of callables, "
                            f"got {operations!r}")
        names = child.columns
        if input_columns is None:
            input_columns = [names[0]]
        elif isinstance(input_columns, str):
            input_columns = [input_columns]
        missing = [c for c in input_columns if c not in names]
        if missing:
            raise ValueError(f"kiln.dataset.map: no column(s) {missing}; the columns are {names}")
        if output_columns is None:
            output_columns = list(input_columns)
        elif isinstance(output_columns, str):
            output_columns = [output_columns]
        in_idx = [names.index(c) for c in input_columns]
        first = min(in_idx)
        others = [c for i, c in enumerate(names) if i not in in_idx]
        before = [c for i, c in enumerate(names[:first]) if i not in in_idx]
        self.columns = before + list(output_columns) + others[len(before):]
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"kiln.dataset.map: the columns after the map would repeat a name: {self.columns}")
        self.apply = _ApplyOps(ops, in_idx, len(output_columns), list(input_columns), list(output_columns))
        self.workers = _workers(num_parallel_workers, "map")
        self.kept = KeptWorkers()  # the workers live as long as the pipeline (started once)

    def _size(self):
        return self.children[0]._size()

    def _rows(self, epoch):
        return ordered_map(self.apply, self.children[0]._rows(epoch), self.workers, what="map", kept=self.kept)


def _stack_rows(columns, group):
    return tuple(stack([row[c] for row in group], f"column '{name}'") for c, name in enumerate(columns))


class BatchDataset(Dataset):
    """Stacks batch_size consecutive rows, column by column; a last short batch is kept unless
    drop_remainder. num_parallel_workers > 1 stacks in worker processes."""

    def __init__(self, child, batch_size, drop_remainder, num_parallel_workers):
        super().__init__([child])
        self.batch_size = _count(batch_size, "batch_size")
        if self.batch_size < 1:
            raise ValueError(f"kiln.dataset.batch: batch_size must be >= 1, got {batch_size}")
        self.drop_remainder = bool(drop_remainder)
        self.workers = _workers(num_parallel_workers, "batch")
        self.kept = KeptWorkers()
        self.columns = child.columns

    def _size(self):
        n = self.children[0]._size()
        if n is None:
            return None
        return n // self.batch_size if self.drop_remainder else -(-n // self.batch_size)

    def _groups(self, epoch):
        rows = self.children[0]._rows(epoch)
        while True:
            group = list(itertools.islice(rows, self.batch_size))
            if not group or (self.drop_remainder and len(group) < self.batch_size):
                return
            yield group

    def _rows(self, epoch):
        # (the kept workers hold the function: one that held this node would keep it alive)
        return ordered_map(functools.partial(_stack_rows, tuple(self.columns)), self._groups(epoch), self.workers,
                           what="batch", kept=self.kept)


class RepeatDataset(Dataset):
    """The child's epochs count times over (None or -1: without end); each repeat reshuffles."""

    def __init__(self, child, count):
        super().__init__([child])
        count = -1 if count is None else _count(count, "repeat count")
        if count == 0 or count < -1:
            raise ValueError(f"kiln.dataset.repeat: count must be -1 (forever) or >= 1, got {count}")
        self.count = count
        self.columns = child.columns

    def _size(self):
        n = self.children[0]._size()
        if self.count == -1:
            raise ValueError("kiln.dataset: an endlessly repeated dataset has no size")
        return None if n is None else n * self.count

    def _rows(self, epoch):
        rounds = itertools.count() if self.count == -1 else range(self.count)
        for r in rounds:
            yield from self.children[0]._rows(epoch * (self.count if self.count > 0 else 1) + r)


class TakeDataset(Dataset):
    """The first count rows (-1: all)."""

    def __init__(self, child, count):
        super().__init__([child])
        count = _count(count, "take count")
        if count == 0 or count < -1:
            raise ValueError(f"kiln.dataset.take: count must be -1 (all) or >= 1, got {count}")
        self.count = count
        self.columns = child.columns

    def _size(self):
        n = self.children[0]._size()
        if self.count == -1:
            return n
        return self.count if n is None else min(n, self.count)

    def _rows(self, epoch):
        rows = self.children[0]._rows(epoch)
        if self.count == -1:
            yield from rows
            return
        try:
            yield from itertools.islice(rows, self.count)
        finally:
            close = getattr(rows, "close", None)
            if close is not None:  # stop the upstream workers now, not at garbage collection
                close()


class SkipDataset(Dataset):
    """All but the first count rows."""

    def __init__(self, child, count):
        super().__init__([child])
        self.count = _count(count, "skip count")
        if self.count < 0:
            raise ValueError(f"kiln.dataset.skip: count must be >= 0, got {count}")
        self.columns = child.columns

    def _size(self):
        n = self.children[0]._size()
        return None if n is None else max(0, n - self.count)

    def _rows(self, epoch):
        yield from itertools.islice(self.children[0]._rows(epoch), self.count, None)


class ProjectDataset(Dataset):
    """Only the named columns, in the order given."""

    def __init__(self, child, columns):
        super().__init__([child])
        if isinstance(columns, str):
            columns = [columns]
        missing = [c for c in columns if c not in child.columns]
        if missing or not columns:
            raise ValueError(f"kiln.dataset.project: no column(s) {missing or columns}; "
                             f"the columns are {child.columns}")
        self.columns = list(columns)
        self.idx = [child.columns.index(c) for c in columns]

    def _size(self):
        return self.children[0]._size()

    def _rows(self, epoch):
        for row in self.children[0]._rows(epoch):
            yield tuple(row[i] for i in self.idx)
