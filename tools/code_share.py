"""Prints the share of kiln's non-test, non-bench code that is C.

C: lines of src/**/*.{c,h,def} and include/**/*.h. Python: lines of python/kiln/**/*.py except
python/kiln/bench/. Run from anywhere: python3 tools/code_share.py [--root DIR]
"""
import argparse
import os
import sys


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def tally(root, folder, suffixes, skip=()):
    """{subfolder relative to root: lines} of the files under root/folder ending in suffixes."""
    counts = {}
    top = os.path.join(root, folder)
    for dirpath, dirnames, filenames in os.walk(top):
        rel = os.path.relpath(dirpath, root)
        if any(rel == s or rel.startswith(s + os.sep) for s in skip):
            dirnames[:] = []
            continue
        n = sum(count_lines(os.path.join(dirpath, f)) for f in filenames if f.endswith(suffixes))
        if n:
            counts[rel] = n
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args(argv)
    c = tally(args.root, "src", (".c", ".h", ".def"))
    c.update(tally(args.root, "include", (".h",)))
    py = tally(args.root, os.path.join("python", "kiln"), (".py",), skip=(os.path.join("python", "kiln", "bench"),))
    for name, counts in (("C", c), ("Python", py)):
        for folder in sorted(counts):
            print(f"{name:6} {counts[folder]:7} {folder}")
    c_total, py_total = sum(c.values()), sum(py.values())
    share = 100.0 * c_total / (c_total + py_total) if c_total + py_total else 0.0
    print(f"C {c_total} lines, Python {py_total} lines: {share:.1f}% C")
    return 0


if __name__ == "__main__":
    sys.exit(main())
