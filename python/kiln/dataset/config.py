"""The seed behind every shuffle of kiln.dataset (MindSpore's mindspore.dataset.config)."""
import numpy as np

_seed = None


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
