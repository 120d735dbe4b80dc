"""kiln.dataset: data pipelines. MindSpore's GeneratorDataset / NumpySlicesDataset with chained
shuffle/map/batch/repeat and create_tuple_iterator; PyTorch's and MegEngine's DataLoader with
samplers; worker processes with a bounded prefetch queue; a progress bar (progress)."""
from . import config
from .loader import (ArrayDataset, BatchSampler, DataLoader, Dataset, RandomSampler, SequentialBatchSampler,
                     SequentialSampler, TensorDataset, default_collate)
from .pipeline import GeneratorDataset, NumpySlicesDataset
from .progress import progress

__all__ = ["ArrayDataset", "BatchSampler", "DataLoader", "Dataset", "GeneratorDataset", "NumpySlicesDataset",
           "RandomSampler", "SequentialBatchSampler", "SequentialSampler", "TensorDataset", "config",
           "default_collate", "progress"]
