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
    ("prepare", "prepare_s", 9),
    ("runs", "runs", 5),
    ("time for runs", "run_s", 13),
    ("per run", "per_run_s", 9),
    ("x1000 runs", "thousand_runs_s", 10),
    ("check", "check", 0),
)
TIME_KEYS = ("prepare_s", "run_s", "per_run_s", "thousand_runs_s")


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


def cell(row, key):
    v = row.get(key)
    if key in TIME_KEYS:
        return fmt_time(v)
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


def print_workload(wl_record, file=None):
    file = file or sys.stdout
    print(f"\n## {wl_record['title']}", file=file)
    n = wl_record["runs"]
    print(f"{wl_record['shapes']}; {n} run{'' if n == 1 else 's'}", file=file)
    print(table(wl_record["rows"]), file=file)
    for note in wl_record.get("notes", ()):
        print(f"  note: {note}", file=file)
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
            (" fullgraph" if r["fullgraph"] == "true" and r["system"] == "kiln.jit" else "")
    return r["system"]


def plot(record, path):
    """A bar chart of per-run times, one panel per workload; returns a note when it can't."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - ImportError or a broken install
        return f"--plot: matplotlib is not importable ({type(e).__name__}); no plot written"
    wls = [w for w in record["workloads"] if any(r.get("per_run_s") for r in w["rows"])]
    if not wls:
        return "--plot: nothing was measured; no plot written"
    n = len(wls)
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.2 + 0.45 * sum(len(w["rows"]) for w in wls) + 0.6 * n),
                             squeeze=False)
    for ax, w in zip(axes[:, 0], wls):
        rows = [r for r in w["rows"] if r.get("per_run_s")]
        top = max(r["per_run_s"] for r in rows)
        unit, scale = next((u, k) for u, k in (("s", 1.0), ("ms", 1e3), ("us", 1e6)) if top * k >= 1 or u == "us")
        labels = [row_label(r) for r in rows]
        values = [r["per_run_s"] * scale for r in rows]
        colors = ["tab:red" if not r.get("agree", True) else ("tab:blue" if r["system"].startswith("kiln")
                                                             else "tab:gray") for r in rows]
        y = range(len(rows))
        ax.barh(y, values, color=colors)
        ax.set_yticks(list(y), labels)
        ax.invert_yaxis()
        ax.set_xlim(0, max(values) * 1.25)
        ax.set_xlabel(f"per run ({unit}); red: results disagree with kiln eager")
        ax.set_title(f"{w['title']} ({w['runs']} runs)", fontsize=10)
        for yi, r in zip(y, rows):
            ax.text(r["per_run_s"] * scale, yi, f" {fmt_time(r['per_run_s'])}", va="center", fontsize=8)
    fig.suptitle(f"kiln.bench, {record['size']} size: {record['machine']}, {record['date']}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
