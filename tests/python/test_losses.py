"""Functional losses (ops.cross_entropy, nll_loss, mse_loss, l1_loss, smooth_l1_loss,
binary_cross_entropy_with_logits, kl_div) and their Cells: NumPy references in float64,
finite-difference gradients, numerical stability at large logits, clear errors, every compiled
variant equal to eager (forward and value_and_grad), and PyTorch's values when torch is importable."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops
from compiled_equal import assert_compiled_equal
from conftest import check_grad

RNG = np.random.default_rng(11)


def T(a):
    return kiln.Tensor(np.asarray(a))


def log_softmax(x, axis=1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def reduce(loss, reduction):
    return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]


def ce_indices_reference(x, y, weight=None, ignore_index=-100, reduction="mean", smoothing=0.0):
    """Cross entropy of logits x (N, C, ...) at labels y, in float64 loops (PyTorch's definition)."""
    logp = log_softmax(x, 1)
    c = x.shape[1]
    w = np.ones(c) if weight is None else weight
    loss = np.zeros(y.shape)
    total = 0.0
    for pos in np.ndindex(*y.shape):
        label = y[pos]
        if label == ignore_index:
            continue
        row = logp[(pos[0], slice(None)) + pos[1:]]
        nll = -w[label] * row[label]
        smooth = -(w * row).sum()
        loss[pos] = (1 - smoothing) * nll + smoothing / c * smooth
        total += w[label]
    if reduction == "mean":
        return loss.sum() / total
    return reduce(loss, reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_with_class_indices(reduction, weighted, smoothing):
    x = RNG.standard_normal((5, 4, 3))
    y = RNG.integers(0, 4, (5, 3))
    y[1, 2] = y[3, 0] = -100
    w = RNG.uniform(0.5, 2.0, 4) if weighted else None
    got = ops.cross_entropy(T(x), T(y), None if w is None else T(w), reduction=reduction, label_smoothing=smoothing)
    np.testing.assert_allclose(got.numpy(), ce_indices_reference(x, y, w, -100, reduction, smoothing), rtol=1e-12)
    cell = nn.CrossEntropyLoss(None if w is None else T(w), reduction=reduction, label_smoothing=smoothing)
    np.testing.assert_array_equal(cell(T(x), T(y)).numpy(), got.numpy())


def test_cross_entropy_with_class_probabilities():
    x = RNG.standard_normal((6, 5))
    p = RNG.dirichlet(np.ones(5), 6)
    w = RNG.uniform(0.5, 2.0, 5)
    logp = log_softmax(x)
    np.testing.assert_allclose(ops.cross_entropy(T(x), T(p)).numpy(), -(logp * p).sum(1).mean(), rtol=1e-12)
    smoothed = p * 0.9 + 0.1 / 5
    np.testing.assert_allclose(ops.cross_entropy(T(x), T(p), T(w), reduction="none", label_smoothing=0.1).numpy(),
                               -(logp * smoothed * w).sum(1), rtol=1e-12)


def test_nll_loss_matches_cross_entropy_of_log_probabilities():
    x = RNG.standard_normal((4, 3))
    y = np.array([2, 0, -1, 1])
    logp = log_softmax(x)
    np.testing.assert_allclose(ops.nll_loss(T(logp), T(y), ignore_index=-1, label_smoothing=0.3).numpy(),
                               ce_indices_reference(x, y, None, -1, "mean", 0.3), rtol=1e-12)
    got = ops.nll_loss(T(logp), T(y), ignore_index=-1, reduction="sum")
    np.testing.assert_allclose(got.numpy(), -(logp[0, 2] + logp[1, 0] + logp[3, 1]), rtol=1e-12)
    w = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(nn.NLLLoss(T(w), -1)(T(logp), T(y)).numpy(),
                               ce_indices_reference(x, y, w, -1), rtol=1e-12)


def test_out_of_range_labels_raise_eagerly_and_compiled():
    x, y = T(RNG.standard_normal((3, 4))), T([0, 4, 1])
    with pytest.raises(IndexError, match="4"):
        ops.cross_entropy(x, y)
    f = kiln.jit(lambda x, y: ops.cross_entropy(x, y), capture_mode="trace")
    f(x, T([0, 3, 1]))
    with pytest.raises(IndexError, match="4"):
        f(x, y)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    a, b = RNG.standard_normal((3, 4)) * 2, RNG.standard_normal((3, 4)) * 2
    d = a - b
    np.testing.assert_allclose(ops.mse_loss(T(a), T(b), reduction).numpy(), reduce(d * d, reduction), rtol=1e-12)
    np.testing.assert_allclose(ops.l1_loss(T(a), T(b), reduction).numpy(), reduce(np.abs(d), reduction), rtol=1e-12)
    for beta in (1.0, 0.5, 2.5, 0.0):
        ref = np.abs(d) if beta == 0 else np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)
        got = ops.smooth_l1_loss(T(a), T(b), beta, reduction)
        np.testing.assert_allclose(got.numpy(), reduce(ref, reduction), rtol=1e-12)
        np.testing.assert_array_equal(nn.SmoothL1Loss(beta, reduction)(T(a), T(b)).numpy(), got.numpy())
    # MindSpore's default reduction for smooth_l1_loss is 'none' (PyTorch's is 'mean')
    assert ops.smooth_l1_loss(T(a), T(b)).shape == (3, 4) and nn.SmoothL1Loss()(T(a), T(b)).shape == (3, 4)
    np.testing.assert_array_equal(nn.MSELoss(reduction)(T(a), T(b)).numpy(),
                                  ops.mse_loss(T(a), T(b), reduction).numpy())
    np.testing.assert_array_equal(nn.L1Loss(reduction)(T(a), T(b)).numpy(), ops.l1_loss(T(a), T(b), reduction).numpy())


def bce_reference(x, y, w=None, pw=None):
    sig = 1.0 / (1.0 + np.exp(-x))
    pw = 1.0 if pw is None else pw
    loss = -(pw * y * np.log(sig) + (1 - y) * np.log(1 - sig))
    return loss if w is None else loss * w


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(reduction):
    x, y = RNG.standard_normal((4, 3)) * 3, RNG.uniform(0, 1, (4, 3))
    w, pw = RNG.uniform(0.5, 2, (4, 3)), RNG.uniform(0.5, 3, 3)
    np.testing.assert_allclose(ops.binary_cross_entropy_with_logits(T(x), T(y), reduction=reduction).numpy(),
                               reduce(bce_reference(x, y), reduction), rtol=1e-10)
    got = ops.binary_cross_entropy_with_logits(T(x), T(y), T(w), T(pw), reduction)
    np.testing.assert_allclose(got.numpy(), reduce(bce_reference(x, y, w, pw), reduction), rtol=1e-10)
    cell = nn.BCEWithLogitsLoss(reduction, weight=T(w), pos_weight=T(pw))
    np.testing.assert_array_equal(cell(T(x), T(y)).numpy(), got.numpy())


def test_binary_cross_entropy_with_logits_is_stable_at_large_logits():
    x = T(np.array([100.0, -100.0, 100.0, -100.0, 0.0], np.float32))
    y = T(np.array([1.0, 1.0, 0.0, 0.0, 1.0], np.float32))
    got = ops.binary_cross_entropy_with_logits(x, y, reduction="none").numpy()
    np.testing.assert_allclose(got, [0.0, 100.0, 100.0, 0.0, np.log(2.0)], rtol=1e-6, atol=1e-30)
    g = kiln.grad(lambda t: ops.binary_cross_entropy_with_logits(t, y, reduction="sum"))(x)
    np.testing.assert_allclose(g.numpy(), [0.0, -1.0, 1.0, 0.0, -0.5], atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "batchmean"])
def test_kl_div(reduction):
    logq = log_softmax(RNG.standard_normal((4, 5)))
    p = RNG.dirichlet(np.ones(5), 4)
    p[0, 1] = 0.0  # a zero label adds 0, not 0 * log 0
    ref = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - logq), 0.0)
    want = ref.sum() / 4 if reduction == "batchmean" else reduce(ref, reduction)
    got = ops.kl_div(T(logq), T(p), reduction)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    logp = np.log(RNG.dirichlet(np.ones(5), 4))
    ref = np.exp(logp) * (logp - logq)
    want = ref.sum() / 4 if reduction == "batchmean" else reduce(ref, reduction)
    np.testing.assert_allclose(ops.kl_div(T(logq), T(logp), reduction, log_target=True).numpy(), want, rtol=1e-12)
    np.testing.assert_array_equal(nn.KLDivLoss(reduction)(T(logq), T(p)).numpy(), got.numpy())


def test_bad_arguments_raise_clear_errors():
    x, y = T(RNG.standard_normal((3, 4))), T([0, 1, 2])
    cases = [
        (lambda: ops.mse_loss(x, T(np.zeros((3, 1)))), ValueError, "mse_loss: input and target must have one shape"),
        (lambda: ops.l1_loss(x, x, "avg"), ValueError, "l1_loss: reduction must be one of"),
        (lambda: ops.mse_loss(y, y), TypeError, "mse_loss: input must be floating point"),
        (lambda: ops.smooth_l1_loss(x, x, -1.0), ValueError, "smooth_l1_loss: beta"),
        (lambda: ops.cross_entropy(T([1.0, 2.0]), T([0])), ValueError, "cross_entropy: logits must be"),
        (lambda: ops.cross_entropy(x, T([0, 1])), ValueError, "cross_entropy: labels of shape \\[2\\]"),
        (lambda: ops.cross_entropy(x, y, T([1.0, 2.0])), ValueError, "cross_entropy: weight must be 1-D with one"),
        (lambda: ops.cross_entropy(x, y, label_smoothing=1.5), ValueError, "cross_entropy: label_smoothing"),
        (lambda: ops.cross_entropy(x, T(np.zeros((3, 5)))), ValueError, "cross_entropy: input and target"),
        (lambda: ops.cross_entropy(x, T(np.array([0, 1, 2], np.int8))), TypeError, "cross_entropy: integer labels"),
        (lambda: ops.nll_loss(x, x), TypeError, "nll_loss: target must hold integer class labels"),
        (lambda: ops.binary_cross_entropy_with_logits(x, x, T(np.ones((2, 3, 4)))), ValueError,
         "binary_cross_entropy_with_logits: weight / pos_weight broadcast"),
        (lambda: ops.kl_div(x, x, "batch"), ValueError, "kl_div: reduction must be one of"),
        (lambda: nn.KLDivLoss("batch"), ValueError, "KLDivLoss: reduction must be one of"),
        (lambda: nn.SmoothL1Loss(beta=-2), ValueError, "SmoothL1Loss: beta"),
        (lambda: nn.BCEWithLogitsLoss(T([1.0])), TypeError, "BCEWithLogitsLoss: the first argument is reduction"),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()


# ---- gradients ----------------------------------------------------------------------------------

LABELS = T(np.array([2, 0, 3]))
LABELS_2D = T(np.array([[1, 0], [1, -100], [0, 1]]))
WEIGHT = T(np.array([0.5, 1.0, 2.0, 1.5]))
PROBS = RNG.dirichlet(np.ones(4), 3)
TARGET = RNG.standard_normal((3, 4))
BINARY = T(RNG.uniform(0, 1, (3, 4)))
GRAD_TABLE = [
    ("ce_indices", lambda x: ops.cross_entropy(x, LABELS, WEIGHT, label_smoothing=0.1)),
    ("ce_indices_2d", lambda x: ops.cross_entropy(ops.reshape(x, 3, 2, 2).swapaxes(1, 2), LABELS_2D,
                                                  T([0.5, 2.0]), reduction="sum")),
    ("ce_probabilities", lambda x: ops.cross_entropy(x, T(PROBS), reduction="sum")),
    ("nll", lambda x: ops.nll_loss(ops.log_softmax(x, 1), LABELS, reduction="none")),
    ("mse", lambda x: ops.mse_loss(x, T(TARGET))),
    ("l1", lambda x: ops.l1_loss(x, T(TARGET), "sum")),
    ("smooth_l1", lambda x: ops.smooth_l1_loss(x, T(TARGET), 0.7, "none")),
    ("bce", lambda x: ops.binary_cross_entropy_with_logits(x, BINARY, pos_weight=T([1.0, 2.0, 0.5, 3.0]))),
    ("kl", lambda x: ops.kl_div(ops.log_softmax(x, 1), T(PROBS), "batchmean")),
    ("kl_log_target", lambda x: ops.kl_div(ops.log_softmax(x, 1), T(np.log(PROBS)), "sum", True)),
]


@pytest.mark.parametrize("name,fn", GRAD_TABLE, ids=[g[0] for g in GRAD_TABLE])
def test_gradients_match_finite_differences(name, fn):
    x = RNG.standard_normal((3, 4))
    x[np.abs(x - TARGET) < 0.05] += 0.2  # away from |d|'s kink and smooth_l1's switch
    check_grad(fn, x)


def test_gradients_reach_probability_targets():
    x = RNG.standard_normal((3, 4))
    check_grad(lambda x, p: ops.cross_entropy(x, p, label_smoothing=0.2), x, PROBS)
    check_grad(lambda q, p: ops.kl_div(q, p, "mean"), log_softmax(x), PROBS)


# ---- compiled ----------------------------------------------------------------------------------


KL_SUM, BCE, SMOOTH = nn.KLDivLoss("sum"), nn.BCEWithLogitsLoss(), nn.SmoothL1Loss(2.0, "none")


def _all_losses(x, y, p):
    return (ops.cross_entropy(x, y), ops.cross_entropy(x, y, WEIGHT.astype(kiln.float32), 1, "none", 0.1),
            ops.cross_entropy(x, p), ops.nll_loss(ops.log_softmax(x, 1), y, reduction="sum"),
            ops.mse_loss(x, p), ops.l1_loss(x, p, "none"), ops.smooth_l1_loss(x, p, 0.5),
            ops.binary_cross_entropy_with_logits(x * 20.0, p, pos_weight=p[0]),
            ops.kl_div(ops.log_softmax(x, 1), p, "batchmean"), KL_SUM(ops.log_softmax(x, 1), p),
            BCE(x, p), SMOOTH(x, p))


def _calls():
    out = []
    for _ in range(2):
        x = T(RNG.standard_normal((3, 4)).astype(np.float32))
        p = T(RNG.dirichlet(np.ones(4), 3).astype(np.float32))
        out.append((x, T(RNG.integers(0, 4, 3)), p))
    return out


def test_compiled_variants_equal_eager():
    assert_compiled_equal(_all_losses, *_calls())


def test_compiled_gradients_equal_eager():
    def total(x, y, p):
        return sum(v.sum() for v in _all_losses(x, y, p))

    assert_compiled_equal(total, *_calls(), grad=True)


def test_dynamic_batch_compiles_once():
    f = kiln.jit(lambda x, y, t: ops.cross_entropy(x, y) + ops.mse_loss(x, t)
                 + ops.binary_cross_entropy_with_logits(x, ops.sigmoid(t)), dynamic=True)
    for n in (3, 5, 9):
        x, t = RNG.standard_normal((n, 4)), RNG.standard_normal((n, 4))
        y = RNG.integers(0, 4, n)
        want = (ce_indices_reference(x, y) + ((x - t) ** 2).mean()
                + bce_reference(x, 1 / (1 + np.exp(-t))).mean())
        np.testing.assert_allclose(f(T(x), T(y), T(t)).numpy(), want, rtol=1e-10)
    assert f.cache_info().compiles == 1, f.cache_info()


def test_torch_agrees():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x, p = RNG.standard_normal((4, 5)), RNG.dirichlet(np.ones(5), 4)
    y, w = np.array([1, 4, -100, 0]), RNG.uniform(0.5, 2, 5)
    tx, tp, ty, tw = (torch.tensor(v) for v in (x, p, y, w))
    pairs = [
        (ops.cross_entropy(T(x), T(y), T(w), label_smoothing=0.3), F.cross_entropy(tx, ty, tw, label_smoothing=0.3)),
        (ops.cross_entropy(T(x), T(p)), F.cross_entropy(tx, tp)),
        (ops.nll_loss(T(x), T(y), reduction="sum"), F.nll_loss(tx, ty, reduction="sum")),
        (ops.smooth_l1_loss(T(x), T(p), 0.3, "mean"), F.smooth_l1_loss(tx, tp, beta=0.3)),
        (ops.binary_cross_entropy_with_logits(T(x * 30), T(p), T(p), T(w)),
         F.binary_cross_entropy_with_logits(tx * 30, tp, tp, pos_weight=tw)),
        (ops.kl_div(T(x), T(p), "batchmean"), F.kl_div(tx, tp, reduction="batchmean")),
        (ops.kl_div(T(x), T(np.log(p)), "none", True), F.kl_div(tx, torch.log(tp), reduction="none", log_target=True)),
    ]
    for got, want in pairs:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10)
