#!/usr/bin/env python3
"""Attributes are read by name outside an op's own kernel file: fails on a kiln_attrs int or double
indexed by a bare number (`n->attrs.i[1]`, `a.f[0]`, `a->i + 2`) in src/, where the names that
src/ops/ops.def's KILN_ATTRS lines give (include/kiln/op_attrs.h: KILN_A_REDUCE_KEEPDIMS, ...)
belong. A loop over every attribute (`a->i[k]`) is not a layout and is not flagged.

Allowed: the ops' own kernel files in src/ops/, except those that read the attributes of many ops
(CROSS_OP below); and files whose `.f[]` or `.i[]` is no kiln_attrs (NOT_ATTRS below, each with why).

    python3 tools/check_attr_access.py [--src DIR]

Exit 0 with a one-line summary, or 1 with every violation (file:line: text)."""
import argparse
import os
import re
import sys

# Files of src/ops/ that read other ops' attributes: named access there too.
CROSS_OP = {
    "ops/infer_sym.c": "the symbolic shape rules of every op",
    "ops/footprint.c": "the FLOP counts of every op",
    "ops/index_lower.c": "builds slice attributes for the index ops",
}

# Files whose numbered .f[] / .i[] are not kiln_attrs.
NOT_ATTRS = {
    "core/symdim.c": "a symbolic product's factor list (term.f[]), not attributes",
}

# .i[<digit> / ->f[<digit>, and pointer arithmetic .i + <digit>.
RAW_INDEX = re.compile(r"(?:\.|->)\s*([if])\s*(?:\[\s*\d|\+\s*\d)")
COMMENT_OR_STRING = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def _blank(match):
    """A comment or string literal as spaces, keeping its newlines (line numbers stay right)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def allowed(rel):
    """Whether src/<rel> may index attributes by number."""
    if rel in NOT_ATTRS:
        return True
    return rel.startswith("ops/") and rel not in CROSS_OP


def violations_in(text):
    """(line number, line) of each raw attribute index in C source text."""
    code = COMMENT_OR_STRING.sub(_blank, text)
    lines, raw = code.split("\n"), text.split("\n")
    return [(k + 1, raw[k].strip()) for k, line in enumerate(lines) if RAW_INDEX.search(line)]


def check(src):
    """Every violation under src as 'path:line: text'."""
    found = []
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            if allowed(rel):
                continue
            with open(path, encoding="utf-8") as f:
                for line, text in violations_in(f.read()):
                    found.append(f"src/{rel}:{line}: {text}")
    return sorted(found)


def missing_allowances(src):
    """Allow-list entries naming no file (a renamed file must not keep its exemption silently)."""
    return [rel for rel in (*CROSS_OP, *NOT_ATTRS) if not os.path.isfile(os.path.join(src, rel))]


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default=os.path.join(here, "..", "src"))
    args = p.parse_args(argv)
    found = check(args.src)
    stale = missing_allowances(args.src)
    for v in found:
        print(f"{v}  (name it: KILN_A_<LAYOUT>_<FIELD>, src/ops/ops.def KILN_ATTRS)")
    for rel in stale:
        print(f"tools/check_attr_access.py: allow-list names src/{rel}, which does not exist")
    if found or stale:
        return 1
    print("check_attr_access: attributes are read by name outside the ops' own files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
