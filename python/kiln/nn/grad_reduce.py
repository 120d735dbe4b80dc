"""The gradient all-reduce of data-parallel training, fused into buckets (DDP's and Horovod's
tensor fusion, MindSpore's AllReduce fusion): the gradients of one dtype, from the last parameter
to the first (the order backward makes them), reduced by one collective per bucket of at most the
bucket size. TrainOneStepCell runs it in data-parallel mode (kiln.set_auto_parallel_context),
nn.DistributedGradReducer is its Cell.

Compiled (kiln.jit, kiln.trace), each gradient gets its own all_reduce with a fusion id (one per
all_reduce_fusion_config segment) and the O1 pass bucket_all_reduce (src/passes/) makes the
buckets, the gradients views of each bucket's result; eager, the buckets are made here with the
same rule (all_reduce_bucket). With one rank nothing is reduced."""
from .. import _C
from .. import context as _context
from .. import ops as _ops
from ..ops import collective


def _segment(k, splits):
    return sum(1 for s in splits if s <= k)


def gradient_buckets(grads, bucket_bytes, split_indices=()):
    """Lists of gradient positions, each one fused all-reduce, as the bucket_all_reduce pass makes
    them: one dtype and all_reduce_fusion_config segment (split_indices) per bucket; from the last
    gradient to the first, each bucket takes the next gradients of its kind while they fit in
    bucket_bytes (a larger gradient alone)."""
    splits = sorted(split_indices)
    order = list(reversed(range(len(grads))))
    key = {k: (grads[k].dtype, _segment(k, splits)) for k in order}
    size = {k: grads[k].numel() * grads[k].dtype.itemsize for k in order}
    taken, buckets = set(), []
    for i, k in enumerate(order):
        if k in taken:
            continue
        bucket, total = [], 0
        for j in order[i:]:
            if j in taken or key[j] != key[k]:
                continue
            if bucket and total + size[j] > bucket_bytes:
                break
            bucket.append(j)
            taken.add(j)
            total += size[j]
        buckets.append(bucket)
    return buckets


def reduce_gradients(grads, mean=True, degree=None, group=None, bucket_bytes=None, split_indices=()):
    """The gradients all-reduced across the group's ranks (averaged when mean: divided by degree
    when given, else by the group's size), in buckets; a tuple in the order given. bucket_bytes
    (eager only; compiled graphs use comm_fusion's size) defaults to comm_fusion's size."""
    grads = tuple(grads)
    op = "mean" if mean and degree is None else "sum"
    gid = collective.group_id(group, "reduce_gradients")
    splits = sorted(split_indices)
    if _C.comm_size(gid) == 1:  # nothing to reduce: no collective, no copy
        out = list(grads)
    elif _C.is_tracing():  # one all_reduce each; the compiler buckets them
        out = [collective.all_reduce(g, op, gid, fusion=1 + _segment(k, splits)) for k, g in enumerate(grads)]
    else:
        if bucket_bytes is None:
            bucket_bytes = _context.gradient_bucket_bytes()
        out = list(grads)
        for bucket in gradient_buckets(grads, bucket_bytes, splits):
            if len(bucket) == 1:
                out[bucket[0]] = collective.all_reduce(grads[bucket[0]], op, gid)
                continue
            flat = collective.all_reduce_bucket([grads[k] for k in bucket], op, gid)
            start = 0
            for k in bucket:
                n = grads[k].numel()
                out[k] = _ops.reshape(_ops.narrow(flat, 0, start, n), tuple(grads[k].shape))
                start += n
    if mean and degree is not None:
        out = [g / degree for g in out]
    return tuple(out)


def broadcast_parameters(parameters, root=0, group=None):
    """Writes the root's value of each parameter into every rank's (MindSpore's parameter_broadcast)."""
    for p in parameters:
        value = collective.broadcast(p, root, group)
        if hasattr(p, "set_data"):
            p.set_data(value)
        else:
            p[...] = value
