"""tools/check_layers.py: run on small planted trees, it fails naming each violation (an upward
#include of src/, an include of a public header of a higher layer or of the users' aggregate, folders
that include or call each other, an upward call between object files, a Python import cycle made by
imports inside functions, an upward import, an import of another module's private name, a folder,
header or module with no layer) and passes the clean versions; run on the real tree, it passes."""
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

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


# Every legal form: includes of the includer's folder, of a lower layer by a relative path and
# src-rooted (as src/python does), of public headers of the includer's layer and below (the users'
# aggregate only from the top), the op table on the include path, codegen including its peer
# runtime one way only. A Python package named kiln (so PY_LAYERS places its modules) whose imports
# go downward, at module level and inside functions, with a hook where a lower module needs a
# higher one, an upward import only under TYPE_CHECKING, imports of underscore-named modules and
# aliases to underscore names.
CLEAN = {
    "include/kiln/core.h": "",
    "include/kiln/ops.h": '#include "kiln/core.h"\n#include "ops.def"\n',
    "include/kiln/graph.h": '#include "kiln/ops.h"\n',
    "include/kiln/kiln.h": '#include "kiln/core.h"\n#include "kiln/graph.h"\n',
    "src/core/internal.h": '#include "kiln/core.h"\n#include "kiln/ops.h"\n#include "ops.def"\n',
    "src/core/tensor.c": '#include "internal.h"\n#include <stdio.h>\n',
    "src/ops/ops.def": "",
    "src/ops/dispatch.c": '#include "../core/internal.h"\n',
    "src/autograd/engine.c": '#include "../core/internal.h"\n#include "../ops/matmul.h"\n',
    "src/ops/matmul.h": "",
    "src/ir/trace.c": '#include "../autograd/node.h"\n#include "kiln/graph.h"\n',
    "src/autograd/node.h": "",
    "src/runtime/plan.h": "",
    "src/codegen/emit.c": '#include "../runtime/plan.h"\n#include "../ir/trace.h"\n',
    "src/ir/trace.h": "",
    "src/python/module.c": '#include "core/internal.h"\n#include "codegen/codegen.h"\n#include "kiln/kiln.h"\n',
    "src/codegen/codegen.h": "",
    "kiln/__init__.py": """\
        from . import _C
        from ._tensor import Tensor
        from . import autograd, jit, nn, ops
        from .version import __version__
        """,
    "kiln/version.py": '__version__ = "0"\n',
    "kiln/hooks.py": "jit_function_class = None  # set by kiln.jit.function\n",
    "kiln/_optable.py": "from . import _C\n",
    "kiln/ops/__init__.py": "from .array import zeros\nfrom .math import add\nfrom ..autograd import grad\n",
    "kiln/ops/_util.py": "from .. import _C\n",
    "kiln/ops/array.py": "from .. import _C, _optable\n\ndef zeros():\n    return None\n",
    "kiln/ops/math.py": """\
        from .. import _C

        def add():
            from .array import zeros  # lazy, and downward within the layer
            return zeros()
        """,
    "kiln/autograd.py": """\
        from typing import TYPE_CHECKING

        from . import _C, hooks
        from .ops import _util
        from .ops.array import zeros as _zeros

        if TYPE_CHECKING:
            from .jit.function import JitFunction

        def grad(fn):
            return isinstance(fn, hooks.jit_function_class)
        """,
    "kiln/_tensor.py": "from . import ops as _ops\n\nclass Tensor:\n    pass\n",
    "kiln/nn/__init__.py": "from .cell import Cell\n",
    "kiln/nn/cell.py": "from .. import hooks\n\ndef jit_of(cell):\n    return hooks.jit_function_class(cell)\n",
    "kiln/jit/__init__.py": "from .function import JitFunction\n",
    "kiln/jit/function.py": """\
        from .. import hooks
        from ..autograd import grad

        class JitFunction:
            def cells(self):
                from ..nn.cell import Cell
                return Cell

        hooks.jit_function_class = JitFunction
        """,
}


def run(tmp_path, files, build=None):
    tree = dict(CLEAN)
    tree.update(files)
    write(tmp_path, {k: v for k, v in tree.items() if v is not None})
    args = [sys.executable, CHECKER, "--src", str(tmp_path / "src"), "--python", str(tmp_path / "kiln"),
            "--build", str(build or tmp_path / "no-build")]
    p = subprocess.run(args, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def test_clean_tree_passes(tmp_path):
    rc, out = run(tmp_path, {})
    assert rc == 0, out
    assert out.startswith("check_layers: ok") and out.count("\n") == 1
    assert "linked symbols not checked: no build directory at" in out


# ---- includes ----------------------------------------------------------------------------------

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


def test_include_of_a_higher_layers_public_header_fails(tmp_path):
    rc, out = run(tmp_path, {"src/ops/dispatch.c": '#include "../core/internal.h"\n#include "kiln/graph.h"\n'})
    assert rc == 1
    assert "src/ops/dispatch.c:2 -> include/kiln/graph.h: ops (layer 1) includes a public header of layer 3" in out


def test_include_of_the_aggregate_below_its_layer_fails(tmp_path):
    # kiln/kiln.h includes kiln/graph.h (ir): core sees the graph through it
    rc, out = run(tmp_path, {"src/core/internal.h": '#include "kiln/kiln.h"\n'})
    assert rc == 1
    assert ("src/core/internal.h:1 -> include/kiln/kiln.h: core (layer 0) includes a public header of layer 3, "
            "the users' aggregate: include the specific headers") in out


def test_public_header_including_a_higher_one_fails(tmp_path):
    rc, out = run(tmp_path, {"include/kiln/ops.h": '#include "kiln/core.h"\n#include "kiln/graph.h"\n'})
    assert rc == 1
    assert "include/kiln/ops.h:2 -> include/kiln/graph.h: core header (layer 0) includes a header of layer 3" in out


def test_public_header_without_a_layer_fails(tmp_path):
    rc, out = run(tmp_path, {"include/kiln/extra.h": '#include "kiln/core.h"\n'})
    assert rc == 1
    assert "include/kiln/extra.h: a public header with no layer" in out


# ---- linked symbols ----------------------------------------------------------------------------

def compile_objects(tmp_path, sources):
    """Objects of `sources` (src-relative path -> C text) where CMake leaves them."""
    build = tmp_path / "build"
    for rel, text in sources.items():
        c = tmp_path / "csrc" / rel
        c.parent.mkdir(parents=True, exist_ok=True)
        c.write_text(text)
        obj = build / "CMakeFiles" / "kiln_objects.dir" / "src" / (rel + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([shutil.which("cc") or "gcc", "-c", str(c), "-o", str(obj)], check=True)
    return build


def test_downward_calls_pass(tmp_path):
    build = compile_objects(tmp_path, {
        "core/tensor.c": "int kiln_core_fn(void) { return 1; }\n",
        "ir/graph.c": "int kiln_core_fn(void);\nint kiln_ir_fn(void) { return kiln_core_fn() + 1; }\n",
    })
    rc, out = run(tmp_path, {}, build)
    assert rc == 0, out
    assert f"1 calls between folders in the objects of {build}" in out


def test_upward_call_fails(tmp_path):
    build = compile_objects(tmp_path, {
        "core/tensor.c": "int kiln_ir_fn(void);\nint kiln_core_fn(void) { return kiln_ir_fn() + 1; }\n",
        "ir/graph.c": "int kiln_ir_fn(void) { return 1; }\n",
    })
    rc, out = run(tmp_path, {}, build)
    assert rc == 1
    assert ("src/core/tensor.c needs kiln_ir_fn, defined in src/ir/graph.c: core (layer 0) calls ir (layer 3), "
            "a layer above it") in out


def test_peer_folders_calling_each_other_fail(tmp_path):
    build = compile_objects(tmp_path, {
        "codegen/emit.c": "int kiln_run_fn(void);\nint kiln_emit_fn(void) { return kiln_run_fn(); }\n",
        "runtime/kbk.c": "int kiln_emit_fn(void);\nint kiln_run_fn(void) { return 1; }\n"
                         "int kiln_kbk_fn(void) { return kiln_emit_fn(); }\n",
    })
    rc, out = run(tmp_path, {}, build)
    assert rc == 1
    assert "folders call each other: codegen -> runtime -> codegen" in out
    assert "src/codegen/emit.c calls kiln_run_fn (src/runtime/kbk.c)" in out


# ---- Python ------------------------------------------------------------------------------------

def test_import_cycle_inside_functions_fails(tmp_path):
    rc, out = run(tmp_path, {"kiln/ops/array.py": """\
        def zeros():
            from .math import add  # lazy, but math imports array lazily too: a cycle
            return add
        """})
    assert rc == 1
    assert "import cycle: kiln.ops.array -> kiln.ops.math -> kiln.ops.array" in out
    assert "kiln/ops/array.py:2 imports kiln.ops.math" in out and "kiln/ops/math.py:4 imports kiln.ops.array" in out


def test_module_level_import_cycle_fails(tmp_path):
    rc, out = run(tmp_path, {"kiln/ops/array.py": "from .math import add\n"})
    assert rc == 1
    assert "import cycle: kiln.ops.array -> kiln.ops.math -> kiln.ops.array" in out


def test_import_of_the_package_attribute_is_a_cycle(tmp_path):
    # `from .. import X` reads an attribute of kiln, so it needs kiln/__init__ (which imports everything)
    rc, out = run(tmp_path, {"kiln/nn/cell.py": "def tensor_class():\n    from .. import Tensor\n    return Tensor\n"})
    assert rc == 1
    assert "import cycle: kiln -> kiln.nn -> kiln.nn.cell -> kiln" in out
    assert "kiln.nn.cell (layer 5) imports a module of layer 9, a layer above it" in out


def test_upward_import_inside_a_function_fails(tmp_path):
    rc, out = run(tmp_path, {"kiln/autograd.py": """\
        from . import _C

        def grad(fn):
            from .jit.function import JitFunction
            return isinstance(fn, JitFunction)
        """})
    assert rc == 1
    assert ("kiln/autograd.py:4 imports kiln.jit.function: kiln.autograd (layer 2) imports a module of layer 6, "
            "a layer above it") in out


def test_import_of_a_private_name_fails(tmp_path):
    rc, out = run(tmp_path, {"kiln/jit/function.py": "from ..autograd import _zeros\n\nclass JitFunction:\n    pass\n"})
    assert rc == 1
    assert "kiln/jit/function.py:1 imports _zeros from kiln.autograd: a private name of another module" in out


def test_module_without_a_layer_fails(tmp_path):
    rc, out = run(tmp_path, {"kiln/extra.py": "from . import _C\n"})
    assert rc == 1
    assert "kiln.extra: a module with no layer" in out


def test_private_and_layer_rules_by_hand():
    assert check_layers._is_private("_x") and not check_layers._is_private("__version__")
    assert check_layers.python_layer("kiln.ops") == 3 and check_layers.python_layer("kiln.ops.math") == 1
    assert check_layers.python_layer("kiln.jit.tree") == 0 and check_layers.python_layer("kiln.jit.function") == 6
    assert check_layers.python_layer("numpy") is None


# ---- the real tree -----------------------------------------------------------------------------

def test_real_tree_has_no_violations():
    c, nedges = check_layers.c_violations(os.path.join(ROOT, "src"))
    assert not c, "layering violations:\n" + "\n".join(msg for _, msg, _ in c)
    assert nedges > 10
    py, nmods = check_layers.python_violations(os.path.join(ROOT, "python", "kiln"))
    assert not py, "\n".join(msg for _, msg, _ in py)
    assert nmods > 30


def test_real_build_has_no_upward_calls():
    build = os.path.join(ROOT, "build")
    if not os.path.isdir(build) or not check_layers.object_files(build):
        pytest.skip("no build/ with object files here (scripts/test.sh runs the tests after its build)")
    sym, ncalls = check_layers.symbol_violations(build)
    assert sym == [], "\n".join(msg for _, msg, _ in sym)
    assert ncalls > 10
