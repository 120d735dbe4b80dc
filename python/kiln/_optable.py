"""The op table of the C core (src/ops/ops.def), as seen from Python.

`OP.add` is the integer id of the op named "add"; `INFO["add"]` describes it.
"""
from collections import namedtuple

from . import _C

OpInfo = namedtuple("OpInfo", "id name nin nout differentiable fusion c_expr")

INFO = {}
for _id, (_name, _nin, _nout, _diff, _fusion, _expr) in enumerate(_C.op_table()):
    INFO[_name] = OpInfo(_id, _name, _nin, _nout, _diff, _fusion, _expr)


class _Ids:
    """Attribute access to op ids: OP.add, OP.conv2d, ..."""

    def __init__(self, info):
        for name, op in info.items():
            setattr(self, name, op.id)


OP = _Ids(INFO)
