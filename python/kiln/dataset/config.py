"""The seed behind every shuffle of kiln.dataset (MindSpore's mindspore.dataset.config), and the
scheduling priority of its worker processes."""
import numpy as np

_seed = None
# Worker processes run this much nicer than the training process (os.nice): prefetching workers
# then take the CPU the training step leaves, instead of a fair share of it (on 2 cores, two
# workers beside the step took a third of its core and the step ran 1.5x slower)
_worker_nice = 10


def set_seed(seed):
    """Makes shuffles (GeneratorDataset, NumpySlicesDataset, .shuffle, RandomSampler,
    DataLoader(shuffle=True)) deterministic: the same pipeline gives the same order each run."""
    global _seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"kiln.dataset.config.set_seed: seed must be a non-negative int, got {seed!r}")
    _seed = int(seed)


def get_seed():
    """The seed set by set_seed, or None (then shuffles draw fresh entropy)."""
    return _seed


def rng(*stream):
    """A NumPy generator for one use (a stream of ints telling uses apart): seeded from the
    global seed when one is set, otherwise from fresh entropy."""
    base = _seed if _seed is not None else np.random.SeedSequence().entropy
    return np.random.default_rng([int(base)] + [int(s) for s in stream])


def set_worker_nice(nice):
    """How much lower the scheduling priority of kiln.dataset's worker processes is than the
    training process's (os.nice increment, 0-19; default 10; 0: the same priority). Read when the
    workers start."""
    global _worker_nice
    if isinstance(nice, bool) or not isinstance(nice, (int, np.integer)) or not 0 <= nice <= 19:
        raise ValueError(f"kiln.dataset.config.set_worker_nice: nice must be an int from 0 to 19, got {nice!r}")
    _worker_nice = int(nice)


def get_worker_nice():
    """The increment set by set_worker_nice (default 10)."""
    return _worker_nice
