"""kiln.dataset: input pipelines in two styles, pure Python + NumPy.

MindSpore style: GeneratorDataset / NumpySlicesDataset with .shuffle .map .batch .repeat
.take .skip .project and create_tuple_iterator / create_dict_iterator.
PyTorch / MegEngine style: DataLoader over Dataset / ArrayDataset / TensorDataset with
SequentialSampler, RandomSampler, BatchSampler.
Workers (num_parallel_workers / num_workers) are described in kiln.dataset.workers;
progress() is a small stderr progress line. See docs/data.md."""
from . import config
from .config import get_seed, set_seed
from .loader import ArrayDataset, DataLoader, Dataset, TensorDataset, default_collate
from .pipeline import GeneratorDataset, NumpySlicesDataset
from .progress import progress
from .samplers import BatchSampler, DistributedSampler, RandomSampler, Sampler, SequentialSampler
from .workers import WorkerError

__all__ = ["config", "get_seed", "set_seed", "ArrayDataset", "DataLoader", "Dataset", "TensorDataset",
           "default_collate", "GeneratorDataset", "NumpySlicesDataset", "progress", "BatchSampler", "DistributedSampler",
           "RandomSampler", "Sampler", "SequentialSampler", "WorkerError"]
