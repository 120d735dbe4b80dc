"""The gradient all-reduce of data-parallel training, fused into buckets (DDP's and Horovod's
tensor fusion): the gradients of one dtype, from the last parameter to the first (the order
backward makes them), are concatenated into flat buffers of at most the bucket size, one
all_reduce each, then split back. TrainOneStepCell runs it in data-parallel mode
(kiln.set_auto_parallel_context), nn.DistributedGradReducer is its Cell."""
from .. import context as _context
from .. import ops as _ops
from ..ops import collective


def gradient_buckets(grads, bucket_bytes, split_indices=()):
    """Lists of gradient positions, each one fused all-reduce: one dtype per bucket, from the last
    gradient to the first, a new bucket when the next would pass bucket_bytes or a split index of
    split_indices (MindSpore's all_reduce_fusion_config) lies between them."""
    splits = sorted(split_indices)

    def segment(k):
        return sum(1 for s in splits if s <= k)

    buckets, current, size, key = [], [], 0, None
    for k in reversed(range(len(grads))):
        g = grads[k]
        nbytes = g.numel() * g.dtype.itemsize if hasattr(g, "numel") else 0
        k_key = (g.dtype, segment(k))
        if current and (k_key != key or size + nbytes > bucket_bytes):
            buckets.append(current)
            current, size = [], 0
        current.append(k)
        size += nbytes
        key = k_key
    if current:
        buckets.append(current)
    return buckets


def reduce_gradients(grads, mean=True, degree=None, group=None, bucket_bytes=None, split_indices=()):
    """The gradients all-reduced across the group's ranks (averaged when mean: divided by degree
    when given, else by the group's size), in buckets; a tuple in the order given."""
    grads = tuple(grads)
    if bucket_bytes is None:
        bucket_bytes = _context.gradient_bucket_bytes()
    op = "mean" if mean and degree is None else "sum"
    out = list(grads)
    for bucket in gradient_buckets(grads, bucket_bytes, split_indices):
        if len(bucket) == 1:
            out[bucket[0]] = collective.all_reduce(grads[bucket[0]], op, group)
        else:
            flat = _ops.concat([_ops.reshape(grads[k], (-1,)) for k in bucket])
            reduced = collective.all_reduce(flat, op, group)
            start = 0
            for k in bucket:
                n = grads[k].numel()
                out[k] = _ops.reshape(_ops.narrow(reduced, 0, start, n), tuple(grads[k].shape))
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
