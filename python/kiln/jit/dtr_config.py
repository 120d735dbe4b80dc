"""MegEngine's megengine.jit.dtr_config.DTRConfig: settings of dynamic tensor rematerialization."""
import numbers


class DTRConfig:
    """Configuration for DTR memory optimization (MegEngine's DTRConfig): when memory use passes
    eviction_threshold bytes, tensors of at least evictee_minimum_size bytes are evicted and
    recomputed when needed again, chosen by a cost weighing their memory (recomp_memory_factor)
    and recomputation time (recomp_time_factor).

    Checked and stored: kiln has no dynamic tensor rematerialization, so kiln.trace warns once
    that it ignores a dtr_config. As in MegEngine, eviction_threshold must be given (> 0)."""

    __slots__ = ("eviction_threshold", "evictee_minimum_size", "recomp_memory_factor", "recomp_time_factor")

    def __init__(self, eviction_threshold=0, evictee_minimum_size=1 << 20, recomp_memory_factor=1,
                 recomp_time_factor=1):
        for name, value in (("eviction_threshold", eviction_threshold), ("evictee_minimum_size", evictee_minimum_size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"DTRConfig: {name} must be an int (bytes), got {value!r}")
        if eviction_threshold <= 0:
            raise ValueError(f"DTRConfig: eviction_threshold must be > 0 (the bytes in use above which tensors are "
                             f"evicted), got {eviction_threshold}")
        if evictee_minimum_size < 0:
            raise ValueError(f"DTRConfig: evictee_minimum_size must be >= 0, got {evictee_minimum_size}")
        for name, value in (("recomp_memory_factor", recomp_memory_factor), ("recomp_time_factor", recomp_time_factor)):
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"DTRConfig: {name} must be a number, got {value!r}")
            if not value >= 0:
                raise ValueError(f"DTRConfig: {name} must be >= 0, got {value!r}")
        self.eviction_threshold, self.evictee_minimum_size = eviction_threshold, evictee_minimum_size
        self.recomp_memory_factor, self.recomp_time_factor = recomp_memory_factor, recomp_time_factor

    def __repr__(self):
        return "DTRConfig(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"
