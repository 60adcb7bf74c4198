#!/bin/bash
# run_all.sh - the comparison tables (all-reduce against Open MPI, MPICH, Gloo, PyTorch-gloo, and the host's
# physical and transport limits), as bench/log/anchors-2026-11-22.md first took them.
#
# Usage:  bench/anchors/run_all.sh [PART ...]        (default: build membw latency ucx allreduce netns)
#         SKIP="netns ucx" bench/anchors/run_all.sh  (skip parts)
# Parts:  setup     apt-get the Debian packages (setup.sh; not in the default list)
#         build     compile the C/C++ programs into $BUILD (default build/anchors in the repository)
#         membw     (e) single-core and 2-core memcpy / a+b / a+=b bandwidth, 1..256 MiB arrays
#         latency   small-message latency floor: shm spin, pipe, TCP loopback (blocking / spinning)
#         ucx       (d) ucx_perftest tag_bw per transport + iperf3 TCP loopback
#         allreduce (a)(b)(c) torch gloo, OpenMPI (vader/tcp/ucx), gloo C++; 2 and 4 ranks, interleaved
#         netns     netns + veth + ping, tc netem / tbf / htb rate limiting measured with iperf3
# Every part runs under `timeout` (PART_TIMEOUT, default 1500 s; allreduce default 2400 s); results and
# logs go to $BUILD/results (RES=...), per-part wall time to timings.txt there. TANDEM_BIN (default
# build/bin/tandem, where built) adds tandem to the all-reduce rounds. Knobs of the parts pass
# through the environment (ROUNDS, REPS, SIZES, IMPLS, NRANKS_LIST, BATCH_S, TLS_LIST, ...).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export BUILD=${BUILD:-$REPO/build/anchors}
RES=${RES:-$BUILD/results}
mkdir -p "$RES"
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(build membw latency ucx allreduce netns)
SKIP=${SKIP:-}
ROUNDS=${ROUNDS:-3}

median_py='
import collections, statistics, sys
keys = [int(x) for x in sys.argv[1].split(",")]; val = int(sys.argv[2])
d = collections.defaultdict(list); hdr = None
for l in sys.stdin:
    if l.startswith("#"): hdr = hdr or l[1:].strip().split(","); continue
    f = l.strip().split(",")
    if len(f) <= val: continue
    try: d[tuple(f[k] for k in keys)].append(float(f[val]))
    except ValueError: pass
names = [hdr[k] for k in keys] if hdr else ["key"] * len(keys)
print(",".join(names + ["median_" + (hdr[val] if hdr else "v"), "min", "max", "n"]))
for k, v in d.items():
    print(",".join(list(k) + ["%.3f" % statistics.median(v), "%.3f" % min(v), "%.3f" % max(v), str(len(v))]))
'

part_setup() { "$HERE/setup.sh"; }
part_build() { "$HERE/build.sh"; }
part_membw() {
  local raw="$RES/membw_raw.csv"
  echo "# round,kernel,threads,size_MiB,payload_GBps,traffic_GBps,median_ms" > "$raw"
  for ((r = 0; r < ROUNDS; r++)); do
    for t in 1 2; do
      "$BUILD/membw" $t 7 1 16 64 256 | grep -v '^#' | sed "s/^/$r,/" >> "$raw"
    done
  done
  # payload GB/s = bytes of one array / time; traffic = payload * streams (copy 2, a+b 3, a+=b 3)
  python3 -c "$median_py" 1,2,3 4 < "$raw" | tee "$RES/membw_summary.csv"
}
part_latency() {
  local raw="$RES/latency_raw.csv"
  echo "# round,mode,iters,reps,oneway_median_us,oneway_min_us,oneway_max_us" > "$raw"
  for ((r = 0; r < ROUNDS; r++)); do
    "$BUILD/pingpong" 20000 5 | grep -v '^#' | sed "s/^/$r,/" >> "$raw"
  done
  python3 -c "$median_py" 1 4 < "$raw" | tee "$RES/latency_summary.csv"
}
part_ucx() { ROUNDS=$ROUNDS OUT="$RES/ucx_raw.csv" "$HERE/ucx_bw.sh" | tee "$RES/ucx_summary.csv"; }
part_allreduce() {
  # record which MPI components get picked by default (pml/btl) once
  mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -np 2 --report-bindings \
    --mca pml_base_verbose 10 --mca btl_base_verbose 10 "$BUILD/mpi_allreduce" default 4096 1 2>&1 |
    grep -E "selected|bound|not in the include|returned priority|^mpi," > "$RES/mpi_selection.txt"
  grep -v '^#' /etc/openmpi/openmpi-mca-params.conf | grep . >> "$RES/mpi_selection.txt"
  ROUNDS=$ROUNDS OUT="$RES/allreduce_raw.csv" "$HERE/allreduce_sweep.sh"
  python3 "$HERE/summarize.py" "$RES/allreduce_raw.csv" --md "$RES/allreduce_summary.md"
}
part_netns() { "$HERE/netns_check.sh" | tee "$RES/netns.txt"; }

: > "$RES/timings.txt.new"
for p in "${PARTS[@]}"; do
  if [[ " $SKIP " == *" $p "* ]]; then echo "== skip $p"; continue; fi
  declare -F "part_$p" > /dev/null || { echo "unknown part $p" >&2; exit 2; }
  lim=${PART_TIMEOUT:-1500}; [ "$p" = allreduce ] && lim=${PART_TIMEOUT:-2400}
  echo "== part $p (timeout ${lim}s) $(date -Is)"
  t0=$(date +%s)
  export -f "part_$p"
  export HERE RES ROUNDS median_py
  timeout -k 10 "$lim" bash -c "part_$p"
  rc=$?
  echo "$p rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$RES/timings.txt.new"
done
mv "$RES/timings.txt.new" "$RES/timings.txt"
