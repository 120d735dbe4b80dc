"""ResNet-18 (He et al.: four stages of two BasicBlocks, stride-2 downsampling with a 1x1
convolution on the shortcut, BatchNorm, global average pooling): a training step (forward and
backward, Momentum) and inference with infer_boost, eagerly or under kiln.jit.

    PYTHONPATH=python python3 examples/resnet18.py [--size 64] [--batch 8] [--steps 5]
        [--mode ast|bytecode|trace|eager]

Prints the training losses, the time of a step and of an inference, eager and jitted."""
import argparse
import time

import numpy as np

import kiln
from kiln import nn
from training import train_step


class Block(nn.Cell):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, pad_mode="pad", padding=1, has_bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.SequentialCell(nn.Conv2d(cin, cout, 1, stride, has_bias=False), nn.BatchNorm2d(cout))

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Cell):
    def __init__(self, num_classes=10, width=64):
        super().__init__()
        self.stem = nn.SequentialCell(nn.Conv2d(3, width, 3, pad_mode="pad", padding=1, has_bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            blocks += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
            cin = cout
        self.blocks = nn.SequentialCell(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Dense(cin, num_classes)

    def construct(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).reshape(x.shape[0], -1))


def make_step(net, mode, lr=0.01):
    loss_fn = nn.CrossEntropyLoss()
    return train_step(lambda x, y: loss_fn(net(x), y), nn.Momentum(net.trainable_params(), lr, 0.9), mode)


def data(batch, size, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [(kiln.Tensor(rng.standard_normal((batch, 3, size, size)).astype(np.float32)),
             kiln.Tensor(rng.integers(0, 10, batch).astype(np.int64))) for _ in range(steps)]


def train(mode="ast", batch=8, size=64, steps=5, width=64, seed=0):
    """(losses, seconds of the last step, the trained net) for a fresh seeded ResNet-18."""
    kiln.manual_seed(seed)
    net = ResNet18(width=width)
    net.set_train()  # BatchNorm on batch statistics (a Cell starts in inference mode, as in MindSpore)
    step = make_step(net, mode)
    losses, last = [], 0.0
    for x, y in data(batch, size, steps, seed):
        t = time.perf_counter()
        losses.append(float(step(x, y).asnumpy()))
        last = time.perf_counter() - t
    return losses, last, net


def infer(net, mode, x):
    """(logits, seconds of a second call) in eval mode; jitted with infer_boost."""
    net.set_train(False)
    f = net if mode == "eager" else kiln.jit(net, capture_mode=mode, infer_boost="on")
    f(x)
    t = time.perf_counter()
    out = f(x)
    return out.asnumpy(), time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--mode", default="ast", choices=["ast", "bytecode", "trace"])
    args = p.parse_args()
    for mode in ("eager", args.mode):
        losses, step_s, net = train(mode, args.batch, args.size, args.steps)
        x = data(args.batch, args.size, 1, seed=1)[0][0]
        _, infer_s = infer(net, mode, x)
        print(f"{mode:8s} losses {' '.join(f'{v:.4f}' for v in losses)}; step {step_s * 1000:.1f} ms, "
              f"inference {infer_s * 1000:.1f} ms")


if __name__ == "__main__":
    main()
