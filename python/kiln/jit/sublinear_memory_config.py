"""MegEngine's megengine.jit.sublinear_memory_config.SublinearMemoryConfig."""
import os

# MegEngine's environment variables (and kiln's spelling of them) set the defaults
_ENV = {"thresh_nr_try": "THRESH_NR_TRY", "genetic_nr_iter": "GENETIC_NR_ITER",
        "genetic_pool_size": "GENETIC_POOL_SIZE", "lb_memory_mb": "LOWER_BOUND_MB", "num_worker": "WORKERS"}


def _env_default(name, default):
    for prefix in ("KILN_SUBLINEAR_MEMORY_", "MGB_SUBLINEAR_MEMORY_"):
        var = prefix + _ENV[name]
        text = os.environ.get(var)
        if text is not None:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"SublinearMemoryConfig: {var}={text!r} must be an int") from None
    return default


class SublinearMemoryConfig:
    """Configuration for sublinear memory optimization (MegEngine's SublinearMemoryConfig).

    Given to kiln.trace(fn, sublinear_memory_config=cfg), kiln.jit(fn, sublinear_memory_config=cfg)
    or JitConfig(sublinear_memory_config=cfg), the compiled training graph drops activations the
    backward reads and recomputes them from checkpoints (src/passes/recompute.c). The checkpoints
    are searched (src/plan/sublinear.c): Chen's greedy block budget over thresholds (halving from
    the peak, thresh_nr_try evenly spaced, thresh_nr_try around the best), then genetic_nr_iter
    rounds of a genetic search (genetic_pool_size candidates a round, fixed seed), every
    candidate scored by the memory planner's peak, on num_worker threads (the result does not
    depend on their number). lb_memory_mb (MB; `lb_memory`, the name on MegEngine's doc page, is
    accepted too): a peak at or below it is good enough, and the plan with the least recomputation
    among those wins. Unset arguments come from KILN_SUBLINEAR_MEMORY_{THRESH_NR_TRY,
    GENETIC_NR_ITER, GENETIC_POOL_SIZE, LOWER_BOUND_MB, WORKERS} or MegEngine's MGB_SUBLINEAR_MEMORY_*
    names of the same."""

    __slots__ = ("thresh_nr_try", "genetic_nr_iter", "genetic_pool_size", "lb_memory_mb", "num_worker")

    def __init__(self, thresh_nr_try=None, genetic_nr_iter=None, genetic_pool_size=None, lb_memory_mb=None,
                 num_worker=None, *, lb_memory=None):
        if lb_memory is not None:
            if lb_memory_mb not in (None, 0, lb_memory):
                raise ValueError(f"SublinearMemoryConfig: lb_memory={lb_memory!r} and lb_memory_mb={lb_memory_mb!r} "
                                 "name the same setting; give one")
            lb_memory_mb = lb_memory
        if thresh_nr_try is None:
            thresh_nr_try = _env_default("thresh_nr_try", 10)
        if genetic_nr_iter is None:
            genetic_nr_iter = _env_default("genetic_nr_iter", 0)
        if genetic_pool_size is None:
            genetic_pool_size = _env_default("genetic_pool_size", 20)
        if lb_memory_mb is None:
            lb_memory_mb = _env_default("lb_memory_mb", 0)
        if num_worker is None:
            num_worker = _env_default("num_worker", max(1, (os.cpu_count() or 1) // 2))
        for name, value, low in (("thresh_nr_try", thresh_nr_try, 0), ("genetic_nr_iter", genetic_nr_iter, 0),
                                 ("genetic_pool_size", genetic_pool_size, 0), ("lb_memory_mb", lb_memory_mb, 0),
                                 ("num_worker", num_worker, 1)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"SublinearMemoryConfig: {name} must be an int, got {value!r}")
            if value < low:
                raise ValueError(f"SublinearMemoryConfig: {name} must be >= {low}, got {value}")
        if genetic_nr_iter > 0 and genetic_pool_size == 0:
            raise ValueError("SublinearMemoryConfig: genetic_pool_size must be >= 1 when genetic_nr_iter > 0")
        self.thresh_nr_try, self.genetic_nr_iter, self.genetic_pool_size = thresh_nr_try, genetic_nr_iter, \
            genetic_pool_size
        self.lb_memory_mb, self.num_worker = lb_memory_mb, num_worker

    @property
    def lb_memory(self):
        return self.lb_memory_mb

    def as_tuple(self):
        """(thresh_nr_try, genetic_nr_iter, genetic_pool_size, lb_memory in bytes, num_worker), as the
        compiler takes them."""
        return (self.thresh_nr_try, self.genetic_nr_iter, self.genetic_pool_size, self.lb_memory_mb << 20,
                self.num_worker)

    def __repr__(self):
        return ("SublinearMemoryConfig(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")")


def check(value, who):
    """value as the sublinear_memory_config of `who` (None or a SublinearMemoryConfig)."""
    if value is not None and not isinstance(value, SublinearMemoryConfig):
        raise TypeError(f"{who}: sublinear_memory_config must be a SublinearMemoryConfig or None, got "
                        f"{type(value).__name__}")
    return value
