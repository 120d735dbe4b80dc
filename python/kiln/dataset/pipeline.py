"""MindSpore-style datasets: a source (GeneratorDataset, NumpySlicesDataset) and lazy operations
chained on it (shuffle, map, batch, repeat, take, skip, project), iterated with
create_tuple_iterator / create_dict_iterator. Rows are tuples of NumPy arrays until an iterator
hands them out (as kiln Tensors unless output_numpy=True). num_parallel_workers > 1 on a source or
a map runs that per-row work in worker processes (kiln.dataset.workers), in order."""
import numpy as np

from . import config, workers


def _rng(epoch):
    seed = config.get_seed()
    return np.random.default_rng(None if seed is None else [seed, epoch])


def _as_row(item, ncols, where):
    row = item if isinstance(item, tuple) else (item,) if ncols == 1 else tuple(item)
    if len(row) != ncols:
        raise ValueError(f"{where}: a row has {len(row)} columns, the dataset names {ncols}")
    return tuple(np.asarray(v) for v in row)


class Dataset:
    """The operations every dataset has; subclasses give column_names and _rows(epoch)."""

    column_names = ()

    # ---- chained operations ----------------------------------------------------------------
    def shuffle(self, buffer_size):
        if not isinstance(buffer_size, int) or buffer_size < 2:
            raise ValueError(f"shuffle: buffer_size must be an int >= 2, got {buffer_size!r}")
        return _Shuffle(self, buffer_size)

    def batch(self, batch_size, drop_remainder=False, num_parallel_workers=None, per_batch_map=None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch: batch_size must be a positive int, got {batch_size!r}")
        return _Batch(self, batch_size, bool(drop_remainder), per_batch_map)

    def map(self, operations, input_columns=None, output_columns=None, num_parallel_workers=None, **kwargs):
        ops = list(operations) if isinstance(operations, (list, tuple)) else [operations]
        if not ops or not all(callable(op) for op in ops):
            raise TypeError("map: operations must be a callable or a list of callables")
        return _Map(self, ops, input_columns, output_columns, num_parallel_workers or 1)

    def repeat(self, count=None):
        if count is not None and (not isinstance(count, int) or count < 1) and count != -1:
            raise ValueError(f"repeat: count must be a positive int, -1 or None, got {count!r}")
        return _Repeat(self, None if count in (None, -1) else count)

    def take(self, count):
        return _Slice(self, 0, count)

    def skip(self, count):
        return _Slice(self, count, None)

    def project(self, columns):
        cols = [columns] if isinstance(columns, str) else list(columns)
        missing = [c for c in cols if c not in self.column_names]
        if missing:
            raise ValueError(f"project: no column {missing[0]!r} (columns: {list(self.column_names)})")
        return _Project(self, cols)

    # ---- sizes and iteration ---------------------------------------------------------------
    def get_dataset_size(self):
        """Rows (batches after batch) of one epoch."""
        n = self._size()
        return n if n is not None else sum(1 for _ in self._rows(0))

    def _size(self):
        return None

    def get_col_names(self):
        return list(self.column_names)

    def create_tuple_iterator(self, columns=None, num_epochs=-1, output_numpy=False, do_copy=True):
        """Rows as lists (one entry per column) of kiln Tensors (NumPy arrays with output_numpy),
        over num_epochs epochs (-1: until the caller stops)."""
        return _Iterator(self, num_epochs, output_numpy, as_dict=False, columns=columns)

    def create_dict_iterator(self, num_epochs=-1, output_numpy=False, do_copy=True):
        return _Iterator(self, num_epochs, output_numpy, as_dict=True)

    def __iter__(self):
        return iter(self.create_tuple_iterator(num_epochs=1))


class _Iterator:
    def __init__(self, ds, num_epochs, output_numpy, as_dict, columns=None):
        self.ds, self.num_epochs, self.output_numpy, self.as_dict = ds, num_epochs, output_numpy, as_dict
        self.columns = columns

    def __iter__(self):
        from .._tensor import Tensor

        names = list(self.ds.column_names)
        pick = None if self.columns is None else [names.index(c) for c in self.columns]
        epoch = 0
        while self.num_epochs < 0 or epoch < self.num_epochs:
            for row in self.ds._rows(epoch):
                if pick is not None:
                    row = tuple(row[k] for k in pick)
                values = list(row) if self.output_numpy else [Tensor(v) for v in row]
                yield dict(zip(names, values)) if self.as_dict else values
            epoch += 1


class GeneratorDataset(Dataset):
    """A dataset from source: a random-access object (__getitem__ and __len__: rows by index,
    shuffled each epoch unless shuffle=False, read by num_parallel_workers processes), an iterable,
    or a function returning an iterator (rows in its order). A row is a tuple with one value per
    column name (a single value for one column). sampler: an iterable of indices (random access)."""

    def __init__(self, source, column_names=None, column_types=None, schema=None, num_samples=None,
                 num_parallel_workers=1, shuffle=None, sampler=None, num_shards=None, shard_id=None, **kwargs):
        if column_names is None:
            column_names = ["data"]
        self.column_names = [column_names] if isinstance(column_names, str) else list(column_names)
        self.source = source
        self.random_access = hasattr(source, "__getitem__") and hasattr(source, "__len__")
        if sampler is not None and not self.random_access:
            raise ValueError("GeneratorDataset: a sampler needs a source with __getitem__ and __len__")
        self.shuffle_rows = (shuffle is None or shuffle) and self.random_access and sampler is None
        self.sampler = sampler
        self.num_samples = num_samples
        if not isinstance(num_parallel_workers, int) or num_parallel_workers < 1:
            raise ValueError(f"GeneratorDataset: num_parallel_workers must be a positive int, got "
                             f"{num_parallel_workers!r}")
        self.workers = num_parallel_workers
        if not self.random_access and not (callable(source) or hasattr(source, "__iter__")):
            raise TypeError(f"GeneratorDataset: source must be random-access, iterable or a generator function, got "
                            f"{type(source).__name__}")

    def _indices(self, epoch):
        if self.sampler is not None:
            idx = list(iter(self.sampler))
        else:
            idx = list(range(len(self.source)))
            if self.shuffle_rows:
                _rng(epoch).shuffle(idx)
        return idx[:self.num_samples] if self.num_samples else idx

    def _size(self):
        if self.random_access:
            return len(self._indices(0))
        return None

    def _rows(self, epoch):
        n = len(self.column_names)
        if self.random_access:
            fetch = self._fetch
            idx = self._indices(epoch)
            if self.workers > 1:
                yield from workers.ordered_map(fetch, idx, self.workers, 4 * self.workers)
            else:
                yield from (fetch(i) for i in idx)
            return
        it = self.source() if callable(self.source) and not hasattr(self.source, "__iter__") else iter(self.source)
        for k, item in enumerate(it):
            if self.num_samples and k >= self.num_samples:
                break
            yield _as_row(item, n, "GeneratorDataset")

    def _fetch(self, i):
        return _as_row(self.source[int(i)], len(self.column_names), "GeneratorDataset")


class NumpySlicesDataset(GeneratorDataset):
    """Rows sliced along the first axis of data: an array, a list/tuple of arrays (one column
    each) or a dict name -> array; shuffled each epoch unless shuffle=False (MindSpore's default)."""

    def __init__(self, data, column_names=None, num_samples=None, num_parallel_workers=1, shuffle=None,
                 sampler=None, **kwargs):
        if isinstance(data, dict):
            column_names = column_names or list(data)
            cols = [np.asarray(v) for v in data.values()]
        elif isinstance(data, (list, tuple)) and data and all(hasattr(v, "__len__") for v in data) and \
                not np.isscalar(data[0]):
            cols = [np.asarray(v) for v in data]
        else:
            cols = [np.asarray(data)]
        column_names = column_names or [f"column_{k}" for k in range(len(cols))]
        lengths = {len(c) for c in cols}
        if len(lengths) != 1:
            raise ValueError(f"NumpySlicesDataset: the columns have different lengths {sorted(lengths)}")
        super().__init__(_Slices(cols), column_names, num_samples=num_samples,
                         num_parallel_workers=num_parallel_workers, shuffle=shuffle, sampler=sampler)


class _Slices:
    def __init__(self, cols):
        self.cols = cols

    def __len__(self):
        return len(self.cols[0])

    def __getitem__(self, i):
        return tuple(c[i] for c in self.cols)


class _Op(Dataset):
    def __init__(self, child):
        self.child = child
        self.column_names = child.column_names


class _Shuffle(_Op):
    def __init__(self, child, buffer_size):
        super().__init__(child)
        self.buffer_size = buffer_size

    def _size(self):
        return self.child._size()

    def _rows(self, epoch):
        rng, buf = _rng(epoch + 7919), []
        for row in self.child._rows(epoch):
            buf.append(row)
            if len(buf) >= self.buffer_size:
                yield buf.pop(int(rng.integers(len(buf))))
        while buf:
            yield buf.pop(int(rng.integers(len(buf))))


class _Map(_Op):
    def __init__(self, child, ops, input_columns, output_columns, nworkers):
        super().__init__(child)
        names = list(child.column_names)
        cols = input_columns if input_columns is not None else names
        cols = [cols] if isinstance(cols, str) else list(cols)
        missing = [c for c in cols if c not in names]
        if missing:
            raise ValueError(f"map: no column {missing[0]!r} (columns: {names})")
        self.ops, self.inputs, self.nworkers = ops, [names.index(c) for c in cols], nworkers
        out = output_columns if output_columns is not None else cols
        self.outputs = [out] if isinstance(out, str) else list(out)
        if len(self.outputs) != len(cols):
            raise ValueError("map: output_columns must name as many columns as input_columns (renaming only)")
        self.column_names = [self.outputs[cols.index(n)] if n in cols else n for n in names]

    def _size(self):
        return self.child._size()

    def _apply(self, row):
        values = tuple(row[k] for k in self.inputs)
        for op in self.ops:
            values = op(*values)
            values = values if isinstance(values, tuple) else (values,)
        if len(values) != len(self.inputs):
            raise ValueError(f"map: the operations return {len(values)} values for {len(self.inputs)} columns")
        out = list(row)
        for k, v in zip(self.inputs, values):
            out[k] = np.asarray(v)
        return tuple(out)

    def _rows(self, epoch):
        rows = self.child._rows(epoch)
        if self.nworkers > 1:
            yield from workers.ordered_map(self._apply, rows, self.nworkers, 4 * self.nworkers)
        else:
            yield from map(self._apply, rows)


class _Batch(_Op):
    def __init__(self, child, size, drop, per_batch_map):
        super().__init__(child)
        self.size, self.drop, self.per_batch_map = size, drop, per_batch_map

    def _size(self):
        n = self.child._size()
        if n is None:
            return None
        return n // self.size if self.drop else -(-n // self.size)

    def _rows(self, epoch):
        buf = []
        for row in self.child._rows(epoch):
            buf.append(row)
            if len(buf) == self.size:
                yield self._stack(buf)
                buf = []
        if buf and not self.drop:
            yield self._stack(buf)

    def _stack(self, rows):
        cols = []
        for k, name in enumerate(self.column_names):
            shapes = {r[k].shape for r in rows}
            if len(shapes) > 1:
                raise ValueError(f"batch: column {name!r} has rows of shapes {sorted(shapes)}; pad them to one shape")
            cols.append(np.stack([r[k] for r in rows]))
        out = tuple(cols)
        if self.per_batch_map is not None:
            out = self.per_batch_map(*out)
            out = out if isinstance(out, tuple) else (out,)
        return out


class _Repeat(_Op):
    def __init__(self, child, count):
        super().__init__(child)
        self.count = count

    def _size(self):
        n = self.child._size()
        return None if n is None or self.count is None else n * self.count

    def _rows(self, epoch):
        k = 0
        while self.count is None or k < self.count:
            yield from self.child._rows(epoch * (self.count or 1) + k)
            k += 1


class _Slice(_Op):
    def __init__(self, child, start, count):
        super().__init__(child)
        if not isinstance(start, int) or start < 0 or (count is not None and (not isinstance(count, int) or count < 0)):
            raise ValueError("take/skip: counts must be ints >= 0")
        self.start, self.count = start, count

    def _size(self):
        n = self.child._size()
        if n is None:
            return None
        n = max(0, n - self.start)
        return n if self.count is None else min(n, self.count)

    def _rows(self, epoch):
        for k, row in enumerate(self.child._rows(epoch)):
            if k < self.start:
                continue
            if self.count is not None and k >= self.start + self.count:
                break
            yield row


class _Project(_Op):
    def __init__(self, child, cols):
        super().__init__(child)
        self.pick = [list(child.column_names).index(c) for c in cols]
        self.column_names = cols

    def _size(self):
        return self.child._size()

    def _rows(self, epoch):
        for row in self.child._rows(epoch):
            yield tuple(row[k] for k in self.pick)
