"""What the practitioner scripts (test_practitioner_scripts.py) found missing, each with its test:
nn.Module and its methods on Cell (parameters, named_parameters, modules, children, buffers,
zero_grad, requires_grad_, to("cpu")), PyTorch's nn.init functions and MindSpore's
kiln.common.initializer, PyTorch's epoch schedulers (StepLR, MultiStepLR, ExponentialLR,
CosineAnnealingLR, LambdaLR) followed by a compiled step without compiling again, SGD's lr=, and
x[...] = number keeping a float64 tensor's precision."""
import math
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn
from conformance import run_all_modes


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.out(self.bn(self.fc(x)))


def test_module_is_cell_with_pytorchs_methods():
    assert nn.Module is nn.Cell
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["fc.weight", "fc.bias", "bn.gamma", "bn.beta", "out.1.weight", "out.1.bias"]
    assert [id(p) for p in net.parameters()] == [id(p) for p in net.trainable_params()]
    assert sorted(n for n, _ in net.named_buffers()) == ["bn.moving_mean", "bn.moving_variance"]
    assert len(list(net.buffers())) == 2
    assert [type(c).__name__ for c in net.children()] == ["Linear", "BatchNorm1d", "SequentialCell"]
    assert [n for n, _ in net.named_children()] == ["fc", "bn", "out"]
    assert [type(m).__name__ for m in net.modules()] == ["Net", "Linear", "BatchNorm1d", "SequentialCell", "ReLU",
                                                         "Linear"]
    assert [n for n, _ in net.named_modules()][:3] == ["", "fc", "bn"]
    assert net.to("cpu") is net and net.cpu() is net
    with pytest.raises(TypeError, match=r"Net.to\(kiln.float64\): kiln does not convert"):
        net.to(kiln.float64)
    with pytest.raises(ValueError, match="CPU only"):
        net.to("cuda")


def test_zero_grad_and_requires_grad_():
    net = Net().eval()
    net(kiln.randn(5, 3)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.fc.requires_grad_(False)
    assert [n for n, _ in net.named_parameters()] == ["bn.gamma", "bn.beta", "out.1.weight", "out.1.bias"]


def test_init_functions_draw_what_the_initializers_draw():
    from kiln.common import initializer as ms_init

    assert ms_init.initializer is nn.init.initializer and ms_init.XavierUniform is nn.init.XavierUniform
    w = nn.Parameter(kiln.zeros(6, 4), name="w")
    cases = [(lambda: nn.init.xavier_uniform_(w, gain=2.0), lambda: nn.init.XavierUniform(2.0)((6, 4))),
             (lambda: nn.init.xavier_normal_(w), lambda: nn.init.XavierNormal()((6, 4))),
             (lambda: nn.init.kaiming_uniform_(w, a=math.sqrt(5)), lambda: nn.init.HeUniform(math.sqrt(5))((6, 4))),
             (lambda: nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu"),
              lambda: nn.init.HeNormal(0, "fan_out", "relu")((6, 4))),
             (lambda: nn.init.normal_(w, 1.0, 0.5), lambda: nn.init.Normal(0.5, 1.0)((6, 4))),
             (lambda: nn.init.uniform_(w, -2, 3), lambda: kiln.ops.uniform((6, 4), -2.0, 3.0))]
    for fill, draw in cases:
        kiln.manual_seed(7)
        assert fill() is w
        kiln.manual_seed(7)
        np.testing.assert_array_equal(w.numpy(), draw().numpy())
    # the draws follow their rules: PyTorch's xavier_uniform_ bound gain * sqrt(6 / (fan_in + fan_out))
    kiln.manual_seed(1)
    big = nn.Parameter(kiln.zeros(200, 300), name="big")
    nn.init.xavier_uniform_(big, gain=2.0)
    bound = 2.0 * math.sqrt(6.0 / 500)
    assert np.abs(big.numpy()).max() <= bound and np.abs(big.numpy()).max() > 0.99 * bound
    nn.init.constant_(w, 0.25)
    assert (w.numpy() == 0.25).all()
    nn.init.zeros_(w)
    assert (w.numpy() == 0).all() and w.grad is None and w.requires_grad
    nn.init.ones_(w)
    assert (w.numpy() == 1).all()
    assert nn.init.calculate_gain("relu") == math.sqrt(2.0)


def sgd_with(scheduler_factory, epochs=6):
    p = nn.Parameter(kiln.ones(2), name="p")
    opt = nn.SGD([p], lr=0.5)
    sched = scheduler_factory(opt)
    rates = []
    for _ in range(epochs):
        rates.append(sched.get_last_lr()[0])
        opt([kiln.ones(2)])
        sched.step()
    return rates, p.numpy()


SCHEDULERS = {
    "StepLR": (lambda o: nn.StepLR(o, step_size=2, gamma=0.5), lambda e: 0.5 * 0.5 ** (e // 2)),
    "MultiStepLR": (lambda o: nn.MultiStepLR(o, milestones=[1, 4], gamma=0.1),
                    lambda e: 0.5 * 0.1 ** ((e >= 1) + (e >= 4))),
    "ExponentialLR": (lambda o: nn.ExponentialLR(o, gamma=0.9), lambda e: 0.5 * 0.9 ** e),
    "CosineAnnealingLR": (lambda o: nn.CosineAnnealingLR(o, T_max=4, eta_min=0.1),
                          lambda e: 0.1 + 0.4 * (1 + math.cos(math.pi * e / 4)) / 2),
    "LambdaLR": (lambda o: nn.lr_scheduler.LambdaLR(o, lambda e: 1 / (e + 1)), lambda e: 0.5 / (e + 1)),
}


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_rules(name):
    make, rule = SCHEDULERS[name]
    rates, p = sgd_with(make)
    want = [rule(e) for e in range(6)]
    np.testing.assert_allclose(rates, want, rtol=1e-15)
    np.testing.assert_allclose(p, 1 - sum(want), rtol=1e-6)


def test_schedulers_against_torch_when_installed():
    torch = pytest.importorskip("torch")
    pairs = {"StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
             "MultiStepLR": lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[1, 4], gamma=0.1),
             "ExponentialLR": lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9),
             "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.1),
             "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (e + 1))}
    for name, make_t in pairs.items():
        tp = torch.nn.Parameter(torch.ones(2))
        topt = torch.optim.SGD([tp], lr=0.5)
        tsched = make_t(topt)
        want = []
        for _ in range(6):
            want.append(tsched.get_last_lr()[0])
            topt.step()
            tsched.step()
        np.testing.assert_allclose(sgd_with(SCHEDULERS[name][0])[0], want, rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_step_follows_an_epoch_scheduler(mode):
    def train(jit):
        kiln.manual_seed(0)
        net = nn.Linear(3, 1)
        opt = nn.Adam(net.parameters(), lr=0.1)
        sched = nn.StepLR(opt, step_size=1, gamma=0.3)
        grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss

        f = kiln.jit(step, capture_mode=mode) if jit else step
        x, y = kiln.ones(4, 3), kiln.zeros(4, 1)
        losses = []
        for _ in range(4):
            losses += [f(x, y).item(), f(x, y).item()]
            sched.step()
        return losses, net.weight.numpy().copy(), f

    want, w_want, _ = train(False)
    got, w_got, f = train(True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(w_got, w_want, rtol=1e-6)
    assert f.stats.compiles <= 2, f.stats  # the rate is a tensor the graph reads


def test_scheduler_refuses_what_it_cannot_drive():
    p = nn.Parameter(kiln.ones(2), name="p")
    with pytest.raises(TypeError, match="a scheduler needs a number"):
        nn.StepLR(nn.SGD([p], learning_rate=[0.1, 0.2]), step_size=1)
    with pytest.raises(ValueError, match="StepLR: step_size must be a positive int"):
        nn.StepLR(nn.SGD([p], lr=0.1), step_size=0)


def test_sgd_and_adam_take_pytorchs_lr():
    p = nn.Parameter(kiln.ones(2), name="p")
    assert nn.SGD([p], lr=0.3).get_lr() == 0.3
    assert nn.Adam([p], lr=0.02, betas=(0.8, 0.9)).beta2 == 0.9


def fill_rate(t, v):
    t[...] = 0.01
    t[1:] = [0.1, 0.2]
    return t * v


def test_setitem_keeps_float64_precision():
    t = kiln.zeros(3, dtype=kiln.float64)
    t[...] = 0.01
    t[1:] = [0.1, 0.2]
    assert t.numpy().tolist() == [0.01, 0.1, 0.2]
    i = kiln.zeros(2, dtype=kiln.int64)
    i[0] = 2.7  # as before: converted like a copy
    assert i.numpy().tolist() == [2, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_all_modes(fill_rate, (kiln.zeros(3, dtype=kiln.float64), kiln.ones(3, dtype=kiln.float64)))
    assert fill_rate(kiln.zeros(3, dtype=kiln.float64), 1.0).numpy().tolist() == [0.01, 0.1, 0.2]


def test_tensor_to_cpu_and_data():
    x = kiln.randn(2, 3)
    assert x.to("cpu") is x and x.cpu() is x and x.to(kiln.device("cpu")) is x
    assert x.to(kiln.float64).dtype == kiln.float64 and x.to("cpu", kiln.int32).dtype == kiln.int32
    assert x.to(device="cpu", dtype=kiln.float64).dtype == kiln.float64
    assert x.to(kiln.zeros(1, dtype=kiln.int64)).dtype == kiln.int64  # other's dtype
    np.testing.assert_array_equal(x.to(kiln.float64).numpy(), x.numpy().astype(np.float64))
    with pytest.raises(ValueError, match=r"Tensor.to\('cuda'\): kiln runs on the CPU only"):
        x.to("cuda")
    with pytest.raises(ValueError, match="kiln.device"):
        kiln.device("cuda", 0)
    w = kiln.randn(3, requires_grad=True)
    d = w.data
    assert not d.requires_grad
    d[0] = 5.0  # shares w's memory, as PyTorch's .data does
    assert w.numpy()[0] == 5.0


def test_namespaces_of_pytorch():
    import kiln.nn.functional as F
    import kiln.optim as optim

    assert F.relu is kiln.ops.relu and F.cross_entropy is kiln.ops.cross_entropy and F.softmax is kiln.ops.softmax
    assert optim.Adam is nn.Adam and optim.SGD is nn.SGD and optim.lr_scheduler.StepLR is nn.StepLR


def test_param_groups_read_and_written():
    a = nn.Parameter(kiln.ones(2), name="a")
    b = nn.Parameter(kiln.ones(2), name="b")
    opt = nn.SGD([{"params": [a], "lr": 0.1}, {"params": [b]}], lr=0.5)
    groups = opt.param_groups
    assert [g["lr"] for g in groups] == [0.1, 0.5] and groups[0]["params"][0] is a
    groups[1]["lr"] = 0.25  # a manual schedule; the other group keeps its rate
    opt([kiln.ones(2), kiln.ones(2)])
    np.testing.assert_allclose(a.numpy(), 0.9)
    np.testing.assert_allclose(b.numpy(), 0.75)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.25]
    with pytest.raises(KeyError, match="only 'lr' can be set"):
        groups[0]["momentum"] = 0.9
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_step_follows_param_groups_lr(mode):
    def train(jit):
        kiln.manual_seed(0)
        net = nn.Linear(3, 1)
        opt = nn.SGD(net.parameters(), lr=0.1, momentum=0.5)
        grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss

        f = kiln.jit(step, capture_mode=mode) if jit else step
        x, y = kiln.ones(4, 3), kiln.zeros(4, 1)
        losses = []
        for epoch in range(4):
            for g in opt.param_groups:
                g["lr"] = 0.1 / (epoch + 1)
            losses += [f(x, y).item(), f(x, y).item()]
        return losses, f

    want, _ = train(False)
    got, f = train(True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert f.stats.compiles <= 2, f.stats


def test_conv2d_takes_pytorchs_keywords_and_says_how_padding_is_written():
    c = nn.Conv2d(4, 8, 3, pad_mode="pad", padding=1, bias=True, groups=2)
    assert c.has_bias and c.group == 2 and c.weight.shape == (8, 2, 3, 3)
    assert c(kiln.randn(1, 4, 5, 5)).shape == (1, 8, 5, 5)
    with pytest.raises(ValueError, match=r"PyTorch's Conv2d\(\.\.\., padding=1\) is Conv2d\(\.\.\., pad_mode='pad', "
                                         r"padding=1, has_bias=True\)"):
        nn.Conv2d(1, 8, 3, padding=1)
    with pytest.raises(ValueError, match=r"MaxPool2d\(\.\.\., pad_mode='pad', padding=1\)\)"):
        nn.MaxPool2d(2, 2, padding=1)
