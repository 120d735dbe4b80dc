"""A kiln.jit profile names the file of the function that ran: two modules whose functions have the
same source (so equal code objects: CPython compares code without its file) named the first
module's file in the second's profile under capture_mode="ast" (issue 28)."""
import importlib.util
import itertools

import numpy as np
import pytest

import kiln

SOURCE = '''from kiln import ops


def f(x):
    h = ops.tanh(x * 2.0 + 1.0)
    return h.exp() - x
'''


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mode, level, backend", list(itertools.product(("ast", "bytecode", "trace"), ("O0", "O1"),
                                                                         ("kbk", "sink"))))
def test_each_function_profile_names_its_own_file(tmp_path, mode, level, backend):
    (tmp_path / "first_mod.py").write_text(SOURCE)
    (tmp_path / "second_mod.py").write_text(SOURCE)
    mods = [load_module(tmp_path / f"{n}.py", f"kiln_test_{n}_{mode}_{level}_{backend}") for n in ("first_mod", "second_mod")]
    assert mods[0].f.__code__ == mods[1].f.__code__  # what made the two one
    x = kiln.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    want = mods[0].f(x).asnumpy()
    for mod, name in zip(mods, ("first_mod.py", "second_mod.py")):
        jf = kiln.jit(mod.f, capture_mode=mode, jit_level=level, backend=backend, profiling=True)
        jf(x)
        np.testing.assert_allclose(jf(x).asnumpy(), want, rtol=1e-6, atol=1e-6)
        ops_ = jf.get_profile()["graph_exec"]["operator"].values()
        files = {o["loc"].rsplit(":", 1)[0] for o in ops_ if o["loc"]}
        assert files == {str(tmp_path / name)}, (name, files)
