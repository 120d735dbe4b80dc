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


def test_a_stale_bytecode_cache_of_a_file_written_before_the_process_is_no_edit(tmp_path, monkeypatch):
    """A bytecode cache left from an older version of the file (Python compiles the file and, with
    bytecode writing off, keeps the stale cache): the file was not edited after import, so ast
    capture converts it."""
    path = tmp_path / "stale_cache_module.py"
    path.write_text("def f(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    importlib.import_module("stale_cache_module")  # writes the cache of this first version
    sys.modules.pop("stale_cache_module")
    path.write_text("def f(x):\n    return x * 3 + 1\n")
    old = os.stat(path).st_mtime - 3600  # written before this process started
    os.utime(path, (old, old))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # the stale cache stays
    module = importlib.import_module("stale_cache_module")
    try:
        x = kiln.Tensor([1.0, 2.0])
        got = kiln.jit(module.f, capture_mode="ast", fullgraph=True)(x)
        assert got.asnumpy().tolist() == [4.0, 7.0]
    finally:
        sys.modules.pop("stale_cache_module", None)
