"""The model zoo in examples/ (issue 30), each at a small size: it trains to its mark, and every
capture mode of kiln.jit gives eager's losses."""
import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
MODES = ["ast", "bytecode", "trace"]


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lenet_on_digits_reaches_97_percent():
    pytest.importorskip("sklearn")
    lenet = load("lenet_digits")
    losses, acc = lenet.train(epochs=12, mode="ast", log=lambda *_: None)
    assert losses[-1] < losses[0] / 10
    assert acc >= 0.97, acc


@pytest.mark.parametrize("mode", MODES)
def test_lenet_jitted_steps_equal_eager(mode):
    pytest.importorskip("sklearn")
    lenet = load("lenet_digits")
    np.testing.assert_allclose(lenet.first_losses(mode), lenet.first_losses("eager"), rtol=1e-5, atol=1e-6)


def test_gpt_learns_the_text():
    gpt = load("gpt_tiny")
    _, _, losses = gpt.train(steps=120, mode="ast", log=lambda *_: None)
    assert np.mean(losses[-10:]) < losses[0] - 1.3, (losses[0], losses[-10:])


@pytest.mark.parametrize("mode", MODES)
def test_gpt_jitted_steps_equal_eager(mode):
    gpt = load("gpt_tiny")
    want = gpt.train(steps=4, mode="eager", batch=4, context=32, log=lambda *_: None)[2]
    got = gpt.train(steps=4, mode=mode, batch=4, context=32, log=lambda *_: None)[2]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_llama_decodes_like_eager_with_a_bounded_number_of_compiles(mode):
    llama = load("llama_decode")
    want = llama.run(tokens=30, mode="eager")[0]
    ids, _, compiles = llama.run(tokens=30, mode=mode)
    assert ids == want
    assert compiles <= 3  # empty cache, one entry, then one dynamic entry for every longer cache
    assert llama.run(tokens=60, mode=mode)[2] == compiles  # longer text: no more compiles


@pytest.mark.parametrize("mode", MODES)
def test_resnet18_training_and_boosted_inference_equal_eager(mode):
    resnet = load("resnet18")
    small = dict(batch=2, size=16, steps=3, width=8)
    want, _, net_eager = resnet.train("eager", **small)
    got, _, net = resnet.train(mode, **small)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    x = resnet.data(2, 16, 1, seed=1)[0][0]
    np.testing.assert_allclose(resnet.infer(net, mode, x)[0], resnet.infer(net_eager, "eager", x)[0],
                               rtol=1e-4, atol=1e-4)
