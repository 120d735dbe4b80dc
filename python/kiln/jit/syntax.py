"""What capture_mode="ast" accepts: kiln.JitSyntaxError and the check of a function's syntax tree
for constructs that cannot become a graph."""
import ast


class JitSyntaxError(SyntaxError):
    """Code that capture_mode="ast" cannot compile to a graph. `filename`, `lineno` and `offset`
    (1-based column) locate it; `construct` names it and `hint` says what to write instead;
    `capture_mode` names the mode that refused it (bytecode capture's fullgraph=True raises it too)."""

    def __init__(self, construct, filename, lineno, col, hint="", capture_mode="ast"):
        where = f"{filename}:{lineno}:{col}" if lineno else filename
        msg = f"{construct} is not supported by kiln.jit(capture_mode=\"{capture_mode}\") at {where}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)
        self.msg = msg
        self.filename, self.lineno, self.offset = filename, lineno, col
        self.construct, self.hint = construct, hint

    def __str__(self):
        return self.msg


class SourceLocation:
    """The file of a converted function and the indentation its source lost to dedenting, so
    node positions can be reported as the user's (1-based) line and column."""

    __slots__ = ("filename", "col_shift")

    def __init__(self, filename, col_shift):
        self.filename, self.col_shift = filename, col_shift

    def loc(self, node):
        return (self.filename, getattr(node, "lineno", 0), getattr(node, "col_offset", 0) + self.col_shift + 1)

    def error(self, node, construct, hint=""):
        filename, line, col = self.loc(node)
        return JitSyntaxError(construct, filename, line, col, hint)


_UNSUPPORTED = {
    ast.Try: ("a try statement", "handle errors outside the jitted function"),
    ast.With: ("a with statement", "enter the context outside the jitted function"),
    ast.AsyncWith: ("async with", "jitted functions cannot be coroutines"),
    ast.AsyncFor: ("async for", "jitted functions cannot be coroutines"),
    ast.AsyncFunctionDef: ("an async function", "jitted functions cannot be coroutines"),
    ast.Await: ("await", "jitted functions cannot be coroutines"),
    ast.Yield: ("yield", "return a tuple or list instead of generating values"),
    ast.YieldFrom: ("yield from", "return a tuple or list instead of generating values"),
    ast.Global: ("a global declaration", "pass the value in as an argument and return the new value"),
    ast.Nonlocal: ("a nonlocal declaration", "pass the value in as an argument and return the new value"),
    ast.Delete: ("a del statement", "rebind the name instead"),
    ast.ClassDef: ("a class definition", "define the class at module level"),
    ast.NamedExpr: ("an assignment expression (:=)", "assign in a separate statement"),
    ast.Match: ("a match statement", "use if/elif"),
    ast.Import: ("an import statement", "import at module level"),
    ast.ImportFrom: ("an import statement", "import at module level"),
}
if hasattr(ast, "TryStar"):
    _UNSUPPORTED[ast.TryStar] = _UNSUPPORTED[ast.Try]


def check(fdef, where):
    """Raises JitSyntaxError at the first construct of the function definition `fdef` (its body
    and nested functions) that the converter does not handle."""
    for node in ast.walk(fdef):
        what = _UNSUPPORTED.get(type(node))
        if what is not None:
            raise where.error(node, *what)
        if isinstance(node, ast.FunctionDef) and node is not fdef and node.decorator_list:
            raise where.error(node, "a decorated function definition inside a jitted function",
                              "define it at module level, or apply the decorator outside")
