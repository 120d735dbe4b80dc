"""Sizes that vary in an exported ONNX model (kiln.export(..., dynamic_axes=...)): a size of kiln's
symbolic graphs is an int or the text of an expression over symbols s0, s1, ... (+, -, *, and //
by a constant: kiln_sym_print). In the ONNX graph a symbol is read from the input dimension it
was bound to (Shape, Gather) and an expression is computed from them with int64 arithmetic; a
list of sizes becomes a 1-D int64 tensor (a Reshape's or Expand's shape, a Slice's bounds)."""
import ast
import re

import numpy as np

_SYMBOL = re.compile(r"s(\d+)")


def is_symbolic(sizes):
    return any(isinstance(s, str) for s in sizes)


def start_plus(start, step, length):
    """start + step * length of sizes: an int when all are, else the expression's text."""
    if not is_symbolic((start, step, length)):
        return start + step * length
    return f"({start})+({step})*({length})"


def product(sizes):
    """The product of sizes: an int when all are, else the expression's text."""
    if not is_symbolic(sizes):
        return int(np.prod(sizes, dtype=np.int64))
    return "*".join(f"({s})" for s in sizes) if sizes else 1


def dim_param(size, labels):
    """A size as an ONNX dimension: an int, or a name (the label of a lone symbol, else its
    expression with the symbols' labels)."""
    if not isinstance(size, str):
        return size
    return _SYMBOL.sub(lambda m: labels.get(int(m.group(1)), m.group(0)), size)


class SizeEmitter:
    """Emits sizes into builders: symbols (bound to graph-input dimensions) in the main graph,
    expressions into the builder that needs them (subgraphs read the main graph's by name)."""

    def __init__(self, main, symbol_dims, input_names):
        self.main = main
        self.symbols = {}
        for k, (i, axis) in symbol_dims.items():  # symbol k: axis of input i, as a 1-element int64 tensor
            shape = main.node("Shape", [input_names[i]])
            self.symbols[k] = main.node("Gather", [shape, main.ints([axis])], axis=0)

    def one(self, b, size):
        """A 1-element int64 tensor of the size."""
        if not isinstance(size, str):
            return b.ints([int(size)])
        return self._emit(b, ast.parse(size, mode="eval").body)

    def scalar(self, b, size):
        """A 0-d int64 tensor of the size."""
        if not isinstance(size, str):
            return b.const(np.asarray(int(size), np.int64))
        return b.node("Reshape", [self.one(b, size), b.ints([])])

    def shape(self, b, sizes):
        """A 1-D int64 tensor of the sizes."""
        if not is_symbolic(sizes):
            return b.ints([int(s) for s in sizes])
        return b.node("Concat", [self.one(b, s) for s in sizes], axis=0)

    def _emit(self, b, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return b.ints([node.value])
        if isinstance(node, ast.Name) and _SYMBOL.fullmatch(node.id) and int(node.id[1:]) in self.symbols:
            return self.symbols[int(node.id[1:])]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return b.node("Neg", [self._emit(b, node.operand)])
        if isinstance(node, ast.BinOp):
            op = {ast.Add: "Add", ast.Sub: "Sub", ast.Mult: "Mul", ast.FloorDiv: "Div"}.get(type(node.op))
            if op is not None:  # (sizes are not negative: Div's truncation is floor division)
                return b.node(op, [self._emit(b, node.left), self._emit(b, node.right)])
        raise ValueError(f"kiln.export(ONNX): a size expression it cannot write: {ast.unparse(node)}")
