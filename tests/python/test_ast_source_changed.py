"""ast capture converts a function's source text: when the file was edited after the module was
imported, that text is not the code that runs, and capture must refuse it (running eagerly, or a
clear error under fullgraph) rather than compile the new text."""
import importlib
import os
import sys

import pytest

import kiln


def test_a_function_whose_file_changed_after_import_runs_as_imported(tmp_path, monkeypatch):
    path = tmp_path / "edited_after_import.py"
    path.write_text("def f(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # the bytecode cache records the source's size and time
    module = importlib.import_module("edited_after_import")
    try:
        path.write_text("def f(x):\n    return x * 3\n")
        st = os.stat(path)
        os.utime(path, (st.st_atime + 5, st.st_mtime + 5))  # edited later than imported
        x = kiln.Tensor([1.0, 2.0])
        with pytest.raises(kiln.JitSyntaxError, match="source file changed"):
            kiln.jit(module.f, capture_mode="ast", fullgraph=True)(x)
        with pytest.warns(RuntimeWarning, match="source file changed"):
            got = kiln.jit(module.f, capture_mode="ast")(x)
        assert got.asnumpy().tolist() == [2.0, 4.0]  # the code that runs, as eager
    finally:
        sys.modules.pop("edited_after_import", None)
