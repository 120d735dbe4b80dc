"""The top operators of a profile, as MegEngine's profile_analyze prints them.

    python -m kiln.tools.profile_analyze FILE [-t N] [--aggregate-by type] [--aggregate OP]
        [--order-by KEY] [--type TYPE ...] [--min-time T] [--max-time T] [--time-of host|device]
        [--plot PNG]

FILE is the JSON of a get_profile() dict (kiln.trace(fn, profiling=True) or kiln.jit(fn,
profiling=True); MegEngine's shape, see kiln.profiler.megengine_profile). An operator's time is
the mean over its runs of "kern" - "start" (host or device), matching its footprint, which is
per run; --aggregate-by type groups the
operators by type with --aggregate (sum by default: mean, max, min, median). Times are seconds.
--plot draws the per-op (or per-type) time as a bar chart with matplotlib."""
import argparse
import json
import statistics
import sys

AGGREGATES = {"sum": sum, "mean": statistics.fmean, "max": max, "min": min, "median": statistics.median}
ORDER_KEYS = ("time", "computation", "memory", "flops", "bandwidth")


class Row:
    __slots__ = ("name", "type", "count", "time", "computation", "memory", "in_shapes", "out_shapes")

    def __init__(self, name, type_, count, time, computation, memory, in_shapes=None, out_shapes=None):
        self.name, self.type, self.count, self.time = name, type_, count, time
        self.computation, self.memory = computation, memory
        self.in_shapes, self.out_shapes = in_shapes, out_shapes

    @property
    def flops(self):
        return self.computation / self.time if self.time > 0 else 0.0

    @property
    def bandwidth(self):
        return self.memory / self.time if self.time > 0 else 0.0


def load_rows(profile, time_of="device"):
    """One Row per operator of a get_profile() dict."""
    try:
        operators = profile["graph_exec"]["operator"]
        times = profile["profiler"][time_of]
        footprint = profile["profiler"].get("opr_footprint", {})
    except (KeyError, TypeError) as e:
        raise ValueError(f"profile_analyze: not a get_profile() dict (missing {e})") from None
    rows = []
    for oid, op in operators.items():
        runs = times.get(oid, {})
        if not runs:
            continue
        fp = footprint.get(oid, {})
        rows.append(Row(op["name"], op["type"], len(runs), statistics.fmean(t["kern"] - t["start"] for t in runs.values()),
                        fp.get("computation") or 0, fp.get("memory") or 0, fp.get("in_shapes"), fp.get("out_shapes")))
    return rows


def aggregate(rows, how):
    fn = AGGREGATES[how]
    groups = {}
    for r in rows:
        groups.setdefault(r.type, []).append(r)
    return [Row(t, t, len(g), fn([r.time for r in g]), fn([r.computation for r in g]), fn([r.memory for r in g]))
            for t, g in groups.items()]


def select(rows, args):
    if args.type:
        rows = [r for r in rows if r.type in args.type]
    if args.aggregate_by == "type":
        rows = aggregate(rows, args.aggregate or "sum")
    if args.min_time is not None:
        rows = [r for r in rows if r.time >= args.min_time]
    if args.max_time is not None:
        rows = [r for r in rows if r.time <= args.max_time]
    rows.sort(key=lambda r: -getattr(r, args.order_by))
    return rows[:args.top] if args.top else rows


def _si(x, unit):
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{prefix}{unit}"
    return f"{x:.2f}{unit}"


def table(rows, total_time, aggregated):
    head = ["type" if aggregated else "name", "count" if aggregated else "runs", "time", "%",
            "computation", "FLOPS", "memory", "bandwidth"] + ([] if aggregated else ["in_shapes", "out_shapes"])
    body = []
    for r in rows:
        line = [r.name, str(r.count), f"{r.time * 1e3:.3f} ms", f"{100 * r.time / total_time:.2f}%" if total_time else "-",
                _si(r.computation, "FLO"), _si(r.flops, "FLOPS"), _si(r.memory, "B"), _si(r.bandwidth, "B/s")]
        if not aggregated:
            line += [str(r.in_shapes), str(r.out_shapes)]
        body.append(line)
    widths = [max(len(h), *(len(b[k]) for b in body)) if body else len(h) for k, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(out)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("profile_analyze --plot needs matplotlib, which is not installed") from None
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    names = [r.name if len(r.name) <= 48 else r.name[:45] + "..." for r in rows][::-1]
    ax.barh(names, [r.time * 1e3 for r in rows][::-1])
    ax.set_xlabel("time (ms)")
    ax.set_title("kiln profile: time per operator")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kiln.tools.profile_analyze",
                                description="The top operators of a get_profile() JSON dump.")
    p.add_argument("file", help="JSON of a get_profile() dict")
    p.add_argument("-t", "--top", type=int, default=10, help="rows to print (0: all); default 10")
    p.add_argument("--aggregate-by", choices=("type",), help="group operators by type")
    p.add_argument("--aggregate", choices=tuple(AGGREGATES), help="how groups combine (default sum)")
    p.add_argument("--order-by", choices=ORDER_KEYS, default="time", help="sort key, largest first")
    p.add_argument("--type", action="append", help="only operators of this type (repeatable)")
    p.add_argument("--min-time", type=float, help="only rows with at least this time (seconds)")
    p.add_argument("--max-time", type=float, help="only rows with at most this time (seconds)")
    p.add_argument("--time-of", choices=("host", "device"), default="device", help="which clock's times")
    p.add_argument("--plot", metavar="FILE", help="bar chart of the rows' times (matplotlib)")
    args = p.parse_args(argv)
    if args.aggregate and not args.aggregate_by:
        p.error("--aggregate needs --aggregate-by type")
    if args.top < 0:
        p.error("--top must be >= 0")
    try:
        with open(args.file, encoding="utf-8") as f:
            profile = json.load(f)
        rows = load_rows(profile, args.time_of)
    except (OSError, ValueError) as e:
        print(f"profile_analyze: {e}", file=sys.stderr)
        return 1
    total = sum(r.time for r in rows)
    shown = select(rows, args)
    print(f"total time of {len(rows)} operators (one run): {total * 1e3:.3f} ms")
    print(table(shown, total, args.aggregate_by == "type"))
    if args.plot:
        plot(shown, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
