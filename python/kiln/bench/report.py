"""The benchmark's outputs: the text tables, the JSON file and the plot.

By default a table fits a 100-column terminal (WIDTH): one "variant" column for how a row compiles,
the per-run median with its spread, the share of the sgemm peak and a short check, long check texts
(mismatches, SLOWER marks) repeated in full under the table. `--wide` prints the seed's columns
(COLUMNS) and every line unwrapped."""
import json
import math
import os
import platform
import sys
import textwrap

WIDTH = 100  # the default output's widest line

COLUMNS = (  # (header, row key, width): the --wide table
    ("system", "system", 15),
    ("enable jit", "enable_jit", 10),
    ("jit level", "jit_level", 9),
    ("capture mode", "capture_mode", 12),
    ("backend", "backend", 11),
    ("fullgraph", "fullgraph", 9),
    ("infer boost", "infer_boost", 11),
    ("amp", "amp", 4),
    ("prepare", "prepare_s", 9),
    ("runs", "runs", 5),
    ("time for runs", "run_s", 13),
    ("per run", "per_run_s", 9),
    ("spread (min-max)", "spread", 19),
    ("x1000 runs", "thousand_runs_s", 10),
    ("GFLOP/s", "gflops_per_s", 8),
    ("of peak", "peak_fraction", 7),
    ("check", "check", 0),
)
COMPACT_COLUMNS = (  # the default table: at most WIDTH columns (CHECK_WIDTH for the check)
    ("system", "system", 15),
    ("variant", "variant", 24),
    ("prepare", "prepare_s", 9),
    ("per run", "per_run_s", 9),
    ("spread", "spread_in_unit", 13),
    ("of peak", "percent_of_peak", 7),
    ("check", "short_check", 0),
)
CHECK_WIDTH = WIDTH - sum(w + 2 for _, _, w in COMPACT_COLUMNS[:-1])
TIME_KEYS = ("prepare_s", "run_s", "per_run_s", "thousand_runs_s")
RATE_KEYS = ("gflops_per_s", "peak_fraction")


def fmt_time(s):
    if s is None or not math.isfinite(s):
        return "-"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.2f} us"


def machine():
    """A one-line description of this machine: CPU model, cores, widest x86 vector extension."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    vec = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")) if flag in flags),
               None)
    parts = [model, f"{os.cpu_count()} cores"] + ([vec] if vec else [])
    return ", ".join(parts)


def fmt_spread(lo, hi):
    """min-max of per-run times in one unit: "12.08-12.60 ms"."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    unit, scale = next((u, k) for u, k in (("s", 1.0), ("ms", 1e3), ("us", 1e6)) if hi * k >= 1 or u == "us")
    return f"{lo * scale:.2f}-{hi * scale:.2f} {unit}"


def variant(row):
    """How a row compiles, in one cell: "trace O1 kbk infer_boost", "bytecode inductor", "-"."""
    parts = [row.get(k) for k in ("capture_mode", "jit_level", "backend")]
    if row.get("fullgraph") == "true" and row.get("system") == "kiln.jit":
        parts.append("fullgraph")
    if row.get("infer_boost") == "on":
        parts.append("infer_boost")
    parts.append(row.get("amp"))  # mixed precision: "bf16", "fp16"
    return " ".join(str(p) for p in parts if p not in (None, "-")) or "-"


def spread_in_unit(row):
    """min-max of the per-run times in the unit of the per-run median: "13.88-14.07"."""
    lo, hi, mid = row.get("per_run_min_s"), row.get("per_run_max_s"), row.get("per_run_s")
    if any(v is None or not math.isfinite(v) for v in (lo, hi, mid)):
        return "-"
    scale = next(k for k, limit in ((1.0, 1), (1e3, 1e-3), (1e6, 0)) if mid >= limit)  # as fmt_time

    def num(x):  # at most 6 characters below 100000
        return f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"
    return f"{num(lo * scale)}-{num(hi * scale)}"


def percent_of_peak(row):
    """The share of the sgemm peak as a percentage ("79.7%"; "<0.1%" below that)."""
    v = row.get("peak_fraction")
    if v is None or not math.isfinite(v):
        return "-"
    return "<0.1%" if v < 1e-3 else f"{v * 100:.3g}%" if v < 10 else f"{v * 100:.0f}%"


def short_check(row):
    """The check column of the default table: the check itself when short, else its verdict and
    a star (the full text follows the table, long_checks)."""
    full = row.get("check", "")
    if len(full) <= CHECK_WIDTH:
        return full
    head = full.split(" ")[0]
    if head == "ok" and row.get("slower_than"):
        head = "ok SLOWER"
    return f"{head} *"


def long_checks(rows):
    """The check texts the default table shortened, one line each: "label: check"."""
    return [f"{row_label(r)}: {r['check']}" for r in rows if short_check(r) != r.get("check", "")]


def cell(row, key):
    if key == "spread":
        return fmt_spread(row.get("per_run_min_s"), row.get("per_run_max_s"))
    if key == "spread_in_unit":
        return spread_in_unit(row)
    if key == "variant":
        return variant(row)
    if key == "percent_of_peak":
        return percent_of_peak(row)
    if key == "short_check":
        return short_check(row)
    v = row.get(key)
    if key in TIME_KEYS:
        return fmt_time(v)
    if key in RATE_KEYS:
        return "-" if v is None else f"{v:.3g}"
    if isinstance(v, bool):
        return str(v).lower()
    return "-" if v is None else str(v)


def table(rows, wide=False):
    """The rows as aligned text, one header line: the seed's columns with wide, else the
    compact ones (COMPACT_COLUMNS)."""
    columns = COLUMNS if wide else COMPACT_COLUMNS

    def line(values):
        return "  ".join(v.ljust(w) if w else v for v, (_, _, w) in zip(values, columns)).rstrip()

    out = [line([h for h, _, _ in columns])]
    out += [line([cell(r, k) for _, k, _ in columns]) for r in rows]
    return "\n".join(out)


def wrap(text, wide=False, indent=""):
    """text as printed lines: as it is with wide, else wrapped to WIDTH, later lines indented
    under the first's text."""
    if wide:
        return indent + text
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_long_words=False, break_on_hyphens=False)


def versus_best_peer(wl_record):
    """The best kiln.jit row against the best peer row (lowest median per-run time of each, failed
    rows left out), and the time the workload's FLOPs would take at the sgemm peak: a bound on any
    row's time, hence on how much faster than that peer any row can be. None without both rows."""
    def best(rows):
        ok = [r for r in rows if not r.get("error") and r.get("per_run_s") is not None and math.isfinite(r["per_run_s"])]
        return min(ok, key=lambda r: r["per_run_s"], default=None)
    return _versus(wl_record, [r for r in wl_record["rows"] if r.get("amp", "-") == "-"], best)


def versus_best_peer_amp(wl_record):
    """versus_best_peer among the mixed-precision rows (kiln's amp rows against the peers'
    autocast rows), None without both."""
    amp = [r for r in wl_record["rows"] if r.get("amp", "-") != "-"]
    if not amp:
        return None

    def best(rows):
        ok = [r for r in rows if not r.get("error") and r.get("per_run_s") is not None and math.isfinite(r["per_run_s"])]
        return min(ok, key=lambda r: r["per_run_s"], default=None)
    return _versus(wl_record, amp, best, bound=False)  # (the float32 sgemm peak bounds no 16-bit product)


def _versus(wl_record, rows, best, bound=True):
    kiln_row = best(r for r in rows if r["system"] == "kiln.jit")
    peer_row = best(r for r in rows if not r["system"].startswith("kiln"))
    if kiln_row is None or peer_row is None:
        return None
    out = {"kiln": row_label(kiln_row), "kiln_s": kiln_row["per_run_s"], "peer": row_label(peer_row),
           "peer_s": peer_row["per_run_s"], "peer_over_kiln": peer_row["per_run_s"] / kiln_row["per_run_s"]}
    flops, peak = wl_record.get("flops"), wl_record.get("sgemm_peak_gflops")
    if flops and peak and bound:
        out["at_peak_s"] = flops / (peak * 1e9)
        out["peer_over_at_peak"] = peer_row["per_run_s"] / out["at_peak_s"]
    return out


def versus_best_peer_text(v):
    text = (f"best kiln.jit row {v['kiln']} {fmt_time(v['kiln_s'])}, best peer {v['peer']} {fmt_time(v['peer_s'])}: "
            f"the peer takes {v['peer_over_kiln']:.2f}x kiln's time")
    if "at_peak_s" in v and v["at_peak_s"] < 0.1 * v["kiln_s"]:
        text += "; these FLOPs at the sgemm peak take under a tenth of kiln's time: memory traffic, not arithmetic, bounds it"
    elif "at_peak_s" in v:
        text += (f"; these FLOPs at the sgemm peak take {fmt_time(v['at_peak_s'])}, so no row running at or below "
                 f"that peak can be more than {v['peer_over_at_peak']:.2f}x faster than this peer")
    return text


def print_workload(wl_record, file=None, wide=False):
    """One workload's table with its header line and notes; by default every line fits WIDTH
    columns, with wide the seed's columns and unwrapped lines."""
    file = file or sys.stdout
    print(f"\n## {wl_record['title']}", file=file)
    n, r = wl_record["runs"], wl_record.get("repeat", 1)
    flops = wl_record.get("flops")
    print(wrap(f"{wl_record['shapes']}; {n} run{'' if n == 1 else 's'}, timed {r} time{'' if r == 1 else 's'}; "
               + (f"{flops / 1e9:.4g} GFLOP per call; " if flops else "")
               + (f"peak {wl_record['sgemm_peak_gflops']:.1f} GFLOP/s; " if wl_record.get("sgemm_peak_gflops") else "")
               + f"load average {wl_record.get('load_before')} before, {wl_record.get('load_after')} after", wide),
          file=file)
    print(table(wl_record["rows"], wide), file=file)
    if not wide:
        for text in long_checks(wl_record["rows"]):
            print(wrap(f"* {text}", wide, "  "), file=file)
    for note in wl_record.get("notes", ()):
        print(wrap(f"note: {note}", wide, "  "), file=file)
    if wl_record.get("versus_best_peer"):
        print(wrap(f"versus peers: {versus_best_peer_text(wl_record['versus_best_peer'])}", wide, "  "), file=file)
    if wl_record.get("versus_best_peer_amp"):
        print(wrap(f"versus peers, mixed precision: {versus_best_peer_text(wl_record['versus_best_peer_amp'])}", wide,
                   "  "), file=file)
    file.flush()


def _clean(obj):
    """JSON without NaN/Infinity: non-finite numbers become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(record, path):
    with open(path, "w") as f:
        json.dump(_clean(record), f, indent=2)
        f.write("\n")


def row_label(r):
    amp = f" {r['amp']}" if r.get("amp", "-") != "-" else ""  # mixed precision
    if r["system"] == "kiln.jit" or r["system"] == "mindspore.jit":
        return f"{r['system']} {r['capture_mode']} {r['jit_level']} {r['backend']}" + \
            (" fullgraph" if r["fullgraph"] == "true" and r["system"] == "kiln.jit" else "") + \
            (" infer_boost" if r.get("infer_boost") == "on" else "") + amp
    return r["system"] + amp


SYSTEMS = ("kiln", "kiln.jit", "torch", "torch.jit.trace", "torch.compile", "jax.jit", "mindspore", "mindspore.jit")
COLOURS = ("#7f7f7f", "#d62728", "#1f77b4", "#17becf", "#9467bd", "#2ca02c", "#ff7f0e", "#8c564b", "#e377c2",
           "#bcbd22")  # one per system, in SYSTEMS order (grey for kiln eager, red for kiln.jit)


def plot_panels(record):
    """What --plot draws: one panel per workload with a measured row, one bar per system (that
    system's best row: lowest median per run), each bar's time relative to the best peer's (kiln
    eager's when no peer ran). [{title, reference, bars: [{system, label, row, ratio, lo, hi,
    colour}]}], colours fixed per system across panels."""
    panels = []
    systems = list(SYSTEMS) + sorted({_system(r) for w in record["workloads"] for r in w["rows"]} - set(SYSTEMS))
    for w in record["workloads"]:
        best = {}
        for r in w["rows"]:
            if _measured(r) and (_system(r) not in best or r["per_run_s"] < best[_system(r)]["per_run_s"]):
                best[_system(r)] = r
        if not best:
            continue
        peers = [r for s, r in best.items() if not s.startswith("kiln") and r.get("amp", "-") == "-"]  # float32
        ref = min(peers, key=lambda r: r["per_run_s"]) if peers else best.get("kiln") or min(
            best.values(), key=lambda r: r["per_run_s"])
        reference = f"best peer ({row_label(ref)})" if peers else f"{row_label(ref)} (no peer ran)"
        bars = []
        for s in sorted(best, key=systems.index):
            r = best[s]
            lo, hi = r.get("per_run_min_s") or r["per_run_s"], r.get("per_run_max_s") or r["per_run_s"]
            bars.append({"system": s, "label": row_label(r), "row": r, "ratio": r["per_run_s"] / ref["per_run_s"],
                         "lo": lo / ref["per_run_s"], "hi": hi / ref["per_run_s"],
                         "colour": COLOURS[systems.index(s) % len(COLOURS)]})
        panels.append({"title": w["title"], "reference": reference, "bars": bars})
    return panels


def plot(record, path):
    """One panel per workload: a horizontal bar per system, its best row's median per-run time
    relative to the best peer's (log scale, 1 = the best peer, the spread as an error bar), each
    system in its own colour. Needs matplotlib (ImportError otherwise); returns a note when nothing
    was measured, else None."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = plot_panels(record)
    if not panels:
        return "--plot: nothing was measured; no plot written"
    heights = [0.6 + 0.32 * len(p["bars"]) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10.0, 1.2 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, panel in zip(axes[:, 0], panels):
        bars = panel["bars"]
        ys = range(len(bars))[::-1]  # the first system at the top
        ratios = [b["ratio"] for b in bars]
        err = [[b["ratio"] - b["lo"] for b in bars], [b["hi"] - b["ratio"] for b in bars]]
        drawn = ax.barh(list(ys), ratios, 0.7, xerr=err, color=[b["colour"] for b in bars], capsize=2,
                        error_kw={"elinewidth": 0.7})
        for bar, b in zip(drawn, bars):
            r = b["row"]
            bar.set_hatch("//" if not r.get("agree", True) else ".." if r.get("slower_than") else "")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}x"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.tick_params(axis="x", labelsize=8)
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks(list(ys), [b["label"] for b in bars], fontsize=8)
        for y, b in zip(ys, bars):
            ax.annotate(f" {b['ratio']:.2f}x  ({fmt_time(b['row']['per_run_s'])})", (max(b["ratio"], b["hi"]), y),
                        va="center", fontsize=7)
        lo = min(min(b["lo"] for b in bars), 1.0)
        hi = max(max(b["hi"] for b in bars), 1.0)
        ax.set_xlim(lo / 1.5, hi * 4.0)  # room for the labels right of the bars
        ax.set_title(f"{panel['title']}: time relative to the {panel['reference']}", fontsize=9, loc="left")
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.set_axisbelow(True)
    axes[-1, 0].set_xlabel("median per-run time / the reference's (log scale; left of the dashed line is faster); "
                           "error bar = min-max", fontsize=8)
    fig.suptitle(f"kiln.bench, {record['size']} size, {record.get('repeat', 1)} repetitions: {record['machine']}, "
                 f"{record['date']}; the best row of each system\nhatched //: results disagree with kiln eager; "
                 "hatched ..: SLOWER than a row it should beat", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # room for the two-line title
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _system(r):
    """The plot's system of a row: its system, with its mixed precision ("kiln.jit bf16")."""
    return r["system"] + (f" {r['amp']}" if r.get("amp", "-") != "-" else "")


def _measured(r):
    v = r.get("per_run_s")
    return v is not None and math.isfinite(v) and v > 0
