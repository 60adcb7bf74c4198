#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, the libraries
# instrumented too) in $FUZZ_BUILD_DIR (default build-fuzz) and runs each for
# SECONDS (default 25) from the checked-in corpus, new inputs going to a
# scratch directory. Prints executions per target; exits non-zero on the first
# finding (its input is kept as $FUZZ_BUILD_DIR/fuzz/<target>-crash-*).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-25}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
TARGETS=(store_frames handshake text shm_header fingerprint)

command -v clang++ >/dev/null || { echo "fuzz/run.sh: clang++ not found (scripts/setup.sh installs clang)" >&2; exit 1; }
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON \
    -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_TRAINER=OFF -DTANDEM_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fsanitize=fuzzer-no-link -fno-omit-frame-pointer"
fi
ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]/#/fuzz_}"

# UCX's memory hooks do not mix with ASan's allocator; nothing here starts UCX, but be safe.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${TARGETS[@]}"; do
  work=$(mktemp -d)
  log="$BUILD/fuzz/$t.log"
  if "$BUILD/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$BUILD/fuzz/$t-" "$work" "fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    corpus=$(ls "$work" | wc -l)
    echo "fuzz $t: ${runs:-?} executions in ${SECONDS_EACH} s, $cov, $corpus new inputs, no findings"
  else
    echo "fuzz $t: FINDING (log: $log)"; tail -40 "$log"; status=1
  fi
  rm -rf "$work"
done
exit $status
