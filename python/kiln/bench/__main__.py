"""python -m kiln.bench (or kiln-bench): the tables of the just-in-time compilation tutorial (seed
003) on this machine, for kiln eager and every kiln.jit variant, next to PyTorch, JAX and
MindSpore when they are installed.

Columns: enable jit, jit level, capture mode, backend, fullgraph (the seed's), then "prepare"
(building the callable and its first call: tracing and compiling for a jit), "runs" further calls
on inputs x * (i / runs), their total time, the time per run and per run x 1000 (the seed's "time
to run a thousand times"), "GFLOP/s" (the workload's FLOPs per call, counted by kiln.profiler on
kiln eager's kernels, over the per-run time) and "of peak" (that over the best sgemm's GFLOP/s on
2048x2048 matrices, measured in the same run: OpenBLAS with either core type, or oneDNN). "check": the first and last results,
and for forward+backward the gradients too, against kiln eager's; any mismatch makes the command
exit with status 1.

By default every line fits a 100-column terminal: the tables show one "variant" column (capture
mode, jit level, backend, fullgraph, infer_boost), prepare, per run, its spread, of peak and check;
--wide prints all the columns above.
"""
import argparse
import datetime
import os
import sys

import kiln

from . import models_table, report, sgemm, slower
from .peers import PEER_NAMES, Peers
from .workloads import (AMP, AMP_DTYPES, AMP_JIT_VARIANTS, AMP_LEVEL, ATOL, FLOAT32, GRAD_RTOL, JIT_VARIANTS, RTOL,
                        RULES, SAME_AS_LISTED, SIZES, compare, jit_variant_status, kiln_amp_variants, kiln_variants,
                        make_workloads, measure, measure_interleaved, workload_flops)


class Progress:
    """One line on stderr, rewritten in place; only when stderr is a terminal."""

    def __init__(self, total):
        self.enabled = sys.stderr.isatty()
        self.total, self.done = total, 0

    def show(self, text):
        if self.enabled:
            sys.stderr.write(f"\r\033[K[{self.done + 1}/{self.total}] {text}")
            sys.stderr.flush()

    def step(self):
        self.done += 1

    def clear(self):
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def parse_peers(text):
    """--peers: comma-separated row names (PEER_NAMES), "jax" for jax.jit, "all" or "none"."""
    aliases = {"all": PEER_NAMES, "none": (), "jax": ("jax.jit",)}
    out = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        if item not in PEER_NAMES and item not in aliases:
            raise argparse.ArgumentTypeError(
                f"unknown peer {item!r}; choose from all, none, {', '.join(PEER_NAMES)}, jax")
        out += aliases.get(item, (item,))
    return tuple(dict.fromkeys(out))


def _positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def build_parser():
    script = os.path.basename(sys.argv[0] or "")
    p = argparse.ArgumentParser(prog="kiln-bench" if script.startswith("kiln-bench") else "python -m kiln.bench",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="the seed's exact shapes and run counts")
    size.add_argument("--smallest", action="store_true", help="tiny shapes and a few runs (smoke test)")
    p.add_argument("--only", choices=("simple", "conv", "attention"), help="one workload group only")
    p.add_argument("--runs", type=_positive, help="runs of the BasicBlock and attention workloads (overrides the size's)")
    p.add_argument("--repeat", type=_positive, default=3, metavar="N",
                   help="time the runs N times (default 3); the table shows the median and the spread (min-max), "
                        "and marks SLOWER a row slower than the variant it should beat by more than the spread")
    p.add_argument("--peers", type=parse_peers, default=PEER_NAMES, metavar="LIST",
                   help="comma-separated peers to run: all (default), none, or any of "
                        f"{', '.join(PEER_NAMES)}, jax")
    p.add_argument("--amp", choices=tuple(AMP_DTYPES) + ("none",), default="bfloat16",
                   help="the mixed-precision rows of the BasicBlock and attention workloads (issue 31): kiln eager and "
                        f"kiln.jit under kiln.amp.auto_mixed_precision(model, '{AMP_LEVEL}', dtype), torch and "
                        "torch.compile under torch.autocast('cpu', dtype); default bfloat16, none for no amp rows")
    p.add_argument("--wide", action="store_true",
                   help="every column of the tutorial's tables (enable jit, runs, time for runs, x1000 runs, "
                        "GFLOP/s, ...) and unwrapped lines; by default the output fits 100 columns")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE as JSON")
    p.add_argument("--models", action="store_true",
                   help="after the tables, the model zoo's (examples/: LeNet5, ResNet-18, a GPT, a Llama decoder) "
                        "training steps against torch eager and torch.compile (bench/bench_zoo.py)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="one panel per workload: the best row of each system, time relative to the best peer "
                        "(needs matplotlib)")
    return p


def _row(variant, res, check, agree, err, where, info):
    return {
        "system": variant.system, "enable_jit": variant.enable_jit, "jit_level": variant.jit_level,
        "capture_mode": variant.capture_mode, "backend": variant.backend, "fullgraph": variant.fullgraph,
        "infer_boost": variant.infer_boost, "amp": variant.amp,
        "prepare_s": res.prepare_s, "runs": res.runs, "repeat": len(res.rep_s), "run_s_each": res.rep_s,
        "run_s": res.run_s, "per_run_s": res.per_run_s, "per_run_min_s": res.per_run_min_s,
        "per_run_max_s": res.per_run_max_s, "first_run_s": res.first_run_s,
        "thousand_runs_s": res.per_run_s * 1000, "check": check, "agree": agree, "max_error": err,
        "worst_output": where, "error": res.error, "traceback": res.traceback, "info": info,
    }


def run_workload(wl, variants, progress, repeat=1, peak_gflops=None):
    """Measures every variant of one workload, the runs `repeat` times; returns its record (rows,
    notes, load average before and after, FLOPs per call) and the count of failures (mismatches,
    and kiln variants that raised). Each row gets its GFLOP/s and their fraction of peak_gflops."""
    record = {"key": wl.key, "group": wl.group, "title": wl.title, "shapes": wl.shapes, "runs": wl.runs,
              "repeat": repeat, "outputs": wl.output_names, "rows": [], "notes": [], "load_before": _load()}
    failures = _measure_rows(wl, variants, progress, repeat, record)
    record["load_after"] = _load()
    record["flops"] = workload_flops(wl)  # after the rows: the eager row's prepare keeps its first-use costs
    for row in record["rows"]:
        row["gflops_per_s"], row["peak_fraction"] = _rate(record["flops"], row["per_run_s"], peak_gflops)
    variant_of = {id(row): v for row, v in zip(record["rows"], variants)}  # one row per variant, in order

    def remeasure(row, base):
        """The two rows timed again in turns (the table timed them minutes apart)."""
        progress.show(f"{wl.title}: {report.row_label(row)} and {report.row_label(base)} timed again in turns")
        again = measure_interleaved([variant_of[id(row)], variant_of[id(base)]], wl.args0, wl.run_args, repeat)
        return [[s / r.runs for s in r.rep_s] for r in again]

    record["slower"] = slower.mark(record["rows"], remeasure)
    for row in record["rows"]:
        for s in row["not_slower_interleaved"]:
            record["notes"].append(
                f"{report.row_label(row)}: {s['ratio']:.2f}x {s['than']}'s time in the table, {s['interleaved_ratio']:.2f}x "
                f"when the two were timed again in turns ({repeat} repetitions each): not slower by more than the "
                "spread, so not marked")
    return record, failures


def _measure_rows(wl, variants, progress, repeat, record):
    """Fills record's rows and notes; returns the count of failures."""
    np_inputs = wl.numpy_args() if any(v.convert for v in variants) else None
    ref = amp_ref = None  # kiln eager's results, and kiln eager amp's
    failures = 0
    for v in variants:
        progress.show(f"{wl.title}: {report.row_label(vars(v))}")
        if v.convert:
            args0, run_args = v.convert(np_inputs[0]), [v.convert(a) for a in np_inputs[1]]
        else:
            args0, run_args = wl.args0, wl.run_args
        res = measure(v, args0, run_args, repeat)
        del args0, run_args
        progress.step()
        info = v.info() if v.info else None
        is_kiln = v.system.startswith("kiln")
        if ref is None:  # kiln eager comes first: the reference
            ref = res
            if res.error:
                record["rows"].append(_row(v, res, "FAILED", False, None, "", info))
                record["notes"].append(f"kiln eager failed: {res.error}")
                return failures + 1
            record["rows"].append(_row(v, res, "reference", True, 0.0, "", info))
            continue
        if res.error:
            record["rows"].append(_row(v, res, "FAILED" if is_kiln else "failed", False, None, "", info))
            record["notes"].append(f"{report.row_label(vars(v))} failed: {res.error}")
            failures += is_kiln
            continue
        grads_from = 1 if wl.backward else None
        # amp rows: kiln.jit's against kiln eager amp (the same computation, float32's tolerance); kiln
        # eager amp and the peers' autocast rows against kiln eager float32 within the low precision's
        base, tol = ref, FLOAT32
        if v.amp != "-":
            base, tol = (amp_ref, FLOAT32) if v.system == "kiln.jit" else (ref, AMP[v.amp])
            if v.system == "kiln":
                amp_ref = res
        if base is None:  # kiln eager amp failed: nothing to check against
            record["rows"].append(_row(v, res, "FAILED (no kiln eager amp result)", False, None, "", info))
            failures += is_kiln
            continue
        ok1, e1, w1 = compare(res.first, base.first, wl.output_names, grads_from, tol)
        ok2, e2, w2 = compare(res.last, base.last, wl.output_names, grads_from, tol)
        agree = ok1 and ok2
        err, where = (e1, w1) if e1 >= e2 else (e2, w2)
        check = "ok" if agree else f"MISMATCH {err:.3g}x tol ({where})"
        if info and info.get("eager_calls"):
            check += f" (ran eagerly {info['eager_calls']}x)"
        record["rows"].append(_row(v, res, check, agree, err, where, info))
        failures += not agree
        slow = _slow_first_run(v, res)
        if slow:
            record["notes"].append(slow)
    return failures


def _slow_first_run(v, res):
    """A note when the first timed run took much longer than the others (work deferred past the
    first call, which "prepare" then does not show), else None."""
    if res.runs < 3:
        return None
    rest = (res.rep_s[0] - res.first_run_s) / (res.runs - 1)  # of the first repetition
    if not (res.first_run_s > 5 * rest and res.first_run_s > 1e-3):
        return None
    why = (" (kiln.jit at O1 and above builds its fused C kernels at the first compiled run)"
           if v.system == "kiln.jit" and v.jit_level != "O0" else "")
    return (f"{report.row_label(vars(v))}: the first run took {report.fmt_time(res.first_run_s)}, the others "
            f"{report.fmt_time(rest)} each{why}")


def _rate(flops, per_run_s, peak_gflops):
    """(GFLOP/s, fraction of peak_gflops) of flops done in per_run_s; None where unknown."""
    if not flops or per_run_s is None or not per_run_s > 0:  # (NaN: a failed row)
        return None, None
    g = flops / per_run_s / 1e9
    return g, (g / peak_gflops if peak_gflops else None)


def _load():
    """The 1-minute load average (other work on the machine skews every figure), or None."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


PEERS_HINT = ("python3 -m venv --system-site-packages ~/kiln-peers && ~/kiln-peers/bin/pip install torch 'jax[cpu]' "
              "mindspore, then run this command in that venv (. ~/kiln-peers/bin/activate)")


def _require_matplotlib(parser):
    try:
        import matplotlib  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError or a broken install
        parser.error(f"--plot needs matplotlib, which is not importable here ({type(e).__name__}: {e}): "
                     "pip install matplotlib (bash ./scripts/bench.sh installs it)")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot:  # before the long run, not after it
        _require_matplotlib(parser)
    size = SIZES["full" if args.full else "smallest" if args.smallest else "default"]
    now = datetime.datetime.now(datetime.timezone.utc)

    statuses = [(v, jit_variant_status(v)) for v in JIT_VARIANTS]
    implemented = [v for v, why in statuses if why is None]
    peers = Peers(args.peers)
    workloads = make_workloads(size, args.only, args.runs)
    amp_jit = [v for v in AMP_JIT_VARIANTS if v in implemented]
    plan = [(wl, kiln_variants(wl, implemented) + peers.variants(wl)
             + ([] if args.amp == "none" else kiln_amp_variants(wl, amp_jit, args.amp) + peers.amp_variants(wl, args.amp)))
            for wl in workloads]

    versions = f"kiln {kiln.__version__} ({kiln.get_num_threads()} threads)"
    torch = peers.modules.get("torch")
    for family, version in peers.versions.items():
        versions += f", {family} {version}" + (f" ({torch.get_num_threads()} threads)" if family == "torch" else "")
    record = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"), "machine": report.machine(), "versions": versions,
        "load_average_before": _load(),
        "size": size.name, "size_note": size.note, "argv": list(sys.argv[1:] if argv is None else argv),
        "tolerance": {"rtol": RTOL, "atol": ATOL, "grad_rtol": GRAD_RTOL, "rules": RULES},
        "amp": None if args.amp == "none" else {
            "dtype": args.amp, "short": AMP_DTYPES[args.amp], "level": AMP_LEVEL,
            "kiln_jit_variants": [v.label() for v in amp_jit],
            "tolerance_vs_float32": {"value_of_max": AMP[AMP_DTYPES[args.amp]].atol,
                                     "grad_rtol": AMP[AMP_DTYPES[args.amp]].grad_rtol}},
        "jit_variants": [dict(vars(v), implemented=why is None, note=why) for v, why in statuses],
        "notes": [], "workloads": [],
    }
    def say(text, indent=""):
        print(report.wrap(text, args.wide, indent))

    print("kiln.bench: the just-in-time compilation tutorial's tables (seed 003) on this machine")
    say(f"{record['machine']}; {versions}; {record['date']}; load average {record['load_average_before']}")
    say(f"size: {size.name}, {size.note}")
    say("prepare = building the callable and its first call; then `runs` calls on inputs x * (i / runs), "
        f"timed {args.repeat} time{'s' if args.repeat > 1 else ''}: time for runs and per run are the median, "
        "spread the min-max of per run over the repetitions; x1000 runs = per run x 1000")
    if not args.wide:
        say("columns: variant = capture mode, jit level, backend (kbk: kernel by kernel), fullgraph, infer_boost; "
            "spread in per run's unit; * = the check in full under the table; --wide: every column of the "
            "tutorial's tables (enable jit, runs, time for runs, x1000 runs, GFLOP/s)")
    say("SLOWER: a kiln.jit row whose median is slower than the row it should beat (kiln eager; the same row at "
        "the jit level below, kbk instead of sink, fullgraph=false, infer_boost off) by more than either row's "
        "spread, in the table and again when the two rows are timed in turns"
        + ("" if args.repeat > 1 else " (needs --repeat 2 or more: no row is marked)"))
    say(f"check: first and last results against kiln eager's: values {RULES['value']}, rtol {RTOL:g}, "
        f"atol {ATOL:g}; gradients {RULES['gradient']}, grad_rtol {GRAD_RTOL:g}")
    if args.wide:
        say("kiln.jit variants run: " + ("; ".join(v.label() for v in implemented) or "none"))
    else:  # as the table's variant column names them
        say("kiln.jit variants run: " + (", ".join(report.variant(dict(vars(v), system="kiln.jit",
                                                                      fullgraph=str(v.fullgraph).lower()))
                                                   for v in implemented) or "none"))
    notes = [f"kiln.jit {v.label()}: {why}" for v, why in statuses if why is not None]
    notes += [f"kiln.jit {n}" for n in SAME_AS_LISTED] + peers.notes
    missing = peers.missing()
    if missing:
        notes.append(f"to add {', '.join(missing)}: {PEERS_HINT}")
    if args.amp != "none":
        t = AMP[AMP_DTYPES[args.amp]]
        notes.append(f"rows ending {AMP_DTYPES[args.amp]} (BasicBlock and attention): mixed precision, kiln eager and "
                     f"kiln.jit ({', '.join(report.variant(dict(vars(v), system='kiln.jit')) for v in amp_jit)}) under "
                     f"kiln.amp.auto_mixed_precision(model, '{AMP_LEVEL}', {args.amp}), torch under "
                     f"torch.autocast('cpu', {args.amp}); kiln.jit's checked against kiln eager amp's results as above, "
                     f"the others against kiln eager float32's: values within {t.atol:g} x max|ref|, gradients "
                     f"grad_rtol {t.grad_rtol:g} (--amp none: no such rows)")
    notes.append("--full for the tutorial's shapes (many minutes)")
    if "torch.compile" in args.peers and torch is not None:
        notes.append("torch.compile: backend inductor; its prepare includes compiling the forward "
                     "(and the backward) to C++")
    record["notes"] = notes
    for n in notes:
        say(f"note: {n}", "  ")
    sys.stdout.flush()

    n = size.sgemm_n
    first, label, cands = sgemm.best_peak(n)
    peaks = [first]  # measured again before each later workload; the best so far is the peak
    record["sgemm_peak"] = {"n": n, "threads": kiln.get_num_threads(), "measured": peaks, "gflops_per_s": peaks[0],
                            "source": label, "candidates": cands}
    say(f"peak: the best sgemm here, {label}, {n}x{n}x{n} float32 on {kiln.get_num_threads()} threads, best of 5: "
        f"{peaks[0]:.1f} GFLOP/s (" + ", ".join(f"{k} {v:.1f}" for k, v in cands.items())
        + "); measured again before each later workload, each table using the best so far (other work on the "
        "machine can cut one measurement far short); GFLOP/s = the workload's FLOPs per call (kiln eager's "
        "kernels under kiln.profiler, the backward's included) / per run; of peak = GFLOP/s / peak")
    bf16 = sgemm.bf16_peak(n)
    record["bf16_gemm_peak"] = {"n": n, "threads": kiln.get_num_threads(), "gflops_per_s": bf16}
    say(f"bf16 GEMM peak: oneDNN's bfloat16 matmul, {n}x{n}x{n} on {kiln.get_num_threads()} threads, best of 5: "
        + (f"{bf16:.1f} GFLOP/s ({bf16 / peaks[0]:.2f} of the sgemm peak)" if bf16 and peaks[0]
           else "none (no bfloat16 arithmetic in oneDNN's instruction set here)"))
    sys.stdout.flush()
    progress = Progress(sum(len(vs) for _, vs in plan))
    failures = 0
    try:
        for wl, variants in plan:
            if record["workloads"]:
                again, again_label, _ = sgemm.best_peak(n)
                peaks.append(again)
                if again >= max(peaks):
                    record["sgemm_peak"]["source"] = again_label
            peak = max((p for p in peaks if p), default=None)
            record["sgemm_peak"]["gflops_per_s"] = peak
            wl_record, f = run_workload(wl, variants, progress, args.repeat, peak)
            wl_record["sgemm_peak_gflops"] = peak
            wl_record["versus_best_peer"] = report.versus_best_peer(wl_record)
            wl_record["versus_best_peer_amp"] = report.versus_best_peer_amp(wl_record)
            failures += f
            record["workloads"].append(wl_record)
            progress.clear()
            report.print_workload(wl_record, wide=args.wide)
            wl.args0 = wl.run_args = None  # free the inputs of finished workloads
    finally:
        progress.clear()

    record["load_average_after"] = _load()
    record["failures"] = failures
    record["ok"] = failures == 0
    record["repeat"] = args.repeat
    record["slower"] = sum(w["slower"] for w in record["workloads"])
    if args.json:
        report.write_json(record, args.json)
    if args.plot:
        why = report.plot(record, args.plot)
        print(f"\n{why}" if why else f"\nplot written to {args.plot}")
    print()
    say(f"{'all results agree with kiln eager' if failures == 0 else f'{failures} FAILED (see check column)'}; "
        + (f"{record['slower']} kiln.jit row{'s' if record['slower'] != 1 else ''} SLOWER than a row "
           "they should beat (see check column)" if record["slower"] else "no row SLOWER than a row it should beat")
        + f"; load average {record['load_average_before']} before, {record['load_average_after']} after")
    zoo = models_table.run(quick=not args.full) if args.models else 0
    return 0 if failures == 0 and zoo == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
