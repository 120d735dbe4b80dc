"""Collectives on tensors across the ranks of a job (the ops of ops.def's collectives block, over
the communication layer of src/comm/): eager, differentiable, and recorded into graphs by
kiln.jit and kiln.trace like any op (as effects: kept, never merged, in their order).

Every rank of the group must make the same calls in the same order with the same dtypes and
shapes; a rank that does not makes every rank fail with an error saying what each called.
Communication must be initialized first (kiln.communication.init(), or
kiln.distributed.init_process_group()).

group: None or "world" (every rank), or a group made by kiln.communication.create_group (its name
or id)."""
import builtins

from .. import _C
from .._optable import OP

_dtype_cls = _C.dtype


class ReduceOp:
    """The reductions: MindSpore's names (ReduceOp.SUM, ...) and MEAN and PROD."""
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


_REDUCE_CODES = {"sum": 0, "mean": 1, "max": 2, "min": 3, "prod": 4}
# the names of groups (kiln.communication.create_group registers its groups here)
WORLD_NAMES = ("world", "hccl_world_group", "nccl_world_group", "mpi_world_group")
_group_ids = {name: 0 for name in WORLD_NAMES}


def register_group(name, group_id):
    """Makes `name` stand for the group id (kiln.communication.create_group calls it)."""
    _group_ids[name] = group_id


def forget_group(name):
    _group_ids.pop(name, None)


def group_id(group, who):
    """The id of a group given as None, a name or an id."""
    if group is None:
        return 0
    if isinstance(group, str):
        if group not in _group_ids:
            raise ValueError(f"{who}: no communication group named {group!r} (known: {sorted(_group_ids)})")
        return _group_ids[group]
    if isinstance(group, builtins.int) and not isinstance(group, builtins.bool) and group >= 0:
        return group
    raise TypeError(f"{who}: group must be None, a group's name or its id, got {group!r}")


def _reduce_code(op, who):
    name = op.lower() if isinstance(op, str) else op
    if name not in _REDUCE_CODES:
        raise ValueError(f"{who}: op must be one of {sorted(_REDUCE_CODES)} (ReduceOp.SUM, ...), got {op!r}")
    return _REDUCE_CODES[name]


def _rank(value, name, who):
    if not isinstance(value, builtins.int) or isinstance(value, builtins.bool) or value < 0:
        raise TypeError(f"{who}: {name} must be an int >= 0, got {value!r}")
    return value


def _tensor(x, who):
    if not isinstance(x, _C.TensorBase):
        raise TypeError(f"{who}: expected a Tensor, got {type(x).__name__}")
    return x


def all_reduce(x, op=ReduceOp.SUM, group=None, fusion=0):
    """The reduction (sum, mean, max, min or prod) of every rank's x, on every rank. fusion
    (MindSpore's AllReduce fusion attribute): in a graph compiled at O1, sum and mean all-reduces
    with the same fusion id > 0 (and group and dtype) are joined into buckets of comm_fusion's
    size (one collective each); 0, the default, keeps this one alone. Eager calls run alone."""
    code = _reduce_code(op, "all_reduce")
    if not isinstance(fusion, builtins.int) or isinstance(fusion, builtins.bool):
        raise TypeError(f"all_reduce: fusion must be an int >= 0, got {fusion!r}")
    if fusion < 0:
        raise ValueError(f"all_reduce: fusion must be an int >= 0 (0: never bucketed), got {fusion}")
    return _C.apply(OP.all_reduce, (_tensor(x, "all_reduce"),), (code, group_id(group, "all_reduce"), fusion))


def all_reduce_bucket(tensors, op=ReduceOp.SUM, group=None):
    """The sum or mean of every rank's tensors (one dtype) as one collective: a 1-D tensor of
    their elements one after the other (the flat bucket; reshape slices of it to read each)."""
    code = _reduce_code(op, "all_reduce_bucket")
    tensors = tuple(_tensor(t, "all_reduce_bucket") for t in tensors)
    return _C.apply(OP.all_reduce_bucket, tensors, (code, group_id(group, "all_reduce_bucket")))


def all_gather(x, group=None):
    """Every rank's x concatenated along axis 0, in rank order (x needs at least one axis)."""
    return _C.apply(OP.all_gather, (_tensor(x, "all_gather"),), (group_id(group, "all_gather"),))


def reduce_scatter(x, op=ReduceOp.SUM, group=None):
    """Block `rank` of the reduction of every rank's x, split along axis 0 into size blocks."""
    code = _reduce_code(op, "reduce_scatter")
    return _C.apply(OP.reduce_scatter, (_tensor(x, "reduce_scatter"),), (code, group_id(group, "reduce_scatter")))


def broadcast(x, root=0, group=None):
    """The root's x on every rank (every rank gives a tensor of the same dtype and shape)."""
    root = _rank(root, "root", "broadcast")
    return _C.apply(OP.broadcast, (_tensor(x, "broadcast"),), (root, group_id(group, "broadcast")))


def reduce(x, root=0, op=ReduceOp.SUM, group=None):
    """The reduction of every rank's x on the root; zeros on the other ranks."""
    root = _rank(root, "root", "reduce")
    code = _reduce_code(op, "reduce")
    return _C.apply(OP.reduce, (_tensor(x, "reduce"),), (code, root, group_id(group, "reduce")))


def barrier(group=None):
    """Waits until every rank of the group reaches it."""
    return _C.apply(OP.barrier, (), (group_id(group, "barrier"),))


def send(x, dst, tag=0, group=None):
    """Sends x to rank dst (which receives it with recv of the same dtype and shape)."""
    dst = _rank(dst, "dst", "send")
    tag = _rank(tag, "tag", "send")
    return _C.apply(OP.send, (_tensor(x, "send"),), (dst, tag, group_id(group, "send")))


def recv(shape, dtype, src, tag=0, group=None):
    """The tensor of this dtype and shape rank src sends (a sender of another dtype or shape is an
    error on this rank)."""
    src = _rank(src, "src", "recv")
    tag = _rank(tag, "tag", "recv")
    if not isinstance(dtype, _dtype_cls):
        raise TypeError(f"recv: dtype must be a kiln dtype, got {dtype!r}")
    shape = tuple(shape)
    for d in shape:
        _rank(d, "each size of shape", "recv")
    return _C.apply(OP.recv, (), (dtype.id, src, tag, group_id(group, "recv"), len(shape), *shape))
