"""A strict form of the conformance check, for functions that must compile: each kiln.jit variant
(capture_mode ast / bytecode / trace x jit_level O0 / O1 x backend kbk / sink) runs the calls,
must compile a graph (no eager fallback, no error) and give eager's results. With grad=True the
variants compile value_and_grad of the function (forward and backward in one graph) and are
compared with eager's value_and_grad."""
import warnings

import kiln
from conformance import ENV, VARIANTS, clone, difference, environment


def _float_positions(args):
    return tuple(i for i, a in enumerate(args) if isinstance(a, kiln.Tensor) and a.dtype.is_floating_point)


def assert_compiled_equal(fn, *calls, grad=False):
    """calls: tuples of arguments. Raises AssertionError naming each variant that differs, raised,
    or ran eagerly."""
    positions = _float_positions(calls[0]) if grad else None
    target = kiln.value_and_grad(fn, grad_position=positions) if grad else fn
    want = [target(*clone(c)) for c in calls]
    problems = []
    with environment(ENV), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for v in VARIANTS:
            jf = v.wrap(target)
            for k, c in enumerate(calls):
                try:
                    got = jf(*clone(c))
                except Exception as e:  # noqa: BLE001 (reported with the variant)
                    problems.append(f"{v.name} call {k}: raised {type(e).__name__}: {e}")
                    break
                d = difference(got, want[k])
                if d:
                    problems.append(f"{v.name} call {k}: {d}")
                    break
            info = jf.cache_info()
            if info.eager_calls:
                problems.append(f"{v.name}: ran eagerly ({info})")
    assert not problems, "\n".join(problems)
