"""Pytrees (issue 34): kiln.tree_util itself, and every entry point taking and returning registered
pytrees with their own types -- kiln.jit (ast / bytecode / trace x O0 / O1 x kbk / sink),
kiln.trace, grad / value_and_grad (gradients as the argument's pytree type, pytree aux) and
ops.while_loop / ops.cond (pytree carries and operands, past 32 tensors) -- each compared with
eager execution, NumPy and finite differences."""
import collections
import dataclasses
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops, tree_util
from conformance import ENV, TRACE_VARIANTS, VARIANTS, clone, difference, environment


class Affine:
    """A user class registered as a pytree node: two tensor children and a hashable tag."""

    def __init__(self, w, b, tag="affine"):
        self.w, self.b, self.tag = w, b, tag

    def __repr__(self):
        return f"Affine({self.w!r}, {self.b!r}, {self.tag!r})"


tree_util.register_pytree_node(Affine, lambda a: ((a.w, a.b), a.tag), lambda tag, ch: Affine(ch[0], ch[1], tag))

Pair = collections.namedtuple("Pair", "first second")


@dataclasses.dataclass
class State:
    h: object
    scale: object


def T(*values, dtype=kiln.float64):
    return kiln.Tensor(np.array(values if len(values) != 1 else values[0], dtype=np.float64), dtype)


def params(seed=0):
    """Every kind of node at once: a registered class, a namedtuple, a dataclass, nested dicts and
    lists, and None leaves."""
    r = np.random.default_rng(seed)

    def v(*shape):
        return kiln.Tensor(r.standard_normal(shape), kiln.float64)

    return {"layer": Affine(v(3, 2), v(2)), "pair": Pair(v(2), [v(2), None]),
            "state": State(v(2), {"inner": v(1), "none": None}), "extra": None}


def model(p, x):
    y = x @ p["layer"].w + p["layer"].b
    y = ops.tanh(y) * p["pair"].first + p["pair"].second[0]
    return (y * p["state"].h).sum() * p["state"].scale["inner"].sum()


def _strict(variant_fn, fn, *calls, reference=None):
    """variant_fn(variant, fn) in every variant runs without error and gives eager's results
    (reference's, by default fn's)."""
    want = [(reference or fn)(*clone(c)) for c in calls]
    problems = []
    with environment(ENV), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v in VARIANTS:
            jf = variant_fn(v, fn)
            for k, c in enumerate(calls):
                try:
                    got = jf(*clone(c))
                except Exception as e:  # noqa: BLE001 (reported with the variant)
                    problems.append(f"{v.name} call {k}: {type(e).__name__}: {e}")
                    break
                d = difference(got, want[k])
                if d:
                    problems.append(f"{v.name} call {k}: {d}")
                    break
            if hasattr(jf, "cache_info") and jf.cache_info().eager_calls:
                problems.append(f"{v.name}: ran eagerly ({jf.cache_info()})")
    assert not problems, "\n".join(problems)


# ---- tree_util ----------------------------------------------------------------------------------


def test_flatten_order_and_roundtrip():
    tree = {"b": (1, None, [2, 3]), "a": Pair(4, {"z": 5, "y": 6}), "c": State(7, 8), "d": Affine(9, 10, "t")}
    leaves, treedef = tree_util.tree_flatten(tree)
    assert leaves == [4, 6, 5, 1, 2, 3, 7, 8, 9, 10]  # dict children by sorted key, None has none
    assert treedef.num_leaves == 10
    back = tree_util.tree_unflatten(treedef, leaves)
    assert list(back) == ["b", "a", "c", "d"]  # the dict's own key order comes back
    assert back["b"] == (1, None, [2, 3]) and type(back["a"]) is Pair and back["a"].second == {"z": 5, "y": 6}
    assert list(back["a"].second) == ["z", "y"]
    assert back["c"] == State(7, 8)
    assert type(back["d"]) is Affine and (back["d"].w, back["d"].b, back["d"].tag) == (9, 10, "t")
    assert tree_util.tree_leaves(tree) == leaves
    assert tree_util.tree_structure(tree) == treedef


def test_treedef_equality_and_hash():
    a = tree_util.tree_structure({"x": [1, 2], "y": None})
    b = tree_util.tree_structure({"y": None, "x": [kiln.Tensor(np.zeros(2)), 3.0]})  # order and leaves differ
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != tree_util.tree_structure({"x": (1, 2), "y": None})  # tuple, not list
    assert a != tree_util.tree_structure({"x": [1, 2], "y": 0})  # a leaf where None was
    assert tree_util.tree_structure(Affine(1, 2, "p")) != tree_util.tree_structure(Affine(1, 2, "q"))  # aux
    assert tree_util.tree_structure(Pair(1, 2)) != tree_util.tree_structure((1, 2))
    assert "Affine" in repr(tree_util.tree_structure(Affine(1, 2)))


def test_tree_map_with_rest_prefix_and_is_leaf():
    got = tree_util.tree_map(lambda a, b: a * 10 + b, {"p": [1, 2], "q": Pair(3, None)},
                             {"p": [4, 5], "q": Pair(6, None)})
    assert got == {"p": [14, 25], "q": Pair(36, None)}
    # the first tree is a prefix of the second: a whole subtree stands for a leaf
    assert tree_util.tree_map(lambda a, b: (a, b), [1, 2], [(3, 4), {"k": 5}]) == [(1, (3, 4)), (2, {"k": 5})]
    assert tree_util.tree_map(lambda x: len(x), [(1, 2), (3,)], is_leaf=lambda x: isinstance(x, tuple)) == [2, 1]
    with pytest.raises(ValueError, match=r"tree structure mismatch at \[1\]"):
        tree_util.tree_map(lambda a, b: a, [1, [2]], [1, (2,)])


def test_bad_use_is_a_clear_error():
    _, treedef = tree_util.tree_flatten([1, 2])
    with pytest.raises(ValueError, match="has 2 leaves, got 3"):
        tree_util.tree_unflatten(treedef, [1, 2, 3])
    with pytest.raises(TypeError, match="must be a PyTreeDef"):
        tree_util.tree_unflatten([1], [1])
    with pytest.raises(ValueError, match="already registered"):
        tree_util.register_pytree_node(Affine, lambda a: ((), None), lambda aux, ch: Affine(0, 0))
    with pytest.raises(ValueError, match="built in"):
        tree_util.register_pytree_node(dict, lambda a: ((), None), lambda aux, ch: {})
    with pytest.raises(TypeError, match="must be a type"):
        tree_util.register_pytree_node(Affine(1, 2), lambda a: ((), None), lambda aux, ch: None)
    with pytest.raises(TypeError, match="keys must be sortable"):
        tree_util.tree_flatten({1: 0, "a": 1})


def test_register_pytree_node_class_and_the_kiln_tree_alias():
    @tree_util.register_pytree_node_class
    class Scaled:
        def __init__(self, value, k):
            self.value, self.k = value, k

        def tree_flatten(self):
            return (self.value,), self.k

        @classmethod
        def tree_unflatten(cls, k, children):
            return cls(children[0], k)

    leaves, treedef = tree_util.tree_flatten(Scaled([1, 2], 3))
    assert leaves == [1, 2] and treedef.unflatten([5, 6]).value == [5, 6] and treedef.unflatten([5, 6]).k == 3
    assert kiln.tree.register_pytree_node is tree_util.register_pytree_node
    assert kiln.tree.tree_flatten is tree_util.tree_flatten
    # one registry: kiln.jit takes and returns the class registered through tree_util
    out = kiln.jit(lambda s: Scaled(s.value * 2, s.k), capture_mode="trace")(Scaled(T([1.0, 2.0]), 3))
    assert type(out) is Scaled and out.k == 3 and out.value.numpy().tolist() == [2.0, 4.0]


# ---- kiln.jit and kiln.trace ---------------------------------------------------------------------


def _step(p, x):
    """Takes the pytree, returns a pytree of every kind (with None leaves) and a loss."""
    y = x @ p["layer"].w + p["layer"].b
    new = {"layer": Affine(p["layer"].w * 0.5, p["layer"].b + 1.0, p["layer"].tag),
           "pair": Pair(y.sum(0), [p["pair"].second[0] * 2.0, None]),
           "state": State(p["state"].h - y.mean(0), {"inner": p["state"].scale["inner"], "none": None}),
           "extra": None}
    return new, model(p, x)


def test_jit_every_mode_takes_and_returns_pytrees():
    x = T(np.arange(6.0).reshape(2, 3) / 5)
    _strict(lambda v, fn: v.wrap(fn), _step, (params(0), x), (params(1), x * 2.0), (params(2), x))


def test_kiln_trace_takes_and_returns_pytrees():
    x = T(np.arange(6.0).reshape(2, 3) / 5)
    want = [_step(*clone(c)) for c in ((params(0), x), (params(1), x))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v in TRACE_VARIANTS:
            tf = v.wrap(_step)
            for k, c in enumerate(((params(0), x), (params(1), x))):
                d = difference(tf(*clone(c)), want[k])
                assert d is None, f"{v.name} call {k}: {d}"


# ---- grad and value_and_grad ---------------------------------------------------------------------


def _numeric_grads(fn, p, x, eps=1e-6):
    leaves, treedef = tree_util.tree_flatten(p)
    out = []
    for k, leaf in enumerate(leaves):
        a = leaf.numpy()
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            vals = []
            for s in (1, -1):
                b = a.copy()
                b[i] += s * eps
                moved = list(leaves)
                moved[k] = kiln.Tensor(b, kiln.float64)
                vals.append(float(fn(treedef.unflatten(moved), x).numpy()))
            g[i] = (vals[0] - vals[1]) / (2 * eps)
        out.append(g)
    return treedef.unflatten(out)


def _assert_same_tree(got, want, rtol=1e-6):
    """got: a pytree of tensors, want: the same pytree of NumPy arrays (or tensors)."""
    gl, gd = tree_util.tree_flatten(got)
    wl, wd = tree_util.tree_flatten(want)
    assert gd == wd, (gd, wd)
    for g, w in zip(gl, wl):
        assert isinstance(g, kiln.Tensor)
        np.testing.assert_allclose(g.numpy(), w.numpy() if isinstance(w, kiln.Tensor) else w, rtol=rtol, atol=1e-8)


def test_grad_of_a_pytree_argument_is_that_pytree_type():
    p, x = params(3), T(np.arange(6.0).reshape(2, 3) / 7)
    g = kiln.grad(model)(p, x)
    assert type(g) is dict and type(g["layer"]) is Affine and g["layer"].tag == "affine"
    assert type(g["pair"]) is Pair and g["pair"].second[1] is None and g["extra"] is None
    assert type(g["state"]) is State and g["state"].scale["none"] is None
    _assert_same_tree(g, _numeric_grads(model, p, x), rtol=1e-5)
    value, g2 = kiln.value_and_grad(model, grad_position=(0, 1))(p, x)
    np.testing.assert_allclose(value.numpy(), model(p, x).numpy())
    _assert_same_tree(g2[0], g)
    assert isinstance(g2[1], kiln.Tensor) and tuple(g2[1].shape) == (2, 3)


def test_grad_with_pytree_aux():
    p, x = params(4), T(np.arange(6.0).reshape(2, 3) / 7)

    def with_aux(p, x):
        y = x @ p["layer"].w
        return (y ** 2).sum(), {"y": y, "info": Pair(y.mean(), None)}

    g, aux = kiln.grad(with_aux, has_aux=True)(p, x)
    assert type(aux) is tuple and type(aux[0]) is dict and type(aux[0]["info"]) is Pair
    np.testing.assert_allclose(aux[0]["y"].numpy(), (x @ p["layer"].w).numpy())
    want = 2 * x.numpy().T @ (x @ p["layer"].w).numpy()
    np.testing.assert_allclose(g["layer"].w.numpy(), want, rtol=1e-10)
    assert float(np.abs(g["layer"].b.numpy()).max()) == 0.0


def _grad_variants(fn, **grad_options):
    """grad of the jitted function, and kiln.jit of grad, in every variant."""
    return [lambda v, f: kiln.value_and_grad(v.wrap(f), **grad_options),
            lambda v, f: v.wrap(kiln.value_and_grad(f, **grad_options))]


def test_grad_of_pytrees_under_every_jit_mode():
    x = T(np.arange(6.0).reshape(2, 3) / 7)
    want = kiln.value_and_grad(model)(params(5), x)
    for variant_fn in _grad_variants(model):
        _strict(variant_fn, model, (params(5), x), (params(6), x), reference=kiln.value_and_grad(model))
    # (the strict check compares with eager's value_and_grad, which itself matches finite differences)
    _assert_same_tree(want[1], _numeric_grads(model, params(5), x), rtol=1e-5)


def test_has_aux_pytree_under_jit():
    def with_aux(p, x):
        y = x @ p["layer"].w + p["layer"].b
        return (y ** 2).sum(), Affine(y, None, "aux")

    x = T(np.arange(6.0).reshape(2, 3) / 7)
    for mode in ("ast", "bytecode", "trace"):
        want_g, want_aux = kiln.grad(with_aux, has_aux=True)(params(7), x)
        got_g, got_aux = kiln.grad(kiln.jit(with_aux, capture_mode=mode), has_aux=True)(params(7), x)
        _assert_same_tree(got_g, want_g)
        assert type(got_aux[0]) is Affine and got_aux[0].b is None and got_aux[0].tag == "aux"
        np.testing.assert_allclose(got_aux[0].w.numpy(), want_aux[0].w.numpy())


# ---- while_loop and cond -------------------------------------------------------------------------


def _loop(p, x):
    def cond_fn(state, n):
        return n < 4

    def body(state, n):
        layer = Affine(state["layer"].w * 0.9, state["layer"].b + x.sum(), state["layer"].tag)
        return {"layer": layer, "pair": Pair(state["pair"].first * 1.1, [state["pair"].second[0] - 1.0, None]),
                "state": state["state"], "extra": None}, n + 1

    return ops.while_loop(cond_fn, body, (p, kiln.Tensor(np.array(0), kiln.int64)))


def _branch(p, x):
    return ops.cond(x.sum() > 0, lambda q, y: Pair(q["layer"].w * 2.0, {"s": q["state"].h + y.sum(), "n": None}),
                    lambda q, y: Pair(q["layer"].w - 1.0, {"s": q["state"].h * 3.0, "n": None}), (p, x))


def test_while_loop_carries_pytrees():
    x = T([0.5, -0.25, 1.0])
    out = _loop(params(8), x)
    assert type(out[0]["layer"]) is Affine and type(out[0]["pair"]) is Pair and out[0]["extra"] is None
    np.testing.assert_allclose(out[0]["layer"].w.numpy(), params(8)["layer"].w.numpy() * 0.9 ** 4)
    assert int(out[1].numpy()) == 4
    _strict(lambda v, f: v.wrap(f), _loop, (params(8), x), (params(9), x * -1.0))


def test_cond_takes_and_returns_pytrees():
    x = T([0.5, -0.25, 1.0])
    _strict(lambda v, f: v.wrap(f), _branch, (params(10), x), (params(10), x * -1.0))


def test_while_loop_with_more_than_32_pytree_leaves_and_its_gradient():
    leaves = {f"k{i:02d}": Pair(T([float(i)]), None) for i in range(40)}

    def f(tree, x):
        out = ops.while_loop(lambda t, n: n < 3, lambda t, n: (tree_util.tree_map(lambda v: v * x, t), n + 1),
                             (tree, kiln.Tensor(np.array(0), kiln.int64)))
        return sum(v.first.sum() for v in out[0].values())

    x = T(1.5)
    want = f(leaves, x)
    np.testing.assert_allclose(want.numpy(), sum(range(40)) * 1.5 ** 3)
    _strict(lambda v, f: v.wrap(f), f, (leaves, x))
    g = kiln.grad(kiln.jit(f, capture_mode="trace"), grad_position=1)(leaves, x)
    np.testing.assert_allclose(g.numpy(), sum(range(40)) * 3 * 1.5 ** 2, rtol=1e-10)


def test_pytree_operand_with_a_non_tensor_leaf_is_a_clear_error():
    x = T([1.0])
    with pytest.raises(TypeError, match="operand 0 must be a Tensor or a pytree of Tensors, got a Pair holding a int"):
        ops.cond(x.sum() > 0, lambda p: p, lambda p: p, (Pair(x, 3),))
    with pytest.raises(TypeError, match="loop value 0 must be a Tensor or a pytree of Tensors, got a dict holding "
                                        "a str"):
        ops.while_loop(lambda d: d["x"].sum() < 3, lambda d: d, ({"x": x, "name": "a"},))


def test_a_dataclass_flattened_before_can_still_be_registered():
    @dataclasses.dataclass
    class Config:
        weight: object
        label: str

    assert tree_util.tree_leaves(Config(1, "a")) == [1, "a"]  # by default: every init field a child
    tree_util.register_pytree_node(Config, lambda c: ((c.weight,), c.label), lambda label, ch: Config(ch[0], label))
    assert tree_util.tree_leaves(Config(1, "a")) == [1]
    out = kiln.jit(lambda c: Config(c.weight * 2.0, c.label + "!"), capture_mode="trace")(Config(T([1.0]), "a"))
    assert type(out) is Config and out.label == "a!" and out.weight.numpy().tolist() == [2.0]
    with pytest.raises(ValueError, match="already registered"):
        tree_util.register_pytree_node(Config, lambda c: ((), None), lambda aux, ch: None)


def test_cond_with_more_than_32_pytree_operands_and_results_and_its_gradient():
    tree = {f"k{i:02d}": State(T([float(i), 1.0]), None) for i in range(36)}

    def f(tree, x):
        out = ops.cond(x.sum() > 0, lambda t, y: tree_util.tree_map(lambda v: v * y, t),
                       lambda t, y: tree_util.tree_map(lambda v: v - y, t), (tree, x))
        return sum((v.h * v.h).sum() for v in out.values())

    for x in (T(2.0), T(-1.0)):
        want = f(tree, x)
        _strict(lambda v, fn: v.wrap(fn), f, (tree, x))
        g = kiln.grad(kiln.jit(f, capture_mode="trace"), grad_position=1)(tree, x)
        # d/dx of sum((v*x)^2) = 2 x sum(v^2); of sum((v-x)^2) = -2 sum(v - x)
        vals = np.array([[float(i), 1.0] for i in range(36)])
        x0 = float(x.numpy())
        expect = 2 * x0 * (vals ** 2).sum() if x0 > 0 else -2 * (vals - x0).sum()
        np.testing.assert_allclose(g.numpy(), expect, rtol=1e-10)
        assert want.numpy() > 0


def test_grad_structure_is_the_argument_as_passed_even_if_the_function_changes_it():
    def f(ws):
        total = (ws[0] * ws[1]).sum()
        ws.append(ws[0] * 2.0)  # the function grows its list argument
        return total

    a, b = T([1.0, 2.0]), T([3.0, 4.0])
    g = kiln.grad(f)([a, b])
    assert type(g) is list and len(g) == 2
    np.testing.assert_allclose(g[0].numpy(), [3.0, 4.0])
    np.testing.assert_allclose(g[1].numpy(), [1.0, 2.0])
