"""kiln.nn: Cells (layers and networks), Parameters, initializers, losses and optimizers,
following MindSpore's mindspore.nn."""
from . import init
from .cell import Cell, CellList, SequentialCell, TrainOneStepCell, WithLossCell
Module = Cell  # PyTorch's and MegEngine's name of the base class
from .graph_cell import GraphCell
from .grad_accumulation import GradientAccumulation
from .grad_reducer import DistributedGradReducer
from .init import initializer
from .layers import (AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dense, Dropout, Embedding, Flatten, GELU, Identity,
                     LayerNorm, LogSoftmax, MaxPool2d, ReLU, RMSNorm, SiLU, Sigmoid, Softmax, Tanh, get_activation)
from .loss import (BCEWithLogitsLoss, CrossEntropyLoss, KLDivLoss, L1Loss, LossBase, MSELoss, NLLLoss,
                   SmoothL1Loss)
from .layers_extra import (AdaptiveAvgPool2d, CellDict, Conv1d, Dropout2d, ELU, GroupNorm, HSigmoid, HSwish, Hardsigmoid,
                           Hardswish, InstanceNorm2d, LeakyReLU, Linear, Mish, ModuleDict, PixelShuffle, PixelUnshuffle,
                           PReLU, Softplus, Unflatten, Upsample)
from .conv_transpose import Conv2dTranspose, Conv3d, ConvTranspose2d
from .layers_more import (AdaptiveAvgPool1d, AvgPool1d, BatchNorm3d, BCELoss, CELU, ConstantPad2d, CosineEmbeddingLoss,
                          CosineSimilarity, Dropout1d, Dropout3d, GLU, Hardtanh, HuberLoss, MarginRankingLoss, MaxPool1d,
                          ModuleList, PairwiseDistance, ParameterDict, ParameterList, ReflectionPad2d, ReLU6,
                          ReplicationPad2d, SELU, Sequential, SoftMarginLoss, Softmin, Softsign, Threshold, ZeroPad2d)
from .pooling_extra import AdaptiveMaxPool2d
from .transformer import (MultiheadAttention, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                          TransformerEncoderLayer)
from .optim import Adam, Optimizer, SGD
from .rnn import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNCell
from .optim_extra import EMA, Adagrad, AdamW, AdamWeightDecay, ExponentialMovingAverage, Lamb, Momentum, RMSProp
from .lr_schedule import (CosineDecayLR, ExponentialDecayLR, LearningRateSchedule, PolynomialDecayLR, WarmUpCosineDecayLR,
                          WarmUpLR, cosine_decay_lr, exponential_decay_lr, piecewise_constant_lr, polynomial_decay_lr,
                          warmup_lr)
from . import utils
from . import functional, lr_scheduler
from .lr_scheduler import CosineAnnealingLR, ExponentialLR, LambdaLR, MultiStepLR, StepLR
from .parameter import Parameter, ParameterTuple

__all__ = [
    "Cell", "Module", "DistributedGradReducer", "GraphCell", "CellList", "SequentialCell", "WithLossCell", "TrainOneStepCell",
    "Parameter", "ParameterTuple", "init", "initializer",
    "Dense", "Conv2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding", "MaxPool2d", "AvgPool2d",
    "Flatten", "Dropout", "Identity", "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax",
    "get_activation", "LeakyReLU", "PReLU", "ELU", "Softplus", "HSigmoid", "HSwish", "Hardsigmoid", "Hardswish",
    "Mish", "Conv1d", "GroupNorm", "InstanceNorm2d", "AdaptiveAvgPool2d", "Upsample", "PixelShuffle",
    "PixelUnshuffle", "Dropout2d", "Unflatten", "CellDict", "ModuleDict", "Linear",
    "Conv2dTranspose", "ConvTranspose2d", "Conv3d", "AdaptiveMaxPool2d", "MultiheadAttention",
    "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder",
    "RNNCell", "LSTMCell", "GRUCell", "RNN", "LSTM", "GRU",
    "ReLU6", "Hardtanh", "Softsign", "SELU", "CELU", "GLU", "Softmin", "Threshold", "ZeroPad2d", "ConstantPad2d",
    "ReflectionPad2d", "ReplicationPad2d", "MaxPool1d", "AvgPool1d", "AdaptiveAvgPool1d", "BatchNorm3d", "Dropout1d",
    "Dropout3d", "CosineSimilarity", "PairwiseDistance", "HuberLoss", "BCELoss", "MarginRankingLoss", "SoftMarginLoss",
    "CosineEmbeddingLoss", "ParameterList", "ParameterDict", "ModuleList", "Sequential",
    "LossBase", "MSELoss", "L1Loss", "CrossEntropyLoss", "NLLLoss", "SmoothL1Loss", "BCEWithLogitsLoss", "KLDivLoss",
    "Optimizer", "SGD", "Adam", "AdamWeightDecay", "AdamW", "Momentum", "RMSProp", "Adagrad", "Lamb", "EMA",
    "ExponentialMovingAverage",
    "LearningRateSchedule", "CosineDecayLR", "WarmUpLR", "ExponentialDecayLR", "PolynomialDecayLR",
    "WarmUpCosineDecayLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LambdaLR",
]


def _name_errors():
    """A constructor's errors from bad arguments name its class (kiln.ops._util.naming_errors)."""
    from .. import ops
    from ..ops._util import function_names, naming_errors

    classes = [c for n, c in globals().items() if n in __all__ and isinstance(c, type)]
    known = function_names(vars(ops)) | {c.__name__ for c in classes}
    for c in classes:  # inherited constructors too: the error names the class called
        if c.__init__ is not object.__init__:  # (object's tolerates the arguments of a __new__)
            c.__init__ = naming_errors(c.__init__, c.__name__, known)
        if "__new__" in c.__dict__:
            c.__new__ = staticmethod(naming_errors(c.__new__, c.__name__, known))


_name_errors()
