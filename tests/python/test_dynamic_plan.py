"""One plan for every binding (issue 16 part 1): a dynamic entry whose recording is made symbolic and
optimized once is also planned once (kiln._C.plan_symbolic) and each new binding is bound to that plan
(kiln._C.bind_plan: sizes and buffer offsets evaluated, the generated code of the first binding called
with the new sizes). test_dynamic_random's random programs run under every compiled variant (jit
levels, kbk and sink, trace/ast/bytecode capture) over shapes that grow past any seen and shrink
again, against eager; the plan and compiler counters show that a new binding plans nothing and
generates no code: nothing compiled, nothing even looked up (and that they would show it if it did)."""
import itertools

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.jit import dynamic
from test_dynamic_random import program, source

# (batch, seq): the first compiles, the next grow past every size seen, then smaller again
SHAPES = ((4, 5), (2, 6), (5, 9), (7, 13), (2, 4), (6, 8))
VARIANTS = list(itertools.product(("O0", "O1", "O2"), ("kbk", "sink"), ("trace", "ast", "bytecode")))
# program seeds whose recordings can be made symbolic (the others fall back to rebinding per binding:
# test_dynamic_random covers them), one per variant
SEEDS = (101, 102, 105, 106, 107, 108, 109, 110, 111, 112, 113, 116, 118, 119, 120, 122, 123, 124)


@pytest.mark.parametrize("n", range(len(VARIANTS)))
def test_random_programs_bound_to_one_plan_agree_with_eager(n):
    level, backend, mode = VARIANTS[n]
    seed = SEEDS[n]
    fn = program(seed)
    jf = kiln.jit(fn, dynamic=True, jit_level=level, backend=backend, capture_mode=mode)
    rng = np.random.default_rng(seed)
    for b, s in SHAPES:
        x = kiln.Tensor(rng.standard_normal((b, s, 3)).astype(np.float32))
        y = kiln.Tensor(rng.standard_normal((s, 3)).astype(np.float32))
        for g, w in zip(jf(x, y), fn(x, y)):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{VARIANTS[n]}\n{source(seed)}")
    info = jf.cache_info()
    assert info.compiles == 1 and info.instances == len(SHAPES) - 1, (VARIANTS[n], info, source(seed))
    d = info.dynamic[0]
    assert d["planned_once"] is d["optimized_once"] is True, (VARIANTS[n], d, source(seed))


def _counts():
    """(plans built, plans bound, (compiler runs, generated code looked up in the loaded objects))"""
    st = kiln._C.codegen_stats()
    return kiln._C.plan_counts() + ((st["compiles"], st["memory_hits"]),)


@pytest.mark.parametrize("backend", ("kbk", "sink"))
def test_a_new_binding_plans_and_compiles_nothing(backend):
    def fn(x, y):
        h = ops.tanh(x * 0.5 + y)
        return h - h.mean(1, keepdims=True), ops.softmax(h, -1).sum(0)

    rng = np.random.default_rng(7)

    def call(jf, n, m):
        x = kiln.Tensor(rng.standard_normal((n, m)).astype(np.float32))
        y = kiln.Tensor(rng.standard_normal((1, m)).astype(np.float32))
        for g, w in zip(jf(x, y), fn(x, y)):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-5)

    sizes = ((4, 6), (5, 7), (9, 3), (33, 17), (2, 2), (6, 6))
    for once in (True, False):  # False: each binding planned again, which the counters must see
        dynamic.planned_instances = once
        try:
            jf = kiln.jit(fn, dynamic=True, jit_level="O1", backend=backend)
            call(jf, *sizes[0])
            call(jf, *sizes[1])  # the entry's first new binding: the recording planned once
            built, bound, compiles = _counts()
            for n, m in sizes[2:]:
                call(jf, n, m)
            built2, bound2, compiles2 = _counts()
            info = jf.cache_info()
            assert info.compiles == 1 and info.instances == len(sizes) - 1, info
            if once:
                assert info.dynamic[0]["planned_once"] is True, info.dynamic
                assert (built2, bound2, compiles2) == (built, bound + len(sizes) - 2, compiles)
            else:
                assert info.dynamic[0]["planned_once"] is None, info.dynamic
                assert built2 >= built + len(sizes) - 2 and bound2 == bound
        finally:
            dynamic.planned_instances = True
