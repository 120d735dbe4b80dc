"""MindSpore's mindspore.common.initializer: the initializers of kiln.nn.init, under the name
MindSpore's tutorials import them by (from mindspore.common.initializer import Normal, initializer)."""
from ..nn.init import (Constant, HeNormal, HeUniform, Initializer, Normal, One, Uniform, XavierNormal,  # noqa: F401
                       XavierUniform, Zero, initializer)
