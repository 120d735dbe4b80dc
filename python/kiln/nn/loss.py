"""Loss cells: MSELoss, L1Loss, CrossEntropyLoss, NLLLoss."""
from .. import _C
from .. import ops
from .._optable import OP
from .cell import Cell

_REDUCTIONS = ("mean", "sum", "none")


class LossBase(Cell):
    """Base of the losses: reduction is 'mean', 'sum' or 'none'."""

    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction

    def get_loss(self, x):
        if self.reduction == "mean":
            return ops.mean(x)
        if self.reduction == "sum":
            return ops.sum(x)
        return x

    def extend_repr(self):
        return f"reduction={self.reduction!r}"


def _check_same_shape(loss, logits, labels):
    if tuple(logits.shape) != tuple(labels.shape):
        raise ValueError(f"{loss}: logits and labels must have one shape, got {logits.shape} and {labels.shape}")


class MSELoss(LossBase):
    """(logits - labels)^2, reduced."""

    def construct(self, logits, labels):
        _check_same_shape("MSELoss", logits, labels)
        d = logits - labels
        return self.get_loss(d * d)


class L1Loss(LossBase):
    """|logits - labels|, reduced."""

    def construct(self, logits, labels):
        _check_same_shape("L1Loss", logits, labels)
        return self.get_loss(ops.abs(logits - labels))


def _as_tensor(x):
    from .._tensor import Tensor

    return x if isinstance(x, _C.TensorBase) else Tensor(x)


class CrossEntropyLoss(LossBase):
    """Cross entropy between logits (N, C) or (N, C, d1, ...) and either integer class labels
    (N,) / (N, d1, ...) or class probabilities of the logits' shape.

    weight: optional per-class weights (C,). ignore_index: integer labels equal to it add
    nothing, to the loss or its gradient (and are left out of the mean). Any other label
    outside [0, C) raises IndexError naming it and C, when the loss runs (in compiled graphs
    too). label_smoothing s mixes the target with the uniform distribution: (1 - s) * target
    + s / C. With integer labels and reduction='mean' the sum is divided by the total weight
    of the counted labels (PyTorch's rule)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.weight = None if weight is None else _as_tensor(weight)
        if self.weight is not None and self.weight.ndim != 1:
            raise ValueError(f"CrossEntropyLoss: weight must be 1-D (one per class), got shape {self.weight.shape}")
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)

    def construct(self, logits, labels):
        if logits.ndim < 2:
            raise ValueError(f"CrossEntropyLoss: logits must be (N, C) or (N, C, d1, ...), got shape {logits.shape}")
        labels = _as_tensor(labels)
        num_classes = logits.shape[1]
        if self.weight is not None and self.weight.shape[0] != num_classes:
            raise ValueError(f"CrossEntropyLoss: weight has {self.weight.shape[0]} entries for {num_classes} classes")
        logp = ops.log_softmax(logits, 1)
        # weights broadcast along the class axis
        w = None if self.weight is None else ops.reshape(ops.cast(self.weight, logp.dtype),
                                                          (num_classes,) + (1,) * (logits.ndim - 2))
        if labels.dtype.is_floating_point:
            return self._with_probabilities(logp, labels, w, num_classes)
        return self._with_indices(logits, logp, labels, w, num_classes)

    def _with_probabilities(self, logp, target, w, num_classes):
        _check_same_shape("CrossEntropyLoss", logp, target)
        if self.label_smoothing:
            target = target * (1.0 - self.label_smoothing) + self.label_smoothing / num_classes
        prod = logp * target if w is None else logp * target * w
        loss = ops.neg(ops.sum(prod, 1))
        if self.reduction == "mean":
            return ops.sum(loss) / float(loss.size)
        return self.get_loss(loss)

    def _with_indices(self, logits, logp, labels, w, num_classes):
        if labels.dtype not in (_C.int32, _C.int64):
            raise TypeError(f"CrossEntropyLoss: integer labels must be int32 or int64, got {labels.dtype}")
        expected = logits.shape[:1] + logits.shape[2:]
        if tuple(labels.shape) != expected:
            raise ValueError(f"CrossEntropyLoss: labels of shape {labels.shape} do not match logits of shape "
                             f"{logits.shape}; expected {expected}")
        keep = ops.ne(labels, self.ignore_index)
        # checked in C, so a compiled loss raises too; ignored labels read class 0
        safe = _C.apply(OP.class_labels, (labels,), (num_classes, self.ignore_index))
        picked = ops.squeeze(ops.gather_elements(logp, 1, ops.unsqueeze(safe, 1)), 1)
        sample_w = ops.cast(keep, logp.dtype)
        if w is not None:
            sample_w = sample_w * ops.gather(self.weight, safe, 0).astype(logp.dtype)
        # where, not a product with the 0/1 mask: an ignored position whose class-0 log
        # probability is -inf (or NaN) still adds 0, and 0 to the gradient
        loss = ops.where(keep, ops.neg(picked) * sample_w, 0.0)
        if self.label_smoothing:
            smooth = ops.where(keep, ops.neg(ops.sum(logp if w is None else logp * w, 1)), 0.0)
            loss = loss * (1.0 - self.label_smoothing) + smooth * (self.label_smoothing / num_classes)
        if self.reduction == "mean":
            return ops.sum(loss) / ops.sum(sample_w)
        return self.get_loss(loss)

    def extend_repr(self):
        return f"reduction={self.reduction!r}, label_smoothing={self.label_smoothing}"


class NLLLoss(LossBase):
    """Negative log likelihood of log-probabilities (N, C) at integer labels (N,)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        self._ce = CrossEntropyLoss(weight, ignore_index, reduction)

    def construct(self, logits, labels):
        ce = self._ce
        labels = _as_tensor(labels)
        num_classes = logits.shape[1]
        w = None if ce.weight is None else ops.reshape(ops.cast(ce.weight, logits.dtype),
                                                        (num_classes,) + (1,) * (logits.ndim - 2))
        return ce._with_indices(logits, logits, labels, w, num_classes)
