"""STAND-IN for kiln.ops.cond / kiln.ops.while_loop (branch cf replaces this file at merge).

Eager semantics only: the predicate is read with bool() and the chosen branch / the loop runs as
plain Python, so under a trace tensor-dependent control flow is frozen like any Python branch."""
from .. import _C


def _truth(pred, what):
    if isinstance(pred, _C.TensorBase):
        if pred.size != 1:
            raise ValueError(f"{what}: the predicate must have one element, got shape {tuple(pred.shape)}")
        return bool(pred.item())
    return bool(pred)


def cond(pred, true_fn, false_fn, operands=()):
    """true_fn(*operands) if pred else false_fn(*operands)."""
    return true_fn(*operands) if _truth(pred, "cond") else false_fn(*operands)


def while_loop(cond_fn, body_fn, init_vals):
    """Runs vals = body_fn(*vals) while cond_fn(*vals); returns the final vals."""
    vals = init_vals
    kind = type(init_vals)
    while _truth(cond_fn(*vals), "while_loop"):
        vals = kind(body_fn(*vals))
    return vals
