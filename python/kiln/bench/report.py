"""The benchmark's outputs: the text tables (the seed's columns), the JSON file and the plot."""
import json
import math
import os
import platform
import sys

COLUMNS = (  # (header, row key, width)
    ("system", "system", 15),
    ("enable jit", "enable_jit", 10),
    ("jit level", "jit_level", 9),
    ("capture mode", "capture_mode", 12),
    ("backend", "backend", 11),
    ("fullgraph", "fullgraph", 9),
    ("infer boost", "infer_boost", 11),
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


def cell(row, key):
    if key == "spread":
        return fmt_spread(row.get("per_run_min_s"), row.get("per_run_max_s"))
    v = row.get(key)
    if key in TIME_KEYS:
        return fmt_time(v)
    if key in RATE_KEYS:
        return "-" if v is None else f"{v:.3g}"
    if isinstance(v, bool):
        return str(v).lower()
    return "-" if v is None else str(v)


def table(rows):
    """The rows as aligned text, one header line."""
    def line(values):
        return "  ".join(v.ljust(w) if w else v for v, (_, _, w) in zip(values, COLUMNS)).rstrip()

    out = [line([h for h, _, _ in COLUMNS])]
    out += [line([cell(r, k) for _, k, _ in COLUMNS]) for r in rows]
    return "\n".join(out)


def versus_best_peer(wl_record):
    """The best kiln.jit row against the best peer row (lowest median per-run time of each, failed
    rows left out), and the time the workload's FLOPs would take at the sgemm peak: a bound on any
    row's time, hence on how much faster than that peer any row can be. None without both rows."""
    def best(rows):
        ok = [r for r in rows if not r.get("error") and r.get("per_run_s") is not None and math.isfinite(r["per_run_s"])]
        return min(ok, key=lambda r: r["per_run_s"], default=None)
    rows = wl_record["rows"]
    kiln_row = best(r for r in rows if r["system"] == "kiln.jit")
    peer_row = best(r for r in rows if not r["system"].startswith("kiln"))
    if kiln_row is None or peer_row is None:
        return None
    out = {"kiln": row_label(kiln_row), "kiln_s": kiln_row["per_run_s"], "peer": row_label(peer_row),
           "peer_s": peer_row["per_run_s"], "peer_over_kiln": peer_row["per_run_s"] / kiln_row["per_run_s"]}
    flops, peak = wl_record.get("flops"), wl_record.get("sgemm_peak_gflops")
    if flops and peak:
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


def print_workload(wl_record, file=None):
    file = file or sys.stdout
    print(f"\n## {wl_record['title']}", file=file)
    n, r = wl_record["runs"], wl_record.get("repeat", 1)
    flops = wl_record.get("flops")
    print(f"{wl_record['shapes']}; {n} run{'' if n == 1 else 's'}, timed {r} time{'' if r == 1 else 's'}; "
          + (f"{flops / 1e9:.4g} GFLOP per call; " if flops else "")
          + (f"peak {wl_record['sgemm_peak_gflops']:.1f} GFLOP/s; " if wl_record.get("sgemm_peak_gflops") else "")
          + f"load average {wl_record.get('load_before')} before, {wl_record.get('load_after')} after", file=file)
    print(table(wl_record["rows"]), file=file)
    for note in wl_record.get("notes", ()):
        print(f"  note: {note}", file=file)
    if wl_record.get("versus_best_peer"):
        print(f"  versus peers: {versus_best_peer_text(wl_record['versus_best_peer'])}", file=file)
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
    if r["system"] == "kiln.jit" or r["system"] == "mindspore.jit":
        return f"{r['system']} {r['capture_mode']} {r['jit_level']} {r['backend']}" + \
            (" fullgraph" if r["fullgraph"] == "true" and r["system"] == "kiln.jit" else "") + \
            (" infer_boost" if r.get("infer_boost") == "on" else "")
    return r["system"]


def plot(record, path):
    """Grouped bars: one group per workload, one bar per kiln variant and peer (the same colour in
    every group), the median per-run time on a log scale with the spread as an error bar. Needs
    matplotlib (ImportError otherwise); returns a note when nothing was measured, else None."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = [w for w in record["workloads"] if any(_measured(r) for r in w["rows"])]
    if not wls:
        return "--plot: nothing was measured; no plot written"
    measured = {row_label(r) for w in wls for r in w["rows"] if _measured(r)}
    labels = [label for label in dict.fromkeys(row_label(r) for w in wls for r in w["rows"]) if label in measured]
    cmap = plt.get_cmap("tab20")
    colors = {label: cmap(i % 20) for i, label in enumerate(labels)}
    width = 0.84 / len(labels)
    fig, ax = plt.subplots(figsize=(min(15.0, max(8.0, 3.0 + 0.12 * len(labels) * len(wls))), 5.5))
    for i, label in enumerate(labels):
        xs, ys, lo, hi, hatches = [], [], [], [], []
        for g, w in enumerate(wls):
            r = next((r for r in w["rows"] if row_label(r) == label and _measured(r)), None)
            if r is None:
                continue
            xs.append(g - 0.42 + width * (i + 0.5))
            ys.append(r["per_run_s"])
            lo.append(r["per_run_s"] - (r.get("per_run_min_s") or r["per_run_s"]))
            hi.append((r.get("per_run_max_s") or r["per_run_s"]) - r["per_run_s"])
            hatches.append("//" if not r.get("agree", True) else ".." if r.get("slower_than") else "")
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], color=colors[label], label=label, capsize=1.5,
                      error_kw={"elinewidth": 0.7})
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
    ax.set_yscale("log")
    ax.set_xticks(range(len(wls)), [_short_title(w["title"]) for w in wls], fontsize=8)
    ax.set_ylabel("per run (s, log scale): median, bar = min-max")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"kiln.bench, {record['size']} size, {record.get('repeat', 1)} repetitions: {record['machine']}, "
                 f"{record['date']}, load average {record.get('load_average_before')} before, "
                 f"{record.get('load_average_after')} after\nhatched //: results disagree with kiln eager; hatched ..: SLOWER than a row "
                 "it should beat", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def _short_title(title):
    """ "conv: ResNet BasicBlock, forward + backward" -> "conv\nforward + backward"."""
    group, _, rest = title.partition(": ")
    return f"{group}\n{rest.rpartition(', ')[2]}" if rest else title.replace(" f(", "\nf(", 1)


def _measured(r):
    v = r.get("per_run_s")
    return v is not None and math.isfinite(v) and v > 0
