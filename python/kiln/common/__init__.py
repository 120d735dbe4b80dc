"""MindSpore's mindspore.common: kiln.common.initializer (the initializers of kiln.nn.init)."""
from . import initializer
