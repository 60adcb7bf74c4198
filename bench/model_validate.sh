#!/usr/bin/env bash
# model_validate.sh: calibrate the scale model on this machine, measure every
# configuration it can run, and compare (tandem model validate).
#
#   sudo bench/model_validate.sh [OUT_DIR]        (default: build/model)
#
# Calibration (2 ranks each): shared memory on one host; a veth link between
# two network namespaces without a rate limit (cpu-bound: the kernel's TCP
# work on the same cores); the same link at 1 Gbit/s (tc tbf). Then, for
# each, the oversubscribed synchronisation step (--step-only: a tiny
# allgather; on shared memory also a 1 MiB all-reduce, on the cpu-bound
# veth a 16 MiB allgather) with 1.5x and 2x as many ranks as cores. Every calibration
# runs in MODEL_CAL_REPEATS launches (default 5), the median of each figure kept.
# Measured: 2, 3, 4 ranks on one host; 2, 3, 4 namespaces on each link; 2
# namespaces of 2 ranks at 1 Gbit/s, flat ring and hierarchical;
# `tandem bench allreduce -b 4K -e 64M -f 4` each, JSON lines in OUT_DIR,
# MODEL_REPEATS sweeps (default 3, interleaved) whose median validate compares.
# Namespaces run unbound (netns_run.sh --bind none) at every count, as the
# model's cpu-bound link and oversubscribed steps were calibrated and validated.
# Namespace cases need root; without it only the one-host cases run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-build/model}")
tandem=${TANDEM:-build/bin/tandem}
mkdir -p "$out"
cal="$out/calibration.json"
rm -f "$cal"
sweep=(-e 64M -f 4 -n 8 -w 5 -c 0 -a 3 --format json)  # after bench allreduce -b SIZE
iters=${MODEL_ITERS:-8}
cores=$(nproc)
# Rank counts that outnumber the cores, for the oversubscribed step.
oversubscribed=($(( cores + (cores + 1) / 2 )) $(( 2 * cores )))

# Repeats, interleaved: one launch can settle into a faster or slower schedule
# than the next (oversubscribed ranks most), so the calibration keeps the
# median of its launches' figures and validate the median of the sweeps'.
cal_repeats=${MODEL_CAL_REPEATS:-5}
repeats=${MODEL_REPEATS:-3}
netns=0
if (( EUID == 0 )) && command -v ip >/dev/null; then netns=1; fi
links=(veth 1gbit)
rate_of() { [[ $1 == 1gbit ]] && echo "--rate 1gbit" || true; }  # veth: no limit
cpu_of() { [[ $1 == veth ]] && echo "--cpu-bound" || true; }
stamp() { echo "== $(date +%T) $*"; }

for (( r = 1; r <= cal_repeats; r++ )); do
  stamp "calibrate: shared memory, 2 ranks ($r of $cal_repeats)"
  "$tandem" launch -n 2 -- "$tandem" model calibrate -o "$cal" -n "$iters"
  (( netns )) || continue
  for link in "${links[@]}"; do
    stamp "calibrate: $link, 2 namespaces ($r of $cal_repeats)"
    bench/netns_run.sh -n 2 --bind none $(rate_of $link) -- "$tandem" model calibrate -o "$cal" --link "$link" $(cpu_of $link) -n "$iters" \
      | grep -v '^\[1\]' || true
  done
done
# After the 2-rank figures: a link's stretch is relative to them.
for (( r = 1; r <= cal_repeats; r++ )); do
  for n in "${oversubscribed[@]}"; do
    stamp "calibrate: shared-memory step, $n ranks on $cores cores ($r of $cal_repeats)"
    "$tandem" launch -n "$n" -- "$tandem" model calibrate -o "$cal" --step-only | grep -v '^\[[1-9]' || true
    (( netns )) || continue
    for link in "${links[@]}"; do
      stamp "calibrate: $link step, $n namespaces on $cores cores ($r of $cal_repeats)"
      bench/netns_run.sh -n "$n" --bind none $(rate_of $link) -- "$tandem" model calibrate -o "$cal" --link "$link" $(cpu_of $link) --step-only \
        | grep '^\[0\] ' || true
    done
  done
done

cases=()
measure() {  # FILE CASE COMMAND...: the first repeat starts FILE and adds the case; each appends its rows
  local file=$1 spec=$2; shift 2
  if (( r == 1 )); then : > "$file"; cases+=(--case "$spec=$file"); fi
  "$@" | grep "^\[0\] {\|^{" >> "$file" || true
}
for (( r = 1; r <= repeats; r++ )); do
  for n in 2 3 4; do
    stamp "measure: $n ranks, one host ($r of $repeats)"
    measure "$out/shm$n.json" "1x$n" "$tandem" launch -n "$n" -- "$tandem" bench allreduce -b 4K "${sweep[@]}"
  done
  if (( netns )); then
    for link in "${links[@]}"; do
      for n in 2 3 4; do
        stamp "measure: $n namespaces, $link ($r of $repeats)"
        measure "$out/$link$n.json" "${n}x1:$link" bench/netns_run.sh -n "$n" --bind none $(rate_of $link) -- "$tandem" bench allreduce -b 4K "${sweep[@]}"
      done
    done
    # Two hosts of two ranks at 1 Gbit/s: the flat ring and the hierarchical all-reduce.
    for algo in ring hierarchical; do
      stamp "measure: 2 hosts x 2 ranks, 1gbit, $algo ($r of $repeats)"
      measure "$out/1gbit2x2$algo.json" "2x2:1gbit" bench/netns_run.sh -n 4 --per-host 2 --bind none --rate 1gbit -- \
        "$tandem" bench allreduce -b 64K "${sweep[@]}" --algorithm "$algo"
    done
  fi
done
(( netns )) || echo "model_validate: not root (or no iproute2): namespace cases skipped" >&2

echo "== validate"
"$tandem" model validate -c "$cal" "${cases[@]}" | tee "$out/validation.txt"
