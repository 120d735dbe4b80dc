"""Tools for people looking inside kiln: graph pictures (draw), memory reports (memory_report) and
MegEngine's profile analyzer (``python -m kiln.tools.profile_analyze``)."""
from .draw import draw
from .memory import MemoryReport, memory_report

__all__ = ["draw", "memory_report", "MemoryReport"]
