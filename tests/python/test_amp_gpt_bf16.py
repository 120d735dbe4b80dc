"""A small GPT (examples/gpt_tiny.py, on its bundled text) trained for a few dozen steps at amp O2
in bfloat16 follows float32 training: both losses fall, and the bfloat16 run's final loss (the
mean of the last steps, the same batches and initial weights as float32's) is within the margin
docs/guide/mixed_precision.md states of float32's."""
import importlib.util
import pathlib
import sys

import numpy as np

import kiln
from kiln import nn

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
STEPS, BATCH, CONTEXT, LAST = 30, 8, 16, 5
MARGIN = 0.01  # |mean of the last 5 losses, bfloat16 - float32| / float32's (documented)


def load_gpt():
    if str(EXAMPLES) not in sys.path:  # gpt_tiny imports the shared training step
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("gpt_tiny", EXAMPLES / "gpt_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(gpt, low):
    kiln.manual_seed(0)
    data, chars = gpt.corpus()
    model = gpt.GPT(len(chars), dim=32, heads=2, layers=1, context=CONTEXT)
    model.set_train()
    net = kiln.amp.auto_mixed_precision(model, "O2", kiln.bfloat16) if low else model
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.AdamW(model.trainable_params(), lr=3e-3, weight_decay=0.01)
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x).reshape(-1, len(chars)), y.reshape(-1)), None,
                                  opt.parameters)

    @kiln.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    losses = [float(step(x, y)) for _, (x, y) in zip(range(STEPS), gpt.batches(data, BATCH, CONTEXT, 0))]
    assert all(p.dtype == kiln.float32 for p in model.trainable_params())  # master weights
    return np.array(losses), len(chars)


def test_gpt_trains_in_bfloat16_as_in_float32():
    gpt = load_gpt()
    fp32, vocab = train(gpt, low=False)
    bf16, _ = train(gpt, low=True)
    assert np.all(np.isfinite(bf16))
    assert abs(fp32[0] - np.log(vocab)) < 0.5 and abs(bf16[0] - fp32[0]) < 0.05  # the same start
    end32, end16 = fp32[-LAST:].mean(), bf16[-LAST:].mean()
    assert end32 < fp32[0] - 1.0 and end16 < bf16[0] - 1.0, (fp32, bf16)  # both learned
    assert abs(end16 - end32) <= MARGIN * end32, (end16, end32)
