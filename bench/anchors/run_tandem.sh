#!/bin/bash
# run_tandem.sh NRANKS SIZES_CSV [REPS] - run `tandem bench` as the sweep runs the other implementations and print
# rows in the sweep's CSV format: impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps
#
# TANDEM_BIN (default build/bin/tandem in the repository) runs, REPS times per size,
#   tandem launch -n N -- tandem bench COLL -a 3 -b BYTES -e BYTES -n ITERS -w WARMUP -c 1 -d f32 [-o sum] --format json
# and reads one JSON object per line (docs/bench.md) with at least the keys
#   collective, bytes, inplace, time_us, wrong
# (-a 3: time_us is the slowest rank's mean, as the MPI programs report the maximum over ranks)
# The row is the median over the launches. Output is parsed only once every launch of a size has ended, so no
# parser shares the ranks' cores while they run.
#   COLL (default allreduce): another `tandem bench` collective; bus bandwidth uses nccl-tests' factor.
#   TANDEM_ROWS: in (inplace) or out (outofplace); default in place for allreduce (as mpi_allreduce.c runs),
#     out of place otherwise (as mpi_coll.c runs).
#   TANDEM_WARM=1: warm as mpi_coll.c warms Open MPI (W = clamp(64 MiB / bytes, 1, 10), then 3, then K untimed
#     calls; K timed; K for 0.1 s at 4 GB/s, 1 to 2000). Default (cold): 5 untimed calls, then 0.1 s at 2 GB/s,
#     5 to 2000 calls.
#   TANDEM_BENCH_ARGS: more flags for tandem bench (e.g. -R 1); TANDEM_VARIANT: the row's variant label.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
[ $# -ge 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
N=$1; SIZES=$2; REPS=${3:-7}
COLL=${COLL:-allreduce}
TANDEM_BIN=${TANDEM_BIN:-$REPO/build/bin/tandem}
[ -x "$TANDEM_BIN" ] || {
  echo "run_tandem.sh: no tandem executable at '$TANDEM_BIN': build it (ninja -C build tandem) or set TANDEM_BIN" >&2
  exit 2
}
case ${TANDEM_ROWS:-} in
  "") [ "$COLL" = allreduce ] && ROWS=inplace || ROWS=outofplace ;;
  in | inplace) ROWS=inplace ;;
  out | outofplace) ROWS=outofplace ;;
  *) echo "run_tandem.sh: TANDEM_ROWS=$TANDEM_ROWS: use in (inplace) or out (outofplace)" >&2; exit 2 ;;
esac
VARIANT=${TANDEM_VARIANT:-default}
clamp() { local v=$1; ((v < $2)) && v=$2; ((v > $3)) && v=$3; echo "$v"; }
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
IFS=, read -r -a sizes <<< "$SIZES"
for s in "${sizes[@]}"; do
  if [ "${TANDEM_WARM:-0}" = 1 ]; then
    iters=$(clamp $((400000000 / s)) 1 2000)
    warmup=$(($(clamp $((67108864 / s)) 1 10) + 3 + iters))
  else
    iters=$(clamp $((200000000 / s)) 5 2000)
    warmup=5
  fi
  : > "$raw"
  for ((rep = 0; rep < REPS; rep++)); do
    # shellcheck disable=SC2046,SC2086
    "$TANDEM_BIN" launch -n "$N" -- "$TANDEM_BIN" bench "$COLL" -a 3 -b "$s" -e "$s" -n "$iters" -w "$warmup" -c 1 \
      -d f32 $([ "$COLL" = allreduce ] && echo "-o sum") --format json ${TANDEM_BENCH_ARGS:-} >> "$raw" 2>/dev/null
  done
  python3 -c '
import json, statistics, sys
n, size, variant, iters, coll, want = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
factor = {"allreduce": 2 * (n - 1) / n, "sendrecv": 1, "reduce": 1, "broadcast": 1}.get(coll, (n - 1) / n)
rows = []
for line in open(sys.argv[7]):
    # tolerate a launcher prefix such as "[0] " before the JSON
    i = line.find("{"); j = line.find("[{")
    try:
        objs = json.loads(line[j:]) if j != -1 and (i == -1 or j < i) else [json.loads(line[i:])] if i != -1 else []
    except ValueError:
        continue
    rows += [o for o in objs if o.get("collective", coll) == coll and int(o.get("bytes", -1)) == size]
# sendrecv has no in-place rows: take what there is
picked = [o for o in rows if bool(o.get("inplace")) == (want == "inplace")] or rows
if not picked:
    sys.exit("run_tandem.sh: no JSON rows for %d bytes" % size)
if any(int(o.get("wrong", 0)) for o in picked):
    sys.exit("run_tandem.sh: tandem reported wrong results at %d bytes" % size)
t = [float(o["time_us"]) for o in picked]
med = statistics.median(t)
alg = size / med / 1e3
print(("tandem" if coll == "allreduce" else "tandem_" + coll) + ",%s,%d,%d,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f"
      % (variant, n, size, iters, len(t), med, min(t), max(t), alg, alg * factor))
' "$N" "$s" "$VARIANT" "$iters" "$COLL" "$ROWS" "$raw" || exit 1
done
