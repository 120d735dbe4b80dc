"""progress(iterable): a one-line progress counter on stderr for data loops."""
import sys
import time


def progress(iterable, total=None, desc="", enabled=None, file=None, every=0.1):
    """Yields the items of iterable, showing `desc: n/total (rate it/s)` on one stderr line.

    It draws only when enabled is True, or when enabled is None and the stream is a terminal
    (so logs and CI output stay clean). total defaults to len(iterable) when it has one.
    every: the least seconds between redraws."""
    stream = file if file is not None else sys.stderr
    if enabled is None:
        enabled = hasattr(stream, "isatty") and stream.isatty()
    if total is None and hasattr(iterable, "__len__"):
        try:
            total = len(iterable)
        except TypeError:
            total = None
    if not enabled:
        yield from iterable
        return
    start = last = time.monotonic()
    n = 0
    prefix = f"{desc}: " if desc else ""

    def draw():
        rate = n / max(time.monotonic() - start, 1e-9)
        of = f"/{total}" if total is not None else ""
        stream.write(f"\r{prefix}{n}{of} ({rate:.1f} it/s)")
        stream.flush()

    try:
        for item in iterable:
            yield item
            n += 1
            now = time.monotonic()
            if now - last >= every:
                last = now
                draw()
    finally:
        draw()
        stream.write("\n")
        stream.flush()
