"""Checkpoint-restart of data-parallel training: a 2-rank job trains 2K steps, rank 0 writing a
checkpoint (parameters and Adam's state: moments, step counters, global step) with
kiln.save_checkpoint after step K; a new mpirun job loads it on every rank with
kiln.load_checkpoint and trains steps K..2K-1. Its final parameters equal the first job's bit for
bit, rank by rank: for the seed's BasicBlock and attention block, eagerly and kiln.jit at O0 (kbk
and sink). At O1 it equals it up to rounding only: the first call of a kiln.jit function runs its
ops eagerly while recording them and later calls run the fused plan, whose sums may round
differently, so the restarted job's step K is computed by the eager kernels where the
uninterrupted job used the plan. A restart that loads the parameters but not the optimizer's
state ends elsewhere (what makes the comparison worth something)."""
import os
import tempfile

import numpy as np

from distributed_util import needs_mpi, run_ranks

pytestmark = needs_mpi

PROGRAM = """
import numpy as np
import kiln
from kiln import communication, nn
import distributed_blocks as D

PHASE, CKPT_DIR, K = {phase!r}, {ckpt_dir!r}, 3
VARIANTS = ["eager", ("ast", "O0", "kbk"), ("ast", "O0", "sink"), ("ast", "O1", "kbk")]
communication.init()
kiln.set_deterministic(True)
r, n = communication.get_rank(), communication.get_group_size()


def training(block, variant):
    net = D.make_net(block)
    opt = nn.Adam(net.trainable_params(), 0.01)
    step = D.mindspore_step(net, opt, variant, True)
    return net, opt, step


for block in ("basic", "attention"):
    batches = [D.shard(b, r, n) for b in D.global_batches(block, 2 * K, n)]
    for variant in VARIANTS:
        tag = f"{{block}}-{{variant if variant == 'eager' else '-'.join(variant[1:])}}"
        ckpt = f"{{CKPT_DIR}}/{{tag}}.ckpt"
        if PHASE == "whole":
            net, opt, step = training(block, variant)
            D.train(step, batches[:K])
            if r == 0:
                kiln.save_checkpoint([net, opt], ckpt)
            D.train(step, batches[K:])
        else:
            net, opt, step = training(block, variant)
            entries = kiln.load_checkpoint(ckpt, net=net)
            kiln.load_param_into_net(opt, entries)
            assert opt.global_step == K
            D.train(step, batches[K:])
            if variant == "eager":
                # without the optimizer's state the continuation differs
                bare, bare_opt, bare_step = training(block, variant)
                kiln.load_checkpoint(ckpt, net=bare)
                D.train(bare_step, batches[K:])
                assert D.digest(D.parameters(bare)) != D.digest(D.parameters(net)), tag
        np.savez(f"{{CKPT_DIR}}/{{PHASE}}-{{tag}}-rank{{r}}.npz", **D.parameters(net))
print(f"rank {{r}} ok", flush=True)
"""


TAGS = [f"{block}-{variant}" for block in ("basic", "attention") for variant in ("eager", "O0-kbk", "O0-sink",
                                                                                   "O1-kbk")]


def _params(ckpt_dir, phase, tag, rank):
    with np.load(os.path.join(ckpt_dir, f"{phase}-{tag}-rank{rank}.npz")) as f:
        return {k: f[k] for k in f.files}


def test_a_restarted_job_continues_bit_for_bit():
    with tempfile.TemporaryDirectory(prefix="kiln-restart-") as ckpt_dir:
        run_ranks(2, PROGRAM.format(phase="whole", ckpt_dir=ckpt_dir), timeout=300)
        assert sorted(n for n in os.listdir(ckpt_dir) if n.endswith(".ckpt")) == sorted(f"{t}.ckpt" for t in TAGS)
        run_ranks(2, PROGRAM.format(phase="resume", ckpt_dir=ckpt_dir), timeout=300)
        for tag in TAGS:
            for rank in range(2):
                whole, resumed = (_params(ckpt_dir, phase, tag, rank) for phase in ("whole", "resume"))
                assert sorted(whole) == sorted(resumed)
                for k in whole:
                    if "O1" in tag:
                        np.testing.assert_allclose(resumed[k], whole[k], rtol=1e-5, atol=1e-6, err_msg=f"{tag} {k}")
                    else:
                        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=f"{tag} rank {rank} {k}")
                    # the ranks agree with each other
                    np.testing.assert_array_equal(whole[k], _params(ckpt_dir, "whole", tag, 1 - rank)[k])
