"""Which fast locals of a code object are dead before each instruction: never read again on any
path from there (CPython 3.11 bytecode, as kiln.jit.bytecode decodes it). A frozen state leaves a
dead local's value out, so a state does not depend on an object no later instruction reads (a list
the function handed to a global and will not touch again keeps its identity out of the cache key).

Conservative: LOAD_FAST and DELETE_FAST read their local; a cell or free variable is always live
(an argument a closure captures too: before MAKE_CELL its slot holds the plain value);
a code that may read its locals by name (locals(), vars(), eval, exec, sys._getframe) has none dead;
zero-argument super() reads the first argument itself; an instruction an exception handler covers
flows to the handler too."""

_READS = frozenset(("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST"))
_NO_FALL_THROUGH = frozenset(("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                              "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT"))
_BY_NAME = frozenset(("locals", "vars", "eval", "exec", "_getframe", "currentframe"))


def dead_before(code, decoded):
    """Per instruction index of decoded (a kiln.jit.bytecode.Code of code): the frozenset of fast
    local indexes dead before it; None when the code may read its locals by name."""
    if _BY_NAME & set(code.co_names):
        return None
    ins, at, handlers = decoded.ins, decoded.at, decoded.handlers
    n, nfast = len(ins), code.co_nlocals
    succ, use, kill = [], [], []
    for k, (op, arg, offset, _, _, target) in enumerate(ins):
        nxt = [] if op in _NO_FALL_THROUGH or k + 1 >= n else [k + 1]
        if target is not None and target in at:
            nxt.append(at[target])
        nxt += [at[h[2]] for h in handlers if h[0] <= offset < h[1] and h[2] in at]
        succ.append(nxt)
        use.append(frozenset((arg,)) if op in _READS and arg is not None and arg < nfast else frozenset())
        kill.append(frozenset((arg,)) if op == "STORE_FAST" and arg is not None else frozenset())
    live = [frozenset()] * n
    changed = True
    while changed:  # (backward dataflow to a fixed point; a handful of passes per loop nesting)
        changed = False
        for k in range(n - 1, -1, -1):
            out = frozenset().union(*(live[j] for j in succ[k])) if succ[k] else frozenset()
            new = use[k] | (out - kill[k])
            if new != live[k]:
                live[k], changed = new, True
    cells = {k for k, name in enumerate(code.co_varnames[:nfast]) if name in code.co_cellvars}  # (MAKE_CELL'd)
    every = frozenset(range(1 if "super" in code.co_names else 0, nfast)) - cells
    return tuple(every - live[k] for k in range(n))
