#!/usr/bin/env bash
# tcp_line_rate.sh: tandem's all-reduce between two network namespaces over
# TCP against iperf3 on the same veth, in one run. Each repetition runs
# iperf3 --bidir (both directions at once, as the all-reduce moves data) and
# then `tandem bench allreduce`; the script compares the all-reduce's busbw
# (for 2 ranks, the bytes each rank sends per second) with iperf3's
# per-direction rate, and prints the medians.
#
#   bench/tcp_line_rate.sh                          # 16 MiB, 3 repetitions, unlimited veth
#   bench/tcp_line_rate.sh --size 64M --reps 5 --env UCX_TCP_TX_SEG_SIZE=64k
#   bench/tcp_line_rate.sh --reps 7 --also TANDEM_SEGMENT_BYTES=1048576   # the defaults and a variant, interleaved
#   bench/tcp_line_rate.sh --rate 1gbit             # the veth limited by tc tbf (a link, not the CPU, is the bound)
#
# Needs root (namespaces), iperf3 and python3.
set -euo pipefail
size=16M reps=3 seconds=5 iters=20
env_args=() rate_args=()
variants=("X=default")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --env) env_args+=(--env "$2"); shift 2 ;;
    --rate) rate_args=(--rate "$2"); shift 2 ;;
    --also) variants+=("$2"); shift 2 ;;
    *) echo "tcp_line_rate: unknown option '$1' (--size, --reps, --seconds, --iters, --env K=V, --rate RATE, --also 'K=V ...')" >&2; exit 2 ;;
  esac
done
command -v iperf3 >/dev/null || { echo "tcp_line_rate: iperf3 not found (apt-get install iperf3)" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tandem="$(command -v tandem || echo "$repo/build/bin/tandem")"
# One line of iperf3's JSON: the received rate of each direction, in GB/s.
summary='import json,sys; e=json.load(sys.stdin)["end"]; print("iperf3", json.dumps({"up": e["sum_received"]["bits_per_second"]/8e9, "down": e["sum_received_bidir_reverse"]["bits_per_second"]/8e9}))'
"$repo/bench/netns_run.sh" -n 2 --timeout 900 "${rate_args[@]}" "${env_args[@]}" -- sh -c "
  for k in \$(seq $reps); do
    if [ \$TANDEM_RANK = 0 ]; then iperf3 -s -1 -p \$((5300 + k)) >/dev/null;
    else sleep 1; iperf3 -c 10.77.0.1 -p \$((5300 + k)) --bidir -t $seconds -J | python3 -c '$summary'; fi
    v=0
    for variant in ${variants[*]@Q}; do
      v=\$((v + 1)); [ \$TANDEM_RANK = 0 ] && echo \"variant \$variant\"
      env \$variant TANDEM_STORE_ADDR=\${TANDEM_STORE_ADDR%:*}:\$((29500 + 10 * k + v)) TANDEM_JOB_ID=tcp\$k.\$v \
        $tandem bench allreduce -a 3 -b $size -e $size -n $iters -w 5 --format json || exit 1
    done
  done" | tee /dev/stderr | python3 -c '
import json, re, statistics, sys
line_rate, busbw, variant = [], {}, ""
for line in sys.stdin:
    v = re.match(r"\[0\] variant (.*)$", line.strip())
    if v:
        variant = v.group(1)
        continue
    m = re.match(r"\[(\d)\] (iperf3 )?(\{.*\})$", line.strip())
    if not m:
        continue
    j = json.loads(m.group(3))
    if m.group(2):
        line_rate.append((j["up"] + j["down"]) / 2)
    elif m.group(1) == "0" and j.get("inplace"):
        busbw.setdefault(variant, []).append(j["busbw_gbps"])
print("iperf3 --bidir per direction (GB/s):", ", ".join(f"{x:.3f}" for x in line_rate))
for name, values in busbw.items():
    print(f"tandem busbw, {name} (GB/s):", ", ".join(f"{x:.3f}" for x in values))
    # Each repetition against the iperf3 run just before it, then the median of those ratios.
    ratios = [b / a for a, b in zip(line_rate, values)]
    if ratios:
        print(f"  median {statistics.median(values):.3f} GB/s; per repetition vs iperf3: " +
              ", ".join(f"{100 * r:.0f}%" for r in ratios) + f"; median {100 * statistics.median(ratios):.0f}%")
'
