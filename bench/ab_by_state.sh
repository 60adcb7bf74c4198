#!/usr/bin/env bash
# ab_by_state.sh: tandem binaries side by side, in interleaved rounds (every
# round runs every binary once per size, the order rotated), each launch
# between two readings of the host-state probe (bench/anchors' pingpong,
# shm_spin: the one-way cost of a cache-line hand-off between two processes).
# The host moves its cores apart ("far", ~0.25 us) and back ("near",
# 0.02-0.14 us) within minutes, so the summary groups launches by the state
# both readings agree on (far: 0.18-0.4 us; others are dropped) and prints
# each binary's median in-place time per size and state, with the count.
#
#   bench/ab_by_state.sh 2 4096,1048576 3 "new=build/bin/tandem" "old=/path/to/tandem"
#   bench/ab_by_state.sh 2 1048576 5 "cma=TANDEM_SHM_PATHS=allreduce:heap:16K-=cma build/bin/tandem" "new=build/bin/tandem"
#
# Arguments: ranks, sizes (bytes, comma-separated), rounds, then one
# "label=[VAR=value ...] binary" per binary. RAW=file keeps (appends) the
# per-launch rows "round label probe_before probe_after bytes time_us";
# PINGPONG names the probe (default build/anchors/pingpong, built by
# bench/anchors/build.sh); BENCH_ARGS is passed to `tandem bench` (e.g.
# "-R 1" for allocate_shared buffers); MAXIT caps the iterations (2000).
set -euo pipefail
[[ $# -ge 4 ]] || { sed -n '2,20p' "$0"; exit 2; }
nranks=$1 sizes=$2 rounds=$3
shift 3
raw=${RAW:-$(mktemp)}
pingpong=${PINGPONG:-$(dirname "$0")/../build/anchors/pingpong}
[[ -x $pingpong ]] || { echo "ab_by_state.sh: no probe at $pingpong: run bench/anchors/build.sh or set PINGPONG" >&2; exit 2; }
probe() { "$pingpong" 20000 3 shm_spin | grep -v '^#' | cut -d, -f4; }
for ((r = 1; r <= rounds; ++r)); do
  specs=("$@")
  k=$(((r - 1) % ${#specs[@]}))
  specs=("${specs[@]:k}" "${specs[@]:0:k}")
  for spec in "${specs[@]}"; do
    label=${spec%%=*} rest=${spec#*=}
    bin=${rest##* } envs=${rest% *}
    [[ "$envs" == "$rest" ]] && envs=""
    for s in ${sizes//,/ }; do
      it=$((300000000 / s))
      ((it > ${MAXIT:-2000})) && it=${MAXIT:-2000}
      ((it < 10)) && it=10
      before=$(probe)
      # shellcheck disable=SC2086
      out=$(env $envs "$bin" launch -n "$nranks" -- "$bin" bench allreduce -a 3 -b "$s" -e "$s" -n "$it" -w 5 -c 0 \
        --format json ${BENCH_ARGS:-} 2>/dev/null || true)
      sleep 0.3 # the launch's processes are gone before the second reading
      after=$(probe)
      echo "$out" | python3 -c '
import json, sys
for line in sys.stdin:
    i = line.find("{")
    if i < 0: continue
    o = json.loads(line[i:])
    if o.get("inplace"): print(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], o["bytes"], o["time_us"])
' "$r" "$label" "$before" "$after" >> "$raw"
    done
  done
done
python3 - "$raw" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) != 6: continue
    _, label, p1, p2, size, t = f
    p1, p2 = float(p1), float(p2)
    state = "near" if max(p1, p2) < 0.15 else "far" if 0.18 <= min(p1, p2) and max(p1, p2) < 0.4 else None
    if state: d[(state, label, int(size))].append(float(t))
for state in ("near", "far"):
    labels = sorted({k[1] for k in d if k[0] == state})
    sizes = sorted({k[2] for k in d if k[0] == state})
    if not labels: continue
    print(f"== {state}: median in-place time_us (launches)")
    print("size".rjust(10), *[l.rjust(18) for l in labels])
    for s in sizes:
        cells = [f"{statistics.median(d[(state, l, s)]):.2f} ({len(d[(state, l, s)])})" if d[(state, l, s)] else "-" for l in labels]
        print(str(s).rjust(10), *[c.rjust(18) for c in cells])
PY
