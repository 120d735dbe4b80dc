"""The version of kiln (pyproject.toml gives the same to the wheel)."""
__version__ = "0.1.0"
