"""Seeded random Python programs over tensors, for the conformance suite's differential test
(test_conformance_random.py): Python semantics around the tensor maths.

Each program is `make(scale)` returning `f(x, y, n, flag, items)`: x, y float tensors (2x3 or
4x3), n a Python int, flag a bool, items a list of tensors of varying length. Its statements mix
tensor maths with a local list and dict (append, index, get, `in`), a closure helper reading
`scale`, builtins (len, range, enumerate, zip, min, max, abs, sum), `and`/`or`/`not` on Python
values and on tensor conditions, conditional expressions, if/elif/else and while loops on tensor
and Python conditions, for loops over ranges, the items and enumerate, break / continue / early
return, and side effects (appends to the global LOG). It returns x, acc, n, k, the list and the
dict. Reproduce a failure's program with
    PYTHONPATH=python:tests/python python3 -c "import pygen; print(pygen.source(SEED))"
"""
import linecache
import random

import kiln

LOG = []  # the programs' side effects: cleared before each run, compared after each call


class Holder:
    """An object outside the programs whose attributes they set (escapes=True)."""


HOLDER = Holder()
KEPT = {}  # a dict outside the programs they store into (escapes=True)


def reset():
    LOG.clear()
    KEPT.clear()
    HOLDER.__dict__.clear()


def snapshot():
    """What the programs did outside, copied deep (lists handed out change after they are)."""
    def copy(v, depth=0):
        if isinstance(v, kiln.Tensor):
            return v.asnumpy().copy()
        if depth > 8:
            return "..."
        if isinstance(v, (list, tuple)):
            return type(v)(copy(x, depth + 1) for x in v)
        if isinstance(v, dict):
            return {k: copy(x, depth + 1) for k, x in v.items()}
        if isinstance(v, set):
            return sorted(v)
        return v

    return copy(LOG), copy(KEPT), copy(dict(HOLDER.__dict__))


class _Gen:
    def __init__(self, seed, escapes=False):
        self.escapes = escapes
        self.r = random.Random(seed)
        self.lines = []
        self.counters = 0
        self.iterating_lst = False

    def emit(self, depth, text):
        self.lines.append("    " * depth + text)

    def num(self, lo=-1.5, hi=1.5):
        return f"{self.r.uniform(lo, hi):.2f}"

    def tensor_cond(self):
        lhs = self.r.choice(["x.sum()", "acc.mean()", "x.max()", "(x * acc).sum()", "lst[-1].min()", "d['a'].sum()"])
        return f"{lhs} {self.r.choice(['>', '<', '>=', '<='])} {self.num()}"

    def python_cond(self):
        return self.r.choice([f"n > {self.r.randint(0, 3)}", "flag", "not flag", f"len(lst) > {self.r.randint(1, 3)}",
                              "len(items) > 1", "'b' in d", f"k < {self.num(0, 2)}", "x.shape[0] == 2"])

    def cond(self):
        roll = self.r.random()
        if roll < 0.4:
            c = self.tensor_cond()
        elif roll < 0.7:
            c = self.python_cond()
        elif roll < 0.8:
            c = f"{self.python_cond()} and {self.tensor_cond()}"
        elif roll < 0.9:
            c = f"{self.tensor_cond()} or {self.python_cond()}"
        else:
            c = f"not ({self.tensor_cond()})"
        return c

    def simple(self, depth):
        a, b = self.num(0.3, 1.5), self.num(-0.5, 0.5)
        choices = [
            f"x = kiln.ops.tanh(x * {a} + {b})",
            f"acc = acc * 0.5 + x * {a}",
            "n = n + 1",
            f"n = (n and n + 1) or {self.r.randint(1, 3)}",
            f"k = max(k, {a}) if flag else min(k, {b})",
            f"k = abs(k - {a}) + len(lst) * 0.1",
            f"acc = acc + lst[len(lst) // 2] * {a}",
            f"acc = acc + d.get('b', y) * {b}",
            f"d['b'] = acc * {a}",
            "acc = helper(acc, x)",
            f"x = x * {a} if x.sum() > {b} else x - acc * {b}",
            "x, acc = acc * 0.5, x",
            f"acc = acc + sum(items) * {b}",
            "LOG.append(n)",
            "LOG.append(len(lst))",
            f"k = k * {a} if (flag or n > 1) else k + {b}",
        ]
        if not self.iterating_lst:
            choices.append(f"lst.append(x * {a})")
        if self.escapes:  # the program's own containers handed to objects outside it, then changed
            choices += ["LOG.append(lst)", "LOG.append(d)", "KEPT['lst'] = lst", "HOLDER.d = d",
                        "LOG.append((lst, n))", "s.add(n)", "s.add(len(lst))", "LOG.append(s)",
                        "n = n + len(s)", f"d['c'] = [x * {a}]", "d.setdefault('e', []).append(n)",
                        "LOG.append(len(d.get('e', ())))", "acc = acc + len(KEPT.get('lst', ())) * 0.1"]
        self.emit(depth, self.r.choice(choices))

    def block(self, depth, budget, loop=None, returns=True):
        for _ in range(self.r.randint(1, 3)):
            roll = self.r.random()
            if budget <= 0 or roll < 0.45:
                self.simple(depth)
            elif roll < 0.65:
                self.emit(depth, f"if {self.cond()}:")
                self.block(depth + 1, budget - 1, loop, returns)
                if self.r.random() < 0.35:
                    self.emit(depth, f"elif {self.cond()}:")
                    self.block(depth + 1, budget - 1, loop, returns)
                if self.r.random() < 0.5:
                    self.emit(depth, "else:")
                    self.block(depth + 1, budget - 1, loop, returns)
            elif roll < 0.73:
                c = f"c{self.counters}"
                self.counters += 1
                self.emit(depth, f"{c} = 0")
                self.emit(depth, f"while {c} < {self.r.randint(1, 3)} and {self.tensor_cond()}:")
                self.emit(depth + 1, f"{c} = {c} + 1")
                self.block(depth + 1, budget - 1, "while", returns=False)
            elif roll < 0.87:
                kind = self.r.randrange(4)
                was = self.iterating_lst
                if kind == 0:
                    self.emit(depth, f"for i in range({self.r.randint(0, 3)}):")
                    self.emit(depth + 1, "acc = acc + x * i")
                elif kind == 1:
                    self.emit(depth, "for it in items:")
                    self.emit(depth + 1, f"acc = acc + it * {self.num()}")
                elif kind == 2:
                    self.emit(depth, "for i, v in enumerate(list(lst)):")
                    self.emit(depth + 1, "acc = acc + v * (i + 1) * 0.1")
                    self.iterating_lst = True
                else:
                    self.emit(depth, "for w, z in zip([0.5, -1.0, 2.0], items):")
                    self.emit(depth + 1, "acc = acc + z * w")
                self.block(depth + 1, budget - 1, "for", returns)
                self.iterating_lst = was
            elif loop is not None and roll < 0.94:
                self.emit(depth, f"if {self.cond()}:")
                self.emit(depth + 1, self.r.choice(["break", "continue"]))
            elif returns:
                self.emit(depth, f"if {self.cond()}:")
                self.emit(depth + 1, "return x * 2, acc, n, k, lst, d")
            else:
                self.simple(depth)


def source(seed, escapes=False):
    g = _Gen(seed, escapes)
    g.emit(2, "acc = x * 0")
    g.emit(2, "lst = [x, y]")
    g.emit(2, "d = {'a': y * 0.5}")
    g.emit(2, "k = 1.0")
    if escapes:
        g.emit(2, "s = {0}")
    g.block(2, 3)
    g.emit(2, "return x, acc + k, n, k, lst, d")
    head = ["def make(scale):", "    def helper(v, w):", "        return v * scale + w * 0.5", "",
            "    def f(x, y, n, flag, items):"]
    return "\n".join(head + g.lines + ["    return f", ""])


def maker(seed, escapes=False):
    """make of `seed` (make(scale) -> f), its source registered in linecache."""
    text = source(seed, escapes)
    filename = f"<pygen seed {seed}{' escapes' if escapes else ''}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace = {"kiln": kiln, "LOG": LOG, "KEPT": KEPT, "HOLDER": HOLDER}
    exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - our own generated source
    return namespace["make"]


def program(seed, scale=0.75, escapes=False):
    """The function f of `seed`, made with closure value scale."""
    return maker(seed, escapes)(scale)


if __name__ == "__main__":
    import sys

    print(source(int(sys.argv[1])))
