"""The inference BasicBlock (bench/bench_infer.py's workload, small) jitted at O1 with
infer_boost runs on oneDNN's fast kernels of the CPU's instruction set, never on its reference
ones (issue 17: on AVX2 CPUs the layout pass picked AVX-512's 16-channel blocks and every
convolution fell back to oneDNN's reference kernel, ~1000x slower). Checked on this CPU, and
in a child process with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN reads it once, at start-up), which
makes an AVX-512 machine run the kernels of an AVX2 one."""
import json
import os
import subprocess
import sys

import numpy as np

import kiln
from conftest import inference_basic_block

CHANNELS = 128  # the benchmark's; a small image keeps a reference-kernel run short
SIZE = 8
BLOCKED = {16: "{0, 2}", 8: "{0, 3}"}  # relayout attributes from NCHW to each blocked layout


def check_basic_block():
    """Runs the block eager and jitted (O1, infer_boost); checks the results agree and that
    no oneDNN primitive was made with a reference implementation. Returns the CPU's channel
    block and the jitted graph's text."""
    block = inference_basic_block(CHANNELS)
    x = kiln.Tensor(np.random.default_rng(1).standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32))
    count, _ = kiln._C.dnnl_ref_primitives()
    with kiln.no_grad():
        eager = block(x).asnumpy()
        jitted = kiln.jit(block, jit_level="O1", infer_boost="on")
        for _ in range(3):  # the traced call, then the compiled graph (twice: cached primitives)
            np.testing.assert_allclose(jitted(x).asnumpy(), eager, rtol=1e-4, atol=1e-4)
    after, described = kiln._C.dnnl_ref_primitives()
    assert after == count, f"oneDNN reference implementations were used: {described}"
    return kiln._C.conv_block_size(), jitted.graph_str()


def _expect_layout(block, text):
    # the layout pass ran, in the CPU's blocked layout: x converted once, the output back
    assert text.count("conv2d_fused(") == 2 and "batch_norm" not in text, text
    assert text.count("relayout(") == 2 and f"relayout(%0) {BLOCKED[block]}" in text, text


def test_basic_block_this_cpu():
    block, text = check_basic_block()
    if block:
        _expect_layout(block, text)


def test_basic_block_avx2():
    if kiln._C.conv_block_size() < 8:
        import pytest
        pytest.skip("this CPU has no AVX2 (oneDNN has no blocked kernels here)")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    package = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"child failed:\n{run.stdout}\n{run.stderr}"
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # AVX2, AVX and SSE4.1 kernels all read 8-channel blocks; AVX-512 is capped away
    assert result["block"] == 8, result
    _expect_layout(result["block"], result["text"])


if __name__ == "__main__":  # the child of test_basic_block_avx2
    block, text = check_basic_block()
    print(json.dumps({"block": block, "text": text}))
