"""BasicBlock inference benchmark: kiln.jit(..., jit_level="O1", infer_boost="on") against
PyTorch eager CPU and kiln eager, as ratios measured in one run.

    PYTHONPATH=python python3 bench/bench_infer.py [--quick] [--rounds N] [--threads T]

Workload (seed 000): ResNet BasicBlock 128->128 channels, stride 1, eval mode, input
(1, 128, 256, 256) float32 (--quick: 1x128x64x64). Targets (issue 4): the O1 + infer_boost
block at least 1.3x faster than PyTorch eager (torch.no_grad(), eval mode, the same number of
threads) and at least 1.3x faster than kiln eager (kiln.no_grad()). Rows without a target show
the effect of the layout pass (disable_format_transform=True) and of O0 + infer_boost.
The variants are timed round-robin, one call each per round, best of the rounds: load from
other processes on the machine hits every variant alike.
"""
import argparse
import time

import numpy as np

import kiln
from kiln import models
from timing import row


def make_block(size, seed=0):
    kiln.manual_seed(seed)
    block = models.BasicBlock(128)
    rng = np.random.default_rng(seed)
    for bn in (block.bn1, block.bn2):  # statistics that make the folding do something
        bn.moving_mean.set_data(rng.standard_normal(128).astype(np.float32) * 0.1)
        bn.moving_variance.set_data(rng.uniform(0.5, 2.0, 128).astype(np.float32))
        bn.gamma.set_data(rng.uniform(0.5, 1.5, 128).astype(np.float32))
        bn.beta.set_data(rng.standard_normal(128).astype(np.float32) * 0.1)
    block.set_train(False)
    x = rng.standard_normal((1, 128, size, size)).astype(np.float32)
    return block, x


def torch_block(torch, block):
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c, eps=block.bn1.eps)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c, eps=block.bn2.eps)

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + x)

    names = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}
    state = {}
    for name, p in block.parameters_and_names():
        head, _, last = name.rpartition(".")
        state[f"{head}.{names.get(last, last)}"] = torch.from_numpy(p.asnumpy().copy())
    model = BasicBlock(128)
    model.load_state_dict(state, strict=False)
    return model.eval()


def timed_round_robin(variants, rounds):
    """Best seconds per call of each variant, calling them in turn."""
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a 64x64 input and fewer rounds")
    p.add_argument("--rounds", type=int, help="calls per variant (default 8, --quick 20)")
    p.add_argument("--threads", type=int, help="threads for kiln and PyTorch alike (default: kiln's)")
    args = p.parse_args()
    if args.threads:
        kiln.set_num_threads(args.threads)
    size = 64 if args.quick else 256
    rounds = args.rounds or (20 if args.quick else 8)
    block, x_np = make_block(size)
    x = kiln.Tensor(x_np)
    threads = kiln.get_num_threads()
    jitted = {
        "O1 infer_boost": kiln.jit(block, jit_level="O1", infer_boost="on"),
        "O1 infer_boost, no format transform": kiln.jit(block, jit_level="O1", infer_boost="on",
                                                        disable_format_transform=True),
        "O0 infer_boost": kiln.jit(block, infer_boost="on"),
    }
    with kiln.no_grad():
        reference = block(x).asnumpy()
        variants = {"kiln eager": lambda: block(x)}
        for name, fn in jitted.items():
            for _ in range(2):  # trace, then the first compiled call (oneDNN primitives made)
                out = fn(x)
            np.testing.assert_allclose(out.asnumpy(), reference, rtol=1e-4, atol=1e-4, err_msg=name)
            variants[name] = lambda fn=fn: fn(x)
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            torch.set_num_threads(threads)
            model, tx = torch_block(torch, block), torch.from_numpy(x_np)
            with torch.no_grad():
                np.testing.assert_allclose(model(tx).numpy(), reference, rtol=1e-4, atol=1e-4, err_msg="torch")
            variants["torch eager"] = lambda: torch.no_grad()(model)(tx)
        best = timed_round_robin(variants, rounds)
    print(f"BasicBlock 128->128, x 1x128x{size}x{size} float32, eval mode, {threads} threads, "
          f"best of {rounds} round-robin calls")
    jit = best["O1 infer_boost"]
    ok = True
    if torch is not None:
        ok &= row("O1 infer_boost vs torch eager", jit * 1e3, "ms", f"torch {torch.__version__} eager",
                  best["torch eager"] * 1e3, best["torch eager"] / jit, 1.3, better="higher")
    else:
        print("torch eager: PyTorch not installed, row skipped")
    ok &= row("O1 infer_boost vs kiln eager", jit * 1e3, "ms", "kiln eager", best["kiln eager"] * 1e3,
              best["kiln eager"] / jit, 1.3, better="higher")
    for name in ("O1 infer_boost, no format transform", "O0 infer_boost"):
        print(f"  {name:<44} {best[name] * 1e3:10.3f} ms  (speedup of O1 infer_boost over it: "
              f"{best[name] / jit:.3f})")
    if torch is not None:
        print(f"  {'torch eager':<44} {best['torch eager'] * 1e3:10.3f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
