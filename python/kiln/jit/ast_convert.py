"""capture_mode="ast": a function's source rewritten so that its control flow goes through the
helpers of ast_runtime (which decide, while the graph is captured, between plain Python for
static conditions and kiln.ops.cond / kiln.ops.while_loop for tensor-valued ones).

The rewrite, per function definition (nested ones included):
  1. `return` inside a loop becomes a flag, a saved value and `break`; after the loop,
     `if flag: return value`.
  2. `break` / `continue` become flags; the statements after them are guarded by `if not flag`
     and a broken loop stops (while: its test; for: its extra test). Loop `else:` clauses move
     after the loop, guarded by the break flag.
  3. Statements after an `if` that returns on some path are copied into its paths that do not,
     so every `if` holding a `return` returns on all paths (an `if` statement that yields the
     function's result).
  4. `if`, `while`, `for`, conditional expressions, `and`/`or`/`not` and chained comparisons
     become helper calls over generated functions that take and return the variables the block
     assigns; calls go through `converted_call`, which converts user functions, methods and
     Cell.construct recursively.
The result is compiled with the original file name and line numbers, so tracebacks and the
source lines the tracer records are the user's."""
import ast
import copy
import inspect
import os
import sys
import textwrap
import time
import types

from .syntax import JitSyntaxError, SourceLocation, check

RT = "__kiln"  # the name under which converted code sees ast_runtime


# ---- analysis ----------------------------------------------------------------------------

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)
_LOOPS = (ast.For, ast.While)


def _walk(node, stop_at_loops=False):
    """Nodes under `node` in its own scope (nested functions, lambdas and comprehensions left out;
    with stop_at_loops, nested loops too)."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, _SCOPES) or (stop_at_loops and isinstance(n, _LOOPS)):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                yield n  # its name is bound here
            continue
        yield n
        todo.extend(ast.iter_child_nodes(n))


def _walk_block(stmts, stop_at_loops=False):
    for s in stmts:
        if isinstance(s, _SCOPES) or (stop_at_loops and isinstance(s, _LOOPS)):
            yield s
            continue
        yield s
        yield from _walk(s, stop_at_loops)


def assigned_names(stmts):
    """Names a block binds, in first-binding order."""
    out = {}
    for n in _walk_block(stmts):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out[n.id] = None
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
            base = n.value
            while isinstance(base, ast.Subscript):
                base = base.value
            if isinstance(base, ast.Name):  # x[i] = v writes x: the block's new x
                out[base.id] = None
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            out[n.name] = None
    return list(out)


def writes_in_place(stmts):
    """Whether a block assigns to a subscript (x[i] = v, x[i] += v): an in-place write."""
    return any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) for n in _walk_block(stmts))


def _contains(stmts, kinds, stop_at_loops=False):
    return any(isinstance(n, kinds) for n in _walk_block(stmts, stop_at_loops))


def _always_returns(stmts):
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return True
    return isinstance(last, ast.If) and _always_returns(last.body) and _always_returns(last.orelse)


# ---- small builders ------------------------------------------------------------------------

def _name(id_, store=False):
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def _assign(name, value, at):
    node = ast.Assign(targets=[_name(name, True)], value=value if isinstance(value, ast.AST) else ast.Constant(value))
    return ast.copy_location(node, at)


def _not(name):
    return ast.UnaryOp(op=ast.Not(), operand=_name(name))


def _rt(attr):
    return ast.Attribute(value=_name(RT), attr=attr, ctx=ast.Load())


def _call_rt(attr, *args):
    return ast.Call(func=_rt(attr), args=list(args), keywords=[])


_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul", ast.LShift: "lshift", ast.RShift: "rshift",
           ast.BitOr: "or_", ast.BitXor: "xor", ast.BitAnd: "and_"}  # -> the operator module's function
_UNARY = {ast.USub: "neg", ast.UAdd: "pos", ast.Invert: "invert"}

_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_OTHER_TESTS = {ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}


def _comparison(loc, left, op, right, at):
    """`left op right`: an order or equality test through ast_runtime.binary (a chosen number's
    comparison is a bool), is / in as they are."""
    name = _COMPARE.get(type(op))
    node = _call_rt("binary", loc, ast.Constant(name), left, right) if name else ast.Compare(
        left=left, ops=[op], comparators=[right])
    return ast.copy_location(node, at)


_CONDITION_FORMS = {"and_": "and_cond", "or_": "or_cond", "not_": "not_cond"}


def _as_condition(test):
    """test, read only for its truth (an if / while / assert test): its `and`, `or` and `not` on
    tensors may give a bool tensor instead of an operand (ast_runtime.and_cond and friends)."""
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and isinstance(test.func.value, ast.Name)
            and test.func.value.id == RT and test.func.attr in _CONDITION_FORMS):
        test.func = _rt(_CONDITION_FORMS[test.func.attr])
        for k, arg in enumerate(test.args):
            if isinstance(arg, ast.Lambda):
                arg.body = _as_condition(arg.body)
            elif not isinstance(arg, ast.Tuple):  # not's operand (a location tuple is left alone)
                test.args[k] = _as_condition(arg)
    return test


def _tuple(elts, store=False):
    return ast.Tuple(elts=list(elts), ctx=ast.Store() if store else ast.Load())


def _strs(names):
    return ast.Constant(tuple(names))


def _def(name, params, body, at):
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], vararg=None, kwonlyargs=[],
                         kw_defaults=[], kwarg=None, defaults=[])
    fd = ast.FunctionDef(name=name, args=args, body=body or [ast.Pass()], decorator_list=[], returns=None,
                         type_comment=None)
    return ast.copy_location(fd, at)


class _Names:
    def __init__(self):
        self.n = 0

    def __call__(self, kind):
        self.n += 1
        return f"__kiln_{kind}_{self.n}"


# ---- steps 1-3: returns in loops, break/continue, returns under if ---------------------------

def _lower_loop_returns(stmts, fresh):
    out = []
    for s in stmts:
        if isinstance(s, _LOOPS) and _contains([s], ast.Return):
            ret, val = fresh("ret"), fresh("retval")
            out.append(_assign(ret, False, s))
            s.body = _returns_to_breaks(s.body, ret, val)
            out.append(s)
            out.append(ast.copy_location(ast.If(test=_name(ret), body=[ast.copy_location(ast.Return(_name(val)), s)],
                                                orelse=[]), s))
            continue
        if isinstance(s, ast.If):
            s.body = _lower_loop_returns(s.body, fresh)
            s.orelse = _lower_loop_returns(s.orelse, fresh)
        out.append(s)
    return out


def _returns_to_breaks(stmts, ret, val):
    out = []
    for s in stmts:
        if isinstance(s, ast.Return):
            out += [_assign(ret, True, s), _assign(val, s.value or ast.Constant(None), s),
                    ast.copy_location(ast.Break(), s)]
            return out
        if isinstance(s, ast.If):
            s.body = _returns_to_breaks(s.body, ret, val)
            s.orelse = _returns_to_breaks(s.orelse, ret, val)
        elif isinstance(s, _LOOPS) and _contains([s], ast.Return):
            s.body = _returns_to_breaks(s.body, ret, val)
            s.orelse = _returns_to_breaks(s.orelse, ret, val)  # runs outside the inner loop: breaks this one
            out.append(s)
            out.append(ast.copy_location(ast.If(test=_name(ret), body=[ast.copy_location(ast.Break(), s)],
                                                orelse=[]), s))
            continue
        out.append(s)
    return out


def _lower_breaks(stmts, fresh):
    """Every loop in the block (at any depth) rewritten without break/continue/else."""
    out = []
    for s in stmts:
        if isinstance(s, ast.If):
            s.body = _lower_breaks(s.body, fresh)
            s.orelse = _lower_breaks(s.orelse, fresh)
            out.append(s)
        elif isinstance(s, _LOOPS):
            out += _lower_loop(s, fresh)
        else:
            out.append(s)
    return out


def _lower_loop(loop, fresh):
    loop.body = _lower_breaks(loop.body, fresh)
    has_break = _contains(loop.body, ast.Break, stop_at_loops=True)
    has_cont = _contains(loop.body, ast.Continue, stop_at_loops=True)
    brk = fresh("break") if has_break else None
    cnt = fresh("continue") if has_cont else None
    pre, post = [], []
    if has_break or has_cont:
        body = _guard(loop.body, brk, cnt)
        if has_cont:
            body = [_assign(cnt, False, loop)] + body
        if has_break:
            pre.append(_assign(brk, False, loop))
            if isinstance(loop, ast.While):
                loop.test = ast.copy_location(ast.BoolOp(op=ast.And(), values=[_not(brk), loop.test]), loop.test)
            else:  # an unrolled for loop keeps iterating once the flag is a tensor: guard the whole body
                loop.kiln_break = brk
                body = [ast.copy_location(ast.If(test=_not(brk), body=body, orelse=[]), loop)]
        loop.body = body
    if loop.orelse:
        post = [ast.copy_location(ast.If(test=_not(brk), body=loop.orelse, orelse=[]), loop)] if has_break \
            else loop.orelse
        post = _lower_breaks(post, fresh)
        loop.orelse = []
    return pre + [loop] + post


def _guard(stmts, brk, cnt):
    out = []
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Break):
            out.append(_assign(brk, True, s))
            return out
        if isinstance(s, ast.Continue):
            out.append(_assign(cnt, True, s))
            return out
        if isinstance(s, ast.If) and _contains([s], (ast.Break, ast.Continue), stop_at_loops=True):
            may_break = _contains([s], ast.Break, stop_at_loops=True)
            may_cont = _contains([s], ast.Continue, stop_at_loops=True)
            s.body, s.orelse = _guard(s.body, brk, cnt), _guard(s.orelse, brk, cnt)
            out.append(s)
            rest = stmts[i + 1:]
            if rest:
                flags = ([brk] if may_break else []) + ([cnt] if may_cont else [])
                test = _not(flags[0]) if len(flags) == 1 else ast.UnaryOp(
                    op=ast.Not(), operand=ast.BoolOp(op=ast.Or(), values=[_name(f) for f in flags]))
                out.append(ast.copy_location(ast.If(test=test, body=_guard(rest, brk, cnt), orelse=[]), rest[0]))
            return out
        out.append(s)
    return out


def _normalize_returns(stmts):
    out = []
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            out.append(s)
            return out
        if isinstance(s, ast.If) and _contains([s], ast.Return):
            rest = stmts[i + 1:]
            body = s.body if _always_returns(s.body) else s.body + copy.deepcopy(rest)
            orelse = s.orelse if _always_returns(s.orelse) else s.orelse + copy.deepcopy(rest)
            s.body, s.orelse = _normalize_returns(body), _normalize_returns(orelse)
            s.kiln_returns = True
            out.append(s)
            return out
        out.append(s)
    return out


def prepare_body(fdef, fresh):
    body = _lower_loop_returns(fdef.body, fresh)
    body = _lower_breaks(body, fresh)
    if not _always_returns(body):
        body.append(ast.copy_location(ast.Return(ast.Constant(None)), body[-1] if body else fdef))
    fdef.body = _normalize_returns(body)


# ---- step 4: control flow and calls through the runtime helpers ------------------------------

def bound_names(fdef):
    """Every name the function (nested defs included) binds: parameters, assignment and loop
    targets, defs, classes and imports. A name only written through (G[k] = v on a global or
    closed-over dict) is not: the block mutates its object and does not rebind it."""
    out = set()
    for n in ast.walk(fdef):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


class _Converter(ast.NodeTransformer):
    def __init__(self, where, fresh, class_name, bound=None):
        self.where, self.fresh = where, fresh
        self.bound = bound  # bound_names of the function converted (None: every name counts)
        self.mangle_prefix = f"_{class_name.lstrip('_')}" if class_name and class_name.strip("_") else None
        self.first_params = []  # first parameter of each enclosing def (for zero-argument super())

    def _loc(self, node):
        return ast.Constant(self.where.loc(node))

    def _mangle(self, name):
        if self.mangle_prefix and name.startswith("__") and not name.endswith("__") and not name.startswith("__kiln"):
            return self.mangle_prefix + name
        return name

    def visit_Attribute(self, node):
        node.attr = self._mangle(node.attr)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        prepare_body(node, self.fresh)
        node.name = self._mangle(node.name)
        params = node.args.posonlyargs + node.args.args
        self.first_params.append(params[0].arg if params else None)
        try:
            self.generic_visit(node)
        finally:
            self.first_params.pop()
        return node

    # -- expressions
    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Name) and f.id == "super" and not node.args and not node.keywords:
            first = self.first_params[-1] if self.first_params else None
            if first is None:
                raise self.where.error(node, "super() without arguments outside a method")
            node.args = [_name("__class__"), _name(first)]
            return node
        node.args = [self._loc(node), f] + node.args
        node.func = _rt("converted_call")
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        thunks = [ast.Lambda(args=_no_args(), body=v) for v in node.values]
        return ast.copy_location(_call_rt("and_" if isinstance(node.op, ast.And) else "or_", self._loc(node),
                                          *thunks), node)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(_call_rt("not_", self._loc(node), node.operand), node)
        return ast.copy_location(_call_rt("unary", ast.Constant(_UNARY[type(node.op)]), node.operand), node)

    # Arithmetic goes through ast_runtime.binary / unary (the operator module's functions): a number
    # an if or loop on a tensor made a 0-d tensor stays a Python number through it.
    def visit_BinOp(self, node):
        self.generic_visit(node)
        return ast.copy_location(_call_rt("binary", self._loc(node), ast.Constant(_BINARY[type(node.op)]), node.left,
                                          node.right),
                                 node)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        if not isinstance(node.target, ast.Name):
            return node  # (x[i] += v, obj.a += v: evaluated once as Python does)
        value = _call_rt("binary", self._loc(node), ast.Constant("i" + _BINARY[type(node.op)].rstrip("_")),
                         _name(node.target.id), node.value)
        return ast.copy_location(ast.Assign(targets=[_name(node.target.id, True)], value=value), node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) == 1:
            return _comparison(self._loc(node), node.left, node.ops[0], node.comparators[0], node)
        # `a < b < c`: each operand evaluated once, and only while the comparisons before it hold
        # (ast_runtime.chain_parts keeps the values the parts share)
        names = ast.Tuple(elts=[ast.Constant(_COMPARE.get(type(op)) or _OTHER_TESTS[type(op)]) for op in node.ops],
                          ctx=ast.Load())
        operands = [ast.Lambda(args=_no_args(), body=v) for v in [node.left] + node.comparators]
        parts = ast.Starred(value=_call_rt("chain_parts", self._loc(node), names, *operands), ctx=ast.Load())
        return ast.copy_location(_call_rt("and_", self._loc(node), parts), node)

    def visit_IfExp(self, node):
        self.generic_visit(node)
        node.test = _as_condition(node.test)
        call = _call_rt("if_exp", node.test, ast.Lambda(args=_no_args(), body=node.body),
                        ast.Lambda(args=_no_args(), body=node.orelse), self._loc(node))
        return ast.copy_location(call, node)

    # -- statements
    def visit_Return(self, node):
        self.generic_visit(node)
        if node.value is not None:
            node.value = ast.copy_location(_call_rt("checked_return", node.value), node.value)
        return node

    def visit_Assert(self, node):
        self.generic_visit(node)
        node.test = _as_condition(node.test)
        msg = ast.Lambda(args=_no_args(), body=node.msg or ast.Constant(None))
        return ast.copy_location(ast.Expr(_call_rt("assert_", node.test, msg, self._loc(node))), node)

    def _values(self, names):
        return _call_rt("values", ast.Call(func=_name("locals"), args=[], keywords=[]), _strs(names))

    def visit_If(self, node):
        if len(node.body) == 1 and isinstance(node.body[0], ast.Raise) and node.body[0].exc is not None:
            # `if cond: raise E(...)`: a runtime check when cond is a tensor (the rest runs after it)
            self.generic_visit(node)
            node.test = _as_condition(node.test)
            exc = ast.Lambda(args=_no_args(), body=node.body[0].exc)
            check = ast.copy_location(ast.Expr(_call_rt("raise_if", node.test, exc, self._loc(node))), node)
            return [check] + node.orelse
        names = self._block_names(node.body + node.orelse)
        in_true, in_false = self._block_names(node.body), self._block_names(node.orelse)
        inplace = ast.Constant(writes_in_place(node.body + node.orelse))
        self.generic_visit(node)
        node.test = _as_condition(node.test)
        tname, fname = self.fresh("if_true"), self.fresh("if_false")
        if getattr(node, "kiln_returns", False):
            tdef = _def(tname, names, node.body, node)
            fdef = _def(fname, names, node.orelse, node)
            ret = ast.Return(_call_rt("if_return", node.test, _name(tname), _name(fname), self._values(names),
                                      _strs(names), inplace, self._loc(node)))
            return [tdef, fdef, ast.copy_location(ret, node)]
        result = [ast.copy_location(ast.Return(_tuple(_name(n) for n in names)), node)]
        tdef = _def(tname, names, node.body + result, node)
        fdef = _def(fname, names, node.orelse + copy.deepcopy(result), node)
        call = _call_rt("if_stmt", node.test, _name(tname), _name(fname), self._values(names), _strs(names),
                        _strs(in_true), _strs(in_false), inplace, self._loc(node))
        return [tdef, fdef, self._unpack(names, call, node)]

    def _unpack(self, names, call, at):
        if not names:
            return ast.copy_location(ast.Expr(call), at)
        return ast.copy_location(ast.Assign(targets=[_tuple((_name(n, True) for n in names), store=True)],
                                            value=call), at)

    def _block_names(self, stmts):
        """The names a block rebinds, which its converted form passes in and returns: not a global
        or closed-over container it only writes through (rebinding it would make it a local)."""
        names = assigned_names(stmts)
        if self.bound is None:
            return names
        return [n for n in names if n in self.bound or n.startswith("__kiln")]  # (or made by the lowering)

    def visit_While(self, node):
        names = self._block_names(node.body)
        inplace = ast.Constant(writes_in_place(node.body))
        self.generic_visit(node)
        node.test = _as_condition(node.test)
        test_name, body_name = self.fresh("while_test"), self.fresh("while_body")
        test_def = _def(test_name, names, [ast.copy_location(ast.Return(node.test), node.test)], node)
        ret = ast.copy_location(ast.Return(_tuple(_name(n) for n in names)), node)
        body_def = _def(body_name, names, node.body + [ret], node)
        call = _call_rt("while_stmt", _name(test_name), _name(body_name), self._values(names), _strs(names),
                        inplace, self._loc(node))
        return [test_def, body_def, self._unpack(names, call, node)]

    def visit_For(self, node):
        names = self._block_names([ast.Assign(targets=[node.target], value=ast.Constant(None))] + node.body)
        inplace = ast.Constant(writes_in_place(node.body))
        self.generic_visit(node)
        body_name = self.fresh("for_body")
        item = self.fresh("item")
        bind = ast.copy_location(ast.Assign(targets=[node.target], value=_name(item)), node.target)
        ret = ast.copy_location(ast.Return(_tuple(_name(n) for n in names)), node)
        body_def = _def(body_name, [item] + names, [bind] + node.body + [ret], node)
        out = [body_def]
        extra = ast.Constant(None)
        brk = getattr(node, "kiln_break", None)
        if brk is not None:
            extra_name = self.fresh("for_test")
            out.append(_def(extra_name, names, [ast.copy_location(ast.Return(_call_rt("not_cond", self._loc(node), _name(brk))), node)],
                            node))
            extra = _name(extra_name)
        call = _call_rt("for_stmt", node.iter, extra, _name(body_name), self._values(names), _strs(names),
                        inplace, self._loc(node))
        out.append(self._unpack(names, call, node))
        return out


def _no_args():
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])


# ---- the whole conversion --------------------------------------------------------------------

def _class_of(fn):
    """The class name a method was defined in (for private-name mangling), from its qualname."""
    parts = fn.__qualname__.split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        return parts[-2]
    return None


def source_error(fn, why):
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code is not None else "<unknown>"
    line = code.co_firstlineno if code is not None else 0
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return JitSyntaxError(f"a function whose source is unavailable ({name}: {why})", filename, line, 1 if line else 0,
                          "define the function in a .py file (or use capture_mode=\"trace\")")


def _lambda_node(fn, lines, first):
    """The ast.Lambda of fn in its source lines (first: the number of lines[0]), with its columns
    as in the file. A lambda is an expression inside some statement: each `lambda` on its first
    line is parsed, in parentheses, over the longest stretch of text that is one lambda; the one
    whose body starts where fn's code does (co_positions) is fn's."""
    code = fn.__code__
    body_at = min(((p[0], p[2]) for p in code.co_positions()  # where the body's code starts (not RESUME's 0:0)
                   if p[0] is not None and p[2] is not None and (p[2], p[3]) != (0, 0)), default=None)
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    head, rest = lines[0], "".join(lines[1:20])
    found = []
    for col in (k for k in range(len(head)) if head.startswith("lambda", k)):
        text = head[col:] + rest
        pad = "(" + " " * (col - 1) if col else "("
        for end in range(len(text), 0, -1):
            try:
                tree = ast.parse(pad + text[:end] + ")", mode="eval")
            except SyntaxError:
                continue
            if isinstance(tree.body, ast.Lambda):
                lam = tree.body
                ast.increment_lineno(lam, first - 1)
                args = lam.args
                if tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs) == names:
                    found.append((lam, col))
                break
    if len(found) > 1 and body_at is not None:
        shift = lambda col: 0 if col else 1  # noqa: E731 (the "(" before a lambda at column 0)
        found = [(lam, col) for lam, col in found if (lam.body.lineno, lam.body.col_offset - shift(col)) == body_at]
    if len(found) != 1:
        raise source_error(fn, "its line holds " + ("no lambda like it" if not found else "several lambdas like it"))
    lam, col = found[0]
    return lam, (0 if col else -1)


def _lambda_as_def(fn, lam):
    """`def <lambda>(args): return body` for the lambda expression lam."""
    body = [ast.copy_location(ast.Return(lam.body), lam.body)]
    return ast.copy_location(ast.FunctionDef(name=fn.__name__, args=lam.args, body=body, decorator_list=[],
                                             returns=None, type_comment=None), lam)


def _process_started():
    """When this process started (seconds since the epoch): Linux's /proc, else when this module was
    imported."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = time.time()
_STARTED = _process_started()


def _source_changed(fn):
    """Whether fn's source file was changed after its module was imported (then converting the
    text in the file would compile other code than the code that runs). Read from the module's
    bytecode cache, which records the size and time of the source it was compiled from; without
    one (not written, or another loader) the file is taken as it is. A cache that disagrees with a
    file last written before this process started is one Python found stale and did not rewrite
    (PYTHONDONTWRITEBYTECODE, a read-only folder): the module was compiled from the file as it is."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    cached, source = getattr(module, "__cached__", None), getattr(module, "__file__", None)
    if not cached or not source or os.path.abspath(source) != os.path.abspath(fn.__code__.co_filename):
        return False
    try:
        with open(cached, "rb") as f:
            header = f.read(16)
        st = os.stat(source)
    except OSError:
        return False
    flags = int.from_bytes(header[4:8], "little") if len(header) == 16 else 1
    if flags != 0:  # a hash-based cache (or none readable): nothing to compare
        return False
    mtime, size = int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")
    return (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF) != (mtime, size) and st.st_mtime > _STARTED


def convert_code(fn):
    """The converted code object of the plain Python function fn (raises JitSyntaxError)."""
    code = fn.__code__
    try:
        # the source of fn's own code: inspect follows a decorator's __wrapped__ from a function,
        # which would compile the undecorated function in the wrapper's place
        lines, first = inspect.getsourcelines(code)
    except (OSError, TypeError):
        raise source_error(fn, "defined in a REPL, exec'd, or built in") from None
    indent = len(lines[0]) - len(lines[0].lstrip())
    if code.co_name == "<lambda>":  # columns kept as in the file, lines numbered already
        lam, indent = _lambda_node(fn, lines, first)
        fdef = _lambda_as_def(fn, lam)
        tree = ast.Module(body=[fdef], type_ignores=[])
    else:
        try:
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except SyntaxError:
            raise source_error(fn, "its source code could not be parsed on its own") from None
        fdef = tree.body[0] if tree.body else None
        if not isinstance(fdef, ast.FunctionDef) or fdef.name != code.co_name:
            raise source_error(fn, "its source is not a def statement")
        ast.increment_lineno(tree, first - 1)
    if _source_changed(fn):
        raise source_error(fn, "its source file changed since the function was defined (the code that runs "
                               "is not the code in the file)")
    where = SourceLocation(code.co_filename, indent)
    check(fdef, where)
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise where.error(fdef, "a generator or coroutine", "return a tuple or list instead")
    fdef.decorator_list = []
    fdef.returns = None
    a = fdef.args
    for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
        if arg is not None:
            arg.annotation = None
    a.defaults, a.kw_defaults = [], [None] * len(a.kwonlyargs)  # the function object keeps its own
    conv = _Converter(where, _Names(), _class_of(fn), bound_names(fdef))
    fdef = conv.visit_FunctionDef(fdef)
    # a factory binding the runtime and the original free variables as closure cells
    factory_args = [RT] + list(code.co_freevars)
    factory = _def("__kiln_factory", factory_args, [fdef, ast.Return(_name(fdef.name))], fdef)
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    compiled = compile(module, code.co_filename, "exec", dont_inherit=True)
    factory_code = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in factory_code.co_consts if isinstance(c, types.CodeType) and c.co_name == fdef.name)
    inner = inner.replace(co_qualname=code.co_qualname) if sys.version_info >= (3, 11) else inner
    _remember(inner)
    return inner


CONVERTED_CODE = set()  # code objects made here, nested ones included: never converted again


def _remember(code):
    CONVERTED_CODE.add(code)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _remember(c)


def _cell(value):
    return (lambda: value).__closure__[0]


def build_function(fn, inner, runtime):
    """A function running the converted code with fn's globals, defaults and closure cells."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    closure = []
    for name in inner.co_freevars:
        if name == RT:
            closure.append(_cell(runtime))
        elif name in cells:
            closure.append(cells[name])
        else:  # a free name the original did not have: cannot happen for valid conversions
            raise RuntimeError(f"kiln.jit: converted {fn.__qualname__} needs unknown free variable {name!r}")
    new = types.FunctionType(inner, fn.__globals__, fn.__name__, fn.__defaults__, tuple(closure) or None)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__kiln_original__ = fn
    return new
