#!/usr/bin/python3
"""Time to a validation accuracy over several seeds: bench/train_compare.sh --seeds.

    bench/train_seeds.py [--target 0.85] [--rate 1gbit] [--output seeds.md] DIR/seed-N ...

Each DIR/seed-N holds one train_compare.sh run. Per seed and system: the
trial-clock time of the first validation at or above the target, the final
validation accuracy, and tandem's time over DDP's; then the median of each
column. A seed that never reaches the target counts as slower than any that
does (its ratio is "not reached" and sorts last). "same-trajectory" ratios
divide the times to the last validation (the same records trained and
validated): what time to the target would be if both crossed it at the same
validation, as they do when they train bitwise the same trajectory.

Final accuracies: each system's difference from DDP's in points per seed,
their mean and standard error. With --rounding-control runs the tables also
have DDP with its sliced layers as separate layers and DDP with the
convolutions channels-last, as tandem-train keeps them (the same trajectory,
other rounding): how far rounding alone moves DDP's own final accuracy; and
per seed, whether tandem's one-host losses and accuracies equal DDP's on the
same layout bit for bit, or the first batch where they part.
"""
import argparse
import json
import math
import os
import re
import statistics

SYSTEMS = [  # (column, directory under a seed's run)
    ("tandem, one host", "local/slots-2"),
    ("DDP gloo, one host", "local/ddp-slots-2"),
    ("tandem fp16, link", "link-tandem-fp16"),
    ("DDP gloo, link", "link-ddp"),
    ("DDP fp16 hook, link", "link-ddp-fp16"),
    ("DDP separate slices, one host", "local/ddp-separate-slots-2"),
    ("DDP channels-last, one host", "local/ddp-cl-slots-2"),
]
RATIOS = [  # (column, numerator, denominator)
    ("one host ÷ DDP", "tandem, one host", "DDP gloo, one host"),
    ("link ÷ DDP", "tandem fp16, link", "DDP gloo, link"),
    ("link ÷ DDP fp16", "tandem fp16, link", "DDP fp16 hook, link"),
]
ACCURACY_GAPS = [  # (row, system, against)
    ("tandem one host − DDP", "tandem, one host", "DDP gloo, one host"),
    ("DDP separate slices − DDP (rounding alone)", "DDP separate slices, one host", "DDP gloo, one host"),
    ("DDP channels-last − DDP (layout alone)", "DDP channels-last, one host", "DDP gloo, one host"),
    ("tandem one host − DDP channels-last", "tandem, one host", "DDP channels-last, one host"),
    ("tandem fp16 link − DDP", "tandem fp16, link", "DDP gloo, link"),
    ("DDP fp16 hook − DDP", "DDP fp16 hook, link", "DDP gloo, link"),
]


def read_run(path, target):
    """(seconds to target or inf, final accuracy, seconds to the last validation) of one metrics.jsonl, or None."""
    if not os.path.exists(path):
        return None
    reached, final, last = math.inf, None, None
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") != "validation":
            continue
        final, last = r["accuracy"], r["time"]
        if r["accuracy"] >= target and reached == math.inf:
            reached = r["time"]
    return reached, final, last


def trajectory(path):
    """[(batch, kind, loss or accuracy)] of one metrics.jsonl: what two runs of one trajectory share bit for bit."""
    out = []
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "train":
            out.append((r["batch"], "loss", r["loss"]))
        elif r.get("kind") == "validation":
            out.append((r["batch"], "accuracy", r["accuracy"]))
    return out


def same_trajectory(run, system, against):
    """Whether two runs of one seed trained bit for bit alike, as a table cell."""
    a, b = (os.path.join(run, sub, "metrics.jsonl") for sub in (system, against))
    if not (os.path.exists(a) and os.path.exists(b)):
        return None
    ta, tb = trajectory(a), trajectory(b)
    for x, y in zip(ta, tb):
        if x != y:
            return f"parts at batch {x[0]} ({x[1]})"
    return f"identical ({len(ta)} values)" if len(ta) == len(tb) else "identical while both ran, lengths differ"


def median(values):
    return statistics.median(values) if values else None


def fmt(v, spec):
    if v is None:
        return "-"
    return "not reached" if math.isinf(v) else format(v, spec)


def fmt_ratio(v):
    return "DDP not reached" if v == 0.0 else fmt(v, ".2f")


def accuracy_gaps(rows):
    """Lines of a table: final accuracy minus DDP's, in points, per seed, mean and standard error."""
    seeds = [seed for seed, _, _ in rows]
    out = ["", "Final validation accuracy minus DDP's (points)", "",
           "| | " + " | ".join(seeds) + " | mean | standard error |", "|---|" + "---:|" * (len(seeds) + 2)]
    for row, system, against in ACCURACY_GAPS:
        gaps = [100 * (g[system][1] - g[against][1]) if g[system] and g[against] else None for _, g, _ in rows]
        have = [x for x in gaps if x is not None]
        if not have:
            continue
        mean = statistics.fmean(have)
        error = statistics.stdev(have) / math.sqrt(len(have)) if len(have) > 1 else None
        out.append(f"| {row} | " + " | ".join(fmt(x, "+.2f") for x in gaps) + f" | {mean:+.2f} | {fmt(error, '.2f')} |")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--output", default="")
    a = p.parse_args()
    rows = []
    runs = sorted(a.runs, key=lambda d: int(re.sub(r"\D", "", os.path.basename(d.rstrip("/"))) or 0))
    for d in runs:
        got = {name: read_run(os.path.join(d, sub, "metrics.jsonl"), a.target) for name, sub in SYSTEMS}
        ratios = {}
        for col, num, den in RATIOS:
            if got[num] and got[den]:
                n, m = got[num][0], got[den][0]
                ratios[col] = math.inf if math.isinf(n) else (0.0 if math.isinf(m) else n / m)
            if got[num] and got[den] and got[num][2] and got[den][2]:
                # The same records and validations end to end: the ratio if both crossed the target together.
                ratios["same-trajectory " + col] = got[num][2] / got[den][2]
        rows.append((os.path.basename(d.rstrip("/")).removeprefix("seed-"), got, ratios))

    ratio_cols = [c for c, _, _ in RATIOS] + ["same-trajectory " + c for c, _, _ in RATIOS]
    head = ["seed"] + [f"{n} (s)" for n, _ in SYSTEMS] + ratio_cols + ["final acc: " + n for n, _ in SYSTEMS]
    out = [f"Time to {a.target:.0%} validation accuracy (trial clock, s), link {a.rate}; "
           "a seed that never reaches it sorts last", "",
           "| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for seed, got, ratios in rows:
        cells = [seed] + [fmt(got[n][0], ".1f") if got[n] else "-" for n, _ in SYSTEMS]
        cells += [fmt_ratio(ratios.get(c)) for c in ratio_cols]
        cells += [fmt(got[n][1], ".4f") if got[n] else "-" for n, _ in SYSTEMS]
        out.append("| " + " | ".join(cells) + " |")
    med = ["**median**"]
    med += [fmt(median([g[n][0] for _, g, _ in rows if g[n]]), ".1f") for n, _ in SYSTEMS]
    med += [fmt_ratio(median([r[c] for _, _, r in rows if c in r])) for c in ratio_cols]
    med += [fmt(median([g[n][1] for _, g, _ in rows if g[n]]), ".4f") for n, _ in SYSTEMS]
    out.append("| " + " | ".join(med) + " |")
    out += accuracy_gaps(rows)
    same = [(seed, same_trajectory(d, "local/slots-2", "local/ddp-cl-slots-2")) for (seed, _, _), d in zip(rows, runs)]
    if any(cell for _, cell in same):
        out += ["", "tandem one host against DDP channels-last: training losses and validation accuracies", "",
                "| seed | bit for bit |", "|---|---|"]
        out += [f"| {seed} | {cell or '-'} |" for seed, cell in same]
    text = "\n".join(out) + "\n"
    print(text, end="")
    if a.output:
        open(a.output, "w").write(text)


if __name__ == "__main__":
    main()
