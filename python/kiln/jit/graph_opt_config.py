"""MegEngine's megengine.jit.graph_opt_config.GraphOptimizationConfig."""


class GraphOptimizationConfig:
    """Switches of single graph optimizations (MegEngine's GraphOptimizationConfig): True on,
    False off, None (the default) left to the trace's opt_level. MegEngine sets them as
    attributes after construction; kiln also takes them as keywords. Each value is checked.

    What kiln.trace makes of them: jit_fuse_reduce=True turns on kiln's fusion (level O1 at
    least), which fuses reductions over the last axis with the elementwise ops around them into
    generated C; jit_fuse_reduce=False cannot be honoured alone at O1/O2 (their fusion always
    takes such reductions) and is ignored there with a warning. kiln never fuses dimshuffles
    (transposes) into generated kernels: jit_fuse_dimshuffle=False holds as is, True is ignored
    with a warning."""

    __slots__ = ("_jit_fuse_dimshuffle", "_jit_fuse_reduce")

    def __init__(self, *, jit_fuse_dimshuffle=None, jit_fuse_reduce=None):
        self.jit_fuse_dimshuffle = jit_fuse_dimshuffle
        self.jit_fuse_reduce = jit_fuse_reduce

    @staticmethod
    def _check(name, value):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"GraphOptimizationConfig: {name} must be True, False or None, got {value!r}")
        return value

    @property
    def jit_fuse_dimshuffle(self):
        return self._jit_fuse_dimshuffle

    @jit_fuse_dimshuffle.setter
    def jit_fuse_dimshuffle(self, value):
        self._jit_fuse_dimshuffle = self._check("jit_fuse_dimshuffle", value)

    @property
    def jit_fuse_reduce(self):
        return self._jit_fuse_reduce

    @jit_fuse_reduce.setter
    def jit_fuse_reduce(self, value):
        self._jit_fuse_reduce = self._check("jit_fuse_reduce", value)

    def __repr__(self):
        words = {None: "UNSET", False: "OFF", True: "ON"}
        return (f"GraphOptimizationConfig {{ jit_fuse_dimshuffle = {words[self.jit_fuse_dimshuffle]}, "
                f"jit_fuse_reduce = {words[self.jit_fuse_reduce]} }}")
