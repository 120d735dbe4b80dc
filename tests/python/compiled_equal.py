"""A strict form of the conformance check, for functions that must compile: each kiln.jit variant
(capture_mode ast / bytecode / trace x jit_level O0 / O1 / O2 x backend kbk / sink) runs the calls,
must compile a graph (no eager fallback, no error) and give eager's results. With grad=True the
variants compile value_and_grad of the function (forward and backward in one graph) and are
compared with eager's value_and_grad."""
import warnings

import kiln
from conformance import ENV, MODES, VARIANTS, Variant, clone, difference, environment

# conformance's variants and O2 (the whole graph sunk by default; kbk asked for explicitly)
STRICT_VARIANTS = VARIANTS + [
    Variant(f"{mode}-O2-{backend}",
            lambda fn, mode=mode, backend=backend: kiln.jit(fn, capture_mode=mode, jit_level="O2", backend=backend))
    for mode in MODES for backend in ("kbk", "sink")]


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
        for v in STRICT_VARIANTS:
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


def assert_never_compiled_silently(op, fn, mode, inputs):
    """fn uses op, whose output size depends on its input's values: under kiln.jit(capture_mode=
    mode) each call either raises NotImplementedError naming op, or gives eager's result with a
    warning naming op (the function run eagerly); never a size baked in at capture."""
    f = kiln.jit(fn, capture_mode=mode)
    ran = False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for a in inputs:
            try:
                got = f(a)
            except NotImplementedError as e:
                assert f"{op}: its output size depends on the values" in str(e)
                continue
            assert got.numpy().tolist() == fn(a).numpy().tolist(), (op, mode)
            ran = True
    if ran:  # (the warning is given once, when the function is first found to run eagerly)
        assert any(f"{op}: its output size depends on the values" in str(w.message) for w in seen), \
            [str(w.message) for w in seen]
        assert f.cache_info().compiles == 0
