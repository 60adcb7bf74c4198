#!/bin/bash
# run_gloo.sh NRANKS ALGO SIZES_CSV [REPS] - launch NRANKS gloo_allreduce processes on loopback.
# PIN=1 pins rank r to cpu r % nproc with taskset. Rank 0's CSV goes to stdout; other ranks' output to stderr.
# The program comes from $BUILD (default build/anchors in the repository; build.sh makes it).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
N=$1; ALGO=$2; SIZES=$3; REPS=${4:-7}
BUILD=${BUILD:-$(cd "$HERE/../.." && pwd)/build/anchors}
STORE=$(mktemp -d /tmp/anchors-gloostore.XXXXXX)
NCPU=$(nproc)
pin() { [ "${PIN:-0}" = 1 ] && echo "taskset -c $(( $1 % NCPU ))"; }
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' TERM INT
for ((r=1; r<N; r++)); do
  $(pin $r) "$BUILD/gloo_allreduce" $r $N "$STORE" "$ALGO" "$SIZES" "$REPS" 1>&2 &
  pids+=($!)
done
$(pin 0) "$BUILD/gloo_allreduce" 0 $N "$STORE" "$ALGO" "$SIZES" "$REPS"
rc=$?
for p in "${pids[@]}"; do wait $p || rc=$?; done
rm -rf "$STORE"
exit $rc
