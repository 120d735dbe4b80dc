"""More functional losses (issue 30; MindSpore's and PyTorch's names and arguments): huber_loss,
binary_cross_entropy, margin_ranking_loss, soft_margin_loss, cosine_embedding_loss. Compositions of
kiln's ops; kiln.nn's loss Cells call these (one definition each)."""
from ._util import as_tensor
from .activations import softplus
from .losses import REDUCTIONS
from .math import abs as abs_, cast, clamp, log, maximum, minimum, sqrt, sum as sum_, where
from .math import mean as mean_


def _reduction(op, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def _reduce(loss, reduction):
    return mean_(loss) if reduction == "mean" else sum_(loss) if reduction == "sum" else loss


def _pair(op, input, target):
    x, y = as_tensor(input), as_tensor(target)
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: input must be floating point, got {x.dtype.name} (shape {list(x.shape)})")
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"{op}: input and target must have one shape, got {list(x.shape)} and {list(y.shape)}")
    return x, cast(y, x.dtype)


def huber_loss(input, target, reduction="mean", delta=1.0):
    """0.5 d^2 where |d| <= delta, delta (|d| - 0.5 delta) beyond (d = input - target), reduced."""
    x, y = _pair("huber_loss", input, target)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or delta <= 0:
        raise ValueError(f"huber_loss: delta must be a positive number, got {delta!r}")
    reduction, delta = _reduction("huber_loss", reduction), float(delta)
    a = abs_(x - y)
    small = minimum(a, delta)  # the quadratic part, at most delta: no overflow where unused
    return _reduce(where(a <= delta, small * small * 0.5, (a - 0.5 * delta) * delta), reduction)


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """-w [y log x + (1 - y) log(1 - x)] of probabilities x, each log clamped at -100 (PyTorch's
    rule: a 0 or 1 probability gives a finite loss), reduced."""
    x, y = _pair("binary_cross_entropy", input, target)
    reduction = _reduction("binary_cross_entropy", reduction)
    loss = -(y * clamp(log(x), min=-100.0) + (1.0 - y) * clamp(log(1.0 - x), min=-100.0))
    if weight is not None:
        loss = loss * cast(as_tensor(weight), x.dtype)
        if tuple(loss.shape) != tuple(x.shape):
            raise ValueError(f"binary_cross_entropy: weight broadcasts the input's shape {list(x.shape)} to "
                             f"{list(loss.shape)}")
    return _reduce(loss, reduction)


def margin_ranking_loss(input1, input2, target, margin=0.0, reduction="mean"):
    """max(0, -y (x1 - x2) + margin): x1 should rank above x2 where y is 1, below where -1."""
    x1, y = _pair("margin_ranking_loss", input1, target)
    x2, _ = _pair("margin_ranking_loss", input2, target)
    reduction = _reduction("margin_ranking_loss", reduction)
    return _reduce(maximum(-y * (x1 - x2) + float(margin), 0.0), reduction)


def soft_margin_loss(input, target, reduction="mean"):
    """log(1 + exp(-y x)) for labels y of 1 and -1 (softplus: no overflow), reduced."""
    x, y = _pair("soft_margin_loss", input, target)
    return _reduce(softplus(-y * x), _reduction("soft_margin_loss", reduction))


def cosine_embedding_loss(input1, input2, target, margin=0.0, reduction="mean"):
    """1 - cos(x1, x2) where y is 1, max(0, cos(x1, x2) - margin) where y is -1; cos along the last
    axis of (N, D) or (D,) inputs, as PyTorch (sum(x1 x2) / sqrt((|x1|^2 + 1e-12)(|x2|^2 + 1e-12)))."""
    a, b = as_tensor(input1), as_tensor(input2)
    y = as_tensor(target)
    if not a.dtype.is_floating_point or tuple(a.shape) != tuple(b.shape) or a.ndim not in (1, 2):
        raise ValueError(f"cosine_embedding_loss: expected two float inputs of one shape (N, D) or (D,), got "
                         f"{a.dtype.name} {list(a.shape)} and {b.dtype.name} {list(b.shape)}")
    if tuple(y.shape) != tuple(a.shape[:-1]):
        raise ValueError(f"cosine_embedding_loss: target must have shape {list(a.shape[:-1])}, got {list(y.shape)}")
    reduction = _reduction("cosine_embedding_loss", reduction)
    eps = 1e-12
    cos = sum_(a * b, -1) / sqrt((sum_(a * a, -1) + eps) * (sum_(b * b, -1) + eps))
    y = cast(y, a.dtype)
    loss = where(y == 1, 1.0 - cos, 0.0) + where(y == -1, maximum(cos - float(margin), 0.0), 0.0)
    return _reduce(loss, reduction)
