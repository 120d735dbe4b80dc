"""Conformance: training loops as users write them, each run eagerly and under every kiln.jit variant
and kiln.trace, over several steps with new batches and with the outer state changed between steps:
optimizers (SGD, Momentum, Adam, AdamW) with weight decay and learning-rate schedules (a per-step list
changed in place, a callable reading a dict, a schedule Cell), freezing a weight between steps, train /
eval switched (BatchNorm's running statistics), gradients accumulated over calls, load_param_into_net
between steps, a Parameter added to and removed from a Cell."""
import numpy as np

import kiln
from kiln import nn
from conformance import TRACE_VARIANTS, VARIANTS, Call, rand, run_all_modes

ALL = VARIANTS + TRACE_VARIANTS
BATCHES = [(rand(5, 3, seed=i), rand(5, 1, seed=10 + i)) for i in range(4)]


def restorer(*cells):
    """reset() putting back every parameter of the cells, and each optimizer's state, as they are now."""
    tensors = []
    for c in cells:
        tensors += list(c.get_parameters())
        if hasattr(c, "state_for_checkpoint"):
            tensors += [v for _, v in c.state_for_checkpoint()]
    values = [v.asnumpy().copy() for v in tensors]

    def reset():
        with kiln.no_grad():
            for v, start in zip(tensors, values):
                v[...] = kiln.Tensor(start.copy(), v.dtype)
    return reset


def weights(net):
    return [p * 1.0 for p in net.get_parameters()]


def training_step(opt_class, **options):
    """(net, optimizer, step): a small regression net and its step as the README writes it."""
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(3, 4), nn.ReLU(), nn.Dense(4, 1)])
    opt = opt_class(net.trainable_params(), **options)
    loss_fn = nn.MSELoss()
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, net.trainable_params())

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss
    return net, opt, step


def test_per_step_learning_rates_changed_in_place_between_steps():
    # eager reads the list at every step; a compiled step must not keep the rates of its capture
    rates = [0.1, 0.05, 0.02]
    net, opt, step = training_step(nn.SGD, learning_rate=rates)
    restore = restorer(net, opt)

    def reset():
        restore()
        rates[:] = [0.1, 0.05, 0.02]

    run_all_modes(step, BATCHES[0], BATCHES[1], Call(BATCHES[2], before=lambda: rates.__setitem__(2, 0.5)),
                  Call(BATCHES[3], before=lambda: rates.__setitem__(2, 0.7)), BATCHES[0],
                  reset=reset, observe=lambda: weights(net), variants=ALL)


def test_per_step_learning_rates_appended_between_steps():
    rates = [0.1]
    net, opt, step = training_step(nn.Momentum, learning_rate=rates, momentum=0.9)
    restore = restorer(net, opt)

    def reset():
        restore()
        rates[:] = [0.1]

    run_all_modes(step, BATCHES[0], BATCHES[1], Call(BATCHES[2], before=lambda: rates.extend([0.3, 0.01, 0.2])),
                  BATCHES[3], reset=reset, observe=lambda: weights(net), variants=ALL)


def test_callable_schedule_reading_a_dict_changed_between_steps():
    cfg = {"scale": 1.0}
    net, opt, step = training_step(nn.Momentum, learning_rate=lambda s: 0.1 * cfg["scale"], momentum=0.9)
    restore = restorer(net, opt)

    def reset():
        restore()
        cfg["scale"] = 1.0

    run_all_modes(step, BATCHES[0], Call(BATCHES[1], before=lambda: cfg.update(scale=0.1)), BATCHES[2],
                  Call(BATCHES[3], before=lambda: cfg.update(scale=3.0)), reset=reset, observe=lambda: weights(net),
                  variants=ALL)


def test_adam_and_adamw_with_weight_decay_and_a_schedule_cell():
    for opt_class, options in ((nn.Adam, dict(learning_rate=nn.ExponentialDecayLR(0.1, 0.5, 1), weight_decay=0.01)),
                               (nn.AdamW, dict(learning_rate=0.01, weight_decay=0.1))):
        net, opt, step = training_step(opt_class, **options)
        run_all_modes(step, *BATCHES, reset=restorer(net, opt), observe=lambda: weights(net), variants=ALL)


def test_weight_frozen_and_unfrozen_between_steps():
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(3, 4), nn.ReLU(), nn.Dense(4, 1)])
    loss_fn = nn.MSELoss()
    first = net[0].weight

    def step(x, y):
        params = net.trainable_params()
        loss, grads = kiln.value_and_grad(lambda a, b: loss_fn(net(a), b), None, params)(x, y)
        with kiln.no_grad():
            for p, g in zip(params, grads):
                p -= 0.1 * g
        return loss, len(params)

    restore = restorer(net)

    def reset():
        restore()
        first.requires_grad = True

    run_all_modes(step, BATCHES[0], Call(BATCHES[1], before=lambda: setattr(first, "requires_grad", False)),
                  BATCHES[2], Call(BATCHES[3], before=lambda: setattr(first, "requires_grad", True)), reset=reset,
                  observe=lambda: weights(net), variants=ALL)


def test_batch_norm_step_with_train_and_eval_switched():
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dense(4, 1)])
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    loss_fn = nn.MSELoss()
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, net.trainable_params())

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    restore = restorer(net, opt)

    def reset():
        restore()
        net.set_train(True)

    run_all_modes(step, BATCHES[0], BATCHES[1], Call(BATCHES[2], before=lambda: net.set_train(False)),
                  Call(BATCHES[3], before=lambda: net.set_train(True)), reset=reset, observe=lambda: weights(net),
                  variants=ALL)


def test_gradients_accumulated_over_calls_applied_every_second():
    kiln.manual_seed(0)
    net = nn.Dense(3, 1)
    loss_fn = nn.MSELoss()
    sums = [kiln.ops.zeros_like(p) for p in net.trainable_params()]
    grad_fn = kiln.value_and_grad(lambda x, y: loss_fn(net(x), y), None, net.trainable_params())
    count = {"n": 0}

    def step(x, y):
        loss, grads = grad_fn(x, y)
        for s, g in zip(sums, grads):
            s += g
        count["n"] += 1
        if count["n"] % 2 == 0:
            with kiln.no_grad():
                for p, s in zip(net.trainable_params(), sums):
                    p -= 0.1 * s
                    s[...] = 0
        return loss

    restore = restorer(net)

    def reset():
        restore()
        count["n"] = 0
        for s in sums:
            s[...] = 0

    run_all_modes(step, *BATCHES, reset=reset, observe=lambda: (weights(net), [s * 1 for s in sums], count["n"]),
                  variants=ALL)


def test_load_param_into_net_between_steps():
    net, opt, step = training_step(nn.SGD, learning_rate=0.1)
    kiln.manual_seed(5)
    other = nn.SequentialCell([nn.Dense(3, 4), nn.ReLU(), nn.Dense(4, 1)])
    loaded = {n: nn.Parameter(kiln.Tensor(p.asnumpy().copy()), n) for n, p in other.parameters_and_names()}
    run_all_modes(step, BATCHES[0], BATCHES[1], Call(BATCHES[2], before=lambda: kiln.load_param_into_net(net, loaded)),
                  BATCHES[3], reset=restorer(net, opt), observe=lambda: weights(net), variants=ALL)


def test_parameter_added_to_and_removed_from_a_cell():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 2)

        def construct(self, x):
            y = self.fc(x)
            if hasattr(self, "shift"):
                y = y + self.shift
            return y

    kiln.manual_seed(0)
    net = Net()

    def add():
        net.shift = nn.Parameter(kiln.Tensor(np.ones(2, np.float32)), "shift")

    def reset():
        if hasattr(net, "shift"):
            del net.shift

    run_all_modes(lambda x: net(x), (rand(2, 3),), Call((rand(2, 3, seed=1),), before=add), (rand(2, 3, seed=2),),
                  Call((rand(2, 3, seed=3),), before=reset), reset=reset, variants=ALL)


def test_learning_rate_parameter_set_between_steps():
    # a rate given as a tensor is read at every step eagerly; the compiled step must read it too
    rate = nn.Parameter(kiln.Tensor(np.array(0.1, np.float32)), "lr", requires_grad=False)
    net, opt, step = training_step(nn.SGD, learning_rate=rate)
    restore = restorer(net, opt)

    def set_rate(v):
        rate.set_data(kiln.Tensor(np.array(v, np.float32)))

    def reset():
        restore()
        set_rate(0.1)

    run_all_modes(step, BATCHES[0], Call(BATCHES[1], before=lambda: set_rate(0.5)), BATCHES[2],
                  Call(BATCHES[3], before=lambda: set_rate(0.01)), reset=reset, observe=lambda: weights(net),
                  variants=ALL)


def test_seed_set_inside_the_step_gives_the_same_dropout_masks():
    # eagerly each call reseeds, so calls with one seed draw the same masks
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(3, 8), nn.Dropout(p=0.5), nn.Dense(8, 2)])

    def f(x, seed):
        kiln.set_seed(seed)
        return net(x), kiln.ops.rand((2,))

    def g(x, seed):
        kiln.manual_seed(seed)
        return net(x) + kiln.ops.randn((4, 2))

    for fn in (f, g):
        run_all_modes(fn, (rand(4, 3), 1), (rand(4, 3), 2), (rand(4, 3), 1), (rand(4, 3, seed=1), 1), variants=ALL)


def test_dropout_masks_with_train_switched_and_seeded_between_calls():
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(3, 8), nn.Dropout(p=0.5), nn.Dense(8, 2)])

    def before(train, seed):
        def b():
            net.set_train(train)
            kiln.set_seed(seed)
        return b

    run_all_modes(lambda x: net(x), Call((rand(4, 3),), before=before(True, 1)),
                  Call((rand(4, 3, seed=1),), before=before(True, 2)), Call((rand(4, 3, seed=2),), before=before(False, 3)),
                  Call((rand(4, 3, seed=3),), before=before(True, 1)), reset=lambda: net.set_train(True), variants=ALL)
