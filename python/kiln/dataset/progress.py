"""A small progress bar for training loops: progress(iterable, total=None, desc="") yields the
items and, when stderr is a terminal (or force=True), redraws one line with the count, rate and
time left."""
import sys
import time


def progress(iterable, total=None, desc="", file=None, force=False, width=30):
    out = file or sys.stderr
    show = force or (hasattr(out, "isatty") and out.isatty())
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    start = time.perf_counter()
    n = 0
    for item in iterable:
        yield item
        n += 1
        if show:
            elapsed = time.perf_counter() - start
            rate = n / elapsed if elapsed > 0 else 0.0
            if total:
                filled = int(width * n / total)
                left = (total - n) / rate if rate else 0.0
                line = f"\r{desc} [{'#' * filled}{'.' * (width - filled)}] {n}/{total} {rate:.1f}/s {left:.0f}s left"
            else:
                line = f"\r{desc} {n} {rate:.1f}/s"
            out.write(line)
            out.flush()
    if show:
        out.write("\n")
        out.flush()
