"""nn.DistributedGradReducer, MindSpore's Cell that all-reduces a step's gradients across the
ranks of a data-parallel job (the buckets: kiln.nn.grad_reduce)."""
from .. import _C
from .. import context as _context
from ..ops import collective
from .cell import Cell
from .grad_reduce import reduce_gradients


class DistributedGradReducer(Cell):
    """MindSpore's nn.DistributedGradReducer(parameters, mean=True, degree=None, fusion_type=1,
    group="hccl_world_group"): calling it on a tuple of gradients (of these parameters) returns them
    all-reduced across the group, averaged when mean (over degree ranks when given, else the
    group's size). Buckets follow set_auto_parallel_context's comm_fusion size (25 MB by default)
    and all_reduce_fusion_config."""

    def __init__(self, parameters, mean=True, degree=None, fusion_type=1, group=None):
        super().__init__(auto_prefix=False)
        self._count = len(tuple(parameters))  # (not kept: they are the network's, not this Cell's)
        if not isinstance(mean, bool):
            raise TypeError(f"DistributedGradReducer: mean must be a bool, got {mean!r}")
        if degree is not None and (isinstance(degree, bool) or not isinstance(degree, int) or degree < 1):
            raise ValueError(f"DistributedGradReducer: degree must be an int >= 1, got {degree!r}")
        self.mean = mean
        self.degree = degree
        self.group = collective.group_id(group, "DistributedGradReducer")
        if not _C.comm_initialized():
            raise RuntimeError("DistributedGradReducer: communication is not initialized (call "
                               "kiln.communication.init() first)")

    def construct(self, grads):
        grads = tuple(grads)
        if len(grads) != self._count:
            raise ValueError(f"DistributedGradReducer: {len(grads)} gradients for {self._count} parameters")
        return reduce_gradients(grads, self.mean, self.degree, self.group,
                                split_indices=_context.get_auto_parallel_context("all_reduce_fusion_config"))
