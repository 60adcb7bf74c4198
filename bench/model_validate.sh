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
# allgather; on shared memory also a 1 MiB one) with 1.5x and 2x as many
# ranks as cores.
# Measured: 2, 3, 4 ranks on one host; 2, 3, 4 namespaces on each link; 2
# namespaces of 2 ranks at 1 Gbit/s, flat ring and hierarchical;
# `tandem bench allreduce -b 4K -e 64M -f 4` each, JSON lines in OUT_DIR.
# Namespace cases need root; without it only the one-host cases run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-build/model}")
tandem=${TANDEM:-build/bin/tandem}
mkdir -p "$out"
cal="$out/calibration.json"
rm -f "$cal"
sweep=(-e 64M -f 4 -n 8 -w 5 -c 0 --format json)  # after bench allreduce -b SIZE
iters=${MODEL_ITERS:-8}
cores=$(nproc)
# Rank counts that outnumber the cores, for the oversubscribed step.
oversubscribed=($(( cores + (cores + 1) / 2 )) $(( 2 * cores )))

echo "== calibrate: shared memory (2 ranks)"
"$tandem" launch -n 2 -- "$tandem" model calibrate -o "$cal" -n "$iters"
for n in "${oversubscribed[@]}"; do
  echo "== calibrate: shared-memory step, $n ranks on $cores cores"
  "$tandem" launch -n "$n" -- "$tandem" model calibrate -o "$cal" --step-only | grep -v '^\[[1-9]' || true
done
cases=()
for n in 2 3 4; do
  echo "== measure: $n ranks, one host"
  "$tandem" launch -n "$n" -- "$tandem" bench allreduce -b 4K "${sweep[@]}" > "$out/shm$n.json"
  cases+=(--case "1x$n=$out/shm$n.json")
done

if (( EUID == 0 )) && command -v ip >/dev/null; then
  for link in veth 1gbit; do
    rate=(); cpu=(--cpu-bound)
    if [[ $link == 1gbit ]]; then rate=(--rate 1gbit); cpu=(); fi
    echo "== calibrate: $link (2 namespaces)"
    bench/netns_run.sh -n 2 "${rate[@]}" -- "$tandem" model calibrate -o "$cal" --link "$link" "${cpu[@]}" -n "$iters" \
      | grep -v '^\[1\]' || true
    for n in "${oversubscribed[@]}"; do
      echo "== calibrate: $link step, $n namespaces on $cores cores"
      bench/netns_run.sh -n "$n" "${rate[@]}" -- "$tandem" model calibrate -o "$cal" --link "$link" --step-only \
        | grep '^\[0\] ' || true
    done
    for n in 2 3 4; do
      echo "== measure: $n namespaces, $link"
      bench/netns_run.sh -n "$n" "${rate[@]}" -- "$tandem" bench allreduce -b 4K "${sweep[@]}" | grep "^\[0\] {" > "$out/$link$n.json"
      cases+=(--case "${n}x1:$link=$out/$link$n.json")
    done
  done
  # Two hosts of two ranks at 1 Gbit/s: the flat ring and the hierarchical all-reduce.
  for algo in ring hierarchical; do
    echo "== measure: 2 hosts x 2 ranks, 1gbit, $algo"
    bench/netns_run.sh -n 4 --per-host 2 --rate 1gbit -- "$tandem" bench allreduce -b 64K "${sweep[@]}" --algorithm "$algo" \
      | grep "^\[0\] {" > "$out/1gbit2x2$algo.json"
    cases+=(--case "2x2:1gbit=$out/1gbit2x2$algo.json")
  done
else
  echo "model_validate: not root (or no iproute2): namespace cases skipped" >&2
fi

echo "== validate"
"$tandem" model validate -c "$cal" "${cases[@]}" | tee "$out/validation.txt"
