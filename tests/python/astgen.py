"""Seeded random Python functions with control flow, for testing capture_mode="ast".

Each program takes a float tensor x (2x3) and returns (x, acc, n): tensors x and acc, Python
number n (a 0-d tensor once a tensor condition touched it). Its statements mix assignments,
if/elif/else on tensor values and on Python values, while loops on tensor conditions (bounded by
a counter), for loops over ranges, lists and zip, break, continue and early return, nested up to
a few levels. Values stay modest (tanh). The source is registered in linecache so the converter
can read it back, and reproduces a failure by printing it:
    PYTHONPATH=python:tests/python python3 -c "import astgen; print(astgen.source(SEED))"
"""
import linecache
import random

import kiln


class _Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.lines = []
        self.counters = 0

    def emit(self, depth, text):
        self.lines.append("    " * depth + text)

    def tensor_cond(self):
        lhs = self.r.choice(["x.sum()", "acc.mean()", "x.max()", "(x * acc).sum()", "x.min()"])
        op = self.r.choice([">", "<", ">=", "<="])
        return f"{lhs} {op} {self.r.uniform(-1.5, 1.5):.2f}"

    def static_cond(self):
        return self.r.choice([f"n > {self.r.randint(0, 4)}", f"k < {self.r.uniform(0, 2):.2f}", "x.shape[0] == 2",
                              "x.ndim > 3"])

    def cond(self):
        c = self.tensor_cond() if self.r.random() < 0.7 else self.static_cond()
        roll = self.r.random()
        if roll < 0.15:
            return f"not ({c})"
        if roll < 0.3:
            return f"{c} and {self.tensor_cond()}"
        if roll < 0.4:
            return f"{c} or {self.static_cond()}"
        return c

    def simple(self, depth):
        choice = self.r.randrange(5)
        a, b = self.r.uniform(0.3, 1.5), self.r.uniform(-0.5, 0.5)
        if choice == 0:
            self.emit(depth, f"x = kiln.ops.tanh(x * {a:.2f} + {b:.2f})")
        elif choice == 1:
            self.emit(depth, f"acc = acc * 0.5 + x * {a:.2f}")
        elif choice == 2:
            self.emit(depth, "n = n + 1")
        elif choice == 3:
            self.emit(depth, f"x = x - acc * {b:.2f} if x.sum() > {b:.2f} else x * {a:.2f}")
        else:
            self.emit(depth, f"k = k * {a:.2f}")

    def block(self, depth, budget, loop=None, returns=True):
        """Statements at `depth`; loop: 'for' or 'while' when inside one (break/continue allowed)."""
        for _ in range(self.r.randint(1, 3)):
            roll = self.r.random()
            if budget <= 0 or roll < 0.45:
                self.simple(depth)
            elif roll < 0.65:
                self.emit(depth, f"if {self.cond()}:")
                self.block(depth + 1, budget - 1, loop, returns)
                if self.r.random() < 0.4:
                    self.emit(depth, f"elif {self.cond()}:")
                    self.block(depth + 1, budget - 1, loop, returns)
                if self.r.random() < 0.6:
                    self.emit(depth, "else:")
                    self.block(depth + 1, budget - 1, loop, returns)
            elif roll < 0.75:
                c = f"c{self.counters}"
                self.counters += 1
                self.emit(depth, f"{c} = 0")
                self.emit(depth, f"while {c} < {self.r.randint(1, 4)} and {self.tensor_cond()}:")
                self.emit(depth + 1, f"{c} = {c} + 1")
                self.block(depth + 1, budget - 1, "while", returns=False)
            elif roll < 0.87:
                it = self.r.choice([f"range({self.r.randint(0, 4)})", "[0.5, 1.5, -1.0]", "zip([1, 2], [0.5, 0.25])"])
                target = "i, j" if it.startswith("zip") else "i"
                self.emit(depth, f"for {target} in {it}:")
                self.emit(depth + 1, "acc = acc + x * i")
                self.block(depth + 1, budget - 1, "for", returns)
            elif loop is not None and roll < 0.95:
                self.emit(depth, f"if {self.cond()}:")
                self.emit(depth + 1, self.r.choice(["break", "continue"]))
            elif returns:
                self.emit(depth, f"if {self.cond()}:")
                self.emit(depth + 1, "return x * 2, acc, n")
            else:
                self.simple(depth)


def source(seed):
    g = _Gen(seed)
    g.emit(1, "acc = x * 0")
    g.emit(1, "n = 0")
    g.emit(1, "k = 1.0")
    g.block(1, 3)
    g.emit(1, "return x, acc + k, n")
    return "def f(x):\n" + "\n".join(g.lines) + "\n"


def program(seed):
    """The function of `seed`, compiled from source registered in linecache."""
    text = source(seed)
    filename = f"<astgen seed {seed}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace = {"kiln": kiln}
    exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - our own generated source
    return namespace["f"]
