"""Five ordinary scripts, written the way a PyTorch or MindSpore tutorial writes them (issue 30: a
practitioner's first hour), at small sizes: a CNN on scikit-learn's digits (DataLoader,
CrossEntropyLoss, Adam, StepLR, checkpoint save and load, an argmax accuracy loop), a character
GRU, a tiny transformer encoder (masks, AdamW, warm-up + cosine, clip_grad_norm_), a convolutional
autoencoder (ConvTranspose2d, MSELoss, weights from nn.init / kiln.common.initializer) and a
regression in PyTorch's idioms (train()/eval(), no_grad, item(), numpy(), detach(), to(dtype),
zero_grad / backward / step).

Each runs eagerly (loss.backward() and optimizer.step()) and with its training step (or model)
under kiln.jit in each capture mode (value_and_grad in the compiled step: .backward() of a compiled
result is refused on purpose); the compiled runs must give eager's losses, weights and metrics."""
import math
import os
import tempfile
import warnings

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
import kiln.optim as optim
from kiln import nn
from kiln.dataset import DataLoader, TensorDataset

# (capture mode, jit level, backend): each capture mode, and O1 with the sink backend once
VARIANTS = (("ast", "O0", "kbk"), ("bytecode", "O0", "kbk"), ("trace", "O0", "kbk"), ("ast", "O1", "sink"))


def jit(fn, mode):
    capture_mode, level, backend = mode
    return kiln.jit(fn, capture_mode=capture_mode, jit_level=level, backend=backend)


def compiled(fn, mode):
    return fn if mode is None else jit(fn, mode)


def torch_style_step(model, loss_fn, optimizer):
    """The eager training step of every PyTorch tutorial."""

    def step(*batch):
        *inputs, target = batch
        optimizer.zero_grad()
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        optimizer.step()
        return loss

    return step


def functional_step(model, loss_fn, optimizer):
    """The same step as one function kiln.jit compiles: forward, gradients and update."""
    grad_fn = kiln.value_and_grad(lambda *b: loss_fn(model(*b[:-1]), b[-1]), None, optimizer.parameters)

    def step(*batch):
        loss, grads = grad_fn(*batch)
        optimizer(grads)
        return loss

    return step


def make_step(model, loss_fn, optimizer, mode):
    if mode is None:
        return torch_style_step(model, loss_fn, optimizer)
    return jit(functional_step(model, loss_fn, optimizer), mode)


# ---- 1. a CNN on scikit-learn's digits -----------------------------------------------------------

def cnn_digits(mode, epochs=4):
    from sklearn.datasets import load_digits

    kiln.manual_seed(0)
    kiln.set_seed(0)
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = y.astype(np.int64)
    X_train, y_train, X_test, y_test = X[:1024], y[:1024], X[1400:], y[1400:]
    train_loader = DataLoader(TensorDataset(kiln.from_numpy(X_train), kiln.from_numpy(y_train)), batch_size=64,
                              shuffle=True)
    test_loader = DataLoader(TensorDataset(kiln.tensor(X_test), kiln.tensor(y_test)), batch_size=128)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1, pad_mode="pad", has_bias=True)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1, pad_mode="pad", has_bias=True)
            self.pool = nn.MaxPool2d(2, 2)
            self.fc1 = nn.Linear(16 * 2 * 2, 32)
            self.fc2 = nn.Linear(32, 10)

        def forward(self, x):
            x = self.pool(F.relu(self.conv1(x)))
            x = self.pool(F.relu(self.conv2(x)))
            x = kiln.flatten(x, 1)
            return self.fc2(F.relu(self.fc1(x)))

    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=0.02)
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    step = make_step(model, criterion, optimizer, mode)
    losses, rates = [], []
    for epoch in range(epochs):
        model.train()
        for xb, yb in train_loader:
            losses.append(step(xb, yb).item())
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step()

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "digits.ckpt")
        kiln.save_checkpoint(model, path)
        restored = Net()
        kiln.load_param_into_net(restored, kiln.load_checkpoint(path))
    evaluate = compiled(restored, mode)
    restored.eval()
    correct = total = 0
    with kiln.no_grad():
        for xb, yb in test_loader:
            pred = evaluate(xb).data.argmax(dim=1)
            correct += (pred == yb).sum().item()
            total += yb.shape[0]
    return losses, rates, correct / total, [p.numpy().copy() for p in model.parameters()]


# ---- 2. a character-level GRU --------------------------------------------------------------------

TEXT = "the quick brown fox jumps over the lazy dog. " * 8


def char_gru(mode, steps=12):
    kiln.manual_seed(1)
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in TEXT], np.int64)
    seq, batch = 16, 8

    class CharGRU(nn.Cell):
        def __init__(self, vocab, hidden):
            super().__init__()
            self.embed = nn.Embedding(vocab, 16)
            self.gru = nn.GRU(16, hidden, batch_first=True)
            self.head = nn.Dense(hidden, vocab)

        def construct(self, x):
            out, _ = self.gru(self.embed(x))
            return self.head(out)

    model = CharGRU(len(chars), 32)
    loss_fn = nn.CrossEntropyLoss()

    def seq_loss(logits, target):
        return loss_fn(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    optimizer = nn.Adam(model.trainable_params(), learning_rate=0.01)
    step = make_step(model, seq_loss, optimizer, mode)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        starts = rng.integers(0, len(data) - seq - 1, batch)
        x = kiln.tensor(np.stack([data[s:s + seq] for s in starts]))
        y = kiln.tensor(np.stack([data[s + 1:s + seq + 1] for s in starts]))
        losses.append(float(step(x, y).asnumpy()))

    # greedy sampling, eval mode
    model.set_train(False)
    generate = compiled(model, mode)
    ids = [stoi["t"]]
    for _ in range(10):
        logits = generate(kiln.tensor([ids], dtype=kiln.int64))
        ids.append(int(logits[0, -1].argmax().item()))
    return losses, "".join(chars[i] for i in ids), [p.asnumpy().copy() for p in model.trainable_params()]


# ---- 3. a tiny transformer encoder classifier ----------------------------------------------------

def tiny_transformer(mode, steps=10):
    kiln.manual_seed(2)
    vocab, seq, d_model = 12, 10, 16

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d_model)
            self.pos = nn.Parameter(kiln.randn(1, seq, d_model) * 0.02)
            layer = nn.TransformerEncoderLayer(d_model, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=2)
            self.head = nn.Linear(d_model, 2)

        def forward(self, x, pad_mask):
            causal = kiln.triu(kiln.ones(seq, seq, dtype=kiln.bool), diagonal=1)
            h = self.encoder(self.tok(x) + self.pos, mask=causal, src_key_padding_mask=pad_mask)
            return self.head(h[:, 0])

    model = Classifier()
    schedule = nn.WarmUpCosineDecayLR(1e-4, 3e-3, 3, steps)  # warm-up, then cosine decay, per step
    optimizer = nn.AdamW(model.parameters(), lr=schedule, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    params = optimizer.parameters
    grad_fn = kiln.value_and_grad(lambda x, m, y: loss_fn(model(x, m), y), None, params)

    def train_step(x, m, y):
        loss, grads = grad_fn(x, m, y)
        grads = kiln.ops.clip_by_global_norm(grads, 1.0)
        optimizer(grads)
        return loss

    def eager_step(x, m, y):
        optimizer.zero_grad()
        loss = loss_fn(model(x, m), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        return loss

    step = eager_step if mode is None else jit(train_step, mode)
    rng = np.random.default_rng(2)
    losses = []
    for _ in range(steps):
        x = rng.integers(1, vocab, (8, seq))
        lengths = rng.integers(4, seq + 1, 8)
        pad = np.arange(seq)[None, :] >= lengths[:, None]
        x[pad] = 0
        y = (x[:, 0] > vocab // 2).astype(np.int64)
        losses.append(step(kiln.tensor(x), kiln.tensor(pad), kiln.tensor(y)).item())
    return losses, [p.numpy().copy() for p in model.parameters()]


# ---- 4. a convolutional autoencoder --------------------------------------------------------------

def autoencoder(mode, steps=8):
    from kiln.common.initializer import Normal, XavierUniform, initializer

    kiln.manual_seed(3)

    class AutoEncoder(nn.Cell):
        def __init__(self):
            super().__init__()
            self.encoder = nn.SequentialCell(nn.Conv2d(1, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=True),
                                             nn.ReLU(),
                                             nn.Conv2d(4, 8, 3, stride=2, pad_mode="pad", padding=1, has_bias=True),
                                             nn.ReLU())
            self.decoder = nn.Sequential(nn.ConvTranspose2d(8, 4, 2, stride=2), nn.ReLU(),
                                         nn.ConvTranspose2d(4, 1, 2, stride=2), nn.Sigmoid())
            for cell in self.cells_and_names():
                if isinstance(cell[1], nn.Conv2d):
                    cell[1].weight.set_data(initializer(XavierUniform(), cell[1].weight.shape, kiln.float32))
            for m in self.decoder.modules():
                if isinstance(m, nn.ConvTranspose2d):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    nn.init.zeros_(m.bias)
            self.encoder[0].bias.set_data(initializer(Normal(0.01), [4]))

        def construct(self, x):
            return self.decoder(self.encoder(x))

    model = AutoEncoder()
    optimizer = nn.SGD(model.trainable_params(), learning_rate=0.5, momentum=0.9)
    step = make_step(model, nn.MSELoss(), optimizer, mode)
    rng = np.random.default_rng(3)
    images = (rng.random((16, 1, 8, 8)) > 0.5).astype(np.float32)
    losses = [float(step(kiln.Tensor(images), kiln.Tensor(images)).asnumpy()) for _ in range(steps)]
    return losses, [p.asnumpy().copy() for p in model.trainable_params()]


# ---- 5. a regression in PyTorch's idioms ---------------------------------------------------------

def regression(mode, epochs=6):
    kiln.manual_seed(4)
    rng = np.random.default_rng(4)
    X = rng.standard_normal((64, 3))  # float64 data, as NumPy makes it
    y = X @ np.array([[1.5], [-2.0], [0.5]]) + 0.3
    x_t = kiln.from_numpy(X).to(kiln.float32).to(kiln.device("cpu"))
    y_t = kiln.tensor(y).float()

    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = make_step(model, loss_fn, optimizer, mode)
    history = []
    for epoch in range(epochs):
        model.train()
        for i in range(0, 64, 16):
            loss = step(x_t[i:i + 16], y_t[i:i + 16])
            history.append(loss.item())
        model.eval()
        with kiln.no_grad():
            pred = model(x_t)
            val = loss_fn(pred, y_t).detach().numpy()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as d:  # torch.save(model.state_dict()) / load_state_dict(torch.load())
        path = os.path.join(d, "regression.ckpt")
        kiln.save_checkpoint(model.state_dict(), path)
        restored = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
        missing, unexpected = restored.load_state_dict(kiln.load_checkpoint(path))
    assert not missing and not unexpected
    with kiln.no_grad():
        np.testing.assert_array_equal(restored(x_t).numpy(), pred.numpy())
    return history, float(val), pred.to(kiln.float64).numpy().dtype.name, weights


# ---- the tests -------------------------------------------------------------------------------------

def assert_same(eager, jitted, rtol=2e-4, atol=1e-5):
    if isinstance(eager, dict):
        assert eager.keys() == jitted.keys()
        for k in eager:
            assert_same(eager[k], jitted[k], rtol, atol)
    elif isinstance(eager, (list, tuple)):
        assert len(eager) == len(jitted)
        for a, b in zip(eager, jitted):
            assert_same(a, b, rtol, atol)
    elif isinstance(eager, str):
        assert eager == jitted
    else:
        np.testing.assert_allclose(jitted, eager, rtol=rtol, atol=atol)


SCRIPTS = {"cnn_digits": cnn_digits, "char_gru": char_gru, "tiny_transformer": tiny_transformer,
           "autoencoder": autoencoder, "regression": regression}


EAGER = {}


def eager_run(name):
    if name not in EAGER:
        EAGER[name] = SCRIPTS[name](None)
    return EAGER[name]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_script_trains_eagerly(name):
    losses = eager_run(name)[0]
    k = max(1, len(losses) // 4)
    assert np.mean(losses[-k:]) < np.mean(losses[:k]), losses  # it learns
    if name == "cnn_digits":
        _, rates, accuracy, _ = eager_run(name)
        assert rates == pytest.approx([0.02, 0.02, 0.01, 0.01])  # StepLR, read through param_groups
        assert accuracy > 0.8, accuracy


@pytest.mark.parametrize("mode", VARIANTS, ids=["-".join(v) for v in VARIANTS])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_compiled_script_equals_eager(name, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = eager_run(name)
        jitted = SCRIPTS[name](mode)
    assert_same(eager, jitted)
