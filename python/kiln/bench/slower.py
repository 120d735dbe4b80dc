"""Rows slower than the variant they should beat: kiln.bench's SLOWER marks (issue 17 part 4).

Every kiln.jit row should beat kiln eager, and each setting meant to make things faster should
beat the same row without it: a higher jit level the level below (O1 vs O0, O2 vs O1), the sink
backend kernel by kernel, fullgraph=True fullgraph=False, infer_boost "on" "off" — the rows that
differ from it in that one setting only. A row is SLOWER than one of these when its median per-run
time exceeds that row's by more than the spread (max - min of the per-run times of the
repetitions) of either row: a difference the noise between repetitions does not explain. Without
repetitions (repeat 1) there is no spread and no row is marked.

The table times one row after another, so a change in the machine's load between two rows looks
like a difference between them. Given a way to measure two rows again (`remeasure`), a row found
slower is timed again together with the row it should beat, their repetitions in turns; the mark
stays only when that measurement finds it slower too, and both ratios are shown."""

import numpy as np

# (row field, {value: the value it should beat}): a setting that should make things faster
SETTINGS = (
    ("jit_level", {"O1": "O0", "O2": "O1"}),
    ("backend", {"sink": "kbk"}),
    ("fullgraph", {"true": "false"}),
    ("infer_boost", {"on": "off"}),
)
KEY = ("capture_mode", "jit_level", "backend", "fullgraph", "infer_boost", "amp")


def _get(row, k):
    return row.get(k, "-") if k == "amp" else row[k]  # (rows from before the amp rows have no "amp")


def baselines(row, rows):
    """The rows `row` should beat, each with a short name of it: [(name, baseline row)]. An amp row
    (mixed precision) is held to the kiln eager row and the kiln.jit rows of its own precision."""
    if row["system"] != "kiln.jit":
        return []
    out = [("eager", r) for r in rows if r["system"] == "kiln" and _get(r, "amp") == _get(row, "amp")]
    for field, beats in SETTINGS:
        if row[field] not in beats:
            continue
        want = {k: _get(row, k) for k in KEY}
        want[field] = beats[row[field]]
        for r in rows:
            if r["system"] == "kiln.jit" and all(_get(r, k) == want[k] for k in KEY):
                name = {"fullgraph": "fullgraph=false", "infer_boost": "infer_boost off"}.get(field, want[field])
                out.append((name, r))
    return out


def spread(row):
    return row["per_run_max_s"] - row["per_run_min_s"]


def is_slower(row, base):
    """Whether row's median is slower than base's by more than either row's spread (needs two
    or more repetitions of both)."""
    if row.get("repeat", 1) < 2 or base.get("repeat", 1) < 2:
        return False
    values = (row["per_run_s"], base["per_run_s"], spread(row), spread(base))
    if any(v is None or v != v for v in values):  # a failed row has no times
        return False
    return row["per_run_s"] - base["per_run_s"] > max(spread(row), spread(base))


def timing(per_run_times):
    """The fields is_slower reads, from the per-run time of each repetition."""
    times = sorted(per_run_times)
    return {"repeat": len(times), "per_run_s": float(np.median(times)) if times else float("nan"),
            "per_run_min_s": times[0] if times else float("nan"),
            "per_run_max_s": times[-1] if times else float("nan")}


def mark(rows, remeasure=None):
    """Sets each row's "slower_than" ([{than, ratio}, with interleaved_ratio when re-measured])
    and appends the marks to its check text; returns the number of rows marked.
    remeasure(row, base), when given, times the two rows again in turns and returns their per-run
    times, one per repetition: ([row's], [base's]). A mark it does not confirm goes to the row's
    "not_slower_interleaved" ([{than, ratio, interleaved_ratio}]) instead."""
    marked = 0
    for row in rows:
        row["slower_than"], row["not_slower_interleaved"] = [], []
        for name, base in baselines(row, rows):
            if base.get("error") or row.get("error") or not is_slower(row, base):
                continue
            found = {"than": name, "ratio": row["per_run_s"] / base["per_run_s"]}
            if remeasure is not None:
                again, base_again = (timing(t) for t in remeasure(row, base))
                found["interleaved_ratio"] = again["per_run_s"] / base_again["per_run_s"]
                if not is_slower(again, base_again):
                    row["not_slower_interleaved"].append(found)
                    continue
            row["slower_than"].append(found)
        if row["slower_than"]:
            marked += 1
            row["check"] += " SLOWER than " + ", ".join(
                f"{s['than']} ({s['ratio']:.2f}x"
                + (f"; {s['interleaved_ratio']:.2f}x timed in turns" if "interleaved_ratio" in s else "") + ")"
                for s in row["slower_than"])
    return marked
