"""ordered_map: fn over items in worker processes (or threads), results in input order.

The rule for processes or threads:
  * fork start method available (Linux, macOS with fork): worker processes. fn is handed to
    them by fork itself, so it need not be picklable; the items sent and results returned must
    be (NumPy arrays, numbers, tuples/lists/dicts of them are).
  * no fork (Windows): processes when fn pickles, otherwise threads.
  * mode="thread" forces threads.
At most num_workers * prefetch items are in flight: iteration overlaps the consumer's work
without reading the whole source ahead. Breaking out of the loop, or an error, terminates the
workers (no process outlives the iterator). An exception in fn is re-raised in the caller as
WorkerError carrying the worker's traceback text."""
import collections
import multiprocessing
import pickle
import traceback
from concurrent.futures import ThreadPoolExecutor

_worker_fn = None  # the fn of the pool this process serves (set by fork, or by _install)


class WorkerError(RuntimeError):
    """An exception raised by dataset code in a data worker; its message holds the worker's
    traceback."""


def _install(fn):
    global _worker_fn
    _worker_fn = fn


def _call(item):
    try:
        return True, _worker_fn(item)
    except BaseException as exc:  # reported back, never lost in the worker
        return False, f"{type(exc).__name__}: {exc}\n--- worker traceback ---\n{traceback.format_exc()}"


def _call_fn(fn, item):
    try:
        return True, fn(item)
    except BaseException as exc:
        return False, f"{type(exc).__name__}: {exc}\n--- worker traceback ---\n{traceback.format_exc()}"


def choose_mode(fn, mode=None):
    """"process" or "thread", by the rule in the module docstring."""
    if mode in ("process", "thread"):
        return mode
    if mode is not None:
        raise ValueError(f"kiln.dataset: worker mode must be 'process', 'thread' or None, got {mode!r}")
    if "fork" in multiprocessing.get_all_start_methods():
        return "process"
    try:
        pickle.dumps(fn)
        return "process"
    except Exception:
        return "thread"


def ordered_map(fn, items, num_workers, prefetch=2, mode=None, what="dataset"):
    """A generator of fn(item) for item in items, in order; fn runs in num_workers workers."""
    if num_workers <= 0:
        for item in items:
            yield fn(item)
        return
    bound = max(1, num_workers * max(1, int(prefetch)))
    if choose_mode(fn, mode) == "thread":
        pool = ThreadPoolExecutor(num_workers)
        submit = lambda item: pool.submit(_call_fn, fn, item)  # noqa: E731
        result = lambda fut: fut.result()  # noqa: E731

        def close():
            pool.shutdown(wait=True, cancel_futures=True)
    else:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        pool = ctx.Pool(num_workers, initializer=_install, initargs=(fn,))
        submit = lambda item: pool.apply_async(_call, (item,))  # noqa: E731
        result = lambda fut: fut.get()  # noqa: E731

        def close():
            pool.terminate()
            pool.join()
    pending = collections.deque()
    source = iter(items)
    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < bound:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(submit(item))
            if not pending:
                return
            ok, value = result(pending.popleft())
            if not ok:
                raise WorkerError(f"kiln.dataset: error in a data worker of {what}: {value}")
            yield value
    finally:
        close()
