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
WorkerError carrying the worker's traceback text. A KeptWorkers keeps the workers between epochs."""
import collections
import multiprocessing
import os
import pickle
import traceback
import weakref
from concurrent.futures import ThreadPoolExecutor

from . import config


class WorkerError(RuntimeError):
    """An exception raised by dataset code in a data worker; its message holds the worker's
    traceback."""


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


def _serve(fn, inbox, outbox, nice):
    """A worker process: fn over the items of inbox, each result (or error text) to outbox; it
    first lowers its own priority by nice (config.set_worker_nice)."""
    if nice:
        try:
            os.nice(nice)
        except OSError:  # (lowering one's priority is always allowed; a platform without it runs as is)
            pass
    while True:
        item = inbox.get()
        if item is None:
            return
        ok, value = _call_fn(fn, item)
        try:
            outbox.send((ok, value))
        except Exception as exc:  # a result that does not pickle
            outbox.send((False, f"the worker's result could not be sent back ({type(exc).__name__}: {exc}); "
                                "return NumPy arrays, numbers or tuples of them"))


class _Processes:
    """num_workers processes; item k goes to worker k % num_workers, so each worker's results,
    read in turn, are in input order. Items go through a Queue (its feeder thread never blocks
    the caller), results come back through a Pipe read only by the caller."""

    def __init__(self, fn, num_workers):
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        self.inboxes, self.outboxes, self.procs = [], [], []
        try:
            for _ in range(num_workers):
                inbox = ctx.Queue()
                receive, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_serve, args=(fn, inbox, send, config.get_worker_nice()), daemon=True)
                proc.start()
                send.close()
                self.inboxes.append(inbox)
                self.outboxes.append(receive)
                self.procs.append(proc)
        except BaseException:
            self.close()
            raise

    def submit(self, k, item):
        w = k % len(self.procs)
        self.inboxes[w].put(item)
        return w

    def result(self, w):
        try:
            return self.outboxes[w].recv()
        except EOFError:
            proc = self.procs[w]
            proc.join(1)
            return False, f"the worker process exited unexpectedly (exit code {proc.exitcode})"

    def close(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join()
        for inbox in self.inboxes:
            inbox.cancel_join_thread()
            inbox.close()
        for outbox in self.outboxes:
            outbox.close()


class _Threads:
    def __init__(self, fn, num_workers):
        self.fn = fn
        self.pool = ThreadPoolExecutor(num_workers)

    def submit(self, k, item):
        return self.pool.submit(_call_fn, self.fn, item)

    def result(self, future):
        return future.result()

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


def _close_kept(box):
    if box[0] is not None:
        box[0].close()
        box[0] = None


class KeptWorkers:
    """Workers kept from one epoch to the next (a dataset node's, for the node's lifetime): starting
    processes costs milliseconds an epoch of small batches notices. A pool comes back here only
    after an epoch that read every result (one broken off is closed: items still in flight would
    come out in the next epoch); the last one is closed when this object goes away."""

    def __init__(self):
        self._box = [None]
        weakref.finalize(self, _close_kept, self._box)

    def take(self):
        pool, self._box[0] = self._box[0], None
        return pool

    def keep(self, pool):
        _close_kept(self._box)
        self._box[0] = pool

    def close(self):
        _close_kept(self._box)


def ordered_map(fn, items, num_workers, prefetch=2, mode=None, what="dataset", kept=None):
    """A generator of fn(item) for item in items, in order; fn runs in num_workers workers (kept:
    a KeptWorkers to take the workers from and give them back to, for the same fn)."""
    if num_workers <= 0:
        for item in items:
            yield fn(item)
        return
    bound = max(1, num_workers * max(1, int(prefetch)))
    pool = kept.take() if kept is not None else None
    if pool is None:
        pool = (_Threads if choose_mode(fn, mode) == "thread" else _Processes)(fn, num_workers)
    pending = collections.deque()
    source = iter(items)
    finished = False
    try:
        exhausted = False
        k = 0
        while True:
            while not exhausted and len(pending) < bound:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(pool.submit(k, item))
                k += 1
            if not pending:
                finished = True
                return
            ok, value = pool.result(pending.popleft())
            if not ok:
                raise WorkerError(f"kiln.dataset: error in a data worker of {what}: {value}")
            yield value
    finally:
        if finished and kept is not None:
            kept.keep(pool)
        else:
            pool.close()
