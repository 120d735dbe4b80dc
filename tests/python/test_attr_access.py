"""Attributes are read by name outside an op's own kernel file (tools/check_attr_access.py): kiln's
src/ passes, and the checker flags the raw indices it exists to catch (and only those)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_attr_access", ROOT / "tools" / "check_attr_access.py")
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)


def _tree(tmp_path, files):
    src = tmp_path / "src"
    for rel, text in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in (*checker.CROSS_OP, *checker.NOT_ATTRS):  # the allow-list's files exist
        path = src / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    return src


def test_kiln_sources_read_attributes_by_name():
    assert checker.check(str(ROOT / "src")) == []
    assert checker.missing_allowances(str(ROOT / "src")) == []
    assert checker.main(["--src", str(ROOT / "src")]) == 0


def test_raw_index_outside_op_files_is_flagged(tmp_path):
    src = _tree(tmp_path, {
        "passes/keepdims.c": "bool k(const kiln_node *n) {\n    return n->attrs.i[1] != 0;\n}\n",
        "ir/eps.c": "double e(const kiln_attrs *a) { return a->f[0]; }\n",
        "plan/shape.c": "const int64_t *s(const kiln_attrs a) { return a.i + 2; }\n",
        "ops/infer_sym.c": "int axis(const kiln_attrs *a) { return (int)a->i[0]; }\n",
    })
    found = checker.check(str(src))
    assert found == [
        "src/ir/eps.c:1: double e(const kiln_attrs *a) { return a->f[0]; }",
        "src/ops/infer_sym.c:1: int axis(const kiln_attrs *a) { return (int)a->i[0]; }",
        "src/passes/keepdims.c:2: return n->attrs.i[1] != 0;",
        "src/plan/shape.c:1: const int64_t *s(const kiln_attrs a) { return a.i + 2; }",
    ]
    assert checker.main(["--src", str(src)]) == 1


def test_named_loops_comments_and_op_files_are_not_flagged(tmp_path):
    src = _tree(tmp_path, {
        "passes/named.c": (
            "/* keepdims is i[1] */\n"
            "bool k(const kiln_node *n) { return n->attrs.i[KILN_A_REDUCE_KEEPDIMS] != 0; }\n"
            "int64_t all(const kiln_attrs *a) { int64_t s = 0; for (int k = 0; k < a->ni; k++) s += a->i[k]; return s; }\n"
            "const char *doc = \"a->i[0]\";\n"
        ),
        "ops/reduce.c": "int keep(const kiln_attrs *a) { return a->i[1] != 0; }\n",
        "core/symdim.c": "int first(const term *t) { return t->f[0]; }\n",
    })
    assert checker.check(str(src)) == []
    assert checker.main(["--src", str(src)]) == 0


def test_stale_allowance_is_reported(tmp_path):
    src = tmp_path / "src"
    (src / "ops").mkdir(parents=True)
    assert set(checker.missing_allowances(str(src))) == set(checker.CROSS_OP) | set(checker.NOT_ATTRS)
    assert checker.main(["--src", str(src)]) == 1
