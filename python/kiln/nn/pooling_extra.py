"""Adaptive max pooling (MindSpore's and PyTorch's AdaptiveMaxPool2d) over ops.adaptive_max_pool2d."""
from .. import ops
from .cell import Cell


class AdaptiveMaxPool2d(Cell):
    """Maximum over PyTorch's adaptive windows to output_size (an int or (h, w); None keeps that
    size): output (i, j) covers rows [floor(i H / h), ceil((i + 1) H / h)) and the columns likewise."""

    def __init__(self, output_size, return_indices=False):
        super().__init__()
        if return_indices:
            raise ValueError("AdaptiveMaxPool2d: return_indices=True is not supported")
        out = (output_size, output_size) if isinstance(output_size, int) or output_size is None else output_size
        if not (isinstance(out, (tuple, list)) and len(out) == 2
                and all(s is None or (isinstance(s, int) and not isinstance(s, bool) and s > 0) for s in out)):
            raise ValueError(f"AdaptiveMaxPool2d: output_size must be a positive int, None or a pair of them, "
                             f"got {output_size!r}")
        self.output_size = tuple(out)

    def construct(self, x):
        if x.ndim != 4:
            raise ValueError(f"AdaptiveMaxPool2d: expected (N, C, H, W), got {list(x.shape)}")
        return ops.adaptive_max_pool2d(x, self.output_size)


__all__ = ["AdaptiveMaxPool2d"]
