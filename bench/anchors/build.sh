#!/bin/bash
# build.sh - compile the comparison programs into $BUILD (default build/anchors in the repository; never the
# source tree). Open MPI's programs need openmpi-bin and libopenmpi-dev; MPICH's (mpich_*) and Gloo's are built
# only where mpich/libmpich-dev and libgloo-dev are installed (README.md says how).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-$REPO/build/anchors}
mkdir -p "$BUILD"
command -v mpicc >/dev/null || {
  echo "build.sh: mpicc not found: apt-get install openmpi-bin libopenmpi-dev (or run bench/anchors/setup.sh)" >&2
  exit 2
}
set -x
gcc -O3 -march=native -fopenmp -o "$BUILD/membw" "$HERE/membw.c"
gcc -O2 -Wall -o "$BUILD/pingpong" "$HERE/pingpong.c"
mpicc -O3 -march=native -o "$BUILD/mpi_allreduce" "$HERE/mpi_allreduce.c"
mpicc -O3 -march=native -o "$BUILD/mpi_coll" "$HERE/mpi_coll.c"
{ set +x; } 2>/dev/null
if command -v mpicc.mpich >/dev/null; then
  set -x
  mpicc.mpich -O3 -march=native -o "$BUILD/mpich_allreduce" "$HERE/mpi_allreduce.c"
  mpicc.mpich -O3 -march=native -o "$BUILD/mpich_coll" "$HERE/mpi_coll.c"
  { set +x; } 2>/dev/null
else
  echo "build.sh: MPICH not installed (apt-get install mpich libmpich-dev): the mpich impl stays unavailable" >&2
fi
if echo "#include <gloo/allreduce.h>" | g++ -std=c++17 -E -x c++ - >/dev/null 2>&1; then
  set -x
  g++ -O3 -march=native -std=c++17 -o "$BUILD/gloo_allreduce" "$HERE/gloo_allreduce.cc" -lgloo -lpthread
  { set +x; } 2>/dev/null
else
  echo "build.sh: Gloo's headers not installed (apt-get install libgloo-dev): the gloo_* impls stay unavailable" >&2
fi
echo "build.sh: programs in $BUILD"
