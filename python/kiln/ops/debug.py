"""print_: printing tensor values when a compiled graph runs (capture_mode="ast" turns print()
calls into it)."""
import sys

from .. import _C
from .._optable import OP

_SLOT = "\x01"  # stands for the next tensor in the print op's text
_CHUNK = 39 * 8  # bytes of text one print op carries (its attribute ints)


def _pack(text):
    data = text.encode("utf-8")
    ints = [len(data)]
    for k in range(0, len(data), 8):
        ints.append(int.from_bytes(data[k:k + 8].ljust(8, b"\0"), "little", signed=True))
    return tuple(ints)


def _chunks(pieces):
    """(text, tensors) pairs of at most _CHUNK bytes of text each."""
    out, text, tensors = [], "", []
    for p in pieces:
        if isinstance(p, _C.TensorBase):
            if len((text + _SLOT).encode("utf-8")) > _CHUNK:
                out.append((text, tensors))
                text, tensors = "", []
            text += _SLOT
            tensors.append(p)
            continue
        for ch in p.replace(_SLOT, "?"):
            if len((text + ch).encode("utf-8")) > _CHUNK:
                out.append((text, tensors))
                text, tensors = "", []
            text += ch
    if text or tensors:
        out.append((text, tensors))
    return out


def print_(*args, sep=" ", end="\n"):
    """Prints like print(*args, sep=sep, end=end), tensors by value (NumPy's layout, 6
    significant digits). Eagerly it prints now; in a captured graph it prints each time the
    graph runs."""
    pieces = []
    for k, a in enumerate(args):
        if k:
            pieces.append(str(sep))
        pieces.append(a if isinstance(a, _C.TensorBase) else str(a))
    pieces.append(str(end))
    sys.stdout.flush()  # what Python printed before comes first
    for text, tensors in _chunks(pieces):
        _C.apply(OP.print, tuple(tensors), _pack(text))
