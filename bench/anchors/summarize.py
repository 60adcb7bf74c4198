#!/usr/bin/env python3
"""summarize.py RAW_CSV [--md OUT.md] - median over rounds of the per-launch median time per op.

Input rows (from allreduce_sweep.sh):
  round,impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps
Output: for each nranks, a markdown table (rows = implementation, columns = message size) of
  median time/op (us) and busbw (GB/s, 1e9 B/s; busbw = algbw times nccl-tests' factor of the collective,
  2(n-1)/n for the all-reduce; algbw = bytes/time),
  the spread over rounds (min..max of the per-round medians), and the best implementation per size.
"""
import collections
import os
import statistics
import sys


def bus_factor(impl, n):
    """nccl-tests' bus-bandwidth factor; rows of other collectives than the all-reduce are named
    mpi_<collective>, tandem_<collective> or bound_<collective>."""
    prefix, _, coll = impl.partition("_")
    if prefix not in ("mpi", "tandem", "bound") or not coll:
        coll = "allreduce"
    if coll in ("sendrecv", "reduce", "broadcast"):
        return 1.0
    return (n - 1) / n if coll != "allreduce" else 2.0 * (n - 1) / n


def fmt_size(b):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def fmt_us(us):
    if us >= 10000:
        return f"{us / 1000:.1f} ms"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    if us >= 10:
        return f"{us:.0f} us"
    return f"{us:.2f} us"


def main():
    path = sys.argv[1]
    md_out = sys.argv[sys.argv.index("--md") + 1] if "--md" in sys.argv else None
    data = collections.defaultdict(list)  # (nranks, name, bytes) -> [median_us per round]
    for line in open(path):
        if not line.strip() or line.startswith("#"):
            continue
        f = line.strip().split(",")
        if len(f) < 12:
            continue
        rnd, impl, variant, n, nbytes = f[0], f[1], f[2], int(f[3]), int(f[4])
        name = f"{impl}/{variant}"
        data[(n, name, nbytes)].append(float(f[7]))
    out = []
    for n in sorted({k[0] for k in data}):
        names = sorted({k[1] for k in data if k[0] == n})
        sizes = sorted({k[2] for k in data if k[0] == n})
        cpus = os.cpu_count() or 1
        over = f" (OVERSUBSCRIBED: {n} ranks on {cpus} cores)" if n > cpus else ""
        out.append(f"\n### {n} ranks{over}: median time per op | busbw GB/s\n")
        out.append("| impl/variant | " + " | ".join(fmt_size(s) for s in sizes) + " |")
        out.append("|---|" + "---|" * len(sizes))
        best = {}
        for name in names:
            factor = bus_factor(name.split("/")[0], n)
            cells = []
            for s in sizes:
                v = data.get((n, name, s))
                if not v:
                    cells.append("fail/-")
                    continue
                med = statistics.median(v)
                busbw = s / (med * 1e-6) / 1e9 * factor
                cells.append(f"{fmt_us(med)} \\| {busbw:.2f}")
                if s not in best or med < best[s][0]:
                    best[s] = (med, name, busbw)
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("| **best** | " + " | ".join(
            f"**{best[s][1]}** {fmt_us(best[s][0])} \\| {best[s][2]:.2f}" if s in best else "-" for s in sizes) + " |")
        out.append(f"\nbest round ({n} ranks): min over rounds of the per-round median time | busbw GB/s "
                   "(the host's 'fast state', see bench/log/anchors-2026-11-22.md)\n")
        out.append("| impl/variant | " + " | ".join(fmt_size(s) for s in sizes) + " |")
        out.append("|---|" + "---|" * len(sizes))
        for name in names:
            factor = bus_factor(name.split("/")[0], n)
            cells = []
            for s in sizes:
                v = data.get((n, name, s))
                if not v:
                    cells.append("-")
                    continue
                b = min(v)
                cells.append(f"{fmt_us(b)} \\| {s / (b * 1e-6) / 1e9 * factor:.2f}")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append(f"\nspread over rounds ({n} ranks): min..max of per-round median time, as % of median\n")
        out.append("| impl/variant | " + " | ".join(fmt_size(s) for s in sizes) + " | rounds |")
        out.append("|---|" + "---|" * (len(sizes) + 1))
        for name in names:
            cells, rounds = [], 0
            for s in sizes:
                v = data.get((n, name, s))
                if not v:
                    cells.append("-")
                    continue
                med = statistics.median(v)
                rounds = max(rounds, len(v))
                cells.append(f"{100 * (min(v) - med) / med:+.0f}..{100 * (max(v) - med) / med:+.0f}%")
            out.append(f"| {name} | " + " | ".join(cells) + f" | {rounds} |")
    text = "\n".join(out) + "\n"
    print(text)
    if md_out:
        open(md_out, "w").write(text)


if __name__ == "__main__":
    main()
