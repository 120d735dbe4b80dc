"""Timing and report helpers shared by the benchmark scripts in this folder."""
import time


def best_time(fn, repeat, number=1, clock=time.perf_counter):
    """Best time of `number` calls over `repeat` rounds, in seconds per call: wall time, or another
    clock (time.thread_time: the CPU time of this thread, which a busy machine does not inflate)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        for _ in range(number):
            fn()
        best = min(best, (clock() - t0) / number)
    return best


def alternate(fa, fb, rounds, number, clock=time.perf_counter):
    """Best per-call times of fa and fb over short alternating rounds: a busy moment on a shared
    machine hits both alike."""
    ta = tb = float("inf")
    for _ in range(rounds):
        ta = min(ta, best_time(fa, 1, number, clock))
        tb = min(tb, best_time(fb, 1, number, clock))
    return ta, tb


def row(name, value, unit, ref_name, ref_value, ratio, target, better="lower"):
    """Prints one figure against its reference and target; returns whether the target is met."""
    ok = ratio <= target if better == "lower" else ratio >= target
    print(f"{name:<46} {value:10.3f} {unit:<8} {ref_name:<28} {ref_value:10.3f}  ratio {ratio:6.3f} "
          f"(target {'<=' if better == 'lower' else '>='} {target}) {'ok' if ok else 'MISSED'}")
    return ok
