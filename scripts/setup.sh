#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian 12. Idempotent: only
# missing packages are installed, and `apt-get update` runs only then.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang-format  # scripts/check_format.sh (CI): the code as .clang-format writes it
  libucx-dev ucx-utils libhwloc-dev libboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libspdlog-dev libeigen3-dev libssl-dev
  gnuplot-nox iproute2 python3
  openmpi-bin  # tests/bench_test.cc runs tandem bench under mpirun; mpicc (bench/anchors) is its own setup.sh's
  iperf3  # bench/tcp_line_rate.sh: the line rate the TCP all-reduce is compared with
  openssh-server openssh-client  # tests/ssh_launch_test.cc: tandem launch over real ssh between namespaces
  pybind11-dev python3-dev python3-numpy
  python3-pip python3-setuptools python3-wheel  # pip install . (pyproject.toml, setup.py), tested offline
  libtorch-dev python3-torch python3-yaml dataset-fashion-mnist zlib1g-dev
  # LibTorch's linear layers call the system BLAS; without an optimised one Debian
  # falls back to the reference BLAS (5x slower training steps here). The OpenMP
  # build follows torch.set_num_threads / torch::set_num_threads.
  libopenblas0-openmp
  clang libclang-rt-14-dev  # make fuzz: libFuzzer, ASan and UBSan runtimes (a recommends, so named here)
)

die() { echo "setup.sh: error: $*" >&2; exit 1; }

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  die "dpkg-query/apt-get not found; this script supports Debian 12. Install these packages by other means: ${PACKAGES[*]}"
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#PACKAGES[@]} packages are installed"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  # Without a terminal (CI) sudo must not wait for a password prompt.
  if [[ -t 0 ]]; then as_root=(sudo); else as_root=(sudo -n); fi
else
  die "need root to install: ${missing[*]} (run as root, or install sudo)"
fi

echo "setup.sh: installing ${#missing[@]} missing package(s): ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup.sh: done"
