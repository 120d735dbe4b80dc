"""Data-parallel training of the seed's blocks (the ResNet BasicBlock and the Llama attention block
of kiln.models, small sizes) on 2 ranks with batch B each gives the loss curve and the final
parameters of one process training on batch 2B, up to float reassociation: MindSpore-style
(TrainOneStepCell in data_parallel mode) eagerly and kiln.jit at O0 / O1 on the kbk and sink
backends; MegEngine-style (GradManager with make_allreduce_cb) eagerly and kiln.trace at
opt_level 0 / 2 (O0 / O1), plain and symbolic.

The BasicBlock's batch norms use their running statistics here: in training mode each rank
normalizes its own shard (there is no SyncBatchNorm), which is not what one process does on the
whole batch; test_distributed_deterministic.py checks that case against a one-process run that
normalizes per shard."""
from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

PROGRAM = """
import numpy as np
import kiln
from kiln import communication
from kiln.ops import collective as C
import distributed_blocks as D

STYLE = {style!r}
STEPS = 3
communication.init()
r, n = communication.get_rank(), communication.get_group_size()
assert n == 2
variants = ["eager"] + (D.JIT_VARIANTS if STYLE == "mindspore" else D.TRACE_VARIANTS)
make_step = D.STYLES[STYLE]

for block in ("basic", "attention"):
    batches = D.global_batches(block, STEPS, n)
    # one process, the whole batch of n * B (every rank computes it alike)
    ref_net = D.make_net(block)
    initial = D.parameters(ref_net)
    ref_losses = [l.item() for l in D.train(make_step(ref_net, D.optimizer(ref_net), "eager", False), batches)]
    ref_params = D.parameters(ref_net)
    assert any(not np.allclose(initial[k], ref_params[k]) for k in initial), "training changed nothing"
    for variant in variants:
        what = f"{{block}} {{STYLE}} {{variant}} rank {{r}}"
        net = D.make_net(block)
        step = make_step(net, D.optimizer(net), variant, True)
        mine = [D.shard(b, r, n) for b in batches]
        # the loss of the global batch: the mean of the ranks' (equal-sized) shards' losses
        losses = [C.all_reduce(l, "mean").item() for l in D.train(step, mine)]
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6, err_msg=what)
        params = D.parameters(net)
        for k in ref_params:
            np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-5, atol=2e-6, err_msg=f"{{what}} {{k}}")
        if variant != "eager" and variant[0] != "trace":
            info = step.cache_info()
            assert info.compiles == 1 and info.eager_calls == 0, (what, info)
        elif variant != "eager":
            assert "all_reduce" in step.graph_str(), what  # compiled, the all-reduce in its graph
        print(f"{{what}} ok", flush=True)
print(f"rank {{r}} ok", flush=True)
"""


def _check(style):
    p = run_ranks(2, PROGRAM.format(style=style), timeout=500)
    variants = 5  # eager and four compiled ones per block
    assert p.stdout.count(f" {style} ") == 2 * 2 * variants, p.stdout


def test_mindspore_style_blocks_on_two_ranks_equal_one_process_with_the_whole_batch():
    _check("mindspore")


def test_megengine_style_blocks_on_two_ranks_equal_one_process_with_the_whole_batch():
    _check("megengine")
