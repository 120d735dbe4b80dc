"""Checkpoints (issue 30): save_checkpoint / load_checkpoint / load_param_into_net with MindSpore's
semantics, optimizer state included so training resumes exactly (eagerly and jitted), PyTorch's
state_dict / load_state_dict, clear errors on mismatched shapes and dtypes, and a format that
refuses a stranger's file clearly: wrong magic, a later version, a bad checksum, truncation, sizes
that do not fit, bad UTF-8, duplicate names."""
import os
import struct
import zlib

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.serialization import CheckpointError, read_checkpoint


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Dense(4, 8), nn.BatchNorm1d(8), nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(kiln.ops.relu(self.bn(self.fc1(x))))


def data(step):
    rng = np.random.default_rng(step)
    return (kiln.Tensor(rng.standard_normal((6, 4)).astype(np.float32)),
            kiln.Tensor(rng.standard_normal((6, 2)).astype(np.float32)))


def make(seed=0):
    kiln.manual_seed(seed)
    net = Net()
    opt = nn.Adam(net.trainable_params(), learning_rate=[0.05, 0.02, 0.01, 0.01, 0.005, 0.002])
    grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    return net, opt, step


@pytest.mark.parametrize("jit", [None, "ast", "bytecode"])
def test_resumed_training_equals_the_uninterrupted_run(jit, tmp_path):
    net, opt, step = make()
    run = kiln.jit(step, capture_mode=jit) if jit else step
    full = [float(run(*data(s)).asnumpy()) for s in range(6)]

    net2, opt2, step2 = make()
    run2 = kiln.jit(step2, capture_mode=jit) if jit else step2
    first = [float(run2(*data(s)).asnumpy()) for s in range(3)]
    path = kiln.save_checkpoint([net2, opt2], str(tmp_path / "run"), append_dict={"epoch": 3, "note": "mid"})
    assert path.endswith(".ckpt")

    net3, opt3, step3 = make(seed=7)  # other initial weights, fresh optimizer state
    params = kiln.load_checkpoint(path)
    assert params["epoch"] == 3 and params["note"] == "mid"
    not_loaded, unused = kiln.load_param_into_net(net3, params)
    assert not_loaded == [] and sorted(unused)[0] == "epoch"
    _, unused_opt = kiln.load_param_into_net(opt3, params)
    assert "fc1.weight" in unused_opt
    run3 = kiln.jit(step3, capture_mode=jit) if jit else step3
    rest = [float(run3(*data(s)).asnumpy()) for s in range(3, 6)]
    np.testing.assert_allclose(first + rest, full, rtol=1e-5, atol=1e-6)
    for (n, a), (_, b) in zip(net.parameters_and_names(), net3.parameters_and_names()):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=n)


def make_train_cell(seed=0):
    kiln.manual_seed(seed)
    net = Net()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.02)
    return nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)


@pytest.mark.parametrize("jit", [None, "ast", "bytecode"])
def test_a_train_cell_checkpoint_holds_its_optimizer_state(jit, tmp_path):
    """MindSpore's save_checkpoint(train_net): the optimizer inside the TrainOneStepCell is saved
    with it (its moments under "optimizer."), so a run resumed from that one file continues exactly;
    dropping them would restart Adam from zero moments without a word."""
    def wrap(cell):
        return kiln.jit(cell, capture_mode=jit) if jit else cell

    full_cell = make_train_cell()
    full = [float(wrap(full_cell)(*data(s)).asnumpy()) for s in range(6)]

    first_cell = make_train_cell()
    run = wrap(first_cell)
    first = [float(run(*data(s)).asnumpy()) for s in range(3)]
    names = [n for n, _ in first_cell.checkpoint_entries()]
    assert "optimizer.moment1.0" in names and "optimizer.global_step" in names
    path = kiln.save_checkpoint(first_cell, str(tmp_path / "train"))

    resumed = make_train_cell(seed=7)
    not_loaded, unused = kiln.load_param_into_net(resumed, kiln.load_checkpoint(path))
    assert not_loaded == [] and unused == []
    run = wrap(resumed)
    rest = [float(run(*data(s)).asnumpy()) for s in range(3, 6)]
    np.testing.assert_allclose(first + rest, full, rtol=1e-5, atol=1e-6)
    assert set(resumed.state_dict()) == set(names)


def test_state_dict_round_trip_and_mismatches(tmp_path):
    net = Net()
    state = net.state_dict()
    assert list(state)[:2] == ["fc1.weight", "fc1.bias"]
    other = Net()
    keys = other.load_state_dict({k: v.asnumpy() for k, v in state.items()})
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    np.testing.assert_array_equal(other.fc2.weight.asnumpy(), net.fc2.weight.asnumpy())
    with pytest.raises(ValueError, match="strict_load"):
        other.load_state_dict({"fc1.weight": state["fc1.weight"]})
    bad = dict(state)
    bad["fc1.weight"] = kiln.Tensor(np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"'fc1.weight' has shape \[8, 4\] in the net, \[3, 3\]"):
        other.load_state_dict(bad)
    bad["fc1.weight"] = kiln.Tensor(np.zeros((8, 4), np.int32))
    with pytest.raises(ValueError, match="'fc1.weight' is float32 in the net, int32"):
        other.load_state_dict(bad)


def test_every_dtype_and_the_mindspore_list_form(tmp_path):
    values = {f"t_{d}": kiln.Tensor(np.arange(6).reshape(2, 3) % 2 if d == "bool" else np.arange(6).reshape(2, 3),
                                    getattr(kiln, d))
              for d in ("bool", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")}
    values["scalar"] = kiln.Tensor(np.float32(2.5))
    path = kiln.save_checkpoint([{"name": k, "data": v} for k, v in values.items()], str(tmp_path / "all.ckpt"))
    back = read_checkpoint(path)
    for k, v in values.items():
        assert back[k].dtype == v.dtype and tuple(back[k].shape) == tuple(v.shape), k
        np.testing.assert_array_equal(back[k].astype(kiln.float64).asnumpy(), v.astype(kiln.float64).asnumpy())


def _valid(tmp_path):
    net = Net()
    return open(kiln.save_checkpoint(net, str(tmp_path / "v.ckpt"), append_dict={"epoch": 1}), "rb").read()


def _rewrap(payload):
    return struct.pack("<8sIIQI", b"KILNCKPT", 1, 0, len(payload), zlib.crc32(payload)) + payload


def test_strangers_files_are_refused_clearly(tmp_path):
    good = _valid(tmp_path)
    cases = {
        "no KILNCKPT magic": b"PK\x03\x04" + good[4:],
        "format version 2": good[:8] + struct.pack("<I", 2) + good[12:],
        "checksum mismatch": good[:-1] + bytes([good[-1] ^ 1]),
        "truncated or extended": good[:-5],
        "not a kiln checkpoint": good[:10],
        "cannot fit": _rewrap(struct.pack("<I", 10 ** 9)),
        "not UTF-8": _rewrap(struct.pack("<II", 1, 2) + b"\xff\xfe" + b"\x01" + struct.pack("<q", 1)),
        "two entries are named": _rewrap(struct.pack("<I", 2) + (struct.pack("<I", 1) + b"a" + b"\x01" +
                                                                 struct.pack("<q", 1)) * 2),
        "needs more bytes than the file holds": _rewrap(struct.pack("<II", 1, 1) + b"w" + struct.pack("<BBB", 0, 6, 2)
                                                        + struct.pack("<QQQ", 10 ** 6, 10 ** 6, 4)),
        "unknown kind": _rewrap(struct.pack("<II", 1, 1) + b"w" + b"\x09"),
    }
    for what, blob in cases.items():
        with pytest.raises(CheckpointError, match=what):
            read_checkpoint(blob)


def test_fuzzed_files_load_or_raise_the_checkpoint_error(tmp_path):
    good = _valid(tmp_path)
    rng = np.random.default_rng(0)
    header = 28
    for trial in range(3000):
        blob = bytearray(good)
        kind = trial % 4
        if kind == 0:  # bit flips in the payload, the checksum then fixed so the parser sees them
            for _ in range(rng.integers(1, 4)):
                i = rng.integers(header, len(blob))
                blob[i] ^= 1 << int(rng.integers(0, 8))
            blob = bytearray(_rewrap(bytes(blob[header:])))
        elif kind == 1:  # truncated anywhere, length and checksum made to agree
            blob = bytearray(_rewrap(bytes(blob[header:header + rng.integers(0, len(blob) - header)])))
        elif kind == 2:  # a huge count or size written over four bytes
            i = rng.integers(header, len(blob) - 4)
            blob[i:i + 4] = struct.pack("<I", int(rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 20])))
            blob = bytearray(_rewrap(bytes(blob[header:])))
        else:  # raw damage anywhere, header included
            i = rng.integers(0, len(blob))
            blob[i] = int(rng.integers(0, 256))
        try:
            read_checkpoint(bytes(blob))
        except CheckpointError:
            pass
