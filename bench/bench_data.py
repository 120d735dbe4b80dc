"""kiln.dataset keeps the model busy (issue 30): a jitted LeNet-style training step on the digits
images (1797 x 1 x 8 x 8; scikit-learn's load_digits when installed, synthetic arrays of the same
shape otherwise, and it says which) in batches of 64, fed by a pipeline whose map does real NumPy
augmentation (shifted-sum blur, contrast stretch, jitter) calibrated to cost as much CPU as the
step. Throughput of training (batches per second) with the map in 2 worker processes against 0
(the map in the training loop), over a few epochs, in one run.

    PYTHONPATH=python python3 bench/bench_data.py [--epochs N]

Target: 2 workers >= 1.7x the batches per second of 0 workers.
"""
import argparse
import os
import time

import numpy as np

from kiln import dataset as ds


def digits():
    try:
        from sklearn.datasets import load_digits
        d = load_digits()
        return d.images.astype(np.float32), d.target.astype(np.int32), "sklearn load_digits"
    except ImportError:
        rng = np.random.default_rng(0)
        images = rng.integers(0, 17, (1797, 8, 8)).astype(np.float32)
        labels = rng.integers(0, 10, 1797).astype(np.int32)
        return images, labels, "synthetic arrays of the digits' shape (scikit-learn not installed)"


class Augment:
    """passes rounds of a 3x3 blur by shifted sums, a contrast stretch and a seeded jitter."""

    def __init__(self, passes):
        self.passes = passes

    def __call__(self, batch):
        x = batch.astype(np.float32)
        rng = np.random.default_rng(int(x.sum()) & 0xFFFF)
        for _ in range(self.passes):
            blur = x.copy()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    blur += np.roll(np.roll(x, dy, axis=1), dx, axis=2)
            x = blur / 10.0
            lo, hi = x.min(axis=(1, 2), keepdims=True), x.max(axis=(1, 2), keepdims=True)
            x = (x - lo) / (hi - lo + 1e-6) + 0.01 * rng.standard_normal(x.shape, dtype=np.float32)
        return x


def calibrate(images, target_s):
    """Augmentation passes costing about target_s of CPU per batch, and one pass's cost."""
    batch = images[:BATCH]
    one = Augment(1)
    for _ in range(20):
        one(batch)
    t = time.process_time()
    for _ in range(100):
        one(batch)
    per_pass = (time.process_time() - t) / 100
    return max(1, round(target_s / per_pass)), per_pass


BATCH = 64


def make_step():
    """A jitted training step of a small LeNet (two 3x3 convolutions, three dense layers, SGD)."""
    import kiln
    from kiln import nn

    kiln.manual_seed(0)
    net = nn.SequentialCell(nn.Conv2d(1, 16, 3, pad_mode="same"), nn.ReLU(), nn.Conv2d(16, 32, 3, pad_mode="same"),
                            nn.ReLU(), nn.Flatten(), nn.Dense(32 * 64, 120), nn.ReLU(), nn.Dense(120, 84),
                            nn.ReLU(), nn.Dense(84, 10))
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.SGD(net.trainable_params(), 0.01, momentum=0.9)
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)

    @kiln.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    def run(x, y):
        return step(kiln.Tensor(x.reshape(-1, 1, 8, 8)), kiln.Tensor(y.astype(np.int64)))

    return run


def step_seconds(step, images, labels):
    x, y = images[:BATCH], labels[:BATCH]
    for _ in range(10):
        step(x, y)
    times = []
    for _ in range(40):
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def pipeline(images, labels, augment, workers):
    data = ds.NumpySlicesDataset((images, labels), column_names=["image", "label"], shuffle=False).batch(BATCH)
    return data.map(augment, input_columns="image", num_parallel_workers=workers if workers > 1 else 1)


def train(step, images, labels, augment, workers, epochs):
    """Batches per second of training over epochs, the pipeline feeding the step."""
    it = pipeline(images, labels, augment, workers).create_tuple_iterator(output_numpy=True)
    for x, y in it:  # one epoch to start the workers and warm the step
        step(x, y)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in it:
            step(x, y)
            n += 1
    return n / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one epoch")
    p.add_argument("--threads", type=int, default=1,
                   help="kernel threads of the training process, in both runs (default 1: on 2 cores the "
                        "workers take the other; PyTorch DataLoader users set torch.set_num_threads likewise)")
    args = p.parse_args()
    import kiln
    kiln.set_num_threads(args.threads)
    if args.quick:
        args.epochs = 1
    images, labels, source = digits()
    step = make_step()
    step_s = step_seconds(step, images, labels)
    passes, per_pass = calibrate(images, step_s)
    augment = Augment(passes)
    print(f"data: {source}; {len(images)} images, batches of {BATCH}; step {step_s * 1000:.2f} ms; map: "
          f"{passes} augmentation passes = {passes * per_pass * 1000:.2f} ms CPU per batch; {os.cpu_count()} CPUs; "
          f"{args.threads} kernel thread(s) in the training process")
    # same values with and without workers (checked on one epoch before timing)
    a = [r[0] for r in pipeline(images, labels, augment, 0).create_tuple_iterator(output_numpy=True)]
    b = [r[0] for r in pipeline(images, labels, augment, 2).create_tuple_iterator(output_numpy=True)]
    assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b)), "workers changed the values"
    zero = train(step, images, labels, augment, 0, args.epochs)
    two = train(step, images, labels, augment, 2, args.epochs)
    print(f"0 workers: {zero:8.1f} training steps/s")
    print(f"2 workers: {two:8.1f} training steps/s")
    print(f"speed-up 2 vs 0 workers: {two / zero:.2f}x (target >= 1.7x)")


if __name__ == "__main__":
    main()
