#!/bin/bash
# setup.sh - install the Debian 12 packages the comparison programs need (root; Debian's archive only). tandem's
# own build does not need them (scripts/setup.sh), so CI does not install them.
set -eu
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  build-essential libgloo-dev libopenmpi-dev openmpi-bin python3-torch \
  ucx-utils libucx-dev iperf3 iproute2 iputils-ping mpich libmpich-dev
# python3-torch is for /usr/bin/python3 (Debian's python), not a pyenv python.
/usr/bin/python3 -c "import torch, torch.distributed as d; print('torch', torch.__version__, 'gloo', d.is_gloo_available())"
