"""A seeded generator of random kiln programs, for differential testing of compiled graphs.

generate(seed) builds a small Python function over kiln tensors as source text: 2-4 inputs of small
shapes that broadcast together (plus weight inputs for some matmuls), then 5-25 random ops drawn from
elementwise math, broadcasting binary ops with tensors and Python scalars, comparisons and where,
reductions, softmax, matmul, views (reshape, permute, slicing, broadcast), concat, casts, repeated
subexpressions (work for CSE), constant subexpressions from Python numbers and kiln.ops.full /
arange / linspace (work for constant folding), identities (work for simplification), in-place writes
into fresh tensors between two equal reads (which no pass may merge), and the patterns fusion looks
for (softmax and norms written out, norm ops, matmul + bias + activation, residual adds, rotary
embedding). Most values feed the results (the leftovers are summed into one), so little is dead code.
Values stay finite and modest: every op's magnitude is bounded and large values are squashed with tanh.

The program is source text so a failure reproduces by reading it:
    PYTHONPATH=python:tests/python python3 -c "import graphgen; print(graphgen.generate(SEED).description)"
The same seed always gives the same program and input values (changing this file changes which
program a seed names).
"""
import linecache
import math
import random

import numpy as np

import kiln

UNARY = ("neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "erf", "sin", "cos")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
COMPARE = (">", "<", ">=", "<=")
REDUCE = ("sum", "mean", "max", "min")
SQUASH_BOUND = 20.0  # values whose magnitude may exceed this are squashed
MAX_SIZE = 1500  # no op makes a value with more elements than this (views and concat check it)

# op kinds and their weights
KINDS = (("unary", 20), ("binary", 22), ("scalar", 10), ("where", 6), ("reduce", 8), ("softmax", 4),
         ("matmul", 6), ("view", 10), ("concat", 4), ("const", 5), ("repeat", 6), ("identity", 5),
         ("cast", 3), ("mutate", 4), ("pattern", 6))


class Value:
    __slots__ = ("name", "shape", "dtype", "bound", "const", "uses", "expr", "is_input")

    def __init__(self, name, shape, dtype, bound, const=False, expr=None, is_input=False):
        self.name, self.shape, self.dtype, self.bound = name, tuple(shape), dtype, bound
        self.const, self.expr, self.is_input = const, expr, is_input
        self.uses = 0

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))


def _broadcast(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _fmt(x):
    """A Python float literal that reads back exactly."""
    return repr(float(x))


def _promote(*dtypes):
    return "float64" if "float64" in dtypes else "float32"


class Program:
    """A generated program: `fn` (the function), `inputs` (NumPy arrays, in argument order),
    `description` (seed, inputs and source), `float_positions` (arguments that are float tensors),
    `tol_dtype` ("float32" when any value is float32, else "float64")."""

    def __init__(self, seed, source, fn, inputs, specs, tol_dtype, n_outputs):
        self.seed, self.source, self.fn, self.inputs = seed, source, fn, inputs
        self.specs = specs  # [(name, shape, dtype name)]
        self.tol_dtype = tol_dtype
        self.n_outputs = n_outputs
        self.float_positions = tuple(i for i, (_, _, d) in enumerate(specs) if d != "int32")
        ins = ", ".join(f"{n}: {d}{list(s)}" for n, s, d in specs)
        self.description = (f"graphgen seed {seed} ({tol_dtype} tolerance)\ninputs: {ins}\n{source}")

    def new_inputs(self, k):
        """Fresh input values of the same shapes and dtypes (k-th replay set; k=0 gives `inputs`)."""
        return make_arrays(np.random.default_rng([self.seed, k]), self.specs)

    def tensors(self, arrays):
        return [kiln.Tensor(np.array(a, order="C"), getattr(kiln, d)) for a, (_, _, d) in zip(arrays, self.specs)]

    def __repr__(self):
        return self.description


def make_arrays(rng, specs):
    out = []
    for _, shape, dtype in specs:
        if dtype == "int32":
            out.append(np.asarray(rng.integers(-3, 4, size=shape), dtype=np.int32))
        else:
            out.append(np.asarray(rng.uniform(-2.0, 2.0, size=shape), dtype=dtype))
    return out


# generate(seed, rows=True): these kinds join, with the row patterns of op_rows
ROW_KINDS = KINDS + (("rows", 16),)


class _Gen:
    def __init__(self, seed, rows=False):
        self.seed = seed
        self.kinds = ROW_KINDS if rows else KINDS
        self.r = random.Random(seed)
        self.lines = []
        self.vals = []
        self.specs = []
        self.weights = []  # weight inputs made for matmuls: (name, shape, dtype)
        self.n = 0
        self.dtype = "float64" if self.r.random() < 0.2 else "float32"
        self.any_f32 = self.dtype == "float32"

    # ---- bookkeeping ------------------------------------------------------------------------
    def emit(self, expr, shape, dtype, bound, const=False, repeatable=True, squash=True):
        name = f"v{self.n}"
        self.n += 1
        self.lines.append(f"{name} = {expr}")
        if dtype == "float32":
            self.any_f32 = True
        v = Value(name, shape, dtype, bound, const, expr if repeatable else None)
        self.vals.append(v)
        if squash and bound > SQUASH_BOUND:
            if self.r.random() < 0.5:
                return self.emit(f"K.tanh({self.use(v)})", shape, dtype, 1.0, const)
            return self.emit(f"{self.use(v)} / (K.abs({self.use(v)}) + 1.0)", shape, dtype, 1.0, const)
        return v

    def use(self, v):
        v.uses += 1
        return v.name

    def pick(self, pred=None, avoid_const=False):
        """A value, favouring recent and unused ones."""
        cands = [v for v in self.vals if (pred is None or pred(v)) and not (avoid_const and v.const)]
        if not cands:
            return None
        n = len(self.vals)
        weights = []
        for v in cands:
            recency = self.vals.index(v) / max(n - 1, 1)
            weights.append(0.5 + 2.0 * recency + (3.0 if v.uses == 0 else 0.0))
        return self.r.choices(cands, weights)[0]

    def partner(self, a, same_dtype=False):
        """A value broadcast-compatible with a (possibly a itself)."""
        def ok(v):
            s = _broadcast(a.shape, v.shape)
            return (s is not None and int(np.prod(s)) <= MAX_SIZE and
                    (not same_dtype or v.dtype == a.dtype))
        others = self.pick(lambda v: v is not a and ok(v))
        if others is not None and self.r.random() < 0.85:
            return others
        return a

    def dt(self, dtype):
        return f"kiln.{dtype}"

    def scalar(self, lo=-2.0, hi=2.0):
        return round(self.r.uniform(lo, hi), 3)

    def rand_shape_like(self, base):
        """A shape broadcast-compatible with base: a suffix of it with some dims set to 1."""
        k = self.r.randint(0, len(base))
        s = list(base[len(base) - k:])
        for i in range(len(s)):
            if self.r.random() < 0.3:
                s[i] = 1
        return tuple(s)

    # ---- inputs -----------------------------------------------------------------------------
    def inputs(self):
        r = self.r
        rank = r.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
        self.base = tuple(r.randint(1, 5) for _ in range(rank))
        n_in = r.randint(2, 4)
        for i in range(n_in):
            shape = self.base if i == 0 else self.rand_shape_like(self.base)
            if r.random() < 0.12:
                dtype = "int32"
            elif self.dtype == "float64" and r.random() < 0.25:
                dtype = "float32"
            elif self.dtype == "float32" and r.random() < 0.08:
                dtype = "float64"
            else:
                dtype = self.dtype
            name = f"x{i}"
            self.specs.append((name, shape, dtype))
            if dtype == "int32":
                v = Value(name, shape, "int32", 3.0, is_input=True)
                v.uses = 1
                self.emit(f"K.cast({v.name}, {self.dt(self.dtype)})", shape, self.dtype, 3.0, repeatable=False)
            else:
                if dtype == "float32":
                    self.any_f32 = True
                self.vals.append(Value(name, shape, dtype, 2.0, is_input=True))

    def weight_input(self, shape, dtype):
        name = f"w{len(self.weights)}"
        self.weights.append((name, tuple(shape), dtype))
        v = Value(name, shape, dtype, 2.0, is_input=True)
        return v

    # ---- ops --------------------------------------------------------------------------------
    def op_unary(self):
        a = self.pick()
        u = self.r.choice(UNARY)
        x = self.use(a)
        b = a.bound
        if u == "neg":
            expr, bound = self.r.choice((f"-{x}", f"K.neg({x})")), b
        elif u == "abs":
            expr, bound = self.r.choice((f"K.abs({x})", f"{x}.abs()")), b
        elif u == "exp":
            expr, bound = f"K.exp(K.clamp({x}, -3.0, 3.0))", math.exp(3.0)
        elif u == "log":
            expr, bound = f"K.log(K.abs({x}) + 1.0)", math.log(b + 1.0)
        elif u == "sqrt":
            expr, bound = f"K.sqrt(K.abs({x}) + 0.1)", math.sqrt(b + 0.1)
        elif u == "gelu":
            expr, bound = f"K.gelu({x})", b
        elif u in ("relu", "silu"):
            expr, bound = self.r.choice((f"K.{u}({x})", f"{x}.{u}()" if u == "relu" else f"K.{u}({x})")), b
        else:  # tanh sigmoid erf sin cos
            expr, bound = self.r.choice((f"K.{u}({x})", f"{x}.{u}()" if u != "erf" else f"K.{u}({x})")), 1.0
        self.emit(expr, a.shape, a.dtype, bound, a.const)

    def op_binary(self):
        a = self.pick()
        b = self.partner(a)
        shape = _broadcast(a.shape, b.shape)
        dtype = _promote(a.dtype, b.dtype)
        x, y = self.use(a), self.use(b)
        op = self.r.choice(BINARY)
        const = a.const and b.const
        if op == "add":
            expr, bound = self.r.choice((f"{x} + {y}", f"K.add({x}, {y})")), a.bound + b.bound
        elif op == "sub":
            expr, bound = self.r.choice((f"{x} - {y}", f"K.sub({x}, {y})")), a.bound + b.bound
        elif op == "mul":
            expr, bound = self.r.choice((f"{x} * {y}", f"K.mul({x}, {y})")), a.bound * b.bound
        elif op == "div":
            expr, bound = f"{x} / (K.abs({y}) + 1.0)", a.bound
        elif op == "maximum":
            expr, bound = f"K.maximum({x}, {y})", max(a.bound, b.bound)
        elif op == "minimum":
            expr, bound = f"K.minimum({x}, {y})", max(a.bound, b.bound)
        else:  # pow: base in (0.5, 1.5), exponent in (-2, 2)
            expr, bound = f"K.pow(K.sigmoid({x}) + 0.5, K.tanh({y}) * 2.0)", 4.0
        self.emit(expr, shape, dtype, bound, const)

    def op_scalar(self):
        a = self.pick()
        x = self.use(a)
        c = self.scalar()
        cs = _fmt(c)
        k = self.r.randrange(9)
        if k == 0:
            expr, bound = f"{x} * {cs}", a.bound * abs(c)
        elif k == 1:
            expr, bound = f"{cs} * {x}", a.bound * abs(c)
        elif k == 2:
            expr, bound = f"{x} + {cs}", a.bound + abs(c)
        elif k == 3:
            expr, bound = f"{cs} - {x}", a.bound + abs(c)
        elif k == 4:
            expr, bound = f"{cs} / (K.abs({x}) + 1.0)", abs(c)
        elif k == 5:
            expr, bound = f"K.maximum({x}, {cs})", max(a.bound, abs(c))
        elif k == 6:
            expr, bound = f"K.minimum({cs}, {x})", max(a.bound, abs(c))
        elif k == 7:
            base = _fmt(round(self.r.uniform(0.5, 2.0), 3))
            expr, bound = f"{base} ** K.tanh({x})", 2.0
        else:
            p = self.r.choice((2.0, 3.0, 0.5, 1.5))
            expr, bound = f"(K.abs({x}) + 0.5) ** {_fmt(p)}", (a.bound + 0.5) ** p
        self.emit(expr, a.shape, a.dtype, bound, a.const)

    def op_where(self):
        a = self.pick()
        b = self.partner(a)
        cshape = _broadcast(a.shape, b.shape)
        cmp = self.r.choice(COMPARE)
        if self.r.random() < 0.3:
            cond = f"({self.use(a)} {cmp} {_fmt(self.scalar(-0.5, 0.5))})"
            cshape = a.shape
        else:
            cond = f"({self.use(a)} {cmp} {self.use(b)})"
        x = self.pick(lambda v: _broadcast(v.shape, cshape) is not None)
        y = self.pick(lambda v: _broadcast(v.shape, cshape, x.shape) is not None)
        dtype = _promote(x.dtype, y.dtype)

        def operand(v):
            n = self.use(v)
            return f"K.cast({n}, kiln.float64)" if v.dtype != dtype else n

        shape = _broadcast(cshape, x.shape, y.shape)
        if int(np.prod(shape)) > MAX_SIZE:
            return self.op_unary()
        k = self.r.randrange(4)
        if k == 0:  # the mask as a number
            expr = f"{operand(x)} * K.cast{cond[:-1]}, {self.dt(dtype)})"
            bound = x.bound
            shape = _broadcast(cshape, x.shape)
        elif k == 1:
            expr, bound = f"K.where({cond}, {_fmt(self.scalar())}, {operand(y)})", max(2.0, y.bound)
            shape = _broadcast(cshape, y.shape)
        else:
            expr, bound = f"K.where({cond}, {operand(x)}, {operand(y)})", max(x.bound, y.bound)
        self.emit(expr, shape, dtype, bound, a.const and b.const and x.const and y.const)

    def axes_arg(self, rank):
        """(source of the axis argument, reduced axes)."""
        r = self.r
        if rank == 0 or r.random() < 0.12:
            return "None", tuple(range(rank))
        if r.random() < 0.5:
            ax = r.randrange(rank)
            return str(ax - rank if r.random() < 0.3 else ax), (ax,)
        axes = tuple(sorted(r.sample(range(rank), r.randint(1, rank))))
        return str(axes) if len(axes) > 1 else f"({axes[0]},)", axes

    def op_reduce(self):
        a = self.pick()
        red = self.r.choice(REDUCE)
        axis, axes = self.axes_arg(len(a.shape))
        keep = self.r.random() < 0.75
        n = int(np.prod([a.shape[i] for i in axes])) if axes else 1
        x = self.use(a)
        if self.r.random() < 0.3:
            expr = f"{x}.{red}({axis}, {keep})"
        else:
            expr = f"K.{red}({x}, axis={axis}, keepdims={keep})"
        shape = tuple((1 if i in axes else d) for i, d in enumerate(a.shape) if keep or i not in axes)
        bound = a.bound * n if red == "sum" else a.bound
        self.emit(expr, shape, a.dtype, bound, a.const)

    def op_softmax(self):
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return self.op_unary()
        rank = len(a.shape)
        ax = self.r.randrange(-rank, rank)
        x = self.use(a)
        if self.r.random() < 0.5:
            self.emit(f"K.softmax({x}, axis={ax})", a.shape, a.dtype, 1.0, a.const)
        else:
            n = a.shape[ax]
            self.emit(f"K.log_softmax({x}, axis={ax})", a.shape, a.dtype, 2 * a.bound + math.log(n) + 1, a.const)

    def op_matmul(self):
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return self.op_unary()
        k = a.shape[-1]
        r = self.r
        mode = r.randrange(4)
        x = self.use(a)
        if mode == 0 and len(a.shape) >= 2:  # a @ a^T, or a @ u^T for a u of matching shape
            u = self.pick(lambda v: v.shape == a.shape and v.dtype == a.dtype)
            y = self.use(u)
            expr = r.choice((f"K.matmul({x}, K.swapaxes({y}, -1, -2))", f"K.matmul({x}, {y}.swapaxes(-1, -2))"))
            shape = a.shape[:-1] + (a.shape[-2],)
            bound = a.bound * u.bound * k
            const = a.const and u.const
        else:
            n = r.randint(1, 5)
            wshape = (k,) if (r.random() < 0.15 and len(a.shape) >= 1) else (k, n)
            if mode == 1:  # a constant weight
                size = int(np.prod(wshape))
                w = f"K.reshape(K.linspace(-1.0, 1.0, {size}, dtype={self.dt(a.dtype)}), {wshape})"
                wb = 1.0
                const = a.const
            else:
                wv = self.weight_input(wshape, a.dtype)
                w, wb, const = wv.name, 2.0, False
            expr = f"K.matmul({x}, {w})"
            shape = a.shape[:-1] + wshape[1:]
            bound = a.bound * wb * k
        self.emit(expr, shape, a.dtype, bound, const)

    def new_shape(self, size):
        """A random shape with `size` elements, rank 0-4."""
        primes, n, p = [], size, 2
        while n > 1:
            while n % p == 0:
                primes.append(p)
                n //= p
            p += 1
        rank = self.r.randint(1 if size > 1 else 0, 4)
        dims = [1] * rank
        for q in primes:
            dims[self.r.randrange(rank)] *= q
        return tuple(dims)

    def op_view(self):
        r = self.r
        a = self.pick()
        x = self.use(a)
        rank = len(a.shape)
        k = r.randrange(7)
        if k == 0 or (rank == 0 and k in (1, 2, 3)):  # reshape
            shape = self.new_shape(a.size)
            src = list(shape)
            if shape and r.random() < 0.3:
                src[r.randrange(len(src))] = -1
            form = r.randrange(3)
            if form == 0:
                expr = f"K.reshape({x}, {tuple(src)})"
            elif form == 1:
                expr = f"{x}.reshape({tuple(src)})"
            else:
                expr, shape = f"{x}.flatten()", (a.size,)
            self.emit(expr, shape, a.dtype, a.bound, a.const)
        elif k == 1 and rank >= 2:  # permute
            perm = list(range(rank))
            r.shuffle(perm)
            form = r.randrange(3)
            if form == 0:
                expr = f"K.permute({x}, {tuple(perm)})"
            elif form == 1:
                i, j = r.sample(range(rank), 2)
                perm = list(range(rank))
                perm[i], perm[j] = perm[j], perm[i]
                expr = f"K.swapaxes({x}, {i}, {j - rank})"
            else:
                perm = list(range(rank))[::-1]
                expr = f"{x}.T"
            self.emit(expr, tuple(a.shape[p] for p in perm), a.dtype, a.bound, a.const)
        elif k in (1, 2) and rank >= 1:  # slice one axis (or index it away)
            key, shape = self.slice_key(a.shape)
            self.emit(f"{x}[{key}]", shape, a.dtype, a.bound, a.const)
        elif k == 3 and rank >= 1:  # unsqueeze / squeeze
            if 1 in a.shape and r.random() < 0.5:
                expr = f"K.squeeze({x})"
                shape = tuple(d for d in a.shape if d != 1)
            else:
                ax = r.randint(0, rank)
                expr = f"K.unsqueeze({x}, {ax})"
                shape = a.shape[:ax] + (1,) + a.shape[ax:]
            if len(shape) > 4:
                shape = tuple(d for d in a.shape if d != 1)
                expr = f"K.squeeze({x})"
            self.emit(expr, shape, a.dtype, a.bound, a.const)
        else:  # broadcast_to a larger shape
            lead = r.randint(0, max(0, 3 - rank)) if rank < 4 else 0
            shape = tuple(r.randint(1, 4) for _ in range(lead)) + tuple(
                r.randint(2, 4) if d == 1 and r.random() < 0.6 else d for d in a.shape)
            if int(np.prod(shape)) > MAX_SIZE:
                shape = a.shape
            self.emit(f"K.broadcast_to({x}, {shape})", shape, a.dtype, a.bound, a.const)

    def op_concat(self):
        r = self.r
        a = self.pick(lambda v: len(v.shape) >= 1 and v.size * 2 <= MAX_SIZE)
        if a is None:
            return self.op_unary()
        rank = len(a.shape)
        ax = r.randrange(rank)

        def fits(v):
            return (v.dtype == a.dtype and len(v.shape) == rank and
                    all(v.shape[i] == a.shape[i] for i in range(rank) if i != ax))
        parts = [a]
        for _ in range(r.choice((1, 1, 2))):
            b = self.pick(lambda v: fits(v) and v is not a)
            parts.append(b if b is not None and r.random() < 0.8 else None)
        srcs, total, bound = [], 0, 0.0
        for p in parts:
            if p is None:  # something of a's shape made on the spot
                srcs.append(f"K.sin({self.use(a)})")
                total += a.shape[ax]
                bound = max(bound, 1.0)
            else:
                srcs.append(self.use(p))
                total += p.shape[ax]
                bound = max(bound, p.bound)
        shape = a.shape[:ax] + (total,) + a.shape[ax + 1:]
        axis = ax - rank if r.random() < 0.3 else ax
        fn = r.choice(("concat", "cat"))
        self.emit(f"K.{fn}([{', '.join(srcs)}], axis={axis})", shape, a.dtype, bound,
                  all(p is None or p.const for p in parts) and a.const)

    def const_leaf(self, shape):
        r = self.r
        dt = self.dt(self.dtype)
        size = int(np.prod(shape))
        k = r.randrange(5)
        if k == 0:
            c = self.scalar()
            return f"K.full({shape}, {_fmt(c)}, dtype={dt})", abs(c)
        if k == 1:
            return f"K.reshape(K.arange({size}, dtype={dt}), {shape}) * 0.1", 0.1 * size
        if k == 2:
            return f"K.linspace(-1.5, 1.5, {size}, dtype={dt}).reshape({shape})", 1.5
        if k == 3:
            return f"K.ones({shape}, dtype={dt}) * ({_fmt(self.scalar())} * {_fmt(self.scalar())})", 4.0
        return f"K.zeros({shape}, dtype={dt}) + {_fmt(self.scalar())}", 2.0

    def op_const(self):
        """A constant subexpression (foldable), later combined with values like any other."""
        r = self.r
        shape = self.rand_shape_like(self.base)
        leaf, bound = self.const_leaf(shape)
        k = r.randrange(4)
        if k == 0:
            expr = leaf
        elif k == 1:
            expr, bound = f"K.exp(K.tanh({leaf})) * 0.5 + 1.0", 0.5 * math.e + 1
        elif k == 2:
            other, b2 = self.const_leaf(shape)
            expr, bound = f"{leaf} * {other} - K.sin({other})", bound * b2 + 1
        else:
            expr, bound = f"K.sqrt(K.abs({leaf}) + 1.0) * {_fmt(self.scalar())}", 2.0 * math.sqrt(bound + 1)
        v = self.emit(expr, shape, self.dtype, bound, const=True)
        if r.random() < 0.6:  # combine it with a value right away
            a = self.pick(lambda u: _broadcast(u.shape, v.shape) is not None and not u.const)
            if a is not None:
                op = r.choice(("+", "*", "-"))
                bnd = a.bound * v.bound if op == "*" else a.bound + v.bound
                self.emit(f"{self.use(a)} {op} {self.use(v)}", _broadcast(a.shape, v.shape),
                          _promote(a.dtype, v.dtype), bnd)

    def op_repeat(self):
        """The same expression again under a new name (common subexpression)."""
        prev = [v for v in self.vals if v.expr is not None]
        if not prev:
            return self.op_unary()
        v = self.r.choice(prev)
        # the operands count as used again
        w = self.emit(v.expr, v.shape, v.dtype, v.bound, v.const, squash=False)
        if self.r.random() < 0.7:  # make both copies live
            self.emit(f"{self.use(v)} + {self.use(w)}", v.shape, v.dtype, 2 * v.bound)

    def op_identity(self):
        """Something algebraically equal to a value (work for simplification)."""
        r = self.r
        a = self.pick()
        x = self.use(a)
        rank = len(a.shape)
        forms = [f"{x} * 1.0", f"{x} + 0.0", f"{x} - 0.0", f"{x} / 1.0", f"K.neg(K.neg({x}))", f"-(-{x})",
                 f"K.broadcast_to({x}, {a.shape})", f"K.reshape({x}, {a.shape})", f"1.0 * {x}",
                 f"K.reshape(K.reshape({x}, ({a.size},)), {a.shape})", f"{x} * 0.0 + {x}", f"{x} - {x} + {x}"]
        if rank >= 2:
            perm = list(range(rank))
            r.shuffle(perm)
            inv = [perm.index(i) for i in range(rank)]
            forms += [f"K.permute(K.permute({x}, {tuple(perm)}), {tuple(inv)})", f"{x}.T.T",
                      f"K.swapaxes(K.swapaxes({x}, 0, -1), 0, -1)"]
        if rank >= 1:
            forms += [f"{x}[:]", f"K.squeeze(K.unsqueeze({x}, 0), 0)"]
        self.emit(r.choice(forms), a.shape, a.dtype, a.bound, a.const)

    def op_cast(self):
        a = self.pick()
        x = self.use(a)
        if a.dtype == "float64":  # a lossy round trip: must stay
            expr = f"K.cast(K.cast({x}, kiln.float32), kiln.float64)"
        else:  # an exact round trip: may go
            expr = f"K.cast(K.cast({x}, kiln.float64), kiln.float32)"
        self.emit(expr, a.shape, a.dtype, a.bound, a.const)

    def slice_key(self, shape):
        """(source of a basic index on one axis, the indexed shape with that axis kept or dropped)."""
        r = self.r
        rank = len(shape)
        ax = r.randrange(rank)
        d = shape[ax]
        if d >= 2 and r.random() < 0.8:
            start = r.randrange(d)
            stop = r.randint(start + 1, d)
            step = r.choice((1, 1, 2))
            sl = f"{start}:{stop}" + (f":{step}" if step != 1 else "")
            out = shape[:ax] + (len(range(start, stop, step)),) + shape[ax + 1:]
        else:
            sl = str(r.randrange(d) - (d if r.random() < 0.3 else 0))
            out = shape[:ax] + shape[ax + 1:]
        key = ", ".join([":"] * ax + [sl])
        if ax > 0 and ax == rank - 1 and r.random() < 0.5:
            key = f"..., {sl}"
        return key, out

    def op_mutate(self):
        """In-place writes into a fresh tensor, with the same read before and after (a pass must not
        merge them, fold the written tensor, or alias it to the value it was copied from)."""
        r = self.r
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return self.op_unary()
        x = self.use(a)
        # (reads of m before the write must not save m for the backward: eager autograd refuses that)
        fresh = r.choice((f"{x} * 1.0", f"{x} + 0.0", f"{x}.clone()", f"K.neg({x})", f"{x} * 0.5"))
        m = self.emit(fresh, a.shape, a.dtype, a.bound, a.const, repeatable=False, squash=False)
        c = _fmt(self.scalar())
        y = self.use(m)
        read = r.choice((f"{y} + {c}", f"{c} - {y}", f"K.sum({y}, axis=-1, keepdims=True)"))
        rshape = m.shape[:-1] + (1,) if "sum" in read else m.shape
        self.emit(read, rshape, m.dtype, m.bound * m.shape[-1] + 2, m.const, repeatable=False)
        target, tshape = m.name, m.shape
        if r.random() < 0.3:  # write through a view of it
            key, vshape = self.slice_key(m.shape)
            if vshape:
                view = self.emit(f"{self.use(m)}[{key}]", vshape, m.dtype, m.bound, m.const,
                                 repeatable=False, squash=False)
                target, tshape = view.name, vshape
        key, sshape = self.slice_key(tshape)
        v = self.pick(lambda u: _broadcast(u.shape, sshape) == tuple(sshape) and u is not m)
        if v is not None and r.random() < 0.6:
            val = self.use(v) if v.dtype == m.dtype else f"K.cast({self.use(v)}, {self.dt(m.dtype)})"
            vb = v.bound
        else:
            val, vb = _fmt(self.scalar()), 2.0
        self.lines.append(f"{target}[{key}] = {val}")
        m.bound = max(m.bound, vb)
        m.const = m.const and (v is None or v.const)
        self.emit(read, rshape, m.dtype, m.bound * m.shape[-1] + 2, m.const, repeatable=False)

    def op_pattern(self):
        """Subgraphs the fusion passes look for: softmax and norms written out, norm ops, bias and
        activation after a matmul, residual adds, rotary embedding."""
        r = self.r
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return self.op_unary()
        x = self.use(a)
        n = a.shape[-1]
        dt = self.dt(a.dtype)
        k = r.randrange(8)
        if k == 0:  # softmax by hand
            ax = r.randrange(-len(a.shape), 0)
            e = self.emit(f"K.exp({x} - {x}.max({ax}, True))", a.shape, a.dtype, 1.0, a.const)
            self.emit(f"{self.use(e)} / {self.use(e)}.sum({ax}, keepdims=True)", a.shape, a.dtype, 1.0, a.const)
        elif k == 1:  # layer norm by hand
            d = self.emit(f"{x} - K.mean({x}, axis=-1, keepdims=True)", a.shape, a.dtype, 2 * a.bound, a.const)
            y = self.use(d)
            self.emit(f"{y} / K.sqrt(K.mean({y} * {y}, axis=-1, keepdims=True) + 1e-05)", a.shape, a.dtype,
                      math.sqrt(n) + 1, a.const)
        elif k == 2:  # rms norm by hand
            self.emit(f"{x} * K.rsqrt(({x} * {x}).mean(-1, keepdims=True) + 1e-06)", a.shape, a.dtype,
                      math.sqrt(n) + 1, a.const)
        elif k == 3:  # the norm ops, with weights
            w = self.weight_input((n,), a.dtype)
            if r.random() < 0.5:
                b = self.weight_input((n,), a.dtype)
                self.emit(f"K.layer_norm({x}, ({n},), {w.name}, {b.name})", a.shape, a.dtype,
                          2 * (math.sqrt(n) + 1) + 2, False)
            else:
                self.emit(f"K.rms_norm({x}, {w.name})", a.shape, a.dtype, 2 * (math.sqrt(n) + 1), False)
        elif k in (4, 5):  # matmul, bias, activation
            m = r.randint(1, 5)
            w = self.weight_input((n, m), a.dtype)
            b = self.weight_input((m,), a.dtype)
            act = r.choice(("K.gelu", "K.relu", "K.silu", "K.tanh", "K.sigmoid", ""))
            self.emit(f"{act}(K.matmul({x}, {w.name}) + {b.name})", a.shape[:-1] + (m,), a.dtype,
                      2.0 * a.bound * n + 2, False)
        elif k == 6:  # residual block
            w = self.weight_input((n, n), a.dtype)
            act = r.choice(("K.gelu", "K.relu", "K.silu"))
            self.emit(f"{x} + {act}(K.matmul({x}, {w.name})) * {_fmt(self.scalar(0.1, 0.5))}", a.shape, a.dtype,
                      a.bound + a.bound * n, False)
        else:  # rotary embedding on the last axis
            if n % 2:
                return self.op_softmax()
            h = n // 2
            cos = f"K.cos(K.arange({h}, dtype={dt}) * 0.7)"
            sin = f"K.sin(K.arange({h}, dtype={dt}) * 0.7)"
            x1 = self.emit(f"{x}[..., :{h}]", a.shape[:-1] + (h,), a.dtype, a.bound, a.const, squash=False)
            x2 = self.emit(f"{x}[..., {h}:]", a.shape[:-1] + (h,), a.dtype, a.bound, a.const, squash=False)
            p, q = self.use(x1), self.use(x2)
            self.emit(f"K.concat([{p} * {cos} - {q} * {sin}, {q} * {cos} + {p} * {sin}], axis=-1)",
                      a.shape, a.dtype, 2 * a.bound, a.const)

    def op_rows(self):
        """What row fusion groups: reductions over the last axis between elementwise prologues and
        epilogues (softmax and log_softmax ops after a scale, norms with weights, reductions that
        drop the axis), also over transposed views."""
        r = self.r
        a = self.pick(lambda v: len(v.shape) >= 1 and v.shape[-1] >= 2)
        if a is None:
            return self.op_unary()
        x = self.use(a)
        n = a.shape[-1]
        shape = a.shape
        if len(a.shape) >= 2 and a.shape[-2] >= 2 and r.random() < 0.3:  # rows of a transposed view
            x = f"K.swapaxes({x}, -1, -2)"
            shape = a.shape[:-2] + (a.shape[-1], a.shape[-2])
            n = shape[-1]
        c = _fmt(self.scalar(0.2, 1.5))
        k = r.randrange(5)
        if k == 0:  # scaled softmax op, times something broadcasting
            y = self.partner_of(shape, a.dtype)
            yb = 1.0 if y is None else y.bound
            ys = "" if y is None else f" * {self.use(y)}"
            self.emit(f"K.softmax({x} * {c}, axis=-1){ys}", shape, a.dtype, yb, a.const and (y is None or y.const))
        elif k == 1:  # log_softmax after a squashing prologue
            self.emit(f"K.log_softmax(K.tanh({x}) + {c}, axis=-1)", shape, a.dtype, 2 + math.log(n) + 2, a.const)
        elif k == 2:  # a reduction dropping the axis, after a chain
            red = r.choice(REDUCE)
            self.emit(f"K.{red}(K.sin({x}) * {c} + 1.0, axis=-1)", shape[:-1], a.dtype, 3.0 * (n if red == "sum" else 1),
                      a.const)
        elif k == 3:  # rms norm with a weight
            w = self.weight_input((n,), a.dtype)
            self.emit(f"{x} * K.rsqrt(K.mean({x} * {x}, axis=-1, keepdims=True) + 1e-05) * {w.name}", shape, a.dtype,
                      2 * (math.sqrt(n) + 1), False)
        else:  # layer norm with mean and variance, then a max-normalization (eps 0.01: the results of rows of
            # nearly equal values amplify rounding in x by at most 1 / sqrt(eps))
            d = self.emit(f"{x} - K.mean({x}, axis=-1, keepdims=True)", shape, a.dtype, 2 * a.bound, a.const,
                          squash=False)
            y = self.use(d)
            self.emit(f"{y} * K.rsqrt(K.mean({y} * {y}, axis=-1, keepdims=True) + 0.01) - K.max({y}, axis=-1, "
                      f"keepdims=True) * {c}", shape, a.dtype, math.sqrt(n) + 1 + 4 * a.bound, a.const)

    def partner_of(self, shape, dtype):
        """A value of dtype broadcasting to shape without growing it, or None."""
        return self.pick(lambda u: u.dtype == dtype and len(u.shape) <= len(shape) and
                         _broadcast(u.shape, shape) == tuple(shape))

    # ---- the program ------------------------------------------------------------------------
    def build(self):
        r = self.r
        self.inputs()
        n_ops = r.randint(5, 25)
        kinds, weights = zip(*self.kinds)
        for _ in range(n_ops):
            kind = r.choices(kinds, weights)[0]
            getattr(self, f"op_{kind}")()
        # outputs: the last value, up to two other unused ones, and (mostly) the means of the remaining
        # unused ones added up, so that little is dead code
        outs = [self.vals[-1]]
        unused = [v for v in self.vals if v.uses == 0 and not v.is_input and v is not outs[0]]
        r.shuffle(unused)
        k = r.randint(0, 2)
        outs += unused[:k]
        rest = unused[k:] if r.random() < 0.8 else []
        if rest:
            total = " + ".join(f"{self.use(v)}.mean()" for v in rest)
            outs.append(self.emit(total, (), _promote(*(v.dtype for v in rest)), 1.0, all(v.const for v in rest)))
        if all(v.const for v in outs):  # make sure something depends on the inputs
            a = self.pick(lambda v: not v.const)
            outs.append(self.vals[-1] if a is None else a)
        for v in outs:
            v.uses += 1
        ret = outs[0].name if len(outs) == 1 else "(" + ", ".join(v.name for v in outs) + ")"
        params = [n for n, _, _ in self.specs] + [n for n, _, _ in self.weights]
        body = "\n".join(f"    {line}" for line in self.lines)
        source = f"def f({', '.join(params)}):\n{body}\n    return {ret}\n"
        specs = self.specs + self.weights
        tol = "float32" if self.any_f32 or any(d == "float32" for _, _, d in specs) else "float64"
        return source, specs, tol, len(outs)


def compile_source(source, seed):
    namespace = {"kiln": kiln, "K": kiln.ops}
    filename = f"<graphgen seed {seed}>"
    # registered like a file's lines, so capture_mode="ast" can read the source back
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec")
    exec(code, namespace)  # noqa: S102 - our own generated source
    return namespace["f"]


def generate(seed, rows=False):
    """The program of `seed` (a Program); rows: with the row-fusion patterns (other programs)."""
    gen = _Gen(seed, rows)
    source, specs, tol, n_out = gen.build()
    fn = compile_source(source, seed)
    inputs = make_arrays(np.random.default_rng([seed, 0]), specs)
    prog = Program(seed, source, fn, inputs, specs, tol, n_out)
    if rows:
        prog.description = "(rows=True) " + prog.description
    return prog


def make(seed):
    """(fn, input arrays, printable description) of the program of `seed`."""
    p = generate(seed)
    return p.fn, p.inputs, p.description


if __name__ == "__main__":
    import sys

    args = [a for a in sys.argv[1:] if a != "--rows"]
    for s in args or ["0"]:
        print(generate(int(s), rows="--rows" in sys.argv).description)
