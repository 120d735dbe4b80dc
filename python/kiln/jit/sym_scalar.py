"""Python scalars from a graph break as graph inputs (capture_mode="bytecode"), like Dynamo's
unspecialized ints and floats.

At a resume point after a graph break, a Python int or float in the frames' locals and stacks
(`s = loss.item()`) would be a constant of the next piece, compiled once per value. Instead the
state holds it as a 0-d tensor (float64 for a float, int64 for an int: the cache key guards its
type, not its value), and the capture sees a SymScalar: an input of the graph that may only feed
tensor maths, where it is weak as a Python scalar is (cast to the tensor's dtype as
kiln's NumPy-2 rules cast a Python scalar). Any other use needs its value (a branch on it, a size,
an index, a call of a function that is not inlined, a container built with it): the capture
raises Specialize, and that resume point keeps its scalars as constants from then on (guarded
by value in the key, as before).
"""
import numpy as np

from .. import _C


class Specialize(Exception):
    """A capture needs the value of a symbolic scalar (why: str(self))."""


class SymScalar:
    """A Python int or float of the interpreted code held as a graph input (tensor), with its value
    at capture time (for messages only: the capture never reads it)."""
    __slots__ = ("tensor", "pytype", "value")

    def __init__(self, tensor, pytype, value):
        self.tensor, self.pytype, self.value = tensor, pytype, value

    def __repr__(self):
        return f"<symbolic {self.pytype.__name__}>"


def as_tensor(v):
    """The 0-d tensor that holds a Python int or float in a state, or None when it stays a constant
    (a bool, an int beyond int64, a subclass such as numpy.float64)."""
    if type(v) is float:
        return _make(np.array(v, dtype=np.float64))
    if type(v) is int and -(1 << 63) <= v < (1 << 63):
        return _make(np.array(v, dtype=np.int64))
    return None


def _make(array):
    from .._tensor import Tensor

    return Tensor(array)


def value_of(t):
    """The Python value a state's 0-d tensor holds (float64: float, int64: int)."""
    return t.item()


def _weak(s, like):
    """s's tensor cast to the dtype a Python scalar of s's type takes next to tensor like."""
    d = like.dtype
    if s.pytype is float:
        dtype = d if d.is_floating_point else _C.float32
    else:
        dtype = _C.int64 if d == _C.bool else d
    return s.tensor.astype(dtype)


def operands(lhs, rhs):
    """The operands of a binary op or comparison where one is a SymScalar: the SymScalar as a
    tensor of the weak dtype beside a tensor; Specialize when the other is not a tensor."""
    ls, rs = isinstance(lhs, SymScalar), isinstance(rhs, SymScalar)
    if ls and not rs and isinstance(rhs, _C.TensorBase):
        return _weak(lhs, rhs), rhs
    if rs and not ls and isinstance(lhs, _C.TensorBase):
        return lhs, _weak(rhs, lhs)
    raise Specialize("a symbolic scalar in Python arithmetic")


def any_in(values):
    for v in values:
        if isinstance(v, SymScalar):
            return True
    return False


# The stack items each instruction reads (from the top), where a SymScalar among them needs its
# value; instructions not named here may read any of the stack. The ones that only move values
# (loads, stores, copies, calls of inlined functions) and binary ops on tensors are SAFE.
SAFE = frozenset((
    "NOP", "RESUME", "PRECALL", "EXTENDED_ARG", "LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_CONST",
    "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLOSURE", "MAKE_CELL", "COPY_FREE_VARS", "POP_TOP", "COPY", "SWAP",
    "PUSH_NULL", "KW_NAMES", "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "BINARY_OP",
    "COMPARE_OP", "CALL", "RETURN_VALUE"))
READS = {
    "LOAD_ATTR": 1, "LOAD_METHOD": 1, "STORE_ATTR": 2, "DELETE_ATTR": 1, "BINARY_SUBSCR": 2, "STORE_SUBSCR": 3,
    "DELETE_SUBSCR": 2, "UNARY_NEGATIVE": 1, "UNARY_POSITIVE": 1, "UNARY_INVERT": 1, "UNARY_NOT": 1,
    "GET_ITER": 1, "UNPACK_SEQUENCE": 1, "UNPACK_EX": 1, "IS_OP": 2, "CONTAINS_OP": 2, "STORE_GLOBAL": 1,
    "STORE_DEREF": 1, "LIST_APPEND": 1, "SET_ADD": 1, "LIST_EXTEND": 1, "SET_UPDATE": 1, "DICT_UPDATE": 1,
    "DICT_MERGE": 1, "MAP_ADD": 2, "LIST_TO_TUPLE": 1,
    "POP_JUMP_FORWARD_IF_TRUE": 1, "POP_JUMP_BACKWARD_IF_TRUE": 1, "POP_JUMP_FORWARD_IF_FALSE": 1,
    "POP_JUMP_BACKWARD_IF_FALSE": 1, "POP_JUMP_FORWARD_IF_NONE": 1, "POP_JUMP_BACKWARD_IF_NONE": 1,
    "POP_JUMP_FORWARD_IF_NOT_NONE": 1, "POP_JUMP_BACKWARD_IF_NOT_NONE": 1, "JUMP_IF_TRUE_OR_POP": 1,
    "JUMP_IF_FALSE_OR_POP": 1,
}
_BY_ARG = frozenset(("BUILD_TUPLE", "BUILD_LIST", "BUILD_SET", "BUILD_STRING", "BUILD_SLICE"))


def check(op, arg, stack):
    """Raises Specialize when the instruction op reads a SymScalar from stack as a Python value."""
    if op in SAFE:
        return
    n = READS.get(op)
    if n is None:
        n = arg if op in _BY_ARG else len(stack)
    if n and any_in(stack[len(stack) - n:]):
        raise Specialize(f"{op} reads a symbolic scalar's value")
