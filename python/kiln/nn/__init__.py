"""kiln.nn: Cells (layers and networks), Parameters, initializers, losses and optimizers,
following MindSpore's mindspore.nn."""
from . import init
from .cell import Cell, CellList, SequentialCell, TrainOneStepCell, WithLossCell
from .init import initializer
from .layers import (AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dense, Dropout, Embedding, Flatten, GELU, Identity,
                     LayerNorm, LogSoftmax, MaxPool2d, ReLU, RMSNorm, SiLU, Sigmoid, Softmax, Tanh, get_activation)
from .loss import CrossEntropyLoss, L1Loss, LossBase, MSELoss, NLLLoss
from .optim import Adam, Optimizer, SGD
from .parameter import Parameter, ParameterTuple

__all__ = [
    "Cell", "CellList", "SequentialCell", "WithLossCell", "TrainOneStepCell",
    "Parameter", "ParameterTuple", "init", "initializer",
    "Dense", "Conv2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding", "MaxPool2d", "AvgPool2d",
    "Flatten", "Dropout", "Identity", "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax",
    "get_activation",
    "LossBase", "MSELoss", "L1Loss", "CrossEntropyLoss", "NLLLoss",
    "Optimizer", "SGD", "Adam",
]
