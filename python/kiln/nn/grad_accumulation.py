"""nn.GradientAccumulation, MindSpore's (mindspore.boost) gradient accumulation: the gradients of
several micro-batches add up locally and the optimizer runs once on their mean; in data-parallel
mode the ranks all-reduce only then, once per bucket every max_accumulation_step micro-batches
(PyTorch DDP's no_sync() for all but the last micro-batch)."""
from .. import _C
from .. import context as _context
from .. import ops as _ops
from .cell import Cell
from .parameter import Parameter


class GradientAccumulation(Cell):
    """GradientAccumulation(max_accumulation_step, optimizer): calling it with (loss, grads) (the
    gradients of the optimizer's parameters for one micro-batch) adds the gradients to its
    accumulators and returns the loss; every max_accumulation_step-th call it also applies the
    optimizer to the accumulated gradients' mean (all-reduced across the ranks first, in buckets,
    when it was made in data-parallel mode, averaged with gradients_mean) and empties them.

    The count of calls is Python state: compile the two kinds of step apart, accumulate(grads) and
    apply(grads) (each its own kiln.jit), rather than a function calling the Cell itself."""

    def __init__(self, max_accumulation_step, optimizer):
        super().__init__(auto_prefix=False)
        if isinstance(max_accumulation_step, bool) or not isinstance(max_accumulation_step, int) \
                or max_accumulation_step < 1:
            raise ValueError(f"GradientAccumulation: max_accumulation_step must be an int >= 1, got "
                             f"{max_accumulation_step!r}")
        if not callable(optimizer) or not hasattr(optimizer, "parameters"):
            raise TypeError(f"GradientAccumulation: optimizer must be an optimizer (nn.SGD, nn.Adam, ...), got "
                            f"{type(optimizer).__name__}")
        self.max_accumulation_step = max_accumulation_step
        self.optimizer = optimizer
        params = tuple(optimizer.parameters)
        self._accumulated = [Parameter(_ops.zeros_like(p), f"accumulated.{getattr(p, 'name', None) or k}",
                                       requires_grad=False) for k, p in enumerate(params)]
        self._calls = 0
        self._reducer = None
        if _context.data_parallel():
            if not _C.comm_initialized():
                raise RuntimeError("GradientAccumulation: data_parallel mode needs communication: call "
                                   "kiln.communication.init() first")
        if _context.data_parallel() and _C.comm_size() > 1:  # one rank: nothing to reduce
            from . import grad_reduce

            mean = _context.get_auto_parallel_context("gradients_mean")
            splits = _context.get_auto_parallel_context("all_reduce_fusion_config")
            self._reducer = lambda grads: grad_reduce.reduce_gradients(grads, mean, split_indices=splits)

    def _check(self, grads):
        grads = tuple(grads)
        if len(grads) != len(self._accumulated):
            raise ValueError(f"GradientAccumulation: {len(grads)} gradients for {len(self._accumulated)} parameters")
        return grads

    def accumulate(self, grads):
        """Adds one micro-batch's gradients to the accumulators (no collective)."""
        for a, g in zip(self._accumulated, self._check(grads)):
            a[...] = a + g

    def apply(self, grads):
        """Adds the last micro-batch's gradients, reduces their mean across the ranks (one
        collective per bucket), applies the optimizer and empties the accumulators."""
        grads = self._check(grads)
        k = self.max_accumulation_step
        total = [(a + g) / k if k > 1 else g for a, g in zip(self._accumulated, grads)]
        if self._reducer is not None:
            total = self._reducer(total)
        self.optimizer(tuple(total))
        if k > 1:
            for a in self._accumulated:
                a[...] = _ops.zeros_like(a)

    def construct(self, loss, grads):
        self._calls += 1
        if self._calls < self.max_accumulation_step:
            self.accumulate(grads)
        else:
            self._calls = 0
            self.apply(grads)
        return loss
