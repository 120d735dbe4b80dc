"""Functional losses (MindSpore's ops.cross_entropy, nll_loss, mse_loss, l1_loss, smooth_l1_loss,
binary_cross_entropy_with_logits, kl_div; PyTorch's argument names), compositions of kiln's ops.
kiln.nn's loss Cells call these: one definition each."""
from .. import _C
from .._optable import OP
from ._util import apply, as_tensor
from .activations import log1p_small
from .array import gather, gather_elements, reshape, squeeze, unsqueeze
from .math import abs as abs_, cast, exp, log, log_softmax, maximum, mean, minimum, ne, neg, sum as sum_, where

REDUCTIONS = ("mean", "sum", "none")


def _reduction(op, reduction, allowed=REDUCTIONS):
    if reduction not in allowed:
        raise ValueError(f"{op}: reduction must be one of {allowed}, got {reduction!r}")
    return reduction


def _reduce(loss, reduction):
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum_(loss)
    return loss


def _same_shape(op, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{op}: input and target must have one shape, got {list(a.shape)} and {list(b.shape)}")


def _floating(op, x):
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: input must be floating point, got {x.dtype}")
    return x


def mse_loss(input, target, reduction="mean"):
    """(input - target)^2, reduced ('mean', 'sum' or 'none')."""
    x, y = _floating("mse_loss", as_tensor(input)), as_tensor(target)
    _same_shape("mse_loss", x, y)
    d = x - y
    return _reduce(d * d, _reduction("mse_loss", reduction))


def l1_loss(input, target, reduction="mean"):
    """|input - target|, reduced."""
    x, y = _floating("l1_loss", as_tensor(input)), as_tensor(target)
    _same_shape("l1_loss", x, y)
    return _reduce(abs_(x - y), _reduction("l1_loss", reduction))


def smooth_l1_loss(input, target, beta=1.0, reduction="none"):
    """0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target; beta 0: |d|).
    reduction defaults to 'none', as MindSpore's (PyTorch's default is 'mean')."""
    x, y = _floating("smooth_l1_loss", as_tensor(input)), as_tensor(target)
    _same_shape("smooth_l1_loss", x, y)
    if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be a non-negative number, got {beta!r}")
    reduction = _reduction("smooth_l1_loss", reduction)
    a = abs_(x - y)
    if beta == 0:
        return _reduce(a, reduction)
    small = minimum(a, float(beta))  # the quadratic part, at most beta: no overflow where unused
    return _reduce(where(a < beta, small * small * (0.5 / beta), a - 0.5 * beta), reduction)


def binary_cross_entropy_with_logits(logits, label, weight=None, pos_weight=None, reduction="mean"):
    """-w [p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))] from logits x (no overflow for large |x|):
    (1 - y) x + (1 + (p - 1) y) (log(1 + exp(-|x|)) + max(-x, 0)); weight w and pos_weight p
    broadcast against the logits (pos_weight along the last axis, one per class)."""
    x, y = _floating("binary_cross_entropy_with_logits", as_tensor(logits)), as_tensor(label)
    _same_shape("binary_cross_entropy_with_logits", x, y)
    reduction = _reduction("binary_cross_entropy_with_logits", reduction)
    y = cast(y, x.dtype)
    log_sig_neg = log1p_small(exp(neg(abs_(x)))) + maximum(neg(x), 0.0)  # -log sigmoid(x)
    if pos_weight is None:
        loss = (1.0 - y) * x + log_sig_neg
    else:
        p = cast(as_tensor(pos_weight), x.dtype)
        loss = (1.0 - y) * x + ((p - 1.0) * y + 1.0) * log_sig_neg
    if weight is not None:
        loss = loss * cast(as_tensor(weight), x.dtype)
    if tuple(loss.shape) != tuple(x.shape):
        raise ValueError(f"binary_cross_entropy_with_logits: weight / pos_weight broadcast the logits' shape "
                         f"{list(x.shape)} to {list(loss.shape)}")
    return _reduce(loss, reduction)


def kl_div(logits, labels, reduction="mean", log_target=False):
    """Kullback-Leibler divergence of labels from logits (log-probabilities): labels (log labels
    - logits), 0 where a label is 0; log_target: labels are log-probabilities too. reduction
    'batchmean' divides the sum by the first dimension (the divergence per sample)."""
    x, t = _floating("kl_div", as_tensor(logits)), as_tensor(labels)
    _same_shape("kl_div", x, t)
    reduction = _reduction("kl_div", reduction, REDUCTIONS + ("batchmean",))
    t = cast(t, x.dtype)
    if log_target:
        loss = exp(t) * (t - x)
    else:
        positive = t > 0
        loss = where(positive, t * (log(where(positive, t, 1.0)) - x), 0.0)
    if reduction == "batchmean":
        return sum_(loss) / float(x.shape[0]) if x.ndim else sum_(loss)
    return _reduce(loss, reduction)


# ---- classification: class indices or class probabilities -----------------------------------------


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross entropy between logits (N, C) or (N, C, d1, ...) and either integer class labels
    (N,) / (N, d1, ...) or class probabilities of the logits' shape.

    weight: optional per-class weights (C,). ignore_index: integer labels equal to it add
    nothing, to the loss or its gradient (and are left out of the mean). Any other label
    outside [0, C) raises IndexError naming it and C, when the loss runs (in compiled graphs
    too). label_smoothing s mixes the target with the uniform distribution: (1 - s) * target
    + s / C. With integer labels and reduction='mean' the sum is divided by the total weight
    of the counted labels (PyTorch's rule)."""
    logits = _floating("cross_entropy", as_tensor(input))
    if logits.ndim < 2:
        raise ValueError(f"cross_entropy: logits must be (N, C) or (N, C, d1, ...), got shape {list(logits.shape)}")
    return _class_loss("cross_entropy", logits, log_softmax(logits, 1), target, weight, ignore_index, reduction,
                       label_smoothing)


def nll_loss(inputs, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Negative log likelihood of log-probabilities (N, C) or (N, C, d1, ...) at integer labels
    (N,) / (N, d1, ...): cross_entropy's rules for weight, ignore_index, reduction and
    label_smoothing."""
    logp = _floating("nll_loss", as_tensor(inputs))
    if logp.ndim < 2:
        raise ValueError(f"nll_loss: input must be (N, C) or (N, C, d1, ...), got shape {list(logp.shape)}")
    labels = as_tensor(target)
    if labels.dtype.is_floating_point:
        raise TypeError(f"nll_loss: target must hold integer class labels, got {labels.dtype}")
    return _class_loss("nll_loss", logp, logp, labels, weight, ignore_index, reduction, label_smoothing)


def _class_loss(op, logits, logp, target, weight, ignore_index, reduction, label_smoothing):
    reduction = _reduction(op, reduction)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    num_classes = logits.shape[1]
    if weight is not None:
        weight = as_tensor(weight)
        if weight.ndim != 1 or weight.shape[0] != num_classes:
            raise ValueError(f"{op}: weight must be 1-D with one entry per class ({num_classes}), got shape "
                             f"{list(weight.shape)}")
    labels = as_tensor(target)
    # weights broadcast along the class axis
    w = None if weight is None else reshape(cast(weight, logp.dtype), (num_classes,) + (1,) * (logits.ndim - 2))
    if labels.dtype.is_floating_point:
        return _with_probabilities(op, logp, labels, w, num_classes, reduction, float(label_smoothing))
    return _with_indices(op, logits, logp, labels, weight, w, num_classes, int(ignore_index), reduction,
                         float(label_smoothing))


def _with_probabilities(op, logp, target, w, num_classes, reduction, smoothing):
    _same_shape(op, logp, target)
    target = cast(target, logp.dtype)
    if smoothing:
        target = target * (1.0 - smoothing) + smoothing / num_classes
    prod = logp * target if w is None else logp * target * w
    loss = neg(sum_(prod, 1))
    if reduction == "mean":
        return sum_(loss) / float(loss.size)
    return _reduce(loss, reduction)


def _with_indices(op, logits, logp, labels, weight, w, num_classes, ignore_index, reduction, smoothing):
    if labels.dtype not in (_C.int32, _C.int64):
        raise TypeError(f"{op}: integer labels must be int32 or int64, got {labels.dtype}")
    expected = tuple(logits.shape[:1]) + tuple(logits.shape[2:])
    if tuple(labels.shape) != expected:
        raise ValueError(f"{op}: labels of shape {list(labels.shape)} do not match logits of shape "
                         f"{list(logits.shape)}; expected {list(expected)}")
    keep = ne(labels, ignore_index)
    # checked in C, so a compiled loss raises too; ignored labels read class 0
    safe = apply(OP.class_labels, (labels,), (num_classes, ignore_index))
    picked = squeeze(gather_elements(logp, 1, unsqueeze(safe, 1)), 1)
    sample_w = cast(keep, logp.dtype)
    if w is not None:
        sample_w = sample_w * cast(gather(weight, safe, 0), logp.dtype)
    # where, not a product with the 0/1 mask: an ignored position whose class-0 log
    # probability is -inf (or NaN) still adds 0, and 0 to the gradient
    loss = where(keep, neg(picked) * sample_w, 0.0)
    if smoothing:
        smooth = where(keep, neg(sum_(logp if w is None else logp * w, 1)), 0.0)
        loss = loss * (1.0 - smoothing) + smooth * (smoothing / num_classes)
    if reduction == "mean":
        return sum_(loss) / sum_(sample_w)
    return _reduce(loss, reduction)
