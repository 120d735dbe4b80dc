"""One rank of a kiln.distributed.launcher job (python -m kiln.distributed._worker job.pkl): finds
the function, starts communication, runs it and writes ("ok", result) or the traceback to
result<rank>.pkl."""
import importlib
import pickle
import runpy
import sys
import traceback


def main(job_path):
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    sys.path[:] = job["path"]
    from .. import communication

    communication.init()
    rank = communication.get_rank()
    try:
        if job["script"]:
            namespace = runpy.run_path(job["script"], run_name="__mp_main__")
            func = namespace[job["name"].split(".")[0]]
        else:
            func = importlib.import_module(job["module"])
            func = getattr(func, job["name"].split(".")[0])
        for part in job["name"].split(".")[1:]:
            func = getattr(func, part)
        func = getattr(func, "func", func)  # the launcher object itself: its function
        result = (True, func(*job["args"], **job["kwargs"]))
    except BaseException:  # noqa: BLE001 (reported to the launching process)
        result = (False, traceback.format_exc())
    with open(f"{job['out']}/result{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
    if not result[0] and communication.get_group_size() > 1:
        from .. import _C

        _C.comm_abort(1)  # the other ranks may wait in a collective this one never reaches
    return 0 if result[0] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
