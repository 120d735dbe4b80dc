"""kiln.jit's dynamic shapes: one capture serving many input shapes.

Which sizes are symbolic: every input size with dynamic=True (or 1), those marked with
kiln.mark_dynamic, and, by default (automatic mode), a size that took a second distinct value by
the time of the next compile; never sizes 0 and 1 (specialized) nor those marked with
kiln.mark_static; dynamic=False (or 0) makes none symbolic. Equal symbolic sizes of one call share a
symbol (so the entry assumes they stay equal). Each symbol is at least 2.

While the function is captured, a traced tensor's shape gives SymInts for its symbolic sizes
(an input's directly; an intermediate's found by rebinding the graph recorded so far to other
sizes and checked again for every later binding). Arithmetic on SymInts (+, -, *, //, %) stays
symbolic (the expressions are kiln._C.SymExpr handles: the C algebra of src/core/symdim.c, one
table per capture; an expression past its limits specializes the symbols it combines), and
reshape, broadcast_to and narrow given SymInts record how their node's attributes follow the
symbols; so does indexing (x[key] and x[key] = value with ints, slices of a positive
step, None and ...: the slice's bounds and the view's sizes are expressions, each clamp and bounds
check a guard; a key with index tensors specializes what it depends on). A comparison of a SymInt
records a guard (the relation and its outcome: a branch on a shape; abs() too); divmod, floor,
ceil, round and isinstance(n, int) stay symbolic as well. Using one as a plain int anywhere else (a
scalar in arithmetic with a tensor, a shape given to another op, range(), int(), float(), math
functions, a list index, bitwise operators, str() or an f-string) specializes its symbols: the
entry then covers only their captured sizes (SymInt's docstring says why it is not an int
subclass). A backward pass (value_and_grad of a jitted function, or one inside it) stays symbolic:
its gradient rules count elements with ops, and a rebinding gives its reshape, expand, full and
slice_assign nodes the sizes of the forward values they were recorded from (KILN_ATTR_SET_FOLLOW).
Nothing derived from a symbolic size is baked in without a guard.

A call whose sizes satisfy an entry's guards binds its symbols; the first call of a binding makes
an instance. The entry's first new binding makes the recording symbolic in C (Graph.symbolize: its
inputs' and size attributes' expressions, every node's sizes inferred as expressions; a backward
pass's followed sizes become the expressions of the values they follow), optimizes that once
(optimize_graph) and plans it once (kiln._C.plan_symbolic: order, fused groups' generated code);
each binding's instance is then that plan bound to its sizes (kiln._C.bind_plan: the graph
instantiated, buffer sizes and offsets evaluated, the groups' and the sink's code of the first
binding called with the new sizes, buffers in one arena the entry's instances share, grown to the
largest binding seen): no pass, no planning, no code generated. With a sublinear-memory config (its
search rewrites each binding's graph), or where the planner refuses the graph, each instance is
instead the concrete graph (Graph.instantiate) planned for itself. A recording that cannot be made
symbolic (an op without a symbolic shape rule, a control-flow body whose sizes change per branch or
iteration, a window or slice not shown to fit) makes each instance as before: the recorded graph
rebound
to those sizes (kiln_graph_rebind: no Python re-run, no new capture), optimized and planned again.
Either way its generated kernels are the same objects (their C takes the sizes as arguments, so
the compiler's cache answers). cache_info() counts these as `instances` (and says per entry whether
they came from the recording optimized once, `optimized_once`, and from one plan, `planned_once`),
not compiles. Later calls of the binding run the instance (positional all-tensor calls of plain
functions straight from the C dispatcher, which checks the symbols' consistency and lower bounds).
A binding the graph does not hold for (a node that keeps sizes with none given, a shape check that
fails, an intermediate shape read that would differ) compiles a new entry.
"""
import collections
import copy
import dataclasses
import operator
import weakref

from .. import _C

# per dynamic entry (each holds a share of the entry's arena, or its own memory): the least recently
# used goes. Enough for the lengths of a generated sequence (a growing KV cache: one binding per
# length) to be bound once and found again by the next sequence, rather than bound anew per token.
MAX_INSTANCES = 256
MAX_OWN_INSTANCES = 16  # instances that each hold their own memory (not bound from one plan)
# instances from the recording made symbolic and optimized once (False: rebound and optimized per
# binding; tests and bench/bench_dynamic.py compare the two)
symbolic_instances = True
# instances from one plan of the optimized symbolic recording (kiln._C.plan_symbolic, bound per binding
# by kiln._C.bind_plan: nothing planned or generated again); False: each instance planned (and its code
# generated) for its binding, as compile_graph does (tests and bench/bench_dynamic.py compare the two)
planned_instances = True
_PROBE_FACTORS = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59)

# ---- marks ------------------------------------------------------------------------------------
_marks = {}  # id(tensor) -> (weakref, {dim: True (dynamic) | False (static)})


def _mark(t, dims, dynamic):
    if not isinstance(t, _C.TensorBase):
        raise TypeError(f"mark_{'dynamic' if dynamic else 'static'}: expected a Tensor, got {type(t).__name__}")
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or not -t.ndim <= d < t.ndim:
            raise IndexError(f"mark_{'dynamic' if dynamic else 'static'}: dimension {d!r} is out of range for a "
                             f"tensor with {t.ndim} dimensions")
    key = id(t)
    ref, marks = _marks.get(key, (None, None))
    if ref is None or ref() is not t:
        marks = {}
        ref = weakref.ref(t, lambda _r, key=key: _marks.pop(key, None))
        _marks[key] = (ref, marks)
    for d in dims:
        marks[d % t.ndim] = dynamic


def mark_dynamic(t, dims):
    """Makes dimension(s) `dims` of tensor t symbolic when a jitted function is next compiled for
    a call taking it (a size of 0 or 1 is still specialized)."""
    _mark(t, dims, True)


def mark_static(t, dims):
    """Keeps dimension(s) `dims` of tensor t exact (never symbolic) in the compiles of calls taking it."""
    _mark(t, dims, False)


def marks_of(t):
    ref, marks = _marks.get(id(t), (None, None))
    return marks if ref is not None and ref() is t else None


# ---- expressions: kiln._C.SymExpr handles into the capture's kiln._C.SymTable (src/core/symdim.c:
# one canonical form, so equal expressions are equal and hash alike). An expression the table has
# no room for raises kiln._C.SymLimitError: the sizes it combines are then specialized.
_CONSTANTS = _C.SymTable()  # a constant uses no symbol: it combines with any table's expressions


def _const(v):
    return _CONSTANTS.const(v)


def evaluate(e, values):
    return e.eval(values)


def symbols_in(e, into):
    into.update(e.symbols())
    return into


def show(e, names):
    return e.text(names)


def _binop(op, a, b):
    return _PYOP[op](a, b)


class SymInt:
    """A size while a dynamic capture records: its value at the capture and the expression over the
    symbols it came from (see the module's docstring for what each use records).

    Not a subclass of int, on purpose: C code (CPython's, NumPy's, kiln's own argument parsing)
    reads an int subclass's stored value directly, without calling __index__, so every such use
    would bake the captured size into the graph with no guard. As it is, each use as an int goes
    through __index__ / __int__ / __float__ and specializes the symbols (the entry then covers only
    their captured sizes: range(n), int(n), math functions, a list index all behave as in eager).
    isinstance(n, int) is true, as in eager (through __class__); only type(n) is SymInt."""

    __slots__ = ("expr", "value", "_capture")

    @property
    def __class__(self):  # isinstance(n, int) and numbers.Integral checks take the int path
        return int

    def __init__(self, expr, value, capture):
        self.expr, self.value, self._capture = expr, value, capture

    def _wrap(self, expr):
        return expr.value if expr.is_const else SymInt(expr, expr.eval(self._capture.values), self._capture)

    def _combine(self, op, lhs, rhs):
        """lhs op rhs as a size; past the algebra's limits, its value with the symbols of both fixed."""
        try:
            return self._wrap(_binop(op, lhs, rhs))
        except _C.SymLimitError:
            for e in (lhs, rhs):
                self._capture.specialize(e, "an expression past the symbolic algebra's limits")
            return _PYOP[op](lhs.eval(self._capture.values), rhs.eval(self._capture.values))

    def _other(self, o):
        if isinstance(o, SymInt):
            return o.expr
        if isinstance(o, int) and not isinstance(o, bool) and -2 ** 63 <= o < 2 ** 63:
            return _const(o)
        return None  # a float, a tensor, an int past int64: the size is used as a number

    def _arith(op, swap=False):
        def f(self, o):
            e = self._other(o)
            if e is None:  # a float, a tensor, an int past int64: the size is used as a number
                return _binary_fallback(op, self.specialize("arithmetic with a non-int"), o, swap)
            lhs, rhs = (e, self.expr) if swap else (self.expr, e)
            if op in ("//", "%") and not rhs.is_const:  # dividing by a symbolic size specializes it
                self._capture.specialize(rhs, "a divisor")
                rhs = _const(evaluate(rhs, self._capture.values))
            return self._combine(op, lhs, rhs)
        return f

    __add__, __radd__ = _arith("+"), _arith("+", True)
    __sub__, __rsub__ = _arith("-"), _arith("-", True)
    __mul__, __rmul__ = _arith("*"), _arith("*", True)
    __floordiv__, __rfloordiv__ = _arith("//"), _arith("//", True)
    __mod__, __rmod__ = _arith("%"), _arith("%", True)
    del _arith

    def __divmod__(self, o):
        return self // o, self % o

    def __rdivmod__(self, o):
        return o // self, o % self

    def _as_int(op, swap=False):  # bitwise operators: the size is used as an int
        def f(self, o):
            v = self.specialize("used as an int")
            return op(o, v) if swap else op(v, o)
        return f

    __and__, __rand__ = _as_int(operator.and_), _as_int(operator.and_, True)
    __or__, __ror__ = _as_int(operator.or_), _as_int(operator.or_, True)
    __xor__, __rxor__ = _as_int(operator.xor), _as_int(operator.xor, True)
    __lshift__, __rlshift__ = _as_int(operator.lshift), _as_int(operator.lshift, True)
    __rshift__, __rrshift__ = _as_int(operator.rshift), _as_int(operator.rshift, True)
    del _as_int

    def __invert__(self):
        return ~self.specialize("used as an int")

    def __abs__(self):  # |n| is n or -n: which one is a guard
        return self if self >= 0 else -self

    def __round__(self, ndigits=None):  # an int rounds, truncates, floors and ceils to itself
        return self if ndigits is None or ndigits >= 0 else round(self.specialize("round()"), ndigits)

    def __trunc__(self):
        return self

    __floor__ = __ceil__ = __trunc__

    def __neg__(self):
        return self._combine("-", _const(0), self.expr)

    def __pos__(self):
        return self

    def _compare(op):
        def f(self, o):
            e = self._other(o)
            if e is None:
                return _COMPARE[op](self.specialize("compared with a non-int"), o)
            result = _COMPARE[op](self.value, evaluate(e, self._capture.values))
            self._capture.guard(op, self.expr, e, result)
            return result
        return f

    __eq__, __ne__ = _compare("=="), _compare("!=")
    __lt__, __le__ = _compare("<"), _compare("<=")
    __gt__, __ge__ = _compare(">"), _compare(">=")
    del _compare

    def __bool__(self):
        return self != 0

    def specialize(self, why):
        self._capture.specialize(self.expr, why)
        return self.value

    def __index__(self):
        return self.specialize("used as an int")

    def __int__(self):
        return self.specialize("used as an int")

    def __float__(self):
        return float(self.specialize("used as a float"))

    def __truediv__(self, o):
        return self.specialize("true division") / o

    def __rtruediv__(self, o):
        return o / self.specialize("true division")

    def __pow__(self, o):
        return self.specialize("a power") ** o

    def __rpow__(self, o):
        return o ** self.specialize("a power")

    def __hash__(self):
        return hash(self.specialize("hashed"))

    def __array__(self, dtype=None, copy=None):  # NumPy (np.sqrt(n), np.array([n])): the int's array
        import numpy

        return numpy.asarray(self.specialize("used by NumPy"), dtype=dtype)

    def __repr__(self):  # text made from a size (f"{n}", str(n), printing it) holds its value
        return repr(self.specialize("made into text"))

    __str__ = __repr__

    def __getattr__(self, name):  # the rest of int's interface (bit_length, to_bytes, ...): as an int
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.specialize(f"int.{name}"), name)

    def __format__(self, spec):
        return format(self.specialize("made into text"), spec)


def concrete(obj):
    """obj with every SymInt inside it (through tuples, lists and dicts) replaced by its int value,
    specializing its symbols: a size the function returns is a plain int to its caller, as in eager
    (the result's structure is part of the entry's key, so the size is fixed for the entry anyway)."""
    if type(obj) is SymInt:
        return obj.specialize("returned")
    if isinstance(obj, _C.TensorBase):  # (the common result: no dataclass test)
        return obj
    if isinstance(obj, (tuple, list)):
        items = [concrete(v) for v in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        if isinstance(obj, list):
            return type(obj)(items) if type(obj) is not list else items
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        items = {k: concrete(v) for k, v in obj.items()}
        if all(items[k] is v for k, v in obj.items()):
            return obj
        out = type(obj)()
        out.update(items)
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # (a dataclass result: its fields)
        changed = {f.name: concrete(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        changed = {k: v for k, v in changed.items() if v is not getattr(obj, k)}
        if not changed:
            return obj
        out = copy.copy(obj)
        for k, v in changed.items():
            object.__setattr__(out, k, v)  # (a frozen dataclass too)
        return out
    return obj


_COMPARE = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
_PYOP = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
         "%": lambda a, b: a % b}


def _binary_fallback(op, value, o, swap):
    return _PYOP[op](o, value) if swap else _PYOP[op](value, o)


# ---- the capture -------------------------------------------------------------------------------
class Capture:
    """What a dynamic capture learns: symbols, guards, specializations, attribute sets and shape reads."""

    def __init__(self, tracer, names, values, input_exprs, aliases):
        self.tracer = tracer
        # the symbols' table (choose_symbols made it; a capture without symbols gets an empty one)
        self.table = next((e.table for row in input_exprs for e in row if not e.is_const), None) or _C.SymTable()
        self.names = names  # per symbol, where it came from ("a.shape[1]")
        self.values = values  # per symbol, its size at the capture
        self.input_exprs = input_exprs  # per graph input, its sizes as expressions
        self._inputs = {id(a): k for k, a in enumerate(aliases)}
        self._aliases = aliases
        self.specialized = set()  # symbols fixed to their captured size
        self.why = {}  # symbol -> why it was specialized
        self.guards = []  # (op, lhs, rhs, outcome)
        self.sets = []  # (node, attr index, kind, expression or int)
        self.reads = []  # (value, expressions) of intermediate shapes Python read
        self._read_cache = {}
        self.backward_nodes = set()  # the nodes backward passes recorded (their gradient rules')
        self._backward_starts = []
        self._rows = None  # input_exprs as (True, size) | (False, symbol) per dimension, for bind

    def symbol(self, k):
        """Symbol k as an expression."""
        return self.table.get(k)

    # bookkeeping
    def guard(self, op, lhs, rhs, outcome):
        if lhs == rhs:  # s0 == s0, s0 <= s0, s0 != s0: true (or false) for every binding, no condition
            return
        g = (op, lhs, rhs, outcome)
        if g not in self.guards:
            self.guards.append(g)

    def specialize(self, expr, why):
        for k in symbols_in(expr, set()):
            if k not in self.specialized:
                self.specialized.add(k)
                self.why[k] = why

    def sym(self, expr):
        return expr.value if expr.is_const else SymInt(expr, evaluate(expr, self.values), self)

    # hooks (kiln._C.set_sym_hooks)
    def shape_hook(self, t, what):
        exprs = self._shape_exprs(t)
        if exprs is None:
            return None
        if what == 0:
            return tuple(self.sym(e) for e in exprs)
        for e in exprs[:1] if what == 2 else exprs:
            self.specialize(e, "len()" if what == 2 else "Tensor.size")
        return None

    def _shape_exprs(self, t):
        k = self._inputs.get(id(t))
        if k is not None and self._aliases[k] is t:
            return self.input_exprs[k]
        if not self.tracer.knows(t):
            if _C.in_body(t):  # a control-flow body's tensor: what Python decides from its sizes is not followed
                for k in range(len(self.values)):
                    self.specialize(self.symbol(k), "a shape read inside a control-flow body")
            return None
        v = self.tracer.value_of(t)
        exprs = self._read_cache.get(v)
        if exprs is None:
            exprs = self._read_cache[v] = self._fit(v)
            self.reads.append((v, exprs))
        return exprs

    def _fit(self, v):
        """The sizes of value v as expressions, found by rebinding the graph recorded so far to probe
        sizes: first each live symbol alone (a symbol the graph cannot vary, such as a matmul's inner
        size against a fixed weight, is specialized), then all together. A size no simple form
        explains specializes every symbol. Every later binding checks the sizes found."""
        g = self.tracer.recorded()
        base = g.value_shape(v)
        for k in range(len(self.values)):
            if k not in self.specialized and self._probe(g, v, (k,)) is None:
                self.specialize(self.symbol(k), "the graph needs a fixed size here")
        live = tuple(k for k in range(len(self.values)) if k not in self.specialized)
        probe, other = self._probe_values(live), self._probe(g, v, live)
        out = []
        for d, x0 in enumerate(base):
            try:
                e = None if other is None else _explain(x0, other[d], self.values, probe, self.symbol)
            except _C.SymLimitError:  # the table is full
                e = None
            if e is None:
                for k in live:
                    self.specialize(self.symbol(k), "an intermediate shape no simple form explains")
                e = _const(x0)
            out.append(e)
        return tuple(out)

    def _probe_values(self, scaled):
        return [x * _PROBE_FACTORS[k % len(_PROBE_FACTORS)] if k in scaled else x for k, x in enumerate(self.values)]

    def _probe(self, g, v, scaled):
        """Value v's shape in g rebound with the symbols `scaled` at other sizes, or None when g does
        not hold for them."""
        try:
            return self.rebind(g, self._probe_values(scaled)).value_shape(v)
        except (ValueError, TypeError, IndexError, OverflowError):
            return None

    def call_hook(self, op, args):
        if op == "backward":  # the gradient rules' nodes follow the forward's sizes
            self._backward_starts.append(self.tracer.count())
            return None
        if op == "backward_done":
            self.backward_nodes.update(range(self._backward_starts.pop(), self.tracer.count()))
            return None
        if op == "derived":  # flatten, squeeze, unsqueeze: each size one of the input's, 1, or the rest
            x, out, src = args
            node = self.tracer.node_of(out)
            if node == self.tracer.count() - 1 and node >= 0 and node != self.tracer.node_of(x):
                for k, d in enumerate(src):
                    if d != -1:
                        self.sets.append((node, k, 1, d) if d >= 0 else (node, k, 2, 0))
            return None
        if op == "sized":
            return self._sized(*args)
        if op == "getitem":
            return self._getitem(*args)
        if op == "setitem":
            return self._setitem(*args)
        x = args[0]
        before = self.tracer.count()
        if op == "narrow":
            _, axis, start, length = args
            s_e, l_e = _expr_of(start), _expr_of(length)
            result = _C.shape.narrow(x, axis, _value(start), _value(length))
            node = self._new_node(before, result)
            if node is None:
                self.specialize(s_e, "narrow"), self.specialize(l_e, "narrow")
                return result
            nd = x.ndim
            a = axis % nd
            for d in range(nd):
                self.sets.append((node, 2 * 8 + d, 1, d))
            self.sets.append((node, a, 0, s_e))
            self.sets.append((node, 2 * 8 + a, 0, l_e))
            return result
        items = args[1:]
        if len(items) == 1 and isinstance(items[0], (tuple, list)):
            items = tuple(items[0])
        exprs = [_expr_of(i) for i in items]
        concrete = tuple(_value(i) for i in items)
        result = (_C.shape.reshape if op == "reshape" else _C.shape.broadcast_to)(x, concrete)
        node = self._new_node(before, result)
        if node is None:
            for e in exprs:
                self.specialize(e, op)
            return result
        lead = len(items) - x.ndim
        for k, (e, c) in enumerate(zip(exprs, concrete)):
            if c == -1:
                self.sets.append((node, k, 2, 0) if op == "reshape" else (node, k, 1, k - lead))
            else:
                self.sets.append((node, k, 0, e))
        return result

    def _sized(self, op, name, ints, floats):
        """A creation op (full, zeros, rand, arange, ...) given symbolic sizes among its int
        attributes: recorded at the captured sizes, each symbolic attribute set from its expression."""
        before = self.tracer.count()
        result = _C.apply(op, (), tuple(int(_value(i)) for i in ints), floats)
        node = self._new_node(before, result)
        for k, i in enumerate(ints):
            if isinstance(i, SymInt):
                if node is None:
                    self.specialize(i.expr, name)
                else:
                    self.sets.append((node, k, 0, i.expr))
        return result

    def _getitem(self, x, key):
        """x[key] with the bounds of its slice (and the sizes of the reshape that drops int axes and
        adds None axes) as expressions of the symbols, each clamp or bounds check a guard. A key
        with index tensors or a negative step, or an x whose sizes the capture cannot follow,
        specializes the symbols the indexing depends on."""
        items, concrete = _key_items(key)
        exprs = self._shape_exprs(x)
        before = self.tracer.count()
        result = x[concrete]
        plan = None if exprs is None else self._index_plan(exprs, items)
        made = self.tracer.count() - before
        slice_node = before if made in (1, 2) and self.tracer.node_of(result) == before + made - 1 else None
        if plan is not None and slice_node is not None:
            starts, lengths, view = plan
            shape = tuple(evaluate(e, self.values) for e in view)
            if shape == tuple(_C.raw_shape(result)) and (made == 2) == (len(view) != len(lengths) or any(
                    a != b for a, b in zip(view, lengths))):
                for d, (st, ln) in enumerate(zip(starts, lengths)):
                    self.sets.append((slice_node, d, 0, st))
                    self.sets.append((slice_node, 2 * 8 + d, 0, ln))
                if made == 2:
                    self.sets.extend((slice_node + 1, k, 0, e) for k, e in enumerate(view))
                return result
        self._specialize_index(exprs, items)
        return result

    def _setitem(self, x, key, value):
        """x[key] = value, its nodes following the symbols as _getitem's do: the slice_assign's
        bounds, and the sizes of the expand and reshape that fit the value to the slice (the C
        lowering makes each only when the value's shape differs from the view's, the slice's)."""
        items, concrete = _key_items(key)
        exprs = self._shape_exprs(x)
        before = self.tracer.count()
        x[concrete] = value
        plan = None if exprs is None else self._index_plan(exprs, items)
        made = self.tracer.count() - before
        if plan is not None and made >= 1 and self.tracer.node_of(x) == before + made - 1 and (
                isinstance(value, (_C.TensorBase, int, float))):
            starts, lengths, view = plan
            shape = tuple(_C.raw_shape(value)) if isinstance(value, _C.TensorBase) else ()
            nodes = []
            if shape != tuple(evaluate(e, self.values) for e in view) and len(shape) <= len(view):
                nodes.append(view)
                shape = tuple(evaluate(e, self.values) for e in view)
            if shape != tuple(evaluate(e, self.values) for e in lengths):
                nodes.append(lengths)
            if len(nodes) == made - 1:
                node = before
                for sizes in nodes:
                    self.sets.extend((node, k, 0, e) for k, e in enumerate(sizes))
                    node += 1
                for d, (st, ln) in enumerate(zip(starts, lengths)):
                    self.sets.append((node, d, 0, st))
                    self.sets.append((node, 2 * 8 + d, 0, ln))
                return None
        self._specialize_index(exprs, items)
        return None

    def _specialize_index(self, exprs, items):
        """What an indexing the capture cannot follow depends on stays at its captured size."""
        for e in (exprs or ()):
            self.specialize(e, "indexing")
        for i in items:
            for part in ((i.start, i.stop, i.step) if isinstance(i, slice) else (i,)):
                if isinstance(part, SymInt):
                    part.specialize("indexing")

    def _index_plan(self, sizes, items):
        """(per axis of x its slice start and length, the view's sizes) as expressions for a key of
        ints, slices with a positive step, None and ..., recording the guards the clamps assumed; or
        None for another key (or bounds past the symbolic algebra's limits)."""
        try:
            return self._index_plan_of(sizes, items)
        except _C.SymLimitError:
            return None

    def _index_plan_of(self, sizes, items):
        def ok(v):
            return v is None or isinstance(v, SymInt) or (isinstance(v, int) and not isinstance(v, bool))

        for i in items:
            if isinstance(i, slice):
                if not (ok(i.start) and ok(i.stop) and ok(i.step)) or _value(i.step) is not None and (
                        isinstance(i.step, SymInt) or i.step <= 0):
                    return None
            elif not (i is None or i is Ellipsis or (ok(i) and i is not None)):
                return None
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        if used > len(sizes) or sum(1 for i in items if i is Ellipsis) > 1:
            return None
        full = slice(None, None, None)
        expanded = []
        for i in items:
            expanded.extend([full] * (len(sizes) - used) if i is Ellipsis else [i])
        if Ellipsis not in items:
            expanded.extend([full] * (len(sizes) - used))
        starts, lengths, view, d = [], [], [], 0
        for i in expanded:
            if i is None:
                view.append(_const(1))
                continue
            size = sizes[d]
            d += 1
            if isinstance(i, slice):
                step = 1 if i.step is None else i.step
                lo = self._bound(i.start, size, _const(0))
                hi = self._bound(i.stop, size, size)
                if self._holds("<", lo, hi):
                    n = _binop("-", hi, lo) if step == 1 else _binop(
                        "+", _binop("//", _binop("-", _binop("-", hi, lo), _const(1)), _const(step)), _const(1))
                    starts.append(lo)
                else:
                    n = _const(0)
                    starts.append(_const(0))
                lengths.append(n)
                view.append(n)
                continue
            e = _expr_of(i)
            if evaluate(e, self.values) < 0:
                e = _binop("+", size, e)
            if not (self._holds(">=", e, _const(0)) and self._holds("<", e, size)):
                return None  # out of bounds: the C lowering raises the error
            starts.append(e)
            lengths.append(_const(1))
        return starts, lengths, view

    def _holds(self, op, lhs, rhs):
        """Whether lhs op rhs at the captured sizes; a guard when either side is symbolic."""
        outcome = _COMPARE[op](evaluate(lhs, self.values), evaluate(rhs, self.values))
        if not lhs.is_const or not rhs.is_const:
            self.guard(op, lhs, rhs, outcome)
        return outcome

    def _bound(self, v, size, default):
        """A slice bound clamped to [0, size] as Python does (positive step), as an expression."""
        if v is None:
            return default
        e = _expr_of(v)
        if evaluate(e, self.values) < 0:
            e = _binop("+", size, e)
            return e if self._holds(">=", e, _const(0)) else _const(0)
        return e if self._holds("<=", e, size) else size

    def _new_node(self, before, result):
        """The node the shape function just recorded, or None when it recorded none or several."""
        if self.tracer.count() != before + 1:
            return None
        node = self.tracer.node_of(result)
        return node if node == before else None

    # binding
    def rebind(self, graph, values):
        shapes = [tuple(evaluate(e, values) for e in exprs) for exprs in self.input_exprs]
        sets = [(n, i, kind, evaluate(v, values) if kind == 0 else v) for n, i, kind, v in self.sets]
        return graph.rebind(shapes, sets + self.follow_sets())

    def follow_sets(self):
        """A gradient rule's reshape, expand, full, slice_assign, convolution or pooling backward
        follows the forward values its sizes came from (KILN_ATTR_SET_FOLLOW)."""
        named = {s[0] for s in self.sets}
        return [(n, 0, 3, 0) for n in sorted(self.backward_nodes - named)]

    def bind(self, leaves):
        """The symbols' sizes for a call's tensors (all of them, by symbol), or None when the call is
        outside what the capture assumed: another exact size, a symbol with two sizes, one below
        2 or away from its specialized size, or a guard with another outcome."""
        values = list(self.values)
        seen = set()
        rows = self._rows
        if rows is None or len(rows) != len(self.input_exprs):  # (a 0-d size input may be added while capturing)
            rows = self._rows = [tuple((True, e.value) if e.is_const else (False, e.symbol_index) for e in row)
                                 for row in self.input_exprs]
        for t, row in zip(leaves, rows):
            shape = t.shape
            if len(shape) != len(row):
                return None
            for size, (fixed, k) in zip(shape, row):
                if fixed:
                    if size != k:
                        return None
                    continue
                if k in seen:
                    if values[k] != size:
                        return None
                    continue
                if size < 2 or (k in self.specialized and size != self.values[k]):
                    return None
                values[k] = size
                seen.add(k)
        for op, lhs, rhs, outcome in self.guards:
            if _COMPARE[op](evaluate(lhs, values), evaluate(rhs, values)) != outcome:
                return None
        return values

    def rebind_checked(self, graph, values):
        """The recorded graph rebound to the binding `values`, or None when it does not hold for it (a
        node keeps sizes with none given, an inference fails, a shape Python read would differ)."""
        try:
            g = self.rebind(graph, values)
            for v, exprs in self.reads:
                if g.value_shape(v) != tuple(evaluate(e, values) for e in exprs):
                    return None
        except (ValueError, TypeError, IndexError, OverflowError):
            return None
        return g

    def symbolize(self, graph, level, inference, disable_format_transform, specialize=False):
        """(the recorded graph made symbolic, it optimized once at `level`), or None where it cannot
        be made symbolic (see the module docstring). Specialized symbols are their sizes.
        specialize: where it cannot, the symbols the graph cannot vary alone (a rebinding with only
        that symbol at another size fails: a convolution's channels against its weight) are tried
        as their sizes, and specialized when that makes it (bind then refuses other sizes of them)."""
        made = self._symbolize(graph, level, inference, disable_format_transform, self.specialized)
        if made is not None or not specialize:
            return made
        stuck = set()
        for k in range(len(self.values)):
            if k not in self.specialized:
                try:
                    self.rebind(graph, self._probe_values((k,)))
                except (ValueError, TypeError, IndexError, OverflowError):
                    stuck.add(k)
        made = self._symbolize(graph, level, inference, disable_format_transform, self.specialized | stuck) \
            if stuck else None
        if made is not None:
            for k in stuck:
                self.specialize(self.symbol(k), "the graph needs a fixed size here")
        return made

    def _symbolize(self, graph, level, inference, disable_format_transform, fixed):
        at = {k: self.values[k] for k in fixed}

        def sub(e):
            return e.substitute(at) if at else e

        try:
            recorded = graph.symbolize(list(self.values), [tuple(sub(e) for e in row) for row in self.input_exprs],
                                       [(n, i, kind, sub(v) if kind == 0 else v) for n, i, kind, v in self.sets]
                                       + self.follow_sets())
            return recorded, _C.optimize_graph(recorded, level=level, inference=inference,
                                               disable_format_transform=disable_format_transform)
        except (ValueError, TypeError, OverflowError):
            return None

    def instantiate(self, graph, recorded, values):
        """graph (made from symbolize's recording) at the binding `values`, or None when the recording
        does not hold for it (an inference fails, a shape Python read would differ)."""
        values = list(values)
        try:
            g = graph.instantiate(values)
            if not self.reads_hold(recorded, values):
                return None
        except (ValueError, TypeError, IndexError, OverflowError):
            return None
        return g

    @staticmethod
    def plan(optimized, options=None):
        """The optimized symbolic recording planned once (kiln._C.plan_symbolic with options, a
        kiln._C.CompileOptions), or False where the planner refuses it."""
        try:
            return _C.plan_symbolic(optimized, options)
        except (ValueError, TypeError, OverflowError):
            return False

    def bind_plan(self, plan, recorded, values):
        """The executable of the binding `values` from plan (kiln._C.bind_plan: nothing planned
        again), or None when the recording does not hold for it (a shape Python read would differ)."""
        values = list(values)
        try:
            if not self.reads_hold(recorded, values):
                return None
            return _C.bind_plan(plan, values)
        except (ValueError, TypeError, IndexError, OverflowError):
            return None

    def reads_hold(self, recorded, values):
        """Whether the shapes Python read while capturing are what it saw, at the binding `values` of
        the symbolic recording."""
        return all(recorded.value_shape_at(v, values) == tuple(evaluate(e, values) for e in exprs)
                   for v, exprs in self.reads)

    def __enter__(self):
        _C.set_sym_hooks(self.shape_hook, self.call_hook, SymInt)
        return self

    def __exit__(self, *exc):
        _C.set_sym_hooks(None, None, None)


def _key_items(key):
    """(the items of an index key, the key with each SymInt given as its captured size)."""
    items = key if isinstance(key, tuple) else (key,)
    concrete = tuple(slice(_value(i.start), _value(i.stop), _value(i.step)) if isinstance(i, slice)
                     else _value(i) for i in items)
    return items, concrete if isinstance(key, tuple) else concrete[0]


def _expr_of(x):
    if isinstance(x, SymInt):
        return x.expr
    return _const(int(x))


def _value(x):
    return x.value if isinstance(x, SymInt) else x


def _explain(x0, x1, v0, v1, symbol):
    """A simple expression over the symbols (symbol(k): symbol k) equal to x0 at sizes v0 and x1 at
    v1, or None."""
    if x0 == x1:
        return _const(x0)
    n = len(v0)
    for k in range(n):
        a0, a1 = v0[k], v1[k]
        if a0 == a1:
            continue
        s = symbol(k)
        if x0 % a0 == 0 and x1 == x0 // a0 * a1:
            return s * (x0 // a0)
        if x0 and a0 % x0 == 0 and x1 == a1 // (a0 // x0):
            return s // (a0 // x0)
        if x1 - a1 == x0 - a0:
            return s + (x0 - a0)
        for j in range(k + 1, n):
            b0, b1 = v0[j], v1[j]
            if b0 != b1 and x0 % (a0 * b0) == 0 and x1 == x0 // (a0 * b0) * a1 * b1:
                return s * symbol(j) * (x0 // (a0 * b0))
    return None


def choose_symbols(leaves, labels, dynamic, history):
    """(names, values, per leaf its sizes as expressions) for a capture: which sizes are symbolic
    (see the module docstring); equal symbolic sizes share one symbol. history: per leaf, the set of
    sizes each dimension took in earlier compiles of this signature's structure (automatic mode).
    labels None: the origins (by symbol, the labels of the sizes it stands for) are not made, and
    None is returned in their place (kiln.trace, which records on every call, reads none)."""
    names, values, by_size = [], [], {}
    exprs, table = [], _C.SymTable()
    for k, t in enumerate(leaves):
        marks = marks_of(t) or {}
        row = []
        for d, size in enumerate(t.shape):
            want = marks.get(d)
            if want is None:
                want = dynamic is True or (dynamic is None and history is not None
                                           and len(history[k][d] | {size}) > 1)
            if not want or size < 2:
                row.append(_const(size))
                continue
            sym = by_size.get(size)
            if sym is None:
                sym = by_size[size] = table.symbol(size)
                names.append(f"s{len(values)}")
                values.append(size)
            row.append(sym)
        exprs.append(tuple(row))
    if labels is None:
        return names, values, exprs, None
    origins = {}
    for k, row in enumerate(exprs):
        for d, e in enumerate(row):
            if not e.is_const:
                origins.setdefault(e.symbol_index, []).append(f"{labels[k]}.shape[{d}]")
    return names, values, exprs, origins


class DynamicEntry:
    """A compiled entry for every binding of its symbols that its guards admit: the recorded graph,
    how it follows the symbols, and an instance per binding met so far."""

    def __init__(self, entry, capture, graph, origins, options):
        self.entry = entry  # the capture's kiln.jit entry (out_spec, guards on Python state, ...)
        self.graph = graph
        self.names, self.values = capture.names, capture.values
        self.live = [k for k in range(len(self.values)) if k not in capture.specialized]
        self.fixed = {k: self.values[k] for k in capture.specialized}
        self.why = capture.why
        self.guards = capture.guards
        self.sets, self.reads = capture.sets, capture.reads
        self.input_exprs = capture.input_exprs
        self._capture = capture
        self.origins = origins
        self.options = options
        self.instances = collections.OrderedDict({tuple(self.values[k] for k in self.live): entry.executable})
        self.fast = None  # the C dispatcher's number for this entry, once registered
        self._symbolic = None  # (recording with symbolic sizes, optimized), or False: none (made once)
        self._plan = None  # kiln._C.plan_symbolic of the optimized recording, or False: none (made once)
        capture.tracer = None  # the trace has ended; keep no reference to it

    @property
    def dims(self):
        """Per input its sizes for the C dispatcher: exact, or -1 - j for live symbol j."""
        slot = {k: j for j, k in enumerate(self.live)}
        return tuple(tuple(-1 - slot[e.symbol_index] if e.symbol_index in slot else evaluate(e, self.values)
                           for e in row) for row in self.input_exprs)

    def bind(self, leaves):
        """The symbols' sizes for a call (all of them, by symbol), or None when it is outside this entry."""
        return self._capture.bind(leaves)

    def symbolic(self):
        """(the recording with symbolic sizes, it optimized once), or None where it cannot be made
        symbolic (see the module docstring); made on the first call that needs it."""
        if self._symbolic is None:
            o = self.options
            # symbols it specializes (a convolution's channels) make other sizes of them miss this
            # entry: bind refuses them, and the C dispatcher finds no instance for them
            self._symbolic = self._capture.symbolize(self.graph, o.level, o.infer_boost == "on",
                                                     o.disable_format_transform, specialize=True) or False
            self.fixed = {k: self.values[k] for k in self._capture.specialized}
        return self._symbolic or None

    def planned(self):
        """The optimized symbolic recording planned once (kiln._C.plan_symbolic), or None where there is
        none (see symbolic()), the sublinear-memory search is asked for (it rewrites each binding's
        graph) or the planner refuses it; made on the first call that needs it."""
        if self._plan is None:
            self._plan = False
            sym = self.symbolic() if symbolic_instances else None
            o = self.options
            if sym is not None and o.sublinear is None:
                self._plan = Capture.plan(sym[1], o.compile_options)
        return self._plan or None

    def _instance_graph(self, values):
        """The graph of this binding's instance, and whether it is already optimized; (None, _) when
        the recording does not hold for the binding."""
        sym = self.symbolic() if symbolic_instances else None
        if sym is None:
            return self._capture.rebind_checked(self.graph, values), False
        return self._capture.instantiate(sym[1], sym[0], values), True

    def instance(self, values):
        """The executable for this binding (made on its first call), or None when the graph does not
        hold for it; second: whether it was made now."""
        key = tuple(values[k] for k in self.live)
        exe = self.instances.get(key)
        if exe is not None:
            self.instances.move_to_end(key)
            return exe, False
        if symbolic_instances and self.symbolic() is not None and any(values[k] != v for k, v in self.fixed.items()):
            return None, False  # a symbol symbolic() specialized (the graph needs it fixed): another entry
        plan = self.planned() if planned_instances else None
        if plan is not None:
            exe = self._capture.bind_plan(plan, self._symbolic[0], values)
            if exe is None:
                return None, False
        else:
            g, optimized = self._instance_graph(values)
            if g is None:
                return None, False
            o = self.options
            options = o.compile_options.replace(level=0) if optimized else o.compile_options
            exe = _C.compile_graph(g, options)
        self.instances[key] = exe
        while len(self.instances) > self.limit:
            self.instances.popitem(last=False)
        return exe, True

    @property
    def limit(self):
        """The most instances kept: bound from one plan (a share of one arena each) or not."""
        return MAX_INSTANCES if self._plan else MAX_OWN_INSTANCES

    def describe(self):
        """The symbols, where they come from, the guards, whether instances come from the recording
        made symbolic and optimized once, and whether from one plan of it (bound per binding: no
        planning, no code generated; False: each binding planned); for cache_info, None until a new
        binding asked."""
        names = self.names
        symbols = {}
        for k, name in enumerate(names):
            where = " = ".join(self.origins.get(k, ()))
            if k in self.fixed:
                symbols[name] = f"{where} == {self.fixed[k]} (specialized: {self.why.get(k, '')})"
            else:
                symbols[name] = f"{where} >= 2"
        guards = [f"{show(l, names)} {op} {show(r, names)}" if outcome else f"not ({show(l, names)} {op} "
                  f"{show(r, names)})" for op, l, r, outcome in self.guards]
        optimized_once = None if self._symbolic is None else bool(self._symbolic)
        planned_once = None if self._plan is None else bool(self._plan)
        return {"symbols": symbols, "guards": guards, "instances": len(self.instances), "optimized_once": optimized_once,
                "planned_once": planned_once}


def shape_free(key):
    """A call key (kiln.jit.function's: options, per tensor (dtype, shape, requires_grad), state)
    without the tensors' sizes, their ranks kept: what a dynamic entry matches."""
    return key[0], tuple((dt, len(shape), rg) for dt, shape, rg in key[1]), key[2]
