"""The same workloads in the systems a user would otherwise pick: PyTorch (eager, torch.jit.trace,
torch.compile), JAX (jax.jit) and MindSpore (PyNative, mindspore.jit). Each model gets kiln's
parameters (copied by name) and kiln's exact inputs; forward+backward returns the value and the
gradients of the trainable parameters in kiln's trainable_params() order, for a gradient of ones
(kiln.value_and_grad's rule for a non-scalar output). A framework that is not importable is
skipped with a one-line note."""
import importlib
import importlib.util
import logging
import math
import warnings

import numpy as np

from .. import models
from .workloads import Variant

PEER_NAMES = ("torch", "torch.jit.trace", "torch.compile", "jax.jit", "mindspore", "mindspore.jit")
FAMILIES = {"torch": ("torch", "torch.jit.trace", "torch.compile"), "jax": ("jax.jit",),
            "mindspore": ("mindspore", "mindspore.jit")}

# mindspore.jit configurations timed (capture_mode, jit_level): the seed's ms_backend rows
MINDSPORE_JIT = (("ast", "O0"), ("ast", "O1"), ("bytecode", "O0"), ("trace", "O0"))


def _import(name):
    try:
        return importlib.import_module(name), None
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install failing on import
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


class Peers:
    """The importable peer frameworks among those `wanted` (row names); notes for the rest."""

    def __init__(self, wanted):
        self.wanted = tuple(wanted)
        self.notes = []
        self.versions = {}
        self.modules = {}
        for family, names in FAMILIES.items():
            if not any(n in self.wanted for n in names):
                continue
            mod, why = _import(family)
            if mod is None:
                self.notes.append(f"{family}: not importable ({why}); {', '.join(names)} skipped")
                continue
            self.modules[family] = mod
            self.versions[family] = getattr(mod, "__version__", "?")
        if "torch" in self.modules:  # inductor warns on every compile that this machine has no CUDA
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        if "jax" in self.modules:
            jax = self.modules["jax"]
            self.versions["jax"] = f"{jax.__version__} ({jax.default_backend()})"

    def missing(self):
        """The peer families not importable here (those not asked for are looked up, not imported)."""
        return [f for f in FAMILIES if f not in self.modules
                and (any(n in self.wanted for n in FAMILIES[f]) or importlib.util.find_spec(f) is None)]

    def variants(self, workload):
        rows = []
        if "torch" in self.modules:
            rows += _torch_variants(self.modules["torch"], workload, self.wanted)
        if "jax" in self.modules and "jax.jit" in self.wanted:
            rows += _jax_variants(self.modules["jax"], workload)
        if "mindspore" in self.modules:
            rows += _mindspore_variants(self.modules["mindspore"], workload, self.wanted)
        return rows


    def amp_variants(self, workload, dtype):
        """The peers' mixed-precision rows of a module workload: torch eager and torch.compile under
        torch.autocast("cpu", dtype) (those of the two asked for), [] without torch."""
        if "torch" not in self.modules or workload.group not in ("conv", "attention"):
            return []
        return _torch_autocast_variants(self.modules["torch"], workload, self.wanted, dtype)


def _kiln_dims(workload):
    """What a peer needs to rebuild the kiln model."""
    m = workload.model
    if workload.group == "conv":
        return dict(channels=m.conv1.weight.shape[0], eps=m.bn1.eps)
    if workload.group == "attention":
        return dict(hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads,
                    inv_freq=np.array(m.inv_freq.asnumpy(), copy=True))
    return {}


# ---- PyTorch ------------------------------------------------------------------------------------------

_TORCH_NAMES = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}


def _torch_name(kiln_name):
    head, _, last = kiln_name.rpartition(".")
    last = _TORCH_NAMES.get(last, last)
    return f"{head}.{last}" if head else last


def _torch_model(torch, workload):
    nn = torch.nn
    dims = _kiln_dims(workload)

    class BasicBlock(nn.Module):
        def __init__(self, c, eps):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c, eps=eps)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c, eps=eps)

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + x)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), -1)

    class LlamaAttention(nn.Module):
        def __init__(self, hidden, heads, kv_heads, inv_freq):
            super().__init__()
            self.hidden, self.heads, self.kv_heads = hidden, heads, kv_heads
            self.head_dim = hidden // heads
            self.q_proj = nn.Linear(hidden, hidden, bias=False)
            self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(hidden, hidden, bias=False)
            self.register_buffer("inv_freq", torch.from_numpy(inv_freq))

        def forward(self, x, position_ids):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            freqs = position_ids[..., None].to(x.dtype) * self.inv_freq
            emb = torch.cat((freqs, freqs), -1)
            cos, sin = emb.cos()[:, None], emb.sin()[:, None]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            n_rep = self.heads // self.kv_heads
            k = k[:, :, None].expand(b, self.kv_heads, n_rep, s, self.head_dim).reshape(b, self.heads, s, -1)
            v = v[:, :, None].expand(b, self.kv_heads, n_rep, s, self.head_dim).reshape(b, self.heads, s, -1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            out = torch.softmax(scores, -1) @ v
            return self.o_proj(out.transpose(1, 2).reshape(b, s, self.hidden))

    if workload.group == "conv":
        model = BasicBlock(dims["channels"], dims["eps"])
    elif workload.group == "attention":
        model = LlamaAttention(dims["hidden"], dims["heads"], dims["kv_heads"], dims["inv_freq"])
    else:
        return None
    state = {_torch_name(n): torch.from_numpy(a) for n, a in workload.state().items()}
    own = model.state_dict()
    missing = [n for n in own if n not in state and not n.endswith("num_batches_tracked") and n != "inv_freq"]
    if missing:
        raise RuntimeError(f"torch model: no kiln parameter for {missing}")
    model.load_state_dict({n: state.get(n, v) for n, v in own.items()})
    return model.eval()


def _torch_autocast_variants(torch, workload, wanted, dtype):
    from .workloads import AMP_DTYPES

    return _torch_variants(torch, workload, wanted, (dtype, AMP_DTYPES[dtype]))


def _torch_variants(torch, workload, wanted, amp=None):
    """torch's rows of the workload; amp = (torch dtype name, short name): its autocast rows instead."""
    def convert(args):
        return tuple(torch.from_numpy(a) for a in args)

    def results(r):
        if isinstance(r, tuple):
            value, grads = r
            return [value.detach().numpy().copy()] + [g.detach().numpy().copy() for g in grads]
        return [r.detach().numpy().copy()]

    def build(wrap):
        """make() for a variant: wrap(model_or_function, torch first-call args) -> callable."""
        def make(args0):
            model = _torch_model(torch, workload)
            if model is None:
                return wrap(models.simple_function, args0)
            if not workload.backward:
                return wrap(model, args0)
            params = dict(model.named_parameters())
            weights = [params[_torch_name(n)] for n in workload.param_names()]
            fwd = wrap(model, args0)

            def step(*args):
                out = fwd(*args)
                return out, torch.autograd.grad(out, weights, torch.ones_like(out))
            return step
        return make

    def trace(model, args0):
        with warnings.catch_warnings():  # recent PyTorch deprecates torch.jit.trace
            warnings.simplefilter("ignore")
            return torch.jit.trace(model, args0)

    def compile_(model, args0):
        torch._dynamo.reset()  # no compiled code reused from an earlier row: prepare compiles
        return torch.compile(model, backend="inductor")

    rows = []
    if amp is not None:  # torch.autocast around the forward (the backward runs outside it, as torch advises)
        low = getattr(torch, amp[0])

        def autocast(wrap):
            def wrapped(model, args0):
                fn = wrap(model, args0)

                def call(*args):
                    with torch.autocast("cpu", dtype=low):
                        return fn(*args)
                return call
            return wrapped

        def results_f32(r):  # NumPy has no bfloat16: values as float32 (exact)
            if isinstance(r, tuple):
                value, grads = r
                return [value.detach().float().numpy().copy()] + [g.detach().float().numpy().copy() for g in grads]
            return [r.detach().float().numpy().copy()]

        if "torch" in wanted:
            rows.append(Variant("torch", False, "-", "-", "-", "-", build(autocast(lambda m, a: m)), results_f32,
                                convert=convert, amp=amp[1]))
        if "torch.compile" in wanted:
            rows.append(Variant("torch.compile", True, "-", "bytecode", "inductor", "false",
                                build(autocast(compile_)), results_f32, convert=convert, amp=amp[1]))
        return rows
    if "torch" in wanted:
        rows.append(Variant("torch", False, "-", "-", "-", "-", build(lambda m, a: m), results, convert=convert))
    if "torch.jit.trace" in wanted:
        rows.append(Variant("torch.jit.trace", True, "-", "trace", "torchscript", "-", build(trace), results,
                            convert=convert))
    if "torch.compile" in wanted:
        rows.append(Variant("torch.compile", True, "-", "bytecode", "inductor", "false", build(compile_), results,
                            convert=convert))
    return rows


# ---- JAX --------------------------------------------------------------------------------------------------


def _jax_variants(jax, workload):
    jnp = jax.numpy
    dims = _kiln_dims(workload)
    names = workload.param_names()
    state = workload.state()
    trainable = {n: state[n] for n in names}
    fixed = {n: a for n, a in state.items() if n not in trainable}

    def bn(x, p, i):
        shape = (1, -1, 1, 1)
        m, v = p[f"bn{i}.moving_mean"].reshape(shape), p[f"bn{i}.moving_variance"].reshape(shape)
        g, b = p[f"bn{i}.gamma"].reshape(shape), p[f"bn{i}.beta"].reshape(shape)
        return (x - m) / jnp.sqrt(v + dims["eps"]) * g + b

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def block(p, x):
        out = jax.nn.relu(bn(conv(x, p["conv1.weight"]), p, 1))
        out = bn(conv(out, p["conv2.weight"]), p, 2)
        return jax.nn.relu(out + x)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return jnp.concatenate((-x[..., half:], x[..., :half]), -1)

    def attention(p, x, position_ids):
        b, s, hidden = x.shape
        nh, nkv = dims["heads"], dims["kv_heads"]
        hd = hidden // nh
        q = (x @ p["q_proj.weight"].T).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
        k = (x @ p["k_proj.weight"].T).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
        v = (x @ p["v_proj.weight"].T).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
        freqs = position_ids[..., None].astype(x.dtype) * p["inv_freq"]
        emb = jnp.concatenate((freqs, freqs), -1)
        cos, sin = jnp.cos(emb)[:, None], jnp.sin(emb)[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = jnp.repeat(k, nh // nkv, axis=1)
        v = jnp.repeat(v, nh // nkv, axis=1)
        scores = q @ jnp.swapaxes(k, -1, -2) / math.sqrt(hd)
        out = jax.nn.softmax(scores, -1) @ v
        return out.transpose(0, 2, 1, 3).reshape(b, s, hidden) @ p["o_proj.weight"].T

    if workload.group == "attention":
        fixed["inv_freq"] = dims["inv_freq"]
    model = {"conv": block, "attention": attention}.get(workload.group)

    def make(args0):
        if model is None:
            return jax.jit(models.simple_function)
        pt = {n: jnp.asarray(a) for n, a in trainable.items()}
        pf = {n: jnp.asarray(a) for n, a in fixed.items()}

        def forward(pt, pf, *args):
            return model({**pt, **pf}, *args)

        if not workload.backward:
            f = jax.jit(forward)
        else:
            def fwd_bwd(pt, pf, *args):
                out, vjp = jax.vjp(lambda q: forward(q, pf, *args), pt)
                (g,) = vjp(jnp.ones_like(out))
                return out, tuple(g[n] for n in names)
            f = jax.jit(fwd_bwd)
        return lambda *args: f(pt, pf, *args)

    def convert(args):
        # int64 positions as int32: JAX runs without 64-bit types unless told otherwise
        return tuple(jnp.asarray(a.astype(np.int32) if a.dtype == np.int64 else a) for a in args)

    def results(r):
        if isinstance(r, tuple):
            return [np.asarray(r[0]).copy()] + [np.asarray(g).copy() for g in r[1]]
        return [np.asarray(r).copy()]

    return [Variant("jax.jit", True, "-", "trace", "xla", "-", make, results, sync=jax.block_until_ready,
                    convert=convert)]


# ---- MindSpore ------------------------------------------------------------------------------------------


def _mindspore_model(ms, workload):
    nn, ops = ms.nn, ms.ops
    dims = _kiln_dims(workload)

    class BasicBlock(nn.Cell):
        def __init__(self, c, eps):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1, has_bias=False)
            self.bn1 = nn.BatchNorm2d(c, eps=eps)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(c, c, 3, pad_mode="pad", padding=1, has_bias=False)
            self.bn2 = nn.BatchNorm2d(c, eps=eps)

        def construct(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + x)

    class LlamaAttention(nn.Cell):
        def __init__(self, hidden, heads, kv_heads, inv_freq):
            super().__init__()
            self.hidden, self.heads, self.kv_heads = hidden, heads, kv_heads
            self.head_dim = hidden // heads
            self.n_rep = heads // kv_heads
            self.scale = 1.0 / math.sqrt(self.head_dim)
            self.q_proj = nn.Dense(hidden, hidden, has_bias=False)
            self.k_proj = nn.Dense(hidden, kv_heads * self.head_dim, has_bias=False)
            self.v_proj = nn.Dense(hidden, kv_heads * self.head_dim, has_bias=False)
            self.o_proj = nn.Dense(hidden, hidden, has_bias=False)
            self.inv_freq = ms.Tensor(inv_freq)

        def rotate_half(self, x):
            half = self.head_dim // 2
            return ops.cat((-x[..., half:], x[..., :half]), -1)

        def construct(self, x, position_ids):
            b, s, _ = x.shape
            q = ops.transpose(ops.reshape(self.q_proj(x), (b, s, self.heads, self.head_dim)), (0, 2, 1, 3))
            k = ops.transpose(ops.reshape(self.k_proj(x), (b, s, self.kv_heads, self.head_dim)), (0, 2, 1, 3))
            v = ops.transpose(ops.reshape(self.v_proj(x), (b, s, self.kv_heads, self.head_dim)), (0, 2, 1, 3))
            freqs = ops.expand_dims(ops.cast(position_ids, x.dtype), -1) * self.inv_freq
            emb = ops.cat((freqs, freqs), -1)
            cos, sin = ops.expand_dims(ops.cos(emb), 1), ops.expand_dims(ops.sin(emb), 1)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            k = ops.repeat_interleave(k, self.n_rep, 1)
            v = ops.repeat_interleave(v, self.n_rep, 1)
            scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.scale
            out = ops.matmul(ops.softmax(scores, -1), v)
            return self.o_proj(ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (b, s, self.hidden)))

    if workload.group == "conv":
        model = BasicBlock(dims["channels"], dims["eps"])
    elif workload.group == "attention":
        model = LlamaAttention(dims["hidden"], dims["heads"], dims["kv_heads"], dims["inv_freq"])
    else:
        return None
    state = workload.state()
    for name, p in model.parameters_and_names():
        if name not in state:
            raise RuntimeError(f"mindspore model: no kiln parameter for {name}")
        p.set_data(ms.Tensor(state[name]))
    model.set_train(False)
    return model


def _frames_without_source():
    import inspect

    return any(f.code_context is None for f in inspect.stack())


def _mindspore_variants(ms, workload, wanted):
    def convert(args):
        return tuple(ms.Tensor(a) for a in args)

    def results(r):
        if isinstance(r, tuple):
            return [r[0].asnumpy().copy()] + [g.asnumpy().copy() for g in r[1]]
        return [r.asnumpy().copy()]

    def build(jit_kwargs):
        def make(args0):
            if jit_kwargs and jit_kwargs["capture_mode"] == "trace" and _frames_without_source():
                # MindSpore's trace reads the source line of every caller frame and fails on a frame
                # without one, leaving its trace state begun (later rows would fail too)
                raise RuntimeError("mindspore.jit(capture_mode='trace') needs the source of every caller frame; "
                                   "`python -m` and `-c` have none: run kiln-bench, bash ./scripts/bench.sh or a "
                                   "script instead")
            model = _mindspore_model(ms, workload)  # a fresh one per variant: no compiled graph reuse
            fn = model if model is not None else models.simple_function
            if jit_kwargs is not None:
                fn = ms.jit(fn, **jit_kwargs)
            if workload.backward:
                # value_and_grad of the jitted model, as kiln's rows do: jit(value_and_grad(...)) in
                # trace mode records the gradients of the first call as constants (MindSpore 2.10)
                params = {p.name: p for p in model.trainable_params()}
                fn = ms.value_and_grad(fn, None, [params[n] for n in workload.param_names()])
            return fn
        return make

    rows = []
    if "mindspore" in wanted:
        rows.append(Variant("mindspore", False, "-", "-", "-", "-", build(None), results, convert=convert))
    if "mindspore.jit" in wanted:
        for capture, level in MINDSPORE_JIT:
            rows.append(Variant("mindspore.jit", True, level, capture, "ms_backend", "false",
                                build(dict(capture_mode=capture, jit_level=level)), results, convert=convert))
    return rows
