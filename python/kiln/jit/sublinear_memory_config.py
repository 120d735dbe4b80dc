"""MegEngine's megengine.jit.sublinear_memory_config.SublinearMemoryConfig."""
import os


class SublinearMemoryConfig:
    """Configuration for sublinear memory optimization (MegEngine's SublinearMemoryConfig).

    Stored only: rematerialization arrives with the sublinear-memory issue. `lb_memory` (the
    name on MegEngine's doc page) is accepted for `lb_memory_mb` (the name in its source)."""

    __slots__ = ("thresh_nr_try", "genetic_nr_iter", "genetic_pool_size", "lb_memory_mb", "num_worker")

    def __init__(self, thresh_nr_try=10, genetic_nr_iter=0, genetic_pool_size=20, lb_memory_mb=0, num_worker=None,
                 *, lb_memory=None):
        if lb_memory is not None:
            if lb_memory_mb not in (0, lb_memory):
                raise ValueError(f"SublinearMemoryConfig: lb_memory={lb_memory!r} and lb_memory_mb={lb_memory_mb!r} "
                                 "name the same setting; give one")
            lb_memory_mb = lb_memory
        if num_worker is None:
            num_worker = max(1, (os.cpu_count() or 1) // 2)
        for name, value, low in (("thresh_nr_try", thresh_nr_try, 0), ("genetic_nr_iter", genetic_nr_iter, 0),
                                 ("genetic_pool_size", genetic_pool_size, 0), ("lb_memory_mb", lb_memory_mb, 0),
                                 ("num_worker", num_worker, 1)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"SublinearMemoryConfig: {name} must be an int, got {value!r}")
            if value < low:
                raise ValueError(f"SublinearMemoryConfig: {name} must be >= {low}, got {value}")
        self.thresh_nr_try, self.genetic_nr_iter, self.genetic_pool_size = thresh_nr_try, genetic_nr_iter, \
            genetic_pool_size
        self.lb_memory_mb, self.num_worker = lb_memory_mb, num_worker

    @property
    def lb_memory(self):
        return self.lb_memory_mb

    def __repr__(self):
        return ("SublinearMemoryConfig(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")")
