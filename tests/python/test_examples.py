"""The model zoo in examples/ (issue 30), each at a small size: it trains to its mark, and every
capture mode of kiln.jit gives eager's losses."""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
MODES = ["ast", "bytecode", "trace"]


def load(name):
    if str(EXAMPLES) not in sys.path:  # (the examples import their shared training step)
        sys.path.insert(0, str(EXAMPLES))
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


# ---- against PyTorch with the same initial weights (where torch is installed) -----------------

def _torch_steps(twin, loss_of, batches, make_opt, clip=None, schedule=None):
    torch = pytest.importorskip("torch")
    opt = make_opt(twin.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule else None
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_of(twin, torch.from_numpy(x.asnumpy()), torch.from_numpy(y.asnumpy()))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(twin.parameters(), clip)
        opt.step()
        if sched:
            sched.step()
        losses.append(float(loss.detach()))
    return losses


def test_lenet_losses_equal_torch_with_copied_weights():
    torch = pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    import kiln
    lenet, twins = load("lenet_digits"), load("torch_twins")
    kiln.manual_seed(0)
    net = lenet.LeNet5()
    twin = twins.copy_weights(net, twins.LeNet5())
    x, y, _, _ = lenet.load_digits_split(0)
    batches = [(kiln.Tensor(x[i * 32:(i + 1) * 32]), kiln.Tensor(y[i * 32:(i + 1) * 32].astype(np.int64)))
               for i in range(5)]
    step = lenet.make_step(net, "ast")
    got = [float(step(a, b).asnumpy()) for a, b in batches]
    want = _torch_steps(twin, lambda m, a, b: torch.nn.functional.cross_entropy(m(a), b), batches,
                        lambda ps: torch.optim.SGD(ps, lr=0.02, momentum=0.9))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gpt_losses_equal_torch_with_copied_weights():
    torch = pytest.importorskip("torch")
    import kiln
    gpt, twins = load("gpt_tiny"), load("torch_twins")
    kiln.manual_seed(0)
    data, chars = gpt.corpus()
    model = gpt.GPT(len(chars), context=32)
    twin = twins.copy_weights(model, twins.GPT(len(chars), context=32))
    steps = 6
    batches = [b for _, b in zip(range(steps), gpt.batches(data, 4, 32, 0))]
    step = gpt.make_step(model, "ast", steps)
    got = [float(step(a, b).asnumpy()) for a, b in batches]
    want = _torch_steps(twin, lambda m, a, b: torch.nn.functional.cross_entropy(m(a).reshape(-1, len(chars)),
                                                                             b.reshape(-1)), batches,
                        lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.01), clip=1.0,
                        schedule=twins.warmup_cosine(3e-4, 3e-3, max(1, steps // 10), steps))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_llama_generates_torch_tokens_with_copied_weights():
    torch = pytest.importorskip("torch")
    import kiln
    llama, twins = load("llama_decode"), load("torch_twins")
    kiln.manual_seed(0)
    model = llama.Llama()
    model.set_train(False)
    twin = twins.copy_weights(model, twins.Llama())
    want = llama.generate(model, kiln.jit(model.construct), [1, 2, 3, 4], 20)
    caches, out = twin.empty_caches(), [1, 2, 3, 4]
    with torch.no_grad():
        for pos in range(23):
            logits, caches = twin(torch.tensor([[out[pos]]]), torch.tensor([pos]), caches)
            if pos >= 3:
                out.append(int(logits[0, -1].argmax()))
    assert out[4:] == want


def test_resnet18_losses_equal_torch_with_copied_weights():
    torch = pytest.importorskip("torch")
    import kiln
    resnet, twins = load("resnet18"), load("torch_twins")
    kiln.manual_seed(0)
    net = resnet.ResNet18(width=8)
    net.set_train()
    twin = twins.copy_weights(net, twins.ResNet18(width=8))
    batches = resnet.data(2, 16, 3)
    step = resnet.make_step(net, "ast")
    got = [float(step(a, b).asnumpy()) for a, b in batches]
    want = _torch_steps(twin, lambda m, a, b: torch.nn.functional.cross_entropy(m(a), b), batches,
                        lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_zoo_benchmark_prints_its_rows(capsys):
    import kiln
    from kiln.bench import models_table
    script = models_table.zoo_script()
    assert script is not None and script.name == "bench_zoo.py"
    import runpy
    argv, sys.argv = sys.argv, [str(script), "--models", "llama", "--quick"]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert "Llama decoder" in out and "kiln eager" in out and "best kiln.jit row" in out
    assert kiln.get_context("background_compile") is False  # the script leaves the settings as they were


def test_lstm_classifier_learns_the_marked_digit():
    lstm = load("lstm_classifier")
    losses, acc = lstm.train(steps=120, mode="ast", log=lambda *_: None)
    assert np.mean(losses[-10:]) < 0.2 and acc >= 0.9, (losses[-10:], acc)


@pytest.mark.parametrize("mode", MODES)
def test_lstm_classifier_jitted_steps_equal_eager(mode):
    lstm = load("lstm_classifier")
    want = lstm.train(steps=4, mode="eager", log=lambda *_: None)[0]
    np.testing.assert_allclose(lstm.train(steps=4, mode=mode, log=lambda *_: None)[0], want, rtol=1e-4, atol=1e-5)


def test_lstm_classifier_losses_equal_torch_with_copied_weights():
    torch = pytest.importorskip("torch")
    import kiln
    lstm, twins = load("lstm_classifier"), load("torch_twins")
    kiln.manual_seed(0)
    net = lstm.Classifier()
    net.set_train()
    twin = twins.copy_weights(net, twins.LSTMClassifier())
    rng = np.random.default_rng(0)
    batches = [tuple(kiln.Tensor(a) for a in lstm.sequences(8, 12, rng)) for _ in range(4)]
    step = lstm.make_step(net, "ast")
    got = [float(step(a, b).asnumpy()) for a, b in batches]
    want = _torch_steps(twin, lambda m, a, b: torch.nn.functional.cross_entropy(m(a), b), batches,
                        lambda ps: torch.optim.Adam(ps, lr=0.01))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
