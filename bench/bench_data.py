"""kiln.dataset throughput with 2 workers against 0 (issue 30): the digits images (1797 x 8 x 8;
scikit-learn's load_digits when installed, synthetic arrays of the same shape otherwise, and it
says which) batched by 32, with a map doing real NumPy augmentation (random-shift blur and
contrast passes) calibrated to about 1 ms of CPU per batch, read for a few epochs.

    PYTHONPATH=python python3 bench/bench_data.py [--epochs N] [--ms 1.0]

Target: 2 workers >= 1.7x the batches per second of 0 workers (hard on a 2-core machine: the
main process also stacks and receives each batch).
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


def calibrate(images, target_ms):
    batch = images[:32]
    one = Augment(1)
    for _ in range(20):
        one(batch)
    t = time.process_time()
    for _ in range(100):
        one(batch)
    per_pass = (time.process_time() - t) / 100
    return max(1, round(target_ms / 1000 / per_pass)), per_pass


def pipeline(images, labels, augment, workers):
    data = ds.NumpySlicesDataset((images, labels), column_names=["image", "label"], shuffle=False).batch(32)
    return data.map(augment, input_columns="image", num_parallel_workers=workers if workers > 1 else 1)


def run(images, labels, augment, workers, epochs):
    data = pipeline(images, labels, augment, workers)
    it = data.create_tuple_iterator(output_numpy=True)
    n = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for _ in it:
            n += 1
    return n / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--ms", type=float, default=1.0, help="CPU milliseconds of augmentation per batch")
    args = p.parse_args()
    images, labels, source = digits()
    passes, per_pass = calibrate(images, args.ms)
    augment = Augment(passes)
    print(f"data: {source}; {len(images)} images, batches of 32; map: {passes} augmentation passes "
          f"= {passes * per_pass * 1000:.2f} ms CPU per batch; {os.cpu_count()} CPUs")
    # same values with and without workers (checked on one epoch before timing)
    a = [r[0] for r in pipeline(images, labels, augment, 0).create_tuple_iterator(output_numpy=True)]
    b = [r[0] for r in pipeline(images, labels, augment, 2).create_tuple_iterator(output_numpy=True)]
    assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b)), "workers changed the values"
    zero = run(images, labels, augment, 0, args.epochs)
    two = run(images, labels, augment, 2, args.epochs)
    print(f"0 workers: {zero:8.1f} batches/s")
    print(f"2 workers: {two:8.1f} batches/s")
    print(f"speed-up 2 vs 0 workers: {two / zero:.2f}x (target >= 1.7x)")


if __name__ == "__main__":
    main()
