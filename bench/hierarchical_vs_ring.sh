#!/usr/bin/env bash
# hierarchical_vs_ring.sh: the hierarchical all-reduce against the flat ring
# on "hosts" made of network namespaces (bench/netns_run.sh --per-host), in
# one run: each repetition runs `tandem bench allreduce` once per algorithm,
# alternating, and the script prints each algorithm's median in-place time.
# Every run gets its own store port and job id: a rank that finishes one run
# early must not meet the previous run's store.
#
#   bench/hierarchical_vs_ring.sh                      # 2 hosts x 2 ranks, 1 Gbit/s, 16 MiB, 5 repetitions
#   bench/hierarchical_vs_ring.sh -n 6 --per-host 3 --rate 200mbit --size 4M --reps 3
#
# Needs root (namespaces) and python3 (the medians).
set -euo pipefail
nranks=4 per_host=2 rate=1gbit size=16M reps=5 iters=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) nranks="$2"; shift 2 ;;
    --per-host) per_host="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    *) echo "hierarchical_vs_ring: unknown option '$1' (-n, --per-host, --rate, --size, --reps, --iters)" >&2; exit 2 ;;
  esac
done
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tandem="$(command -v tandem || echo "$repo/build/bin/tandem")"
bench="$tandem bench allreduce -a 3 -b $size -e $size -n $iters -w 2 --format json"
"$repo/bench/netns_run.sh" -n "$nranks" --per-host "$per_host" --rate "$rate" --timeout 900 -- sh -c \
  "k=0; for i in \$(seq $reps); do for a in ring hierarchical; do k=\$((k + 1));
     TANDEM_STORE_ADDR=\${TANDEM_STORE_ADDR%:*}:\$((29500 + k)) TANDEM_JOB_ID=run\$k $bench --algorithm \$a || exit 1;
   done; done" |
  tee /dev/stderr | sed -n 's/^\[0\] \({.*\)$/\1/p' | python3 -c '
import json, statistics, sys
times = {}
for line in sys.stdin:
    j = json.loads(line)
    if j["inplace"]:
        times.setdefault(j["algorithm"], []).append(j["time_us"] / 1e3)
for a, t in times.items():
    print(f"{a:13s} median {statistics.median(t):8.1f} ms over {len(t)} runs: " + ", ".join(f"{x:.1f}" for x in t))
if len(times) == 2:
    ratio = statistics.median(times["hierarchical"]) / statistics.median(times["ring"])
    print(f"hierarchical / ring: {ratio:.2f}")
'
