"""MegEngine's megengine.distributed.functional: the collectives by name (kiln.ops.collective's
ops, differentiable and recorded into graphs like any op)."""
from ..ops import collective


def all_reduce_sum(inp, group=None):
    return collective.all_reduce(inp, "sum", group)


def all_reduce_mean(inp, group=None):
    return collective.all_reduce(inp, "mean", group)


def all_reduce_max(inp, group=None):
    return collective.all_reduce(inp, "max", group)


def all_reduce_min(inp, group=None):
    return collective.all_reduce(inp, "min", group)


def all_reduce_prod(inp, group=None):
    return collective.all_reduce(inp, "prod", group)


def all_gather(inp, group=None, axis=0):
    """Every rank's inp concatenated along axis 0 (kiln gathers along axis 0 only)."""
    if axis != 0:
        raise NotImplementedError(f"all_gather: kiln gathers along axis 0, got axis={axis}")
    return collective.all_gather(inp, group)


def reduce_scatter_sum(inp, group=None, axis=0):
    if axis != 0:
        raise NotImplementedError(f"reduce_scatter_sum: kiln scatters along axis 0, got axis={axis}")
    return collective.reduce_scatter(inp, "sum", group)


def reduce_scatter_mean(inp, group=None, axis=0):
    if axis != 0:
        raise NotImplementedError(f"reduce_scatter_mean: kiln scatters along axis 0, got axis={axis}")
    return collective.reduce_scatter(inp, "mean", group)


def broadcast(inp, group=None, root=0):
    return collective.broadcast(inp, root, group)


def reduce_sum(inp, group=None, root=0):
    """The sum of every rank's inp on the root; zeros elsewhere."""
    return collective.reduce(inp, root, "sum", group)


def remote_send(inp, dest_rank, tag=0, group=None):
    return collective.send(inp, dest_rank, tag, group)


def remote_recv(src_rank, shape, dtype, tag=0, group=None):
    return collective.recv(shape, dtype, src_rank, tag, group)
