"""PyTorch's torch.optim (import kiln.optim as optim): kiln.nn's optimizers, which take PyTorch's
lr= (and Adam's betas=), and optim.lr_scheduler's epoch schedulers. MindSpore's spelling of all of
them is kiln.nn.*."""
from ..nn import SGD, Adagrad, Adam, AdamW, Optimizer, RMSProp  # noqa: F401
from ..nn import lr_scheduler  # noqa: F401
