"""The op table of the C core (src/ops/ops.def), as seen from Python.

`OP.add` is the integer id of the op named "add"; `INFO["add"]` describes it. `side_effects`: running
the op twice, or not at all, is visible (in-place writes, random draws, printing, checks). `control`:
the op runs subgraphs (cond's if, while_loop's while and while_grad). `checks_values`: the kernel refuses
some input values (an index out of range, a label outside the classes), raising when a graph runs it.
"""
from collections import namedtuple

from . import _C

OpInfo = namedtuple("OpInfo", "id name nin nout differentiable fusion c_expr side_effects control checks_values")

INFO = {}
for _id, _row in enumerate(_C.op_table()):
    INFO[_row[0]] = OpInfo(_id, *_row)


class _Ids:
    """Attribute access to op ids: OP.add, OP.conv2d, ..."""

    def __init__(self, info):
        for name, op in info.items():
            setattr(self, name, op.id)


OP = _Ids(INFO)
