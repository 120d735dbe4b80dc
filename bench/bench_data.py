"""The data pipeline keeps the model busy (issue 30): batches of the digits images (scikit-learn's
bundled load_digits; synthetic arrays of the same shape when scikit-learn is missing, said so in
the output) through kiln.dataset.DataLoader with a per-sample augmentation that costs real CPU
work (a few FFT-based blurs of each 8x8 image), read with 2 worker processes against 0, in the same
run; printed: batches per second of each and their ratio (target >= 1.7 with 2 workers; a 2-core
machine running the main process too bounds it below 2).

    PYTHONPATH=python python3 bench/bench_data.py [--epochs N]"""
import argparse
import time

import numpy as np

from kiln import dataset as ds


def load():
    try:
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images.astype(np.float32), d.target.astype(np.int64), "scikit-learn digits"
    except ImportError:
        rng = np.random.default_rng(0)
        return rng.random((1797, 8, 8), dtype=np.float32) * 16, rng.integers(0, 10, 1797), "synthetic (no sklearn)"


class Augmented:
    def __init__(self, images, labels, rounds):
        self.images, self.labels, self.rounds = images, labels, rounds

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        k = np.fft.rfft2(np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16, img.shape)
        for _ in range(self.rounds):  # (real work: blurs, then sharpen back)
            img = np.fft.irfft2(np.fft.rfft2(img) * k, img.shape).astype(np.float32)
        return (img - img.mean()) / (img.std() + 1e-6), self.labels[i]


def rate(loader, epochs):
    t0 = time.perf_counter()
    n = 0
    for _ in range(epochs):
        for _batch in loader:
            n += 1
    return n / (time.perf_counter() - t0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    images, labels, source = load()
    data = Augmented(images, labels, rounds=40)
    zero = rate(ds.DataLoader(data, batch_size=32), args.epochs)
    two = rate(ds.DataLoader(data, batch_size=32, num_workers=2), args.epochs)
    print(f"data pipeline on {source}, {len(data)} images, batch 32")
    print(f"0 workers {zero:8.1f} batches/s   2 workers {two:8.1f} batches/s   ratio {two / zero:.2f} "
          f"(target >= 1.7) {'ok' if two / zero >= 1.7 else 'MISSED'}")


if __name__ == "__main__":
    main()
