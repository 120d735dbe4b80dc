"""PyTorch's torch.nn.functional (import kiln.nn.functional as F): kiln.ops' functions, which take
PyTorch's argument names where they differ (F.softmax(x, dim=1), F.cross_entropy(logits, target),
F.relu, F.dropout, F.interpolate, ...). The functions are kiln.ops' own: kiln.jit captures them
as it captures kiln.ops."""
from ..ops import *  # noqa: F401,F403
