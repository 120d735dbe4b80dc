"""kiln.dataset.config: the seed shuffling draws from (MindSpore's dataset.config.set_seed)."""
_seed = [None]


def set_seed(seed):
    """Makes shuffling and random samplers repeat from this seed (an int in [0, 2**32))."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ValueError(f"set_seed: seed must be an int in [0, 2**32), got {seed!r}")
    _seed[0] = seed


def get_seed():
    """The seed set here, else kiln.set_seed's, else None (fresh randomness each run)."""
    if _seed[0] is not None:
        return _seed[0]
    import kiln

    return kiln.get_seed()
