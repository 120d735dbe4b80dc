"""Gradient buckets reduced in place (issue 32): when a compiled plan makes a bucket's gradients
itself, the memory planner lays them out one after the other in the bucket's own block and the
all-reduce runs there, nothing packed (DDP's gradients written straight into their bucket).

- Data-parallel training of an MLP and a small conv net on 2 ranks (kiln.set_deterministic(True)):
  the parameters trained with buckets in place equal, bit for bit, those trained with the same
  compiled step packing its buckets (KILN_BUCKET_IN_PLACE=0), and one process on the 2B batch up
  to rounding; capture trace and ast x O0 / O1 x kbk / sink, overlap off and on; the same for
  nn.GradientAccumulation's compiled apply step. At O1 the plan, explain() and the comm layer's
  counter say the buckets ran in place.
- Where the planner may not lay a gradient out (a graph input, a view, a graph output, a tensor
  read again after the bucket, a bucket whose results are returned) the bucket packs and every
  value equals NumPy's, on 2 ranks and on 3 (a mean over a rank count that is not a power of two
  divides the sum), with and without the deterministic order."""
from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

COMMON = """
import os
import numpy as np
import kiln
from kiln import _C, communication, nn
from kiln.ops import collective as C

communication.init()
r, n = communication.get_rank(), communication.get_group_size()
DEFAULT_OVERLAP = _C.comm_overlap()


def bucket_steps(calls):
    '''(in place, packed) bucket counts of each call'''
    out = []
    for call in calls:
        before = _C.comm_bucket_counts()
        call()
        after = _C.comm_bucket_counts()
        out.append((after[0] - before[0], after[1] - before[1]))
    return out


def compiled(f, variant, in_place, overlap):
    '''f compiled by its first call, made inside this setting'''
    os.environ["KILN_BUCKET_IN_PLACE"] = "1" if in_place else "0"
    _C.comm_set_overlap(overlap)
    return kiln.jit(f, capture_mode=variant[0], jit_level=variant[1], backend=variant[2])
"""

TRAINING = COMMON + """
kiln.set_deterministic(True)
STEPS, B = 3, 2


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(5, 12)
        self.fc2 = nn.Dense(12, 3)

    def construct(self, x):
        return self.fc2(self.fc1(x).tanh())


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, has_bias=True)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 6 * 6, 3)

    def construct(self, x):
        return self.fc(self.flatten(self.relu(self.conv(x))))


NETS = {"mlp": (MLP, (5,)), "conv": (ConvNet, (2, 6, 6))}
rng = np.random.RandomState(0)
DATA = {k: (rng.randn(STEPS, n * B, *shape).astype(np.float32), rng.randn(STEPS, n * B, 3).astype(np.float32))
        for k, (_, shape) in NETS.items()}


def train(name, variant, parallel=True, in_place=True, overlap=False):
    '''the trained parameters, each call's (in place, packed) bucket counts, the step'''
    kiln.reset_auto_parallel_context()
    if parallel:
        kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    kiln.manual_seed(3)
    net = NETS[name][0]()
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.5))
    step = cell if variant == "eager" else compiled(lambda x, y: cell(x, y), variant, in_place, overlap)
    X, Y = DATA[name]
    rows = slice(r * B, (r + 1) * B) if parallel else slice(None)
    counts = bucket_steps([lambda s=s: step(kiln.tensor(X[s, rows]), kiln.tensor(Y[s, rows]))
                                 for s in range(STEPS)])
    _C.comm_set_overlap(DEFAULT_OVERLAP)
    kiln.reset_auto_parallel_context()
    if variant != "eager":
        info = step.cache_info()
        assert info.eager_calls == 0 and info.compiles == 1, (variant, info)
    return [p.numpy() for p in net.trainable_params()], counts, step


VARIANTS = [(m, lv, be) for m in ("trace", "ast") for lv in ("O0", "O1") for be in ("kbk", "sink")]
for name in NETS:
    ref, _, _ = train(name, "eager", parallel=False)
    eager, counts, _ = train(name, "eager")
    assert counts == [(0, 1)] * STEPS, counts  # eagerly the one bucket is packed
    for p, q in zip(eager, ref):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)
    for variant in VARIANTS:
        for overlap in ((False, True) if variant[1] == "O1" else (False,)):
            what = f"{name} {variant} overlap {overlap}"
            got, counts, step = train(name, variant, overlap=overlap)
            packed, packed_counts, packed_step = train(name, variant, in_place=False, overlap=overlap)
            for p, q, w in zip(got, packed, ref):
                np.testing.assert_array_equal(p, q, err_msg=what)
                np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-6, err_msg=what)
            if variant[1] == "O0":  # one all-reduce per gradient: no bucket
                assert counts[1:] == packed_counts[1:] == [(0, 0)] * (STEPS - 1), (what, counts)
                continue
            # after the first call (which captures): the one bucket in place, or packed
            assert counts[1:] == [(1, 0)] * (STEPS - 1) and packed_counts[1:] == [(0, 1)] * (STEPS - 1), \\
                (what, counts, packed_counts)
            assert step.plan_str().count("{inputs in place}") == 1, (what, step.plan_str())
            assert "{inputs in place}" not in packed_step.plan_str(), what
            assert f"{len(got)} tensors (" in str(step.explain()) and " in place" in str(step.explain()), what
            assert " packed" in str(packed_step.explain()), what

# gradient accumulation: the apply step's bucket (its gradients made in the step) in place
K = 2


def accumulation(variant, in_place):
    kiln.reset_auto_parallel_context()
    kiln.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True)
    kiln.manual_seed(7)
    net = MLP()
    opt, loss_fn = nn.SGD(net.trainable_params(), 0.5, momentum=0.9), nn.MSELoss()
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    acc = nn.GradientAccumulation(K, opt)
    kiln.reset_auto_parallel_context()
    accumulate = compiled(lambda x, y: acc.accumulate(grad_fn(x, y)[1]), variant, in_place, False)
    apply = compiled(lambda x, y: acc.apply(grad_fn(x, y)[1]), variant, in_place, False)
    X, Y = DATA["mlp"]
    counts = []
    for c in range(STEPS):
        rows = [slice(r * B + m * (B // K), r * B + (m + 1) * (B // K)) for m in range(K)]
        calls = [lambda m=m: (apply if m == K - 1 else accumulate)(kiln.tensor(X[c, rows[m]]), kiln.tensor(Y[c, rows[m]]))
                 for m in range(K)]
        counts.append(bucket_steps(calls)[-1])
    _C.comm_set_overlap(DEFAULT_OVERLAP)
    return [p.numpy() for p in net.trainable_params()], counts, apply


ref, _, _ = train("mlp", "eager", parallel=False)
for variant in [(m, "O1", be) for m in ("trace", "ast") for be in ("kbk", "sink")]:
    got, counts, apply = accumulation(variant, True)
    packed, packed_counts, _ = accumulation(variant, False)
    for p, q, w in zip(got, packed, ref):
        np.testing.assert_array_equal(p, q, err_msg=str(variant))
    assert counts[1:] == [(1, 0)] * (STEPS - 1) and packed_counts[1:] == [(0, 1)] * (STEPS - 1), \\
        (variant, counts, packed_counts)
    assert "{inputs in place}" in apply.plan_str(), (variant, apply.plan_str())
print(f"rank {r} ok", flush=True)
"""

FALLBACK = COMMON + """
rng = np.random.RandomState(10 + r)
SHAPES = ((3, 4), (5,), (2, 3))
args = tuple(kiln.tensor(rng.randn(*s).astype(np.float32)) for s in SHAPES)
rngs = [np.random.RandomState(10 + q) for q in range(n)]
parts = [tuple(g.randn(*s).astype(np.float32) for s in SHAPES) for g in rngs]
mine = parts[r]


def mean(f):
    '''the mean over the ranks of f(rank's a, b, c), in rank order'''
    total = f(*parts[0])
    for q in range(1, n):
        total = total + f(*parts[q])
    return total / np.float32(n)


def reduce3(ga, gb, gc):
    return [C.all_reduce(g, "mean", fusion=1) for g in (ga, gb, gc)]


def in_place(a, b, c):  # every gradient made here and read by the bucket only
    ra, rb, rc = reduce3(a * 2, b * 3, c + 1)
    return ra * 1.5, rb * 1.5, rc * 1.5


def returned(a, b, c):  # b * 3 is also a result
    gb = b * 3
    ra, rb, rc = reduce3(a * 2, gb, c + 1)
    return ra * 1.5, rb * 1.5, rc * 1.5, gb


def read_after(a, b, c):  # b * 3 is read again after the bucket
    gb = b * 3
    ra, rb, rc = reduce3(a * 2, gb, c + 1)
    return ra * 1.5, rb * 1.5 + gb, rc * 1.5


def view(a, b, c):  # a view (of a * 2) in the bucket
    ra, rb, rc = reduce3((a * 2).transpose(1, 0), b * 3, c + 1)
    return ra * 1.5, rb * 1.5, rc * 1.5


def graph_input(a, b, c):  # a graph input (c) in the bucket
    ra, rb, rc = reduce3(a * 2, b * 3, c)
    return ra * 1.5, rb * 1.5, rc * 1.5


def results(a, b, c):  # the bucket's results are the graph's results
    return reduce3(a * 2, b * 3, c + 1)


want_a, want_b = mean(lambda a, b, c: a * 2) * 1.5, mean(lambda a, b, c: b * 3) * 1.5
CASES = {
    in_place: (True, [want_a, want_b, mean(lambda a, b, c: c + 1) * 1.5]),
    returned: (False, [want_a, want_b, mean(lambda a, b, c: c + 1) * 1.5, mine[1] * 3]),
    read_after: (False, [want_a, want_b + mine[1] * 3, mean(lambda a, b, c: c + 1) * 1.5]),
    view: (False, [want_a.T, want_b, mean(lambda a, b, c: c + 1) * 1.5]),
    graph_input: (False, [want_a, want_b, mean(lambda a, b, c: c) * 1.5]),
    results: (False, [want_a / 1.5, want_b / 1.5, mean(lambda a, b, c: c + 1)]),
}
for deterministic in (False, True):
    kiln.set_deterministic(deterministic)
    for f, (laid_out, want) in CASES.items():
        for variant in [(m, "O1", be) for m in ("trace", "ast") for be in ("kbk", "sink")]:
            for overlap in (False, True):
                what = f"{f.__name__} {variant} overlap {overlap} deterministic {deterministic}"
                jf = compiled(f, variant, True, overlap)
                outs = []
                counts = bucket_steps([lambda: outs.append(jf(*args))] * 2)
                _C.comm_set_overlap(DEFAULT_OVERLAP)
                assert counts[1] == ((1, 0) if laid_out else (0, 1)), (what, counts, jf.plan_str())
                assert ("{inputs in place}" in jf.plan_str()) == laid_out, (what, jf.plan_str())
                for got in outs:
                    assert len(got) == len(want), what
                    for g, w in zip(got, want):
                        np.testing.assert_allclose(g.numpy(), w, rtol=1e-6, atol=1e-6, err_msg=what)
                # the inputs are left as they were
                for a, m in zip(args, mine):
                    np.testing.assert_array_equal(a.numpy(), m, err_msg=what)
print(f"rank {r} ok", flush=True)
"""


def test_training_with_buckets_in_place_equals_packed_bitwise_and_one_process():
    run_ranks(2, TRAINING, timeout=900)


def test_buckets_the_plan_cannot_lay_out_pack_and_equal_numpy_on_two_ranks():
    run_ranks(2, FALLBACK, timeout=600)


def test_buckets_in_place_on_three_ranks_divide_the_mean_and_equal_numpy():
    run_ranks(3, FALLBACK, timeout=600)
