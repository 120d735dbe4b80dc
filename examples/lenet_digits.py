"""LeNet5 trained on scikit-learn's bundled digits (1,797 8x8 images, upsampled to LeNet's 32x32),
fed by kiln.dataset, with MindSpore's Momentum optimizer, eagerly or under kiln.jit.

    PYTHONPATH=python python3 examples/lenet_digits.py [--epochs 12] [--mode ast|bytecode|trace|eager]

Prints the loss of each epoch and the accuracy on the 20% of images held out (>= 97% expected)."""
import argparse
import sys

import numpy as np

import kiln
from kiln import dataset as ds
from kiln import nn
from training import train_step


class LeNet5(nn.Cell):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.SequentialCell(
            nn.Conv2d(1, 6, 5, pad_mode="valid"), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5, pad_mode="valid"), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten())
        self.classifier = nn.SequentialCell(nn.Dense(16 * 5 * 5, 120), nn.ReLU(), nn.Dense(120, 84), nn.ReLU(),
                                            nn.Dense(84, num_classes))

    def construct(self, x):
        return self.classifier(self.features(x))


def load_digits_split(seed=0):
    """(train images, train labels, test images, test labels): 32x32 float32 images in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("examples/lenet_digits.py needs scikit-learn (bash scripts/install-deps.sh installs it)")
    d = load_digits()
    images = np.kron(d.images / 16.0, np.ones((4, 4)))[:, None].astype(np.float32)  # 8x8 -> 32x32
    labels = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(0.8 * len(images))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def make_step(net, mode, lr=0.02):
    loss_fn = nn.CrossEntropyLoss()
    return train_step(lambda x, y: loss_fn(net(x), y), nn.Momentum(net.trainable_params(), lr, 0.9), mode)


def accuracy(net, images, labels):
    net.set_train(False)
    predicted = net(kiln.Tensor(images)).asnumpy().argmax(axis=1)
    net.set_train(True)
    return float((predicted == labels).mean())


def train(epochs=12, mode="ast", batch_size=32, seed=0, log=print):
    """Trains a fresh LeNet5; returns (per-epoch mean losses, test accuracy)."""
    kiln.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_digits_split(seed)
    net = LeNet5()
    net.set_train()
    ds.config.set_seed(seed)
    data = ds.NumpySlicesDataset((x_train, y_train), column_names=["image", "label"], shuffle=True).batch(batch_size)
    # MindSpore's cosine decay to the last step: at a constant rate the last epochs wander, and the
    # accuracy at the end would depend on the GEMM kernels' rounding (88-98% across OpenBLAS's cores)
    per_epoch = data.get_dataset_size()
    step = make_step(net, mode, nn.cosine_decay_lr(0.0005, 0.02, epochs * per_epoch, per_epoch, epochs))
    losses = []
    for epoch in range(epochs):
        total = [float(step(x, y.astype(kiln.int64)).asnumpy()) for x, y in data.create_tuple_iterator()]
        losses.append(float(np.mean(total)))
        log(f"epoch {epoch + 1:2d}: loss {losses[-1]:.4f}")
    acc = accuracy(net, x_test, y_test)
    log(f"test accuracy: {acc * 100:.1f}% ({len(y_test)} images)")
    return losses, acc


def first_losses(mode, steps=5, seed=0):
    """The losses of the first training steps from fixed weights and batches (to compare modes)."""
    kiln.manual_seed(seed)
    x_train, y_train, _, _ = load_digits_split(seed)
    step = make_step(LeNet5(), mode)
    return [float(step(kiln.Tensor(x_train[i * 32:(i + 1) * 32]), kiln.Tensor(y_train[i * 32:(i + 1) * 32].astype(
        np.int64))).asnumpy()) for i in range(steps)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--mode", default="ast", choices=["ast", "bytecode", "trace", "eager"])
    args = p.parse_args()
    train(args.epochs, args.mode)


if __name__ == "__main__":
    main()
