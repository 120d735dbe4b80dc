"""Recurrent-layer benchmark: an nn.LSTM over 128 steps (batch 16, input 64, hidden 128), eager
against kiln.jit, forward and forward+backward (value_and_grad over the weights).

    PYTHONPATH=python python3 bench/bench_rnn.py [--quick] [--mode ast|bytecode|trace] [--level O0|O1]

Targets (issue 30): the first compiled call (capture + compile) takes at most 2 s, and a compiled
forward+backward step is at least 2x faster than eager. The layer is one `rnn_layer` op (the whole
time loop in C, its gradient one `rnn_layer_backward`) eagerly and compiled alike, so the compiled
step saves only Python's dispatch around it; checked here before timing: one node per layer.
"""
import argparse
import time

import numpy as np

import kiln
from kiln import nn
from timing import alternate, row

STEPS, BATCH, INPUT, HIDDEN = 128, 16, 64, 128


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats")
    p.add_argument("--mode", default="ast", choices=("ast", "bytecode", "trace"))
    p.add_argument("--level", default="O1", choices=("O0", "O1"))
    args = p.parse_args()
    rounds, number = (3, 2) if args.quick else (5, 5)
    kiln.manual_seed(0)
    lstm = nn.LSTM(INPUT, HIDDEN)
    params = lstm.trainable_params()
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((STEPS, BATCH, INPUT)).astype(np.float32))

    def loss(a):
        out, (h, c) = lstm(a)
        return (out * out).mean() + (c * c).mean()

    print(f"kiln {kiln.__version__}: nn.LSTM({INPUT}, {HIDDEN}) over {STEPS} steps, batch {BATCH}, float32; "
          f"capture_mode={args.mode!r}, jit_level={args.level!r}")
    jitted = kiln.jit(loss, capture_mode=args.mode, jit_level=args.level)
    step_eager = kiln.value_and_grad(loss, None, params)
    step_jit = kiln.value_and_grad(jitted, None, params)
    t0 = time.perf_counter()
    value_j, grads_j = step_jit(x)
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    jitted(x)
    t_compile_forward = time.perf_counter() - t0
    value_e, grads_e = step_eager(x)
    np.testing.assert_allclose(value_j.asnumpy(), value_e.asnumpy(), rtol=1e-5)
    for gj, ge in zip(grads_j, grads_e):
        np.testing.assert_allclose(gj.asnumpy(), ge.asnumpy(), rtol=1e-3, atol=1e-6)
    if args.mode != "bytecode":  # (bytecode's differentiable pieces keep their graphs elsewhere)
        text = jitted.graph_str(x)
        assert text.count("= rnn_layer(") == 1, "the layer is not one rnn_layer node"

    t_fwd_eager, t_fwd_jit = alternate(lambda: loss(x), lambda: jitted(x), rounds, number)
    t_eager, t_jit = alternate(lambda: step_eager(x), lambda: step_jit(x), rounds, number)
    ms = 1e3
    print(f"first compiled forward+backward call (capture + compile): {t_compile:.2f} s "
          f"({'ok' if t_compile <= 2 else 'MISSED'}: target <= 2 s); forward alone: {t_compile_forward:.2f} s")
    row("forward (ms)", t_fwd_jit * ms, "ms", "eager", t_fwd_eager * ms, t_fwd_eager / t_fwd_jit, 1.0, "higher")
    row("forward+backward (ms)", t_jit * ms, "ms", "eager", t_eager * ms, t_eager / t_jit, 2.0, "higher")


if __name__ == "__main__":
    main()
