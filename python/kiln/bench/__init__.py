"""kiln's benchmark: the just-in-time compilation tutorial's workloads (seed 003) in kiln eager and
every kiln.jit variant, next to PyTorch, JAX and MindSpore when installed.

    python -m kiln.bench [--full | --smallest] [--only simple|conv|attention] [--json FILE] [--plot FILE.png]

workloads.py holds the workloads, the sizes and THE list of kiln.jit variants (JIT_VARIANTS);
peers.py the other frameworks; report.py the table, JSON and plot; __main__.py the command.
"""
from .workloads import JIT_VARIANTS, SIZES, JitVariant, jit_variant_status  # noqa: F401


def main(argv=None):
    """Runs the benchmark with command-line arguments argv; returns the exit status."""
    from .__main__ import main as _main

    return _main(argv)
