"""PyTorch's torch.nn.utils spellings kiln users reach for."""
from ..ops.clip import clip_grad_norm_

__all__ = ["clip_grad_norm_"]
