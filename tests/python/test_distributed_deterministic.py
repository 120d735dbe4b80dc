"""kiln.set_deterministic(True) (MindSpore's name; set_context(deterministic="ON") is its older
spelling): float all-reduces combine the ranks' tensors in rank order, ((x0 + x1) + x2) ..., so

- on 3 ranks, with values whose sum depends on the order (1 + 1e8 - 1e8), every rank gets exactly
  NumPy's left-to-right sum (and mean, and product), eagerly and compiled (the setting is read
  when the all-reduce runs, so a function compiled before it was set follows it too);
- data-parallel training of the seed's blocks on 2 ranks equals, bit for bit, one process that
  computes each shard's gradients and adds them in rank order (per_shard_reference: the same
  summation order as the ranks' all-reduce; a one-process run on the whole batch sums the 2B
  samples inside its kernels in another order, so it is equal up to rounding only, as
  test_distributed_equivalence.py checks), eagerly, MindSpore- and MegEngine-style; the
  BasicBlock's batch norms in training mode (each shard normalized on its own);
- every rank ends with the same bits, and a second job repeats the first one's bits, eagerly and
  compiled (kiln.jit at O0 / O1, kbk / sink; kiln.trace)."""
import re

from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

COLLECTIVES = """
import functools
import itertools
import warnings
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
assert n == 3
assert kiln.get_deterministic() is False and kiln.get_context("deterministic") == "OFF"

for dtype, big in ((np.float32, 1e8), (np.float64, 1e17)):
    # element j: the ranks hold a permutation of (1, big, -big); in rank order the 1 is lost
    # when it meets big first and kept otherwise
    perms = list(itertools.permutations((1.0, big, -big)))
    table = np.array(perms, dtype).T                     # table[rank][j]
    rng = np.random.RandomState(7)
    factors = (1 + rng.rand(n, 500)).astype(dtype)       # products rounded differently by order
    in_order = lambda rows, f: functools.reduce(f, list(rows))
    want_sum = in_order(table, np.add)
    want_prod = in_order(factors, np.multiply)
    assert len(set(want_sum.tolist())) == 2, want_sum    # the order matters for these values
    other_order = in_order(factors[::-1], np.multiply)
    assert (other_order != want_prod).any()
    compiled = kiln.jit(lambda a, b: (C.all_reduce(a, "sum"), C.all_reduce(a, "mean"), C.all_reduce(b, "prod")),
                        jit_level="O1")
    x, f = kiln.tensor(table[r]), kiln.tensor(factors[r])
    compiled(x, f)  # compiled while the setting is off
    for on in (True, False):
        kiln.set_deterministic(on)
        results = [(C.all_reduce(x, "sum"), C.all_reduce(x, "mean"), C.all_reduce(f, "prod")), compiled(x, f)]
        for s, m, p in results:
            if on:
                np.testing.assert_array_equal(s.numpy(), want_sum)
                np.testing.assert_array_equal(m.numpy(), want_sum / dtype(n))
                np.testing.assert_array_equal(p.numpy(), want_prod)
            else:  # the library's order: the same value up to rounding
                np.testing.assert_allclose(p.numpy(), want_prod, rtol=1e-5)
    # the gradient of an all-reduce is an all-reduce: ordered too
    kiln.set_deterministic(True)
    g = kiln.grad(lambda v: (C.all_reduce(v, "sum") * kiln.tensor(table[(r + 1) % n])).sum())(x)
    np.testing.assert_array_equal(g.numpy(), in_order(np.roll(table, -1, axis=0), np.add))
    # max and min and integers are exact in any order: unchanged
    np.testing.assert_array_equal(C.all_reduce(x, "max").numpy(), table.max(0))
    ints = kiln.tensor(np.array([r + 1, 2 ** 40], np.int64))
    np.testing.assert_array_equal(C.all_reduce(ints, "sum").numpy(), [6, 3 * 2 ** 40])
    kiln.set_deterministic(False)

kiln.set_context(deterministic="ON")
assert kiln.get_deterministic() is True and kiln.get_context("deterministic") == "ON"
kiln.set_context(deterministic="OFF")
assert kiln.get_deterministic() is False
for bad, call in ((1, kiln.set_deterministic), ("on", lambda v: kiln.set_context(deterministic=v))):
    try:
        call(bad)
    except (TypeError, ValueError) as e:
        assert "deterministic" in str(e), e
    else:
        raise AssertionError(f"{bad!r} accepted")
assert kiln.get_deterministic() is False
print(f"rank {r} ok", flush=True)
"""

TRAINING = """
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C
import distributed_blocks as D

STEPS = 3
communication.init()
kiln.set_deterministic(True)
r, n = communication.get_rank(), communication.get_group_size()


def same_on_every_rank(net, what):
    flat = np.concatenate([p.numpy().ravel() for p in net.trainable_params()])
    rows = C.all_gather(kiln.tensor(flat[None, :])).numpy()
    for q in range(n):
        np.testing.assert_array_equal(rows[q], flat, err_msg=f"{what}: rank {q} differs from rank {r}")


for block in ("basic", "attention"):
    batches = D.global_batches(block, STEPS, n)
    ref_net = D.make_net(block, train_bn=True)
    ref_losses = D.per_shard_reference(ref_net, batches, n)
    ref = D.parameters(ref_net)
    mine = [D.shard(b, r, n) for b in batches]
    for style, variants in (("mindspore", ["eager"] + D.JIT_VARIANTS), ("megengine", ["eager"] + D.TRACE_VARIANTS)):
        for variant in variants:
            what = f"{block} {style} {variant}"
            net = D.make_net(block, train_bn=True)
            step = D.STYLES[style](net, D.optimizer(net), variant, True)
            losses = [C.all_reduce(l, "mean").numpy() for l in D.train(step, mine)]
            same_on_every_rank(net, what)
            if variant == "eager":  # the one-process run that adds the shards' gradients in rank order
                np.testing.assert_array_equal(losses, ref_losses, err_msg=what)
                params = D.parameters(net)
                for k in ref:
                    np.testing.assert_array_equal(params[k], ref[k], err_msg=f"{what} {k}")
            print(f"digest {what} rank {r} {D.digest(D.parameters(net))} {D.digest(losses)}", flush=True)
print(f"rank {r} ok", flush=True)
"""


def test_all_reduce_combines_the_ranks_in_rank_order():
    run_ranks(3, COLLECTIVES)


def test_training_is_bitwise_reproducible_and_equals_the_per_shard_reference():
    source = TRAINING
    first = run_ranks(2, source, timeout=400)
    second = run_ranks(2, source, timeout=400)
    digests = [re.findall(r"digest ([^\n]+? rank \d) ([0-9a-f]{64} [0-9a-f]{64})", p.stdout) for p in (first, second)]
    assert len(digests[0]) == 2 * 2 * 2 * 5, first.stdout
    assert dict(digests[0]) == dict(digests[1]), (first.stdout, second.stdout)
