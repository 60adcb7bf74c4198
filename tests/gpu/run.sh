#!/usr/bin/env bash
# The GPU test tier in one command: builds tests/gpu (nvcc, CMake and Ninja are
# all it needs), then checks every CUDA kernel against the CPU functors and
# times it against a device-to-device copy, printing one table. Exits non-zero
# on a mismatch or a CUDA error. Without a GPU it says so and exits 0 after the
# build (TANDEM_GPU_REQUIRED=1 makes that a failure).
#
#   tests/gpu/run.sh [--quick] [--check-only | --bandwidth-only] [--samples N] [--json FILE]
#
# Environment: TANDEM_GPU_BUILD (build folder, default build-gpu at the
# repository root), TANDEM_GPU_TIMEOUT (seconds each run may take, default
# 600: a hung kernel fails the tier instead of stalling it), TANDEM_CUDA_ARCHITECTURES (default: the GPU's own, else
# the library's list), TANDEM_GPU_SANITIZE=1 (then the quick checks again
# under compute-sanitizer's memcheck, which sees reads out of bounds too), JOBS.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${TANDEM_GPU_BUILD:-$root/build-gpu}

[[ -d /usr/local/cuda/bin ]] && PATH="$PATH:/usr/local/cuda/bin"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "tests/gpu: nvcc not found (install a CUDA toolkit, or put its bin/ on PATH)" >&2
  exit 1
fi

# Build for the GPU that is here (sm_90 on an H100 or H200); without one, for the library's list.
archs=${TANDEM_CUDA_ARCHITECTURES:-}
if [[ -z $archs ]] && cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1); then
  archs=${cap//./}
fi
configure=(-DCMAKE_BUILD_TYPE=Release)
[[ -n $archs ]] && configure+=("-DTANDEM_CUDA_ARCHITECTURES=$archs")

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S "$here" -B "$build" "${generator[@]}" "${configure[@]}" >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || true
fi
limit=${TANDEM_GPU_TIMEOUT:-600}
status=0
timeout "$limit" "$build/tandem-gpu-kernels" "$@" || status=$?
if ((status == 124)); then
  echo "tests/gpu: tandem-gpu-kernels ran past $limit s (TANDEM_GPU_TIMEOUT) and was stopped" >&2
fi
if ((status == 77)); then
  if [[ ${TANDEM_GPU_REQUIRED:-0} == 1 ]]; then
    echo "tests/gpu: no GPU, and TANDEM_GPU_REQUIRED=1" >&2
    exit 1
  fi
  echo "tests/gpu: built; no GPU here, so nothing ran"
  exit 0
fi
if ((status == 0)) && [[ ${TANDEM_GPU_SANITIZE:-0} == 1 ]]; then
  echo "compute-sanitizer memcheck, quick checks:"
  timeout "$limit" compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tandem-gpu-kernels" --quick \
    --check-only || status=$?
fi
exit "$status"
