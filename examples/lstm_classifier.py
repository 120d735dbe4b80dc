"""An LSTM sequence classifier: is the marked digit of a noisy sequence above 4? Each sequence is
a run of random digits (one-hot) where one position carries a marker, so the answer needs the
whole sequence read and remembered. Embedding -> 2-layer LSTM -> last state -> Dense, Adam,
eagerly or under kiln.jit (each layer is one rnn_layer op, the whole time loop in C).

    PYTHONPATH=python python3 examples/lstm_classifier.py [--steps 300] [--mode ast|bytecode|trace|eager]

Prints the loss every 50 steps and the accuracy on held-out sequences (>= 90% expected)."""
import argparse

import numpy as np

import kiln
from kiln import nn
from training import train_step

VOCAB = 11  # digits 0-9 and the marker


class Classifier(nn.Cell):
    def __init__(self, hidden=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, hidden, num_layers=2, batch_first=True)
        self.head = nn.Dense(hidden, 2)

    def construct(self, tokens):
        _, (h_n, _) = self.lstm(self.embed(tokens))
        return self.head(h_n[-1])


def sequences(n, length, rng):
    """(tokens (n, length) int64, labels (n,) int64): the digit after the marker decides."""
    tokens = rng.integers(0, 10, (n, length))
    where = rng.integers(0, length - 1, n)
    tokens[np.arange(n), where] = 10
    labels = (tokens[np.arange(n), where + 1] > 4).astype(np.int64)
    return tokens.astype(np.int64), labels


def make_step(net, mode, lr=0.01):
    loss_fn = nn.CrossEntropyLoss()
    return train_step(lambda x, y: loss_fn(net(x), y), nn.Adam(net.trainable_params(), lr), mode)


def train(steps=300, mode="ast", batch=32, length=12, seed=0, log=print):
    """(losses, held-out accuracy) of a fresh seeded classifier."""
    kiln.manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = Classifier()
    net.set_train()
    step = make_step(net, mode)
    losses = []
    for i in range(steps):
        x, y = sequences(batch, length, rng)
        losses.append(float(step(kiln.Tensor(x), kiln.Tensor(y)).asnumpy()))
        if (i + 1) % 50 == 0:
            log(f"step {i + 1:4d}: loss {np.mean(losses[-50:]):.4f}")
    net.set_train(False)
    x, y = sequences(500, length, np.random.default_rng(seed + 1))
    acc = float((net(kiln.Tensor(x)).asnumpy().argmax(1) == y).mean())
    log(f"held-out accuracy: {acc * 100:.1f}%")
    return losses, acc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--mode", default="ast", choices=["ast", "bytecode", "trace", "eager"])
    args = p.parse_args()
    train(args.steps, args.mode)


if __name__ == "__main__":
    main()
