"""tools/check_layers.py: run on small fake trees, it fails on an upward #include, on folders that
include each other, on a folder with no layer and on a Python import cycle, and passes a clean
tree; run on the real tree, it finds no violation beyond the known ones other work is clearing."""
import importlib.util
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKER = os.path.join(ROOT, "tools", "check_layers.py")

_spec = importlib.util.spec_from_file_location("check_layers", CHECKER)
check_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layers)


def write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


# Includes every legal form: the includer's folder, a lower layer by a relative path and
# src-rooted (as src/python does), the public API, the op table on the include path, codegen
# including its peer runtime one way only; a Python package whose only way back is a lazy import.
CLEAN = {
    "include/kiln/kiln.h": "",
    "src/core/internal.h": '#include "kiln/kiln.h"\n#include "ops.def"\n',
    "src/core/tensor.c": '#include "internal.h"\n#include <stdio.h>\n',
    "src/ops/ops.def": "",
    "src/ops/dispatch.c": '#include "../core/internal.h"\n',
    "src/autograd/engine.c": '#include "../core/internal.h"\n#include "../ops/matmul.h"\n',
    "src/ops/matmul.h": "",
    "src/ir/trace.c": '#include "../autograd/node.h"\n',
    "src/autograd/node.h": "",
    "src/runtime/plan.h": "",
    "src/codegen/emit.c": '#include "../runtime/plan.h"\n#include "../ir/trace.h"\n',
    "src/ir/trace.h": "",
    "src/python/module.c": '#include "core/internal.h"\n#include "codegen/codegen.h"\n',
    "src/codegen/codegen.h": "",
    "pkg/__init__.py": "from . import _C\nfrom .a import f\nfrom . import b\n",
    "pkg/a.py": "from . import b as _b\n\ndef f():\n    return _b.g()\n",
    "pkg/b.py": """\
        import os

        class Helper:
            import json

        def g():
            from .a import f  # lazy: runs when g is called, not at import
            return f
        """,
}


def run(tmp_path, files):
    tree = dict(CLEAN)
    tree.update(files)
    write(tmp_path, tree)
    p = subprocess.run([sys.executable, CHECKER, "--src", str(tmp_path / "src"), "--python", str(tmp_path / "pkg")],
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def test_clean_tree_passes(tmp_path):
    rc, out = run(tmp_path, {})
    assert rc == 0, out
    assert out.startswith("check_layers: ok") and out.count("\n") == 1


def test_upward_include_fails(tmp_path):
    rc, out = run(tmp_path, {"src/core/tensor.c": '#include "internal.h"\n\n#include "../ir/trace.h"\n'})
    assert rc == 1
    assert "src/core/tensor.c:3 -> src/ir/trace.h: core (layer 0) includes ir (layer 3), a layer above it" in out


def test_upward_include_src_rooted_fails(tmp_path):
    rc, out = run(tmp_path, {"src/ir/graph.c": '#include "codegen/codegen.h"\n'})
    assert rc == 1
    assert "src/ir/graph.c:1 -> src/codegen/codegen.h: ir (layer 3) includes codegen" in out


def test_peer_folders_in_a_cycle_fail(tmp_path):
    rc, out = run(tmp_path, {"src/runtime/exec.c": '#include "../codegen/codegen.h"\n'})
    assert rc == 1
    assert "folders include each other: codegen -> runtime -> codegen" in out
    assert "src/codegen/emit.c:1 -> src/runtime/plan.h" in out and "src/runtime/exec.c:1 -> src/codegen/codegen.h" in out
    assert "a layer above it" not in out  # peers: a cycle, not an upward include


def test_folder_without_a_layer_fails(tmp_path):
    rc, out = run(tmp_path, {"src/io/save.c": '#include "../core/internal.h"\n'})
    assert rc == 1
    assert "src/io: a folder with no layer" in out


def test_python_import_cycle_fails(tmp_path):
    rc, out = run(tmp_path, {"pkg/b.py": "from .a import f\n"})
    assert rc == 1
    assert "import cycle: pkg.a -> pkg.b -> pkg.a" in out
    assert "pkg/a.py:1 imports pkg.b" in out and "pkg/b.py:1 imports pkg.a" in out


def test_python_import_cycle_through_the_package_fails(tmp_path):
    # `from pkg import f` reads an attribute of the package, so it needs pkg/__init__ run first
    rc, out = run(tmp_path, {"pkg/b.py": "import os\n\nif os.sep:\n    from pkg import f\n"})
    assert rc == 1
    assert "import cycle: pkg -> pkg.b -> pkg" in out


def test_real_tree_has_no_violations():
    c, _ = check_layers.c_violations(os.path.join(ROOT, "src"))
    assert not c, "layering violations:\n" + "\n".join(msg for _, msg, _ in c)
    py, nmods = check_layers.python_violations(os.path.join(ROOT, "python", "kiln"))
    assert not py, "\n".join(msg for _, msg, _ in py)
    assert nmods > 30
