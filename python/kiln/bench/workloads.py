"""The tutorial's workloads (seed 003), kiln's variants of running them, and the measurement.

A workload is a model (kiln.models), its first-call inputs and its per-run inputs: run i of n
gets every float input scaled by i / n (the tutorial's `x * (i / 1000)`), computed before the
timed loop. A variant is a named way of running it (kiln eager, one kiln.jit configuration, a
peer framework); measure() times its first call ("time to prepare") and the runs.
"""
import functools
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

import kiln
from kiln import models, profiler

# ---- kiln's jit variants -----------------------------------------------------------------------------
# capture_mode x jit_level x backend x fullgraph, one row each: THE list the benchmark runs. A row
# whose kiln.jit(...) construction raises NotImplementedError is skipped with a "not implemented
# yet" note, so rows for planned features can wait here and start running when their issue lands.
# Configurations kiln accepts but runs exactly like a row already listed are left out (they would
# time the same thing twice); SAME_AS_LISTED says which, and goes when they differ.


@dataclass(frozen=True)
class JitVariant:
    capture_mode: str
    jit_level: str
    backend: str
    fullgraph: bool
    infer_boost: str = "off"

    def kwargs(self):
        return dict(capture_mode=self.capture_mode, jit_level=self.jit_level, backend=self.backend,
                    fullgraph=self.fullgraph, infer_boost=self.infer_boost)

    def label(self):
        return (f"capture_mode={self.capture_mode!r}, jit_level={self.jit_level!r}, backend={self.backend!r}, "
                f"fullgraph={self.fullgraph}" + (f", infer_boost={self.infer_boost!r}" if self.infer_boost != "off"
                                                 else ""))


JIT_VARIANTS = (
    JitVariant("trace", "O0", "kbk", False),
    JitVariant("trace", "O1", "kbk", False),
    JitVariant("trace", "O2", "kbk", False),
    JitVariant("trace", "O0", "sink", False),
    JitVariant("trace", "O1", "sink", False),
    JitVariant("ast", "O0", "kbk", False),
    JitVariant("ast", "O1", "kbk", False),
    JitVariant("ast", "O0", "kbk", True),
    JitVariant("trace", "O1", "kbk", False, "on"),
    JitVariant("bytecode", "O0", "kbk", False),
    JitVariant("bytecode", "O1", "kbk", False),
    JitVariant("bytecode", "O0", "sink", False),
)

SAME_AS_LISTED = (
    "fullgraph=True changes nothing in trace capture (a trace sees no Python it could reject): not listed",
)

# ---- mixed precision (issue 31) ----------------------------------------------------------------------
# The amp rows of the module workloads (BasicBlock, attention): the model under
# kiln.amp.auto_mixed_precision(model, "O2", dtype) run eagerly and by these kiln.jit variants (the
# fastest float32 rows of the README's table), next to the peers' autocast rows (torch.autocast("cpu",
# dtype) around torch eager and torch.compile). AMP_DTYPES: --amp's choices, with the short name
# the tables' variant column ends with.
AMP_LEVEL = "O2"
AMP_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
AMP_JIT_VARIANTS = (
    JitVariant("trace", "O0", "kbk", False),
    JitVariant("trace", "O1", "kbk", False),
    JitVariant("bytecode", "O0", "sink", False),
)


def jit_variant_status(variant):
    """None when kiln.jit accepts the variant, else why it is skipped (one line)."""
    try:
        kiln.jit(models.simple_function, **variant.kwargs())
    except NotImplementedError as e:
        return f"not implemented yet ({_first_line(e)})"
    except (ValueError, TypeError) as e:
        return f"rejected ({_first_line(e)})"
    return None


def _first_line(e):
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# ---- sizes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    name: str
    simple_shape: tuple
    simple_runs: int
    conv_channels: int
    conv_hw: int
    conv_runs: int
    attn_hidden: int
    attn_heads: int
    attn_kv_heads: int
    attn_seq: int
    attn_runs: int
    note: str
    sgemm_n: int = 2048  # the peak GFLOP/s: the best sgemm (sgemm.best_peak) of sgemm_n x sgemm_n matrices


SIZES = {
    # the seed's exact shapes; the heavy modules run fewer than 1000 times (per-run time and the
    # 1000-run equivalent are shown)
    "full": Size("full", (2, 3), 1000, 128, 256, 10, 4096, 32, 8, 512, 10,
                 "the seed's shapes; heavy modules run 10 times (x1000 column: per run x 1000)"),
    # the seed's channels, heads-to-kv-heads ratio and head dim; smaller images, hidden size and
    # sequence: about 3 minutes on 2 cores with every peer
    "default": Size("default", (2, 3), 1000, 128, 64, 20, 1024, 8, 2, 256, 20,
                    "scaled down from the seed (--full: the seed's shapes)"),
    # tiny shapes, a few runs: for the smoke test
    "smallest": Size("smallest", (2, 3), 5, 4, 8, 2, 32, 4, 2, 8, 2, "tiny shapes, a few runs (smoke test)", 512),
}


# ---- workloads -----------------------------------------------------------------------------------------


@dataclass
class Workload:
    key: str            # "simple", "conv-fwd", "conv-fwdbwd", "attention-fwd", "attention-fwdbwd"
    group: str          # "simple", "conv", "attention" (--only)
    title: str
    shapes: str
    backward: bool      # value_and_grad over the trainable parameters
    model: object       # kiln.models function or Cell
    args0: tuple        # first-call inputs (kiln tensors)
    run_args: list      # per-run inputs
    output_names: list = field(default_factory=list)  # of the flattened results, for messages

    @property
    def runs(self):
        return len(self.run_args)

    def param_names(self):
        """Names of the trainable parameters, in trainable_params() order."""
        if not hasattr(self.model, "trainable_params"):
            return []
        names = {id(p): n for n, p in self.model.parameters_and_names()}
        return [names[id(p)] for p in self.model.trainable_params()]

    def state(self):
        """Every parameter (trainable or not) by name, as NumPy: what peers copy."""
        if not hasattr(self.model, "parameters_and_names"):
            return {}
        return {n: np.array(p.asnumpy(), copy=True) for n, p in self.model.parameters_and_names()}

    def numpy_args(self):
        """(first-call inputs, per-run inputs) as NumPy arrays with exactly kiln's values."""
        conv = lambda args: tuple(np.array(a.asnumpy(), copy=True) for a in args)  # noqa: E731
        return conv(self.args0), [conv(a) for a in self.run_args]


def _scaled_runs(args, runs):
    """Run i of `runs` gets every float input multiplied by i / runs; other inputs as they are."""
    out = []
    for i in range(runs):
        s = i / runs
        out.append(tuple(a * s if a.dtype.is_floating_point else a for a in args))
    return out


def _randomize_batch_norm(block, rng):
    """Non-trivial BatchNorm affine parameters and statistics, so the check sees them."""
    for bn in (block.bn1, block.bn2):
        c = bn.num_features
        bn.gamma.set_data(kiln.Tensor(rng.uniform(0.5, 1.5, c).astype(np.float32)))
        bn.beta.set_data(kiln.Tensor(rng.uniform(-0.5, 0.5, c).astype(np.float32)))
        bn.moving_mean.set_data(kiln.Tensor(rng.uniform(-0.2, 0.2, c).astype(np.float32)))
        bn.moving_variance.set_data(kiln.Tensor(rng.uniform(0.5, 2.0, c).astype(np.float32)))


def make_workloads(size, only=None, runs=None, seed=0):
    """The workloads of `size` (a Size), those of group `only` when given. `runs` overrides the
    heavy modules' run count."""
    rng = np.random.default_rng(seed)
    kiln.manual_seed(seed)
    out = []
    if only in (None, "simple"):
        args = tuple(kiln.Tensor(rng.standard_normal(size.simple_shape).astype(np.float32)) for _ in range(3))
        shape = "x".join(map(str, size.simple_shape))
        out.append(Workload("simple", "simple", "simple function f(a, b, c) = a * b + c",
                            f"a, b, c float32 {shape}", False, models.simple_function, args,
                            _scaled_runs(args, size.simple_runs), ["output"]))
    if only in (None, "conv"):
        c, hw = size.conv_channels, size.conv_hw
        block = models.BasicBlock(c)
        _randomize_batch_norm(block, rng)
        x = kiln.Tensor(rng.standard_normal((1, c, hw, hw)).astype(np.float32))
        n = runs or size.conv_runs
        shapes = f"BasicBlock {c}->{c} channels, stride 1; x float32 1x{c}x{hw}x{hw}; eval mode"
        out.append(Workload("conv-fwd", "conv", "conv: ResNet BasicBlock, forward", shapes, False, block, (x,),
                            _scaled_runs((x,), n), ["output"]))
        wl = Workload("conv-fwdbwd", "conv", "conv: ResNet BasicBlock, forward + backward", shapes, True, block,
                      (x,), _scaled_runs((x,), n))
        wl.output_names = ["value"] + [f"grad {p}" for p in wl.param_names()]
        out.append(wl)
    if only in (None, "attention"):
        h, nh, nkv, s = size.attn_hidden, size.attn_heads, size.attn_kv_heads, size.attn_seq
        attn = models.LlamaAttention(h, nh, nkv, rope_theta=500000.0)
        x = kiln.Tensor(rng.standard_normal((1, s, h)).astype(np.float32))
        pos = kiln.Tensor(np.arange(s, dtype=np.int64).reshape(1, s))
        n = runs or size.attn_runs
        shapes = (f"LlamaAttention hidden {h}, {nh} heads, {nkv} kv heads (head dim {h // nh}), rope theta 5e5; "
                  f"x float32 1x{s}x{h}, position_ids arange({s})")
        out.append(Workload("attention-fwd", "attention", "attention: Llama attention, forward", shapes, False,
                            attn, (x, pos), _scaled_runs((x, pos), n), ["output"]))
        wl = Workload("attention-fwdbwd", "attention", "attention: Llama attention, forward + backward", shapes,
                      True, attn, (x, pos), _scaled_runs((x, pos), n))
        wl.output_names = ["value"] + [f"grad {p}" for p in wl.param_names()]
        out.append(wl)
    return out


def workload_flops(workload):
    """The floating-point operations of one call of the workload: kiln eager's call (forward, and
    for forward+backward the backward too) run once under kiln.profiler, its kernels' FLOPs summed
    (the op table's KILN_COST footprints, the profiler's own count)."""
    fn = kiln_variants(workload, ())[0].make(workload.args0)
    with profiler.profile(record_shapes=False, profile_memory=False) as prof:
        fn(*workload.args0)
    return sum(e["flops"] for e in prof.events() if e["kind"] == "kernel")


# ---- kiln's variants of a workload ----------------------------------------------------------------------


@dataclass
class Variant:
    """One row: how to build the callable (make(first-call args) -> fn; fn(*args) -> result) and
    how to read its results (to_numpy(result) -> list of arrays, value first then gradients)."""
    system: str
    enable_jit: bool
    jit_level: str
    capture_mode: str
    backend: str
    fullgraph: str
    make: object
    to_numpy: object
    sync: object = None          # blocks until an asynchronous result is ready
    convert: object = None       # peers: one tuple of NumPy inputs -> the callable's arguments
    info: object = None          # after the run: a dict of extra facts (e.g. jit cache statistics)
    infer_boost: str = "-"       # kiln.jit's infer_boost ("on"/"off"); "-" for the others
    amp: str = "-"               # mixed precision: the low dtype's short name ("bf16", "fp16"), "-" for float32


def kiln_results(result):
    """kiln results as NumPy: a tensor, or (value, grads) of value_and_grad."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], tuple):
        value, grads = result
        return [np.array(value.asnumpy(), copy=True)] + [np.array(g.asnumpy(), copy=True) for g in grads]
    return [np.array(result.asnumpy(), copy=True)]


def kiln_variants(workload, jit_variants):
    """kiln eager, then each implemented jit variant."""
    model = workload.model
    weights = model.trainable_params() if workload.backward else None

    def eager(args0):
        return kiln.value_and_grad(model, None, weights) if workload.backward else model

    rows = [Variant("kiln", False, "-", "-", "-", "-", eager, kiln_results, infer_boost="-")]
    for v in jit_variants:
        holder = {}

        def make(args0, v=v, holder=holder):
            jf = holder["jit"] = kiln.jit(model, **v.kwargs())
            return kiln.value_and_grad(jf, None, weights) if workload.backward else jf

        def info(holder=holder):
            jf = holder.get("jit")
            if jf is None:
                return {}
            if workload.backward and hasattr(jf, "_grad_variant"):  # the compiled forward+backward
                jf = jf._grad_variant(None, weights, False)
            ci = jf.cache_info()
            return {"compiles": ci.compiles, "eager_calls": ci.eager_calls, "hits": ci.hits}

        rows.append(Variant("kiln.jit", True, v.jit_level, v.capture_mode, v.backend, str(v.fullgraph).lower(),
                            make, kiln_results, info=info, infer_boost=v.infer_boost))
    return rows


def kiln_amp_variants(workload, jit_variants, dtype="bfloat16"):
    """The amp rows of a module workload: kiln eager, then each of jit_variants, on a copy of the
    model (same weights; auto_mixed_precision sets its norms to_float(float32)) under
    kiln.amp.auto_mixed_precision(copy, AMP_LEVEL, dtype); forward+backward takes the gradients of
    the copy's float32 master weights. [] for the simple function."""
    import copy

    if not hasattr(workload.model, "trainable_params"):
        return []
    short = AMP_DTYPES[dtype]
    model = copy.deepcopy(workload.model)
    net = kiln.amp.auto_mixed_precision(model, AMP_LEVEL, getattr(kiln, dtype))
    weights = model.trainable_params() if workload.backward else None

    def forward(*args):
        return net(*args)

    def eager(args0):
        return kiln.value_and_grad(forward, None, weights) if workload.backward else forward

    rows = [Variant("kiln", False, "-", "-", "-", "-", eager, kiln_results, amp=short)]
    for v in jit_variants:
        holder = {}

        def make(args0, v=v, holder=holder):
            jf = holder["jit"] = kiln.jit(forward, **v.kwargs())
            return kiln.value_and_grad(jf, None, weights) if workload.backward else jf

        rows.append(Variant("kiln.jit", True, v.jit_level, v.capture_mode, v.backend, str(v.fullgraph).lower(),
                            make, kiln_results, info=functools.partial(_jit_info, holder, workload, weights),
                            infer_boost=v.infer_boost, amp=short))
    return rows


def _jit_info(holder, workload, weights):
    """A kiln.jit row's cache statistics (compiles, calls run eagerly, hits) after its runs."""
    jf = holder.get("jit")
    if jf is None:
        return {}
    if workload.backward and hasattr(jf, "_grad_variant"):  # the compiled forward+backward
        jf = jf._grad_variant(None, weights, False)
    ci = jf.cache_info()
    return {"compiles": ci.compiles, "eager_calls": ci.eager_calls, "hits": ci.hits}


# ---- measuring and checking ---------------------------------------------------------------------------------


@dataclass
class Result:
    prepare_s: float = float("nan")
    runs: int = 0
    rep_s: list = field(default_factory=list)  # the time of the `runs` calls, once per repetition
    first_run_s: float = float("nan")  # of the first repetition (not synchronized for asynchronous peers)
    first: list = None   # outputs of the first call (prepare), NumPy
    last: list = None    # outputs of the last run
    error: str = None    # the variant failed: one line
    traceback: str = None

    @property
    def run_s(self):
        """The median of the repetitions' times."""
        return float(np.median(self.rep_s)) if self.rep_s else float("nan")

    def _per_run(self, s):
        return s / self.runs if self.runs and self.rep_s else float("nan")

    @property
    def per_run_s(self):
        return self._per_run(self.run_s)

    @property
    def per_run_min_s(self):
        return self._per_run(min(self.rep_s, default=float("nan")))

    @property
    def per_run_max_s(self):
        return self._per_run(max(self.rep_s, default=float("nan")))


def measure(variant, args0, run_args, repeat=1):
    """Time to prepare (building the callable and its first call), then `repeat` times the time
    of the runs (every run_args once)."""
    return measure_interleaved([variant], args0, run_args, repeat)[0]


def measure_interleaved(variants, args0, run_args, repeat=1):
    """measure() of several variants at once: each prepared, then timed in turns, repetition i of
    every variant before repetition i + 1 of any, so that a change in the machine's load during the
    measurement reaches them alike. One Result per variant; a variant that fails is left out of
    later turns."""
    results = [Result(runs=len(run_args)) for _ in variants]
    fns = [_guarded(res, _prepare, v, args0, res) for v, res in zip(variants, results)]
    outs = [None] * len(variants)
    for rep in range(repeat):
        for i, (v, res) in enumerate(zip(variants, results)):
            if res.error is None:
                outs[i] = _guarded(res, _time_runs, v, fns[i], run_args, res, rep == 0)
    for v, res, out in zip(variants, results, outs):
        if res.error is None and out is not None:
            _guarded(res, lambda: setattr(res, "last", v.to_numpy(out)))
    return results


def _guarded(res, fn, *args):
    """fn(*args), or None with res.error and res.traceback set when it raises: a failing variant
    is reported, not fatal."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        res.error = f"{type(e).__name__}: {_first_line(e)}"
        res.traceback = traceback.format_exc()
        return None


def _prepare(variant, args0, res):
    """Builds the callable and makes its first call: res.prepare_s and res.first; the callable."""
    t0 = time.perf_counter()
    fn = variant.make(args0)
    out = fn(*args0)
    if variant.sync:
        variant.sync(out)
    res.prepare_s = time.perf_counter() - t0
    res.first = variant.to_numpy(out)
    return fn


def _time_runs(variant, fn, run_args, res, first_repetition):
    """One repetition: every run_args once, its time appended to res.rep_s; the last output."""
    out = None
    t0 = time.perf_counter()
    runs = iter(run_args)
    for args in runs:  # the first run alone: work deferred past the first call shows there
        out = fn(*args)
        break
    t1 = time.perf_counter()
    for args in runs:
        out = fn(*args)
    if variant.sync and out is not None:
        variant.sync(out)
    res.rep_s.append(time.perf_counter() - t0)
    if first_repetition:
        res.first_run_s = t1 - t0
    return out


# Tolerances of a variant's results against kiln eager's (float32).
# Values (forward outputs): elementwise, |got - ref| <= ATOL * max(1, max|ref|) + RTOL * |ref|.
#   float32 sums of K terms err in proportion to the size of the terms, not of the sum, so an
#   element that cancels to near zero keeps the error of the large terms it came from: atol is
#   taken relative to the output's largest element. 1e-4 of it covers K up to the 4096-wide
#   attention projections (sqrt(4096) * 2**-24 ~ 4e-6 per term).
# Gradients: relative L2 error, ||got - ref|| <= GRAD_RTOL * ||ref||, 1e-2. ReLU's derivative
#   jumps at 0: a pre-activation within rounding of 0 may take the other branch in another system,
#   which changes a whole output channel of the previous conv's weight gradient by O(1). Seen:
#   torch.compile on the default BasicBlock, one pixel of channel 79 with pre-activation 2.9e-7:
#   809 of 147456 elements of conv1's weight gradient off by up to 6%, relative L2 error 2.1e-3,
#   every other gradient within 7e-5. A real error (a missing term, a wrong channel or slice)
#   moves the tensor by far more than 1e-2: one wrong channel of 128 is ~1/sqrt(128) ~ 0.09.
RTOL, ATOL = 1e-3, 1e-4
GRAD_RTOL = 1e-2
RULES = {"value": "|got - ref| <= atol * max(1, max|ref|) + rtol * |ref| elementwise",
         "gradient": "||got - ref||_2 <= grad_rtol * ||ref||_2"}


@dataclass(frozen=True)
class Tolerance:
    """A check's tolerance (the rules above): atol is taken relative to max(atol_floor, max|ref|)."""
    rtol: float = RTOL
    atol: float = ATOL
    grad_rtol: float = GRAD_RTOL
    atol_floor: float = 1.0


FLOAT32 = Tolerance()
# The amp rows that compute differently from kiln eager float32 (kiln eager amp, the peers' autocast
# rows) are checked against it within the reduced precision's error: every value within a fraction of
# the output's largest magnitude (docs/guide/mixed_precision.md: one bfloat16 product 2%, float16
# 0.4%), gradients by relative L2 error. A pre-activation within a bfloat16 rounding of 0 takes the
# other ReLU branch, moving a conv weight's gradient more than its value: measured 3.0% on the
# default BasicBlock's conv1 gradient, 0.2-0.7% elsewhere. kiln.jit's amp rows must equal kiln eager
# amp's results (FLOAT32's tolerance against that row: measured bit for bit).
AMP = {"bf16": Tolerance(rtol=0.0, atol=2e-2, grad_rtol=5e-2, atol_floor=0.0),
       "fp16": Tolerance(rtol=0.0, atol=5e-3, grad_rtol=2e-2, atol_floor=0.0)}


def _error(g, r, gradient, tol=FLOAT32):
    """The error of g against r in units of its tolerance (agreement: <= 1)."""
    if not np.all(np.isfinite(g)):
        return float("inf")
    if gradient:
        diff = float(np.linalg.norm(g - r))
        return 0.0 if diff == 0 else diff / (tol.grad_rtol * float(np.linalg.norm(r))) if np.any(r) else float("inf")
    scale = max(tol.atol_floor, float(np.max(np.abs(r))))
    bound = tol.atol * scale + tol.rtol * np.abs(r)
    diff = np.abs(g - r)
    with np.errstate(divide="ignore", invalid="ignore"):  # (a zero bound: a difference is infinitely off)
        return float(np.max(np.where(diff == 0, 0.0, diff / bound)))


def compare(got, ref, names, grads_from=None, tol=FLOAT32):
    """(agree, worst error in units of its tolerance, which output). Outputs from index
    grads_from on are gradients (None: no gradients)."""
    if got is None or ref is None:
        return False, float("inf"), "no result"
    if len(got) != len(ref):
        return False, float("inf"), f"{len(got)} outputs, expected {len(ref)}"
    worst, where = 0.0, ""
    for i, (g, r) in enumerate(zip(got, ref)):
        name = names[i] if i < len(names) else f"output {i}"
        g = np.asarray(g, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        if g.shape != r.shape:
            return False, float("inf"), f"{name}: shape {g.shape}, expected {r.shape}"
        if r.size == 0:
            continue
        e = _error(g, r, grads_from is not None and i >= grads_from, tol)
        if not e <= worst:  # NaN counts as the worst
            worst, where = (e if e == e else float("inf")), name
    return worst <= 1.0, worst, where
