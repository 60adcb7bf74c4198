#!/bin/bash
# run_bound.sh MODE NRANKS SIZES_CSV [REPS] - the all-to-all's floor on this host as sweep rows:
# tandem-alltoall-bound (docs/bench.md) in MODE (cma, mapped-stream or mapped-copy), REPS launches per size,
# each the mean of its calls (0.1 s at 4 GB/s, 5 to 2000), the row the median over launches:
#   bound_alltoall,MODE,nranks,bytes,calls,launches,median_us,min_us,max_us,algbw_GBps,busbw_GBps
# BOUND_BIN defaults to build/bench/tandem-alltoall-bound (ninja -C build tandem-alltoall-bound).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
[ $# -ge 3 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
MODE=$1; N=$2; SIZES=$3; REPS=${4:-7}
BOUND_BIN=${BOUND_BIN:-$REPO/build/bench/tandem-alltoall-bound}
[ -x "$BOUND_BIN" ] || {
  echo "run_bound.sh: no program at '$BOUND_BIN': ninja -C build tandem-alltoall-bound, or set BOUND_BIN" >&2
  exit 2
}
IFS=, read -r -a sizes <<< "$SIZES"
for s in "${sizes[@]}"; do
  calls=$((400000000 / s)); ((calls < 5)) && calls=5; ((calls > 2000)) && calls=2000
  means=()
  for ((rep = 0; rep < REPS; rep++)); do
    line=$("$BOUND_BIN" "$MODE" "$N" "$s" "$calls") || exit 1
    means+=("$(echo "$line" | cut -d, -f4)")
  done
  python3 -c '
import statistics, sys
mode, n, size, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = [float(x) for x in sys.argv[5:]]
med = statistics.median(t)
alg = size / med / 1e3
print("bound_alltoall,%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f" % (mode, n, size, calls, len(t), med, min(t), max(t), alg, alg * (n - 1) / n))
' "$MODE" "$N" "$s" "$calls" "${means[@]}"
done
