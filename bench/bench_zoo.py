"""The model zoo (examples/) side by side with PyTorch (issue 30): each model's training step (the
Llama decoder: tokens per second of greedy decoding with a KV cache) with kiln eager, kiln.jit's
best of a few rows, torch eager and torch.compile, at the same thread count, same weights, same
run; and the first call's time (capture + compile) of kiln.jit against torch.compile's, from an
empty compile cache and with background compile on (first calls run interpreted kernels while the
generated C builds; the steady-state rows are timed once it is built).

    PYTHONPATH=python python3 bench/bench_zoo.py [--models lenet,resnet18,gpt,lstm,llama] [--repeat 20]
        [--no-background-compile] [--warm-cache]

torch is used where importable (a venv made with --system-site-packages; see README). Targets:
kiln's best jit row >= 1.3x torch eager and >= 1.1x torch.compile; compile time <= torch.compile's."""
import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

import kiln

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import gpt_tiny  # noqa: E402
import lenet_digits  # noqa: E402
import llama_decode  # noqa: E402
import lstm_classifier  # noqa: E402
import resnet18  # noqa: E402

JIT_ROWS = [dict(capture_mode="ast", jit_level="O0"), dict(capture_mode="ast", jit_level="O1"),
            dict(capture_mode="ast", jit_level="O1", backend="sink"), dict(capture_mode="bytecode", jit_level="O1")]


def timed(fn, repeat):
    """(seconds of the first call, median seconds of repeat later calls)."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    kiln.wait_compiles()  # background builds (--background-compile): later calls run the native code
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, statistics.median(times)


# ---- the models: kiln step makers and torch twins ----------------------------------------------

def kiln_steps(make_net, make_step, x, y):
    """options -> (a fresh seeded net in training mode, a call of its training step on x, y):
    eager for options None, else kiln.jit(step, **options)."""
    def kiln_step(options):
        kiln.manual_seed(0)
        net = make_net()
        net.set_train()
        step = make_step(net)
        step = kiln.jit(step, **options) if options is not None else step
        xs, ys = kiln.Tensor(x), kiln.Tensor(y)
        return net, lambda: step(xs, ys).asnumpy()

    return kiln_step


def lenet_case():
    rng = np.random.default_rng(0)
    x = rng.random((32, 1, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, 32).astype(np.int64)
    steps = kiln_steps(lenet_digits.LeNet5, lambda net: lenet_digits.make_step(net, "eager"), x, y)
    return "LeNet5 train step, batch 32, 1x32x32", steps, (x, y), "LeNet5", dict(lr=0.02, momentum=0.9), None


def resnet_case():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, 8).astype(np.int64)
    steps = kiln_steps(lambda: resnet18.ResNet18(width=32), lambda net: resnet18.make_step(net, "eager"), x, y)
    return "ResNet-18 (width 32) train step, batch 8, 3x32x32", steps, (x, y), "ResNet18", \
        dict(lr=0.01, momentum=0.9), dict(width=32)


def gpt_case():
    data, chars = gpt_tiny.corpus()
    x, y = next(gpt_tiny.batches(data, 16, 64, 0))
    x, y = x.asnumpy(), y.asnumpy()
    steps = kiln_steps(lambda: gpt_tiny.GPT(len(chars)), lambda net: gpt_tiny.make_step(net, "eager", 1000), x, y)
    return "GPT (2 layers, 64 wide) train step, batch 16 x 64 tokens", steps, (x, y), "GPT", \
        dict(adamw=True), dict(vocab=len(chars))


def lstm_case():
    x, y = lstm_classifier.sequences(32, 128, np.random.default_rng(0))
    steps = kiln_steps(lstm_classifier.Classifier, lambda net: lstm_classifier.make_step(net, "eager"), x, y)
    return "LSTM classifier (2 layers, 32 wide) train step, batch 32 x 128 steps", steps, (x, y), \
        "LSTMClassifier", dict(adam=True), None


def torch_train_step(twins, torch, net, case_args, opt_args, compiled):
    x, y = (torch.from_numpy(a) for a in case_args)
    model = torch.compile(net) if compiled else net
    if opt_args.get("adamw"):
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    elif opt_args.get("adam"):
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=opt_args["lr"], momentum=opt_args["momentum"])

    def step():
        opt.zero_grad()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        if opt_args.get("adamw"):
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    return step


def train_rows(case, torch, twins, repeat):
    title, kiln_step, args, twin_name, opt_args, twin_kwargs = case
    rows = {}
    net, fn = kiln_step(None)
    rows["kiln eager"] = timed(fn, repeat)
    for options in JIT_ROWS:
        _, fn = kiln_step(options)
        rows["kiln.jit " + " ".join(f"{v}" for v in options.values())] = timed(fn, repeat)
    if torch is not None:
        for compiled in (False, True):
            twin = getattr(twins, twin_name)(**(twin_kwargs or {}))
            if twin_name == "GPT":
                twin = getattr(twins, twin_name)(twin_kwargs["vocab"])
            twins.copy_weights(net, twin)
            twin.train()
            step = torch_train_step(twins, torch, twin, args, opt_args, compiled)
            rows["torch.compile" if compiled else "torch eager"] = timed(step, repeat)
    return title, rows


def llama_rows(torch, twins, tokens):
    kiln.manual_seed(0)
    model = llama_decode.Llama()
    model.set_train(False)
    rows = {}

    def kiln_decode(step):
        return lambda: llama_decode.generate(model, step, [1, 2, 3, 4], tokens)

    rows["kiln eager"] = timed(kiln_decode(model.construct), 2)
    for options in JIT_ROWS:
        rows["kiln.jit " + " ".join(f"{v}" for v in options.values())] = timed(
            kiln_decode(kiln.jit(model.construct, **options)), 2)
    if torch is not None:
        twin = twins.copy_weights(model, twins.Llama()).eval()
        for compiled in (False, True):
            fwd = torch.compile(twin, dynamic=True) if compiled else twin

            def decode(fwd=fwd):
                caches, out = twin.empty_caches(), [1, 2, 3, 4]
                with torch.no_grad():
                    for pos in range(3 + tokens):
                        logits, caches = fwd(torch.tensor([[out[pos]]]), torch.tensor([pos]), caches)
                        if pos >= 3:
                            out.append(int(logits[0, -1].argmax()))
                return out

            rows["torch.compile" if compiled else "torch eager"] = timed(decode, 2)
    # per token, not per run
    return f"Llama decoder (2 layers, 128 wide, GQA 8/2) greedy decoding, {tokens} tokens", {
        k: (first, run / (tokens + 3)) for k, (first, run) in rows.items()}


def report(title, rows, per_token=False):
    print(f"\n{title}")
    unit = "per token" if per_token else "per step"
    print(f"  {'row':34s} {unit:>12s} {'first call':>12s}")
    for k, (first, run) in rows.items():
        print(f"  {k:34s} {run * 1e3:9.3f} ms {first:10.3f} s")
    jit = {k: v for k, v in rows.items() if k.startswith("kiln.jit")}
    best = min(jit, key=lambda k: jit[k][1])
    line = f"  best kiln.jit row: {best}"
    if "torch eager" in rows:
        line += (f"; speed-up vs torch eager {rows['torch eager'][1] / jit[best][1]:.2f}x (target >= 1.3), "
                 f"vs torch.compile {rows['torch.compile'][1] / jit[best][1]:.2f}x (target >= 1.1); "
                 f"first call kiln / torch.compile {jit[best][0] / rows['torch.compile'][0]:.2f} (target <= 1.0)")
    print(line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="lenet,resnet18,gpt,lstm,llama")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="5 repeats, 16 tokens")
    p.add_argument("--background-compile", action=argparse.BooleanOptionalAction, default=True,
                   help="kiln.set_context(background_compile=...): first calls run interpreted kernels while "
                        "generated C builds (default on; steady-state rows are timed after kiln.wait_compiles())")
    p.add_argument("--warm-cache", action="store_true",
                   help="use kiln's compile cache as it is (default: an empty one, so first calls compile)")
    args = p.parse_args()
    # (restored at the end: tests run this script in their own process)
    was_background, was_cache = kiln.get_context("background_compile"), os.environ.get("KILN_CACHE_DIR")
    kiln.set_context(background_compile=args.background_compile)
    cache = None if args.warm_cache else tempfile.TemporaryDirectory(prefix="kiln-bench-zoo-cache-")
    if cache is not None:
        os.environ["KILN_CACHE_DIR"] = cache.name
    if args.quick:
        args.repeat, args.tokens = 5, 16
    try:
        import torch
        import torch_twins as twins
        torch.set_num_threads(kiln.get_num_threads() if hasattr(kiln, "get_num_threads") else os.cpu_count())
    except ImportError:
        torch = twins = None
        print("torch is not installed: kiln rows only")
    threads = torch.get_num_threads() if torch is not None else "-"
    print(f"{os.cpu_count()} CPUs; torch threads {threads}; "
          f"torch {torch.__version__ if torch is not None else 'absent'}; kiln's compile cache "
          f"{'as it is' if args.warm_cache else 'empty'}, background compile {'on' if args.background_compile else 'off'}")
    cases = {"lenet": lenet_case, "resnet18": resnet_case, "gpt": gpt_case, "lstm": lstm_case}
    try:
        for name in args.models.split(","):
            if name == "llama":
                report(*llama_rows(torch, twins, args.tokens), per_token=True)
            else:
                report(*train_rows(cases[name](), torch, twins, args.repeat))
    finally:
        kiln.wait_compiles()
        kiln.set_context(background_compile=was_background)
        if cache is not None:
            cache.cleanup()
            if was_cache is None:
                os.environ.pop("KILN_CACHE_DIR", None)
            else:
                os.environ["KILN_CACHE_DIR"] = was_cache


if __name__ == "__main__":
    main()
