"""Loss cells: MSELoss, L1Loss, SmoothL1Loss, CrossEntropyLoss, NLLLoss, BCEWithLogitsLoss,
KLDivLoss. Each calls its function in kiln.ops.losses (one definition)."""
from .. import _C
from .. import ops
from ..ops import losses as _losses
from .cell import Cell

_REDUCTIONS = _losses.REDUCTIONS


class LossBase(Cell):
    """Base of the losses: reduction is 'mean', 'sum' or 'none'."""

    _allowed = _REDUCTIONS

    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in self._allowed:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {self._allowed}, got {reduction!r}")
        self.reduction = reduction

    def get_loss(self, x):
        if self.reduction == "mean":
            return ops.mean(x)
        if self.reduction == "sum":
            return ops.sum(x)
        return x

    def extend_repr(self):
        return f"reduction={self.reduction!r}"


class MSELoss(LossBase):
    """(logits - labels)^2, reduced (ops.mse_loss)."""

    def construct(self, logits, labels):
        return _losses.mse_loss(logits, labels, self.reduction)


class L1Loss(LossBase):
    """|logits - labels|, reduced (ops.l1_loss)."""

    def construct(self, logits, labels):
        return _losses.l1_loss(logits, labels, self.reduction)


class SmoothL1Loss(LossBase):
    """Quadratic below beta, linear above (ops.smooth_l1_loss); reduction 'none' by default, as
    MindSpore's (PyTorch's is 'mean')."""

    def __init__(self, beta=1.0, reduction="none"):
        super().__init__(reduction)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be a non-negative number, got {beta!r}")
        self.beta = float(beta)

    def construct(self, logits, labels):
        return _losses.smooth_l1_loss(logits, labels, self.beta, self.reduction)


def _as_tensor(x):
    from .._tensor import Tensor

    return x if isinstance(x, _C.TensorBase) else Tensor(x)


class CrossEntropyLoss(LossBase):
    """Cross entropy between logits and class labels or class probabilities (ops.cross_entropy,
    which says what weight, ignore_index and label_smoothing do)."""

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
        return _losses.cross_entropy(logits, labels, self.weight, self.ignore_index, self.reduction,
                                     self.label_smoothing)

    def extend_repr(self):
        return f"reduction={self.reduction!r}, label_smoothing={self.label_smoothing}"


class NLLLoss(LossBase):
    """Negative log likelihood of log-probabilities (N, C) at integer labels (N,) (ops.nll_loss)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        self.weight = None if weight is None else _as_tensor(weight)
        self.ignore_index = int(ignore_index)

    def construct(self, logits, labels):
        return _losses.nll_loss(logits, labels, self.weight, self.ignore_index, self.reduction)


class BCEWithLogitsLoss(LossBase):
    """Binary cross entropy from logits, numerically stable (ops.binary_cross_entropy_with_logits);
    MindSpore's argument order (reduction, weight, pos_weight)."""

    def __init__(self, reduction="mean", weight=None, pos_weight=None):
        if isinstance(reduction, _C.TensorBase):  # PyTorch's order: BCEWithLogitsLoss(weight, ...)
            raise TypeError("BCEWithLogitsLoss: the first argument is reduction (MindSpore's order); pass "
                            "weight=... by keyword")
        super().__init__(reduction)
        self.weight = None if weight is None else _as_tensor(weight)
        self.pos_weight = None if pos_weight is None else _as_tensor(pos_weight)

    def construct(self, logits, labels):
        return _losses.binary_cross_entropy_with_logits(logits, labels, self.weight, self.pos_weight, self.reduction)


class KLDivLoss(LossBase):
    """Kullback-Leibler divergence of labels from log-probabilities (ops.kl_div); reduction also
    'batchmean' (the sum over the batch size)."""

    _allowed = _REDUCTIONS + ("batchmean",)

    def __init__(self, reduction="mean", log_target=False):
        super().__init__(reduction)
        self.log_target = bool(log_target)

    def construct(self, logits, labels):
        return _losses.kl_div(logits, labels, self.reduction, self.log_target)
