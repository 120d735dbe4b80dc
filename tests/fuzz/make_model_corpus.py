"""Writes the seed corpus of the model loader's fuzz harness, tests/fuzz/corpus_model: small valid
kiln model files, each with embedded test cases. ctest runs kiln-run --check and the C example on
them too. simple.kiln, basic_block.kiln, mlp.kiln and cond.kiln (a*b+c as recorded, a BasicBlock
with every inference rewrite, an MLP, a graph with control flow) are format version 1 files, kept
as written by the kiln before version 2 (readers still load them); this script writes the version 2
seeds: names_v2.kiln (every name kept) and two_graphs_v2.kiln (a file of two graphs, append=True).
The files named by a hash are inputs a libFuzzer run found (libFuzzer's -merge=1, at most 1200
bytes), replayed by CI. Run again after a change of the file format:

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


ALL_NAMES = dict(keep_var_name=2, keep_opr_name=True, keep_param_name=True, keep_opr_priority=True)


def main():
    os.makedirs(HERE, exist_ok=True)
    kiln.manual_seed(0)
    rng = np.random.default_rng(0)
    arr = lambda *shape: kiln.tensor(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    mlp = MLP()
    v = arr(2, 6)
    dump(mlp, "names_v2.kiln", (v,), [v], optimize_for_inference=False, **ALL_NAMES)
    two = os.path.join(HERE, "two_graphs_v2.kiln")
    if os.path.exists(two):
        os.remove(two)
    a, b, c = arr(2, 3), arr(2, 3), arr(2, 3)
    dump(models.simple_function, "two_graphs_v2.kiln", (a, b, c), [(a, b, c)], graph_name="abc", **ALL_NAMES)
    p, q = arr(3), arr(3)
    dump(branchy, "two_graphs_v2.kiln", (p, q), [(p, q)], append=True, graph_name="cond", **ALL_NAMES)


if __name__ == "__main__":
    main()
