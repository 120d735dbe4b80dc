"""Writes the seed corpus of the model loader's fuzz harness, tests/fuzz/corpus_model: small valid
kiln model files (a*b+c as recorded, a BasicBlock with every inference rewrite, an MLP, a graph
with control flow), each with embedded test cases. ctest runs kiln-run --check and the C example
on them too. The files named by a hash beside them are inputs a libFuzzer run found (libFuzzer's
-merge=1, at most 1200 bytes), replayed by CI. Run again after a change of the file format
(and drop the hash-named files, whose bytes follow the old one):

    PYTHONPATH=python python3 tests/fuzz/make_model_corpus.py
"""
import os

import numpy as np

import kiln
from kiln import models, nn, ops

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_model")


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 5)
        self.fc2 = nn.Dense(5, 3)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


def branchy(x, y):
    return ops.cond((x.sum() > 0), lambda a, b: a * b, lambda a, b: a - b, (x, y)) + 1


def dump(fn, name, inputs, cases, **options):
    t = kiln.trace(fn, capture_as_const=True)
    t(*inputs)
    t.dump(os.path.join(HERE, name), input_data=cases, **options)


def main():
    os.makedirs(HERE, exist_ok=True)
    kiln.manual_seed(0)
    rng = np.random.default_rng(0)
    arr = lambda *shape: kiln.tensor(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    a, b, c = arr(2, 3), arr(2, 3), arr(2, 3)
    dump(models.simple_function, "simple.kiln", (a, b, c), [(a, b, c)], optimize_for_inference=False)
    block = models.BasicBlock(4)
    block.set_train(False)
    x = arr(1, 4, 6, 6)
    dump(block, "basic_block.kiln", (x,), [x], enable_fuse_conv_bias_with_z=True)
    mlp = MLP()
    v = arr(2, 6)
    dump(mlp, "mlp.kiln", (v,), [v, arr(2, 6)])
    p, q = arr(3), arr(3)
    dump(branchy, "cond.kiln", (p, q), [(p, q), (-abs(p), q)])


if __name__ == "__main__":
    main()
