"""Random programs over the ops real models reach for (issue 30's ops: rounding, cumulative sums,
sorting, flips and rolls, triangles, padding, one-hot, masked fills, gathers, batched products,
einsum, norms, activations, losses, Python's // and %), for differential tests against eager.

A program is Python source (so capture_mode="ast" reads it back), built from a seed: one or two
float inputs and a chain of random steps, each valid for the shapes it gets; the generator tracks
every value's shape. `grad_safe` programs leave out steps whose gradient is undefined at points the
inputs can reach (none here divide by values near zero or take logs of them).

    PYTHONPATH=python:tests/python python3 tests/python/modelops_gen.py SEED   prints a program
"""
import linecache
import random

import numpy as np

import kiln


class _Value:
    def __init__(self, name, shape, key):
        # key: how the shape was derived from the inputs'; values of one key have one shape at any
        # input sizes (two shapes equal by chance at the generated sizes are never paired)
        self.name, self.shape, self.key = name, tuple(shape), key


def _axis(r, v):
    return r.randrange(len(v.shape))


# Each step: (name, needs(shape) -> bool, make(r, v, other) -> (expression, shape)). `other` is a
# second value of the same shape or None.
def _unary(expr):
    return lambda r, v, o: (expr.format(v.name), v.shape)


STEPS = [
    ("floor", lambda s: True, _unary("K.floor({0} * 2.0) * 0.5 + {0} * 0.25")),
    ("ceil", lambda s: True, _unary("K.ceil({0}) - {0} * 0.5")),
    ("round", lambda s: True, _unary("K.round({0} * 3.0) + {0}")),
    ("trunc", lambda s: True, _unary("K.trunc({0} * 1.7) + {0} * 0.5")),
    ("log1p", lambda s: True, _unary("K.log1p(K.abs({0}))")),
    ("expm1", lambda s: True, _unary("K.expm1(K.clamp({0}, -3.0, 2.0))")),
    ("floordiv", lambda s: True, _unary("{0} // 0.75 + {0} * 0.1")),
    ("mod", lambda s: True, _unary("{0} % 0.8 + {0} * 0.3")),
    ("rmod", lambda s: True, _unary("(-{0}) % 1.5 - {0}")),
    ("where_scalar", lambda s: True, _unary("K.where({0} > 0.2, {0}, 0.5)")),
    ("masked_fill", lambda s: True, _unary("K.masked_fill({0}, {0} < -0.3, -1.25)")),
    ("clamp", lambda s: True, _unary("K.clamp({0}, -1.0, 1.5)")),
    ("isnan", lambda s: True, _unary("K.where(K.isnan({0}), 0.0, {0}) + K.isfinite({0}).astype(kiln.float32)")),
    ("leaky_relu", lambda s: True, _unary("K.leaky_relu({0}, 0.1)")),
    ("elu", lambda s: True, _unary("K.elu({0})")),
    ("softplus", lambda s: True, _unary("K.softplus({0})")),
    ("hardswish", lambda s: True, _unary("K.hardswish({0})")),
    ("mish", lambda s: True, _unary("K.mish({0})")),
    ("gelu_tanh", lambda s: True, _unary("K.gelu({0}, approximate='tanh')")),
    ("cumsum", lambda s: True, lambda r, v, o: (f"K.cumsum({v.name}, {_axis(r, v)}) * 0.25", v.shape)),
    ("cumprod", lambda s: True,
     lambda r, v, o: (f"K.cumprod(K.clamp({v.name}, -1.2, 1.2), {_axis(r, v)})", v.shape)),
    ("sort", lambda s: True,
     lambda r, v, o: (f"K.sort({v.name}, {_axis(r, v)}, descending={r.random() < 0.5})[0]", v.shape)),
    ("flip", lambda s: True, lambda r, v, o: (f"K.flip({v.name}, ({_axis(r, v)},))", v.shape)),
    ("roll", lambda s: True,
     lambda r, v, o: (f"K.roll({v.name}, {r.randint(-3, 3)}, {_axis(r, v)})", v.shape)),
    ("tril", lambda s: len(s) >= 2, lambda r, v, o: (f"K.tril({v.name}, {r.randint(-1, 1)})", v.shape)),
    ("triu", lambda s: len(s) >= 2, lambda r, v, o: (f"K.triu({v.name}, {r.randint(-1, 1)})", v.shape)),
    ("softmax", lambda s: True, lambda r, v, o: (f"K.softmax({v.name}, {_axis(r, v)})", v.shape)),
    ("log_softmax", lambda s: True, lambda r, v, o: (f"K.log_softmax({v.name}, -1) * 0.3", v.shape)),
    ("pad", lambda s: True,
     lambda r, v, o: _pad(r, v)),
    ("tile", lambda s: True,
     lambda r, v, o: (f"K.tile({v.name}, {(1,) * (len(v.shape) - 1) + (2,)})", v.shape[:-1] + (2 * v.shape[-1],))),
    ("repeat_interleave", lambda s: True,
     lambda r, v, o: (f"K.repeat_interleave({v.name}, 2, axis={len(v.shape) - 1})", v.shape[:-1] + (2 * v.shape[-1],))),
    ("topk", lambda s: s[-1] >= 3,
     lambda r, v, o: (f"K.topk({v.name}, 2, dim=-1, largest={r.random() < 0.5})[0]", v.shape[:-1] + (2,))),
    ("norm", lambda s: len(s) >= 2,
     lambda r, v, o: (f"K.norm({v.name}, dim=-1, keepdim=True) * {v.name}", v.shape)),
    ("einsum", lambda s: len(s) >= 2,
     lambda r, v, o: (f"K.einsum('...ij,...kj->...ik', {v.name}, {v.name}) * 0.2", v.shape[:-1] + (v.shape[-2],))),
    ("bmm", lambda s: len(s) == 3,
     lambda r, v, o: (f"K.bmm({v.name}, {v.name}.transpose(0, 2, 1)) * 0.2", v.shape[:-1] + (v.shape[-2],))),
    ("one_hot", lambda s: True,
     lambda r, v, o: (f"K.one_hot(K.argmax({v.name}, -1), {v.name}.shape[-1]).astype(kiln.float32) * {v.name}",
                      v.shape)),
    ("gather_elements", lambda s: True,
     lambda r, v, o: (f"K.gather_elements({v.name}, -1, K.argsort({v.name}, -1))", v.shape)),
    ("binary_add", lambda s: True,
     lambda r, v, o: (f"{v.name} + {o.name} * 0.5" if o else f"{v.name} + 1.0", v.shape)),
    ("binary_max", lambda s: True,
     lambda r, v, o: (f"K.maximum({v.name}, {o.name})" if o else f"K.maximum({v.name}, 0.1)", v.shape)),
    ("binary_mod", lambda s: True,
     lambda r, v, o: (f"{v.name} % (K.abs({o.name}) + 0.5)" if o else f"{v.name} % 0.9", v.shape)),
    ("binary_floordiv", lambda s: True,
     lambda r, v, o: (f"{v.name} // (K.abs({o.name}) + 0.5) * 0.25" if o else f"{v.name} // 1.25", v.shape)),
]

# Reductions that end a program (one scalar or a smaller tensor per output).
ENDINGS = [
    lambda v: f"{v.name}.sum(-1)",
    lambda v: f"{v.name}.mean()",
    lambda v: f"K.amax({v.name}, -1)",
    lambda v: f"K.mse_loss({v.name}, {v.name} * 0.5)",
    lambda v: f"K.smooth_l1_loss({v.name}, {v.name} * 0.0, reduction='mean')",
    lambda v: f"K.binary_cross_entropy_with_logits({v.name}, K.sigmoid({v.name} * 0.0 + 0.3))",
    lambda v: f"K.cross_entropy({v.name}.reshape(-1, {v.name}.shape[-1]), K.argmax({v.name}, -1).reshape(-1))",
]


def _pad(r, v):
    lo, hi = r.randint(0, 2), r.randint(0, 2)
    return f"K.pad({v.name}, ({lo}, {hi}))", v.shape[:-1] + (v.shape[-1] + lo + hi,)


class Program:
    def __init__(self, seed, source, fn, shapes):
        self.seed, self.source, self.fn, self.shapes = seed, source, fn, shapes

    def inputs(self, k=0, grow=0):
        """Input arrays (k: which draw); grow: every size that many larger (the program's steps hold
        for sizes 2 to 7)."""
        rng = np.random.default_rng([self.seed, k])
        return [rng.uniform(-2.5, 2.5, tuple(d + grow for d in s)).astype(np.float32) for s in self.shapes]

    def __repr__(self):
        return f"modelops seed {self.seed}:\n{self.source}"


def generate(seed, grad_safe=False):
    r = random.Random(seed)
    rank = r.choice((1, 2, 2, 3))
    shape = tuple(r.randint(2, 5) for _ in range(rank))
    n_in = r.choice((1, 2))
    vals = [_Value(f"x{k}", shape, "input") for k in range(n_in)]
    lines = []
    steps = [s for s in STEPS if not (grad_safe and s[0] in ("isnan",))]
    for k in range(r.randint(3, 6)):
        v = r.choice(vals)
        options = [s for s in steps if s[1](v.shape)]
        name, _, make = r.choice(options)
        other = next((u for u in vals if u is not v and u.key == v.key), None)
        expr, new_shape = make(r, v, other)
        out = _Value(f"t{k}", new_shape, v.key if new_shape == v.shape else f"{expr}")
        lines.append(f"    {out.name} = {expr}  # {name}")
        vals.append(out)
    last = vals[-1]
    outs = [r.choice(ENDINGS)(last)]
    if r.random() < 0.5:
        outs.append(vals[-2].name if len(vals) > n_in + 1 else last.name)
    params = ", ".join(v.name for v in vals[:n_in])
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    source = f"def f({params}):\n" + "\n".join(lines) + f"\n    return {ret}\n"
    filename = f"<modelops seed {seed}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"kiln": kiln, "K": kiln.ops}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated source
    return Program(seed, source, namespace["f"], [shape] * n_in)


if __name__ == "__main__":
    import sys

    for s in sys.argv[1:] or ["0"]:
        print(generate(int(s)))
