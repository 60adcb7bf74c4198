#!/bin/bash
# allreduce_sweep.sh - interleaved float32 sweep of tandem and the other implementations on one host (loopback and
# shared memory). Run from anywhere; bench/anchors/build.sh first.
#
# Every round runs every (nranks, impl) once, the impl order rotated each round, so slow drifts of the shared host
# hit all implementations alike. Each launch runs all SIZES (see the *_allreduce sources for the per-size timing
# method) and is bounded by LAUNCH_TIMEOUT seconds. summarize.py takes the median over rounds. Before each launch
# the log records the host-state probe (pingpong shm_spin: one-way cache-line hand-off, us). Env knobs (defaults):
#   ROUNDS=3  REPS=7  BATCH_S=0.1  LAUNCH_TIMEOUT=240  NRANKS_LIST="2 4"
#   SIZES=4096,65536,1048576,16777216,67108864,268435456
#   COLL=allreduce: or alltoall sendrecv reduce gather scatter allgather reduce_scatter broadcast, for the MPI
#     programs (mpi_coll.c) and `tandem bench COLL` (run_tandem.sh); torch and gloo_* are all-reduce only,
#     bound_* all-to-all only.
#   BUILD=build/anchors (the programs)  RES=$BUILD/results  OUT=$RES/allreduce_raw.csv (the log beside it)
#   TANDEM_BIN=build/bin/tandem  TANDEM_OLD_BIN (tandem_old)  BOUND_BIN=build/bench/tandem-alltoall-bound
#   IMPLS (default: every impl whose programs are built; the list below):
#     tandem         tandem bench, heap buffers, as run_tandem.sh runs it (cold: 5 untimed calls per launch)
#     tandem_reg     the same with Communicator::allocate_shared buffers (`tandem bench -R 1`)
#     tandem_warm    the same warmed up as mpi_coll.c warms Open MPI (run_tandem.sh, TANDEM_WARM=1)
#     tandem_old     the binary TANDEM_OLD_BIN, for a before/after in the same rounds
#     tandem_staged, tandem_cma
#                    tandem with every heap-buffer row staged, or by cross-memory attach from 16 KiB
#                    (TANDEM_SHM_PATHS, docs/algorithms.md "The path table")
#     mpi_vader      Open MPI, ob1 + vader shared memory (its default here); mpi_vader_nobind adds --bind-to none
#     mpi_ucx_shm    Open MPI over UCX shared memory; mpi_tcp, mpi_ucx_tcp over loopback TCP; mpi_default
#     mpich          MPICH 4 ch4 shared memory (built by build.sh where MPICH is installed)
#     gloo_ring gloo_oldring gloo_chunked gloo_hd gloo_hd_pin gloo_bcube
#                    Gloo from C++ over loopback TCP (built where libgloo-dev is installed)
#     torch torch_pin  PyTorch's gloo backend (/usr/bin/python3 with python3-torch)
#     bound_cma, bound_mapped
#                    the all-to-all's floor: tandem-alltoall-bound cma / mapped-stream (run_bound.sh)
#   torch/gloo ranks are not pinned unless *_pin (taskset rank r -> cpu r%2); mpirun binds ranks to cores by
#   default when not oversubscribed (np 2); tandem launch binds its ranks (docs/running.md).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export BUILD=${BUILD:-$REPO/build/anchors}
export TANDEM_BIN=${TANDEM_BIN:-$REPO/build/bin/tandem}
export TANDEM_OLD_BIN=${TANDEM_OLD_BIN:-}
export BOUND_BIN=${BOUND_BIN:-$REPO/build/bench/tandem-alltoall-bound}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-7}
export BATCH_S=${BATCH_S:-0.1}
LAUNCH_TIMEOUT=${LAUNCH_TIMEOUT:-240}
NRANKS_LIST=${NRANKS_LIST:-"2 4"}
SIZES=${SIZES:-4096,65536,1048576,16777216,67108864,268435456}
export COLL=${COLL:-allreduce}
RES=${RES:-$BUILD/results}
OUT=${OUT:-$RES/allreduce_raw.csv}
LOG=${OUT%.csv}.log

# What each impl needs before it can run: a program built, or a binary named.
needs() {
  case $1 in
    tandem | tandem_reg | tandem_warm | tandem_staged | tandem_cma) echo "$TANDEM_BIN" ;;
    tandem_old) echo "${TANDEM_OLD_BIN:-TANDEM_OLD_BIN}" ;;
    mpi_*) [ "$COLL" = allreduce ] && echo "$BUILD/mpi_allreduce" || echo "$BUILD/mpi_coll" ;;
    mpich) [ "$COLL" = allreduce ] && echo "$BUILD/mpich_allreduce" || echo "$BUILD/mpich_coll" ;;
    gloo_*) echo "$BUILD/gloo_allreduce" ;;
    torch | torch_pin) echo /usr/bin/python3 ;;
    bound_cma | bound_mapped) echo "$BOUND_BIN" ;;
    *) return 1 ;;
  esac
}
# How to provide what needs() names.
fix() {
  case $1 in
    tandem_old) echo "set TANDEM_OLD_BIN to the other tandem executable" ;;
    tandem*) echo "build it (ninja -C build tandem) or set TANDEM_BIN" ;;
    mpi_*) echo "run bench/anchors/build.sh (needs openmpi-bin libopenmpi-dev)" ;;
    mpich) echo "run bench/anchors/build.sh (needs mpich libmpich-dev)" ;;
    gloo_*) echo "run bench/anchors/build.sh (needs libgloo-dev)" ;;
    torch*) echo "install python3-torch" ;;
    bound_*) echo "build it (ninja -C build tandem-alltoall-bound) or set BOUND_BIN" ;;
  esac
}
ALL_IMPLS="tandem tandem_reg tandem_warm torch torch_pin gloo_ring gloo_oldring gloo_chunked gloo_hd gloo_hd_pin"
ALL_IMPLS="$ALL_IMPLS mpi_vader mpi_vader_nobind mpi_tcp mpi_ucx_shm mpi_ucx_tcp mpich"
if [ -z "${IMPLS:-}" ]; then
  IMPLS=""
  for impl in $ALL_IMPLS; do
    [ -x "$(needs "$impl")" ] && IMPLS="$IMPLS $impl"
  done
fi
read -r -a impls <<< "$IMPLS"
ni=${#impls[@]}
[ "$ni" -gt 0 ] || { echo "allreduce_sweep.sh: nothing to run: build the programs (bench/anchors/build.sh)" >&2; exit 2; }
for impl in "${impls[@]}"; do
  prog=$(needs "$impl") || {
    echo "allreduce_sweep.sh: unknown impl '$impl'; known: $ALL_IMPLS tandem_old tandem_staged tandem_cma" \
      "mpi_default gloo_bcube bound_cma bound_mapped" >&2
    exit 2
  }
  [ -x "$prog" ] || { echo "allreduce_sweep.sh: $impl needs $prog: $(fix "$impl")" >&2; exit 2; }
  case $impl in torch* | gloo_*) [ "$COLL" = allreduce ] || { echo "allreduce_sweep.sh: $impl runs COLL=allreduce only" >&2; exit 2; } ;; esac
  case $impl in bound_*) [ "$COLL" = alltoall ] || { echo "allreduce_sweep.sh: $impl runs COLL=alltoall only" >&2; exit 2; } ;; esac
done
[ -x "$BUILD/pingpong" ] || { echo "allreduce_sweep.sh: no host-state probe at $BUILD/pingpong: run bench/anchors/build.sh" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
: > "$LOG"

# loopback only: OOB and TCP BTL pinned to lo; UCX tcp pinned to lo.
MPI="mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo"
if [ "$COLL" = allreduce ]; then MPIPROG="mpi_allreduce"; MPICHPROG="mpich_allreduce"
else MPIPROG="mpi_coll $COLL"; MPICHPROG="mpich_coll $COLL"; fi

run_impl() {  # impl nranks
  local impl=$1 n=$2
  case $impl in
    torch)        "$HERE/run_torch.sh" "$n" "$SIZES" "$REPS" ;;
    gloo_ring)    "$HERE/run_gloo.sh" "$n" ring "$SIZES" "$REPS" ;;
    gloo_bcube)   "$HERE/run_gloo.sh" "$n" bcube "$SIZES" "$REPS" ;;
    gloo_oldring) "$HERE/run_gloo.sh" "$n" oldring "$SIZES" "$REPS" ;;
    gloo_chunked) "$HERE/run_gloo.sh" "$n" chunked "$SIZES" "$REPS" ;;
    gloo_hd)      "$HERE/run_gloo.sh" "$n" hd "$SIZES" "$REPS" ;;
    gloo_hd_pin)  PIN=1 "$HERE/run_gloo.sh" "$n" hd "$SIZES" "$REPS" | sed 's/,hd,/,hd-pinned,/' ;;
    torch_pin)    PIN=1 TORCH_VARIANT=gloo-pinned "$HERE/run_torch.sh" "$n" "$SIZES" "$REPS" ;;
    mpi_default)  $MPI -np "$n" -x BATCH_S "$BUILD/"$MPIPROG default "$SIZES" "$REPS" ;;
    mpi_vader)    $MPI -np "$n" -x BATCH_S --mca pml ob1 --mca btl vader,self \
                    "$BUILD/"$MPIPROG ob1-vader "$SIZES" "$REPS" ;;
    mpi_vader_nobind) $MPI -np "$n" -x BATCH_S --bind-to none --mca pml ob1 --mca btl vader,self \
                    "$BUILD/"$MPIPROG ob1-vader-nobind "$SIZES" "$REPS" ;;
    mpi_tcp)      $MPI -np "$n" -x BATCH_S --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
                    "$BUILD/"$MPIPROG ob1-tcp "$SIZES" "$REPS" ;;
    mpi_ucx_shm)  $MPI -np "$n" -x BATCH_S --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
                    -x UCX_TLS=self,sm "$BUILD/"$MPIPROG ucx-sm "$SIZES" "$REPS" ;;
    mpi_ucx_tcp)  $MPI -np "$n" -x BATCH_S --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
                    -x UCX_TLS=self,tcp -x UCX_NET_DEVICES=lo "$BUILD/"$MPIPROG ucx-tcp "$SIZES" "$REPS" ;;
    mpich)        mpirun.mpich -np "$n" -genv BATCH_S "$BATCH_S" "$BUILD/"$MPICHPROG mpich "$SIZES" "$REPS" ;;
    tandem)       "$HERE/run_tandem.sh" "$n" "$SIZES" "$REPS" ;;
    tandem_reg)   TANDEM_VARIANT=registered TANDEM_BENCH_ARGS="-R 1 ${TANDEM_BENCH_ARGS:-}" \
                    "$HERE/run_tandem.sh" "$n" "$SIZES" "$REPS" ;;
    tandem_warm)  TANDEM_VARIANT=warm TANDEM_WARM=1 "$HERE/run_tandem.sh" "$n" "$SIZES" "$REPS" ;;
    tandem_old)   TANDEM_VARIANT=old TANDEM_BIN=$TANDEM_OLD_BIN "$HERE/run_tandem.sh" "$n" "$SIZES" "$REPS" ;;
    tandem_staged) TANDEM_VARIANT=staged TANDEM_SHM_PATHS='*:heap:*=staged' "$HERE/run_tandem.sh" "$n" "$SIZES" "$REPS" ;;
    tandem_cma)   TANDEM_VARIANT=cma TANDEM_SHM_PATHS='allreduce:heap:16K-=cma' "$HERE/run_tandem.sh" "$n" "$SIZES" "$REPS" ;;
    bound_cma)    "$HERE/run_bound.sh" cma "$n" "$SIZES" "$REPS" ;;
    bound_mapped) "$HERE/run_bound.sh" mapped-stream "$n" "$SIZES" "$REPS" ;;
    *) echo "unknown impl $impl" >&2; return 2 ;;
  esac
}

echo "# round,impl,variant,nranks,bytes,K,reps,median_us,min_us,max_us,algbw_GBps,busbw_GBps" >> "$OUT"
for ((r = 0; r < ROUNDS; r++)); do
  for n in $NRANKS_LIST; do
    for ((j = 0; j < ni; j++)); do
      impl=${impls[$(((j + r) % ni))]}
      probe=$("$BUILD/pingpong" 20000 3 shm_spin 2>/dev/null | awk -F, '/^shm_spin/{print $4}')
      t0=$(date +%s%N)
      tmp=$(mktemp)
      timeout -k 10 "$LAUNCH_TIMEOUT" bash -c "$(declare -f run_impl); HERE='$HERE' BUILD='$BUILD' SIZES='$SIZES' REPS='$REPS' MPI='$MPI' MPIPROG='$MPIPROG' MPICHPROG='$MPICHPROG' run_impl $impl $n" \
        > "$tmp" 2>> "$LOG"
      rc=$?
      dt=$(( ($(date +%s%N) - t0) / 1000000 ))
      grep -v '^#' "$tmp" | sed "s/^/$r,/" >> "$OUT"
      printf 'round=%d nranks=%d impl=%-16s rc=%d %6dms rows=%d probe_shm_spin_us=%s\n' "$r" "$n" "$impl" \
        "$rc" "$dt" "$(grep -vc '^#' "$tmp")" "$probe" | tee -a "$LOG"
      rm -f "$tmp"
      # on timeout, GNU timeout signals its whole process group (launchers also kill their ranks by pid)
      if [ "$rc" != 0 ]; then sleep 2; fi
    done
  done
done
echo "allreduce_sweep.sh: rows in $OUT; python3 $HERE/summarize.py $OUT for the tables"
