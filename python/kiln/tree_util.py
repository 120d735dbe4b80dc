"""kiln.tree_util: pytrees, as JAX's jax.tree_util.

A pytree is a nest of containers whose non-container items are its leaves. Containers (nodes) by
default: None (a node with no children), tuple, list, dict (children in sorted key order, as JAX),
namedtuple, OrderedDict and defaultdict (in insertion order), dataclass instances (their init
fields) and every type given to register_pytree_node. Anything else is a leaf: a Tensor, a
number, a NumPy array, a string.

The registry is the one kiln.jit and kiln.trace flatten their arguments and results with
(kiln._C.tree, src/python/tree.c): a type registered here is taken and returned by every entry
point. tree_flatten / tree_unflatten have no side effects (beyond caching how an unregistered
dataclass type flattens) and call nothing but the registered flatten / unflatten functions.
"""
import collections

from . import _C

__all__ = ["PyTreeDef", "register_pytree_node", "register_pytree_node_class", "tree_flatten", "tree_unflatten",
           "tree_leaves", "tree_structure", "tree_map", "all_leaves"]

_registry = _C.tree.registry  # type -> (flatten, unflatten), or None for a dataclass that stays a leaf

_NoneType = type(None)
# the containers handled without a registration; registering one of them is an error
_BUILTIN = (_NoneType, tuple, list, dict, collections.OrderedDict, collections.defaultdict)


def register_pytree_node(nodetype, flatten_func, unflatten_func):
    """Makes objects of nodetype pytree nodes for kiln.tree_util and for every kiln entry point
    (kiln.jit in all capture modes, kiln.trace, grad / value_and_grad, while_loop, cond).

    flatten_func(obj) -> (children, aux_data): children an iterable of subtrees, aux_data a
    hashable value (compared when tree structures are; under kiln.jit it is part of the compile
    cache key). unflatten_func(aux_data, children) -> obj rebuilds the object."""
    if not isinstance(nodetype, type):
        raise TypeError(f"register_pytree_node: nodetype must be a type, got {type(nodetype).__name__}")
    if nodetype in _BUILTIN or _C.TensorBase in nodetype.__mro__:
        raise ValueError(f"register_pytree_node: {nodetype.__name__} is built in and cannot be registered")
    if not callable(flatten_func) or not callable(unflatten_func):
        raise TypeError("register_pytree_node: flatten_func and unflatten_func must be callable")
    if _registry.get(nodetype) is not None and type(_registry[nodetype]) is not _DataclassNode:
        raise ValueError(f"register_pytree_node: {nodetype.__qualname__} is already registered")
    _C.tree.register_node(nodetype, flatten_func, unflatten_func)


def register_pytree_node_class(cls):
    """Class decorator: registers cls with its method tree_flatten(self) -> (children, aux_data) and
    its classmethod tree_unflatten(aux_data, children); returns cls."""
    register_pytree_node(cls, lambda obj: obj.tree_flatten(), cls.tree_unflatten)
    return cls


def _dataclass_node(cls):
    """(flatten, unflatten) of a dataclass: its init fields as children, their names as aux; a
    field set outside __init__ keeps it from being rebuilt, so such a class stays a leaf (and, for
    kiln.jit, a constant)."""
    import dataclasses

    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return None
    names = tuple(f.name for f in fields)
    return _DataclassNode((lambda obj: (tuple(getattr(obj, n) for n in names), names),
                           lambda aux, children: cls(**dict(zip(aux, children)))))


class _DataclassNode(tuple):
    """The (flatten, unflatten) made for an unregistered dataclass: registering the class replaces it."""


_C.tree.set_node_default(_dataclass_node)


def _node_pair(t):
    """The (flatten, unflatten) of a registered or dataclass type t, or None."""
    pair = _registry.get(t, False)
    if pair is False:
        if not hasattr(t, "__dataclass_fields__"):
            return None
        pair = _registry.setdefault(t, _dataclass_node(t))
    return pair


class _DictKeys(tuple):
    """A dict node's aux: its keys sorted (what equality and hashing see, as JAX), carrying the
    dict's own key order, in which unflatten rebuilds it (so a result's keys are in eager's order)."""

    def __new__(cls, keys, order):
        self = super().__new__(cls, keys)
        self.order = order
        return self


# A tree structure is a nest of tuples: _LEAF for a leaf, (type, aux, (child structure, ...)) for
# a node; the type is compared by identity, aux by equality.
_LEAF = "*"


def _flatten(x, leaves, is_leaf):
    if is_leaf is not None and is_leaf(x):
        leaves.append(x)
        return _LEAF
    t = type(x)
    if t is tuple or t is list:
        return (t, None, tuple([_flatten(c, leaves, is_leaf) for c in x]))
    if t is dict:
        try:
            keys = tuple(sorted(x))
        except TypeError:
            raise TypeError(f"tree_flatten: a dict's keys must be sortable to flatten it, got {list(x)!r}") from None
        order = tuple(x)
        return (dict, keys if order == keys else _DictKeys(keys, order),
                tuple([_flatten(x[k], leaves, is_leaf) for k in keys]))
    if x is None:
        return (_NoneType, None, ())
    if isinstance(x, _C.TensorBase):
        leaves.append(x)
        return _LEAF
    pair = _node_pair(t)
    if pair is not None:
        children, aux = pair[0](x)
        return (t, aux, tuple([_flatten(c, leaves, is_leaf) for c in children]))
    if isinstance(x, tuple) and hasattr(t, "_fields"):  # a namedtuple
        return (t, None, tuple([_flatten(c, leaves, is_leaf) for c in x]))
    if t is collections.OrderedDict:
        return (t, tuple(x), tuple([_flatten(c, leaves, is_leaf) for c in x.values()]))
    if t is collections.defaultdict:
        keys = tuple(sorted(x))
        return (t, (x.default_factory, _DictKeys(keys, tuple(x))),
                tuple([_flatten(x[k], leaves, is_leaf) for k in keys]))
    leaves.append(x)
    return _LEAF


def _build(node, children):
    t, aux = node[0], node[1]
    if t is tuple:
        return tuple(children)
    if t is list:
        return list(children)
    if t is dict:
        if type(aux) is _DictKeys:  # rebuilt in the flattened dict's own key order
            at = dict(zip(aux, children))
            return {k: at[k] for k in aux.order}
        return dict(zip(aux, children))
    if t is _NoneType:
        return None
    pair = _node_pair(t)
    if pair is not None:
        return pair[1](aux, children)
    if t is collections.OrderedDict:
        return collections.OrderedDict(zip(aux, children))
    if t is collections.defaultdict:
        at = dict(zip(aux[1], children))
        return collections.defaultdict(aux[0], [(k, at[k]) for k in aux[1].order])
    return t._make(children)  # a namedtuple


def _unflatten(node, it):
    if node is _LEAF:
        return next(it)
    return _build(node, [_unflatten(c, it) for c in node[2]])


def _count(node):
    return 1 if node is _LEAF else sum(_count(c) for c in node[2])


def _text(node):
    if node is _LEAF:
        return "*"
    t, aux, children = node
    inner = ", ".join(_text(c) for c in children)
    if t is tuple:
        return f"({inner}{',' if len(children) == 1 else ''})"
    if t is list:
        return f"[{inner}]"
    if t is dict:
        return "{" + ", ".join(f"{k!r}: {_text(c)}" for k, c in zip(aux, children)) + "}"
    if t is _NoneType:
        return "None"
    return f"{t.__name__}({inner})"


class PyTreeDef:
    """The structure of a pytree without its leaves: equal (and hashing equal) for equal
    structures: the same node types, equal aux data, the same number of leaves in the same places."""

    __slots__ = ("_node", "_num_leaves", "_hash")

    def __init__(self, node):
        self._node = node
        self._num_leaves = _count(node)
        self._hash = None

    @property
    def num_leaves(self):
        return self._num_leaves

    @property
    def num_nodes(self):
        def nodes(n):
            return 1 if n is _LEAF else 1 + sum(nodes(c) for c in n[2])
        return nodes(self._node)

    def unflatten(self, leaves):
        """The pytree of this structure with the given leaves (an iterable, exactly num_leaves)."""
        leaves = list(leaves)
        if len(leaves) != self._num_leaves:
            raise ValueError(f"tree_unflatten: the structure {self} has {self._num_leaves} leaves, "
                             f"got {len(leaves)}")
        return _unflatten(self._node, iter(leaves))

    def flatten_up_to(self, tree):
        """The subtrees of tree at this structure's leaves (tree must have this structure as a
        prefix: equal nodes down to this structure's leaves)."""
        out = []
        _up_to(self._node, tree, out, "")
        return out

    def leaf_paths(self):
        """Where each leaf sits, as text: ['key'] for a dict entry, .name for a namedtuple's or a
        dataclass's field, [i] otherwise ("" for a tree that is one leaf)."""
        out = []
        _paths(self._node, "", out)
        return out

    def children(self):
        """The structures of the root node's children."""
        return [] if self._node is _LEAF else [PyTreeDef(c) for c in self._node[2]]

    def __eq__(self, other):
        return isinstance(other, PyTreeDef) and _same(self._node, other._node)

    def __hash__(self):
        if self._hash is None:
            self._hash = hash(_hash_key(self._node))
        return self._hash

    def __repr__(self):
        return f"PyTreeDef({_text(self._node)})"


def _paths(node, path, out):
    if node is _LEAF:
        out.append(path)
        return
    t, aux, children = node
    if t is dict or t is collections.OrderedDict:
        labels = [f"[{k!r}]" for k in aux]
    elif t is collections.defaultdict:
        labels = [f"[{k!r}]" for k in aux[1]]
    elif hasattr(t, "_fields") and issubclass(t, tuple):
        labels = [f".{n}" for n in t._fields]
    elif hasattr(t, "__dataclass_fields__") and isinstance(aux, tuple) and len(aux) == len(children):
        labels = [f".{n}" for n in aux]
    else:
        labels = [f"[{i}]" for i in range(len(children))]
    for label, c in zip(labels, children):
        _paths(c, path + label, out)


def _same(a, b):
    if a is _LEAF or b is _LEAF:
        return a is b
    return (a[0] is b[0] and a[1] == b[1] and len(a[2]) == len(b[2])
            and all(_same(x, y) for x, y in zip(a[2], b[2])))


def _hash_key(node):
    return node if node is _LEAF else (id(node[0]), node[1], tuple(_hash_key(c) for c in node[2]))


def _up_to(node, tree, out, path):
    if node is _LEAF:
        out.append(tree)
        return
    kids = []
    here = _flatten(tree, kids, lambda x: x is not tree)  # tree's own node, its children as leaves
    if here is _LEAF or here[0] is not node[0] or here[1] != node[1] or len(here[2]) != len(node[2]):
        raise ValueError(f"tree structure mismatch at {path or 'the root'}: expected {_text(node)}, "
                         f"got {type(tree).__name__} {repr(tree)[:80]}")
    for k, (c, sub) in enumerate(zip(node[2], kids)):
        _up_to(c, sub, out, f"{path}[{node[1][k]!r}]" if node[0] is dict else f"{path}[{k}]")


def tree_flatten(tree, is_leaf=None):
    """(leaves, treedef): the leaves of tree in order (dict children by sorted key) and its
    structure. is_leaf(x) -> True makes x a leaf without looking into it."""
    leaves = []
    node = _flatten(tree, leaves, is_leaf)
    return leaves, PyTreeDef(node)


def tree_unflatten(treedef, leaves):
    """The pytree of treedef's structure with the given leaves."""
    if not isinstance(treedef, PyTreeDef):
        raise TypeError(f"tree_unflatten: treedef must be a PyTreeDef, got {type(treedef).__name__}")
    return treedef.unflatten(leaves)


def tree_leaves(tree, is_leaf=None):
    """The leaves of tree, in tree_flatten's order."""
    leaves = []
    _flatten(tree, leaves, is_leaf)
    return leaves


def tree_structure(tree, is_leaf=None):
    """The PyTreeDef of tree."""
    return PyTreeDef(_flatten(tree, [], is_leaf))


def tree_map(f, tree, *rest, is_leaf=None):
    """The pytree of tree's structure whose leaves are f(leaf, *the leaves of rest at the same
    place); each tree in rest has tree's structure (or tree's structure as a prefix, the subtree
    standing for a leaf)."""
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = [treedef.flatten_up_to(r) for r in rest]
    return treedef.unflatten(f(*xs) for xs in zip(leaves, *others))


def all_leaves(iterable, is_leaf=None):
    """Whether every item of iterable is a leaf."""
    return all(_flatten(x, [], is_leaf) is _LEAF for x in iterable)
