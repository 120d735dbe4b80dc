"""Worker processes for the data pipeline: the per-sample work (a source's __getitem__, map
operations, collation) runs in a pool forked from the main process, which therefore needs to
pickle only indices and the results (NumPy arrays), never the dataset or the functions. Results
come back in submission order, at most `window` tasks ahead of the consumer (the prefetch queue),
and the pool is terminated when iteration ends, breaks or raises. Where fork is not available the
work runs in threads."""
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

_jobs = {}  # job id -> the function the workers call (inherited through fork)
_next_id = [0]
_lock = threading.Lock()


def _run(job, arg):
    return _jobs[job](arg)


def ordered_map(fn, args, workers, window):
    """fn over args in `workers` processes (threads where fork is missing), yielding results in
    order with at most `window` outstanding."""
    with _lock:
        job = _next_id[0]
        _next_id[0] += 1
        _jobs[job] = fn
    try:
        if "fork" in multiprocessing.get_all_start_methods():
            pool = multiprocessing.get_context("fork").Pool(workers)
            submit = lambda a: pool.apply_async(_run, (job, a))  # noqa: E731
            result = lambda f: f.get()  # noqa: E731
            close = pool.terminate
        else:
            pool = ThreadPoolExecutor(workers)
            submit = lambda a: pool.submit(fn, a)  # noqa: E731
            result = lambda f: f.result()  # noqa: E731
            close = lambda: pool.shutdown(wait=False, cancel_futures=True)  # noqa: E731
        try:
            pending = []
            it = iter(args)
            for a in it:
                pending.append(submit(a))
                if len(pending) >= window:
                    break
            while pending:
                done = pending.pop(0)
                for a in it:
                    pending.append(submit(a))
                    break
                yield result(done)
        finally:
            close()
    finally:
        with _lock:
            _jobs.pop(job, None)
