"""BatchNorm+ReLU backward benchmark: the fused kernel (batch_norm_relu_backward, what O1 makes of
relu_backward feeding batch_norm_backward in training graphs) against the two kernels it replaces,
on the ResNet BasicBlock's activations, timed in turns in one run.

    PYTHONPATH=python python3 bench/bench_bn_relu.py [--quick]

Target (issue 17 part 5): the fused kernel takes at most 1.0x the time of relu_backward followed by
batch_norm_backward (it reads gy and the mask together and never writes the masked gradient).
"""
import argparse
import sys

import numpy as np

import kiln
from kiln._optable import OP
from kiln.ops._util import apply
from timing import alternate, row


def tensors(shape, rng):
    c = shape[1]
    gy, x, r = (kiln.Tensor(rng.standard_normal(shape).astype(np.float32)) for _ in range(3))
    gamma = kiln.Tensor(rng.uniform(0.5, 1.5, c).astype(np.float32))
    mean = kiln.Tensor(rng.uniform(-0.2, 0.2, c).astype(np.float32))
    invstd = kiln.Tensor(rng.uniform(0.5, 2.0, c).astype(np.float32))
    return gy, x, gamma, mean, invstd, r


def bench(shape, quick, rng):
    gy, x, gamma, mean, invstd, r = tensors(shape, rng)
    attrs = (1,)  # batch statistics (training)

    def unfused():
        masked = apply(OP.relu_backward, (gy, r))
        return apply(OP.batch_norm_backward, (masked, x, gamma, mean, invstd), attrs)

    def fused():
        return apply(OP.batch_norm_relu_backward, (gy, x, gamma, mean, invstd, r), attrs)

    for a, b in zip(unfused(), fused()):  # the same results first
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-5)
    numel = int(np.prod(shape))
    number = max(1, (2 if quick else 20) * (1 << 21) // numel)
    t_fused, t_unfused = alternate(fused, unfused, 5 if quick else 15, number)
    label = "x".join(map(str, shape))
    return [row(f"bn+relu backward {label}", t_fused * 1e3, "ms", "relu_bwd + bn_bwd", t_unfused * 1e3,
                t_fused / t_unfused, 1.0, "lower")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the default BasicBlock size only, fewer rounds")
    args = p.parse_args()
    print(f"kiln {kiln.__version__}, {kiln.get_num_threads()} threads")
    rng = np.random.default_rng(0)
    shapes = [(1, 128, 64, 64)] + ([] if args.quick else [(1, 128, 256, 256)])  # kiln.bench default, --full
    results = []
    for shape in shapes:
        results += bench(shape, args.quick, rng)
    print(f"{sum(results)} of {len(results)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
