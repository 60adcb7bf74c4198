#!/usr/bin/env bash
# netns_run.sh: run one tandem rank per network namespace, the namespaces
# joined by a real (optionally rate-limited) link, to benchmark collectives
# between "hosts" on one machine.
#
#   bench/netns_run.sh -n 2 --rate 1gbit -- tandem bench allreduce -b 1M -e 64M
#
# Topology. 2 ranks: one veth pair, rank 0 in namespace h0 (10.77.0.1/24),
# rank 1 in h1 (10.77.0.2/24). More ranks: a bridge in a separate "switch"
# namespace and one veth per host (rank r at 10.77.0.<r+1>). The root
# namespace's interfaces are never touched. --rate limits every link in both
# directions with tc tbf (this kernel has no netem; tbf is enough for a rate).
#
# Bootstrap. Each rank gets TANDEM_RANK, TANDEM_WORLD_SIZE,
# TANDEM_LOCAL_RANK=0, TANDEM_LOCAL_WORLD_SIZE=1 and
# TANDEM_STORE_ADDR=10.77.0.1:<port> with TANDEM_HOST_STORE=1: rank 0 hosts
# the bootstrap store on its own veth address, so the store traffic crosses
# the link as well. Each rank also gets its own UTS namespace and hostname
# (node0, node1, ...).
#
# Why the link is real. Network namespaces share the IPC namespace, so UCX
# would otherwise move data between them through sysv/cma shared memory and
# never touch the veth. The script sets UCX_TLS=tcp,self and TANDEM_SHM=0
# (tandem already counts ranks in different namespaces as different hosts;
# the variable makes it explicit), prints that, and prints the bytes every
# veth carried when the job ends.
#
# Output: every line of rank r is prefixed "[r] ". Exit code: 0 when every
# rank exits 0, else the first failing rank's code (124: --timeout hit).
# Cleanup: on exit, error or Ctrl-C the script kills what still runs in its
# namespaces and deletes them (namespaces are named tnr<pid>h<r>, tnr<pid>sw;
# ones left by a killed run, whose pid is gone, are deleted by the next run).
# Needs root, iproute2 (ip, tc) and util-linux (unshare).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/netns_run.sh [options] -- command [args...]
  -n, --nranks N      ranks, one per network namespace (>= 2; default 2)
  --per-host K        K ranks per namespace instead (host-major: rank r on host r / K; K divides N);
                      the ranks of a host keep tandem's shared memory (TANDEM_SHM=1)
  --rate RATE         limit every link in both directions with tc tbf (e.g. 1gbit, 200mbit)
  --burst SIZE        tbf burst (default 256kb; must exceed one GSO packet, 64 KiB)
  --queue TIME        tbf queue as the longest wait a packet may have (default 20ms); packets
                      beyond it are dropped, and TCP's retransmissions then show in the timings
  --port P            store port on rank 0 (default 29400)
  --net A.B.C         /24 of the link (default 10.77.0)
  --timeout S         kill the ranks after S seconds (exit 124; default 0 = none)
  --bind auto|none    auto (default): each host runs on its own equal share of this script's CPUs
                      when there are at least as many CPUs as hosts, as separate machines would;
                      none: every rank may run on every CPU
  --env K=V           extra environment for every rank (repeatable); may override the defaults
  -h, --help          this text
The command runs in each namespace with TANDEM_RANK etc. set; a bare `tandem`
is found in ./build/bin when it is not on PATH.
EOF
}

nranks=2 per_host=1 rate="" burst="256kb" queue="20ms" port=29400 net="10.77.0" timeout_s=0 bind=auto
extra_env=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--nranks) nranks="$2"; shift 2 ;;
    --per-host) per_host="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --burst) burst="$2"; shift 2 ;;
    --queue) queue="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --net) net="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --bind) bind="$2"; shift 2 ;;
    --env) extra_env+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "netns_run: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 ]]; then echo "netns_run: no command given (put it after --)" >&2; usage >&2; exit 2; fi
if ! [[ "$nranks" =~ ^[0-9]+$ ]] || (( nranks < 2 || nranks > 200 )); then
  echo "netns_run: -n must be an integer in 2..200 (got '$nranks')" >&2; exit 2
fi
if ! [[ "$per_host" =~ ^[0-9]+$ ]] || (( per_host < 1 || nranks % per_host != 0 || nranks / per_host < 2 )); then
  echo "netns_run: --per-host must divide -n and leave at least 2 hosts (got $per_host for $nranks ranks)" >&2; exit 2
fi
nhosts=$((nranks / per_host))
if ! [[ "$timeout_s" =~ ^[0-9]+$ ]]; then echo "netns_run: --timeout must be whole seconds" >&2; exit 2; fi
if [[ "$bind" != auto && "$bind" != none ]]; then echo "netns_run: --bind takes auto or none (got '$bind')" >&2; exit 2; fi
if (( EUID != 0 )); then echo "netns_run: needs root (creates network namespaces, veths, qdiscs)" >&2; exit 2; fi
for tool in ip tc unshare taskset; do
  command -v "$tool" >/dev/null || { echo "netns_run: '$tool' not found (install iproute2 / util-linux)" >&2; exit 2; }
done

# A bare `tandem` from the source tree's build when it is not installed.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v "$1" >/dev/null && [[ -x "$repo/build/bin/$1" ]]; then
  export PATH="$repo/build/bin:$PATH"
fi
command -v "$1" >/dev/null || { echo "netns_run: command '$1' not found" >&2; exit 2; }

base="tnr$$"
ns() { echo "${base}h$1"; }
switch_ns="${base}sw"
tmp="$(mktemp -d /tmp/netns_run.XXXXXX)"
made=()
pids=()

# shellcheck disable=SC2317  # reached through the traps
cleanup() {
  trap - EXIT INT TERM
  for n in "${made[@]}"; do  # whatever still runs in our namespaces (the ranks and their children)
    ip netns pids "$n" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for n in "${made[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "netns_run: interrupted, cleaning up" >&2; exit 130' INT TERM

# Namespaces of earlier runs whose script is gone.
for n in $(ip netns list | awk '{print $1}' | grep -E '^tnr[0-9]+(h[0-9]+|sw)$' || true); do
  pid="${n#tnr}"; pid="${pid%%[hs]*}"
  if ! kill -0 "$pid" 2>/dev/null; then ip netns del "$n" 2>/dev/null || true; fi
done

shape() {  # namespace device: tbf on its egress (a short queue keeps the rate honest)
  [[ -z "$rate" ]] || tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency "$queue"
}

for ((r = 0; r < nhosts; ++r)); do
  ip netns add "$(ns $r)"; made+=("$(ns $r)")
  ip -n "$(ns $r)" link set lo up
done
links=()  # "namespace device" of each host's end, for the byte counts at the end
if (( nhosts == 2 )); then
  ip link add tnr$$a netns "$(ns 0)" type veth peer name tnr$$b netns "$(ns 1)"
  ip -n "$(ns 0)" link set tnr$$a name eth0
  ip -n "$(ns 1)" link set tnr$$b name eth0
  topology="one veth pair"
else
  ip netns add "$switch_ns"; made+=("$switch_ns")
  ip -n "$switch_ns" link add br0 type bridge
  ip -n "$switch_ns" link set br0 up
  for ((r = 0; r < nhosts; ++r)); do
    ip -n "$switch_ns" link add "p$r" type veth peer name eth0 netns "$(ns $r)"
    ip -n "$switch_ns" link set "p$r" master br0 up
    shape "$switch_ns" "p$r"
  done
  topology="a bridge (namespace $switch_ns) and one veth per host"
fi
for ((r = 0; r < nhosts; ++r)); do
  ip -n "$(ns $r)" addr add "$net.$((r + 1))/24" dev eth0
  ip -n "$(ns $r)" link set eth0 up
  shape "$(ns $r)" eth0
  links+=("$(ns $r)")
done

# Carrier comes up asynchronously; ranks that list interfaces too early see
# theirs down and leave it out of the interface selection.
for ((r = 0; r < nhosts; ++r)); do
  for ((try = 0; try < 100; ++try)); do
    [[ "$(ip netns exec "$(ns $r)" cat /sys/class/net/eth0/operstate)" == up ]] && break
    sleep 0.05
  done
  [[ "$(ip netns exec "$(ns $r)" cat /sys/class/net/eth0/operstate)" == up ]] ||
    { echo "netns_run: eth0 of node$r did not come up" >&2; exit 1; }
done

# Binding. Without it the scheduler mixes both "hosts'" compute, progress
# threads and network work over every CPU; with it a host's work, the
# kernel's share of its traffic included, stays on the CPUs it was given.
cpus=()  # this script's allowed CPUs, from a list such as 0-3,6
IFS=, read -ra ranges <<<"$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)"
for range in "${ranges[@]}"; do
  for ((c = ${range%-*}; c <= ${range#*-}; ++c)); do cpus+=("$c"); done
done
host_cpus() {  # the CPU list of host $1 under --bind auto, empty when unbound
  [[ "$bind" == auto ]] && (( ${#cpus[@]} >= nhosts )) || return 0
  local share=$(( ${#cpus[@]} / nhosts )) list=()
  for ((c = $1 * share; c < ($1 + 1) * share; ++c)); do list+=("${cpus[$c]}"); done
  (IFS=,; echo "${list[*]}")
}
if [[ -n "$(host_cpus 0)" ]]; then
  binding="each host on its own CPUs: $(for ((r = 0; r < nhosts; ++r)); do printf 'node%d %s; ' "$r" "$(host_cpus $r)"; done)"
else
  binding="none (--bind $bind, ${#cpus[@]} CPUs for $nhosts hosts)"
fi

store="$net.1:$port"
shm=0
(( per_host == 1 )) || shm=1
rank_env() {
  echo TANDEM_RANK="$1" TANDEM_WORLD_SIZE="$nranks" TANDEM_LOCAL_RANK=$(($1 % per_host)) \
    TANDEM_LOCAL_WORLD_SIZE="$per_host" TANDEM_STORE_ADDR="$store" TANDEM_HOST_STORE=1 TANDEM_ALLOW_NO_SECRET=1 UCX_TLS=tcp,self TANDEM_SHM=$shm
}
echo "netns_run: $nranks ranks ($per_host per host) in namespaces $(ns 0)..$(ns $((nhosts - 1))), joined by $topology, subnet $net.0/24"
echo "netns_run: link rate: ${rate:-unlimited}${rate:+ per direction (tc tbf, burst $burst, queue $queue)}"
echo "netns_run: store on rank 0 at $store (TANDEM_HOST_STORE=1)"
if (( per_host == 1 )); then
  echo "netns_run: UCX_TLS=tcp,self and TANDEM_SHM=0: data crosses the veth over TCP, not UCX or tandem shared memory"
else
  echo "netns_run: UCX_TLS=tcp,self: data between hosts crosses the veth over TCP; within a host tandem's shared memory"
fi
echo "netns_run: binding: ${binding%; }"
[[ ${#extra_env[@]} -eq 0 ]] || echo "netns_run: extra environment: ${extra_env[*]}"
echo "netns_run: command: $*"

limit=()
(( timeout_s == 0 )) || limit=(timeout --kill-after=5 "$timeout_s")
for ((r = 0; r < nranks; ++r)); do
  on_cpus=()
  bound="$(host_cpus $((r / per_host)))"
  [[ -z "$bound" ]] || on_cpus=(taskset -c "$bound")
  # shellcheck disable=SC2046  # rank_env's words are K=V pairs without spaces
  ( set +e
    # shellcheck disable=SC2016  # $0 and $@ belong to the inner sh
    ip netns exec "$(ns $((r / per_host)))" unshare --uts sh -c 'hostname "$0" && exec "$@"' "node$((r / per_host))" \
      env $(rank_env $r) "${extra_env[@]}" "${limit[@]}" "${on_cpus[@]}" "$@" 2>&1
    echo $? > "$tmp/rc$r"
  ) | sed -u "s/^/[$r] /" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()

code=0
for ((r = 0; r < nranks; ++r)); do
  rc="$(cat "$tmp/rc$r" 2>/dev/null || echo 1)"
  if [[ "$rc" != 0 ]]; then
    echo "netns_run: rank $r exited with $rc" >&2
    (( code != 0 )) || code="$rc"
  fi
done
for ((r = 0; r < nhosts; ++r)); do
  tx=$(ip netns exec "${links[$r]}" cat /sys/class/net/eth0/statistics/tx_bytes)
  rx=$(ip netns exec "${links[$r]}" cat /sys/class/net/eth0/statistics/rx_bytes)
  echo "netns_run: node$r eth0 ($net.$((r + 1))) sent $tx bytes, received $rx bytes"
done
if [[ -n "$rate" ]]; then  # drops at the shaper mean TCP retransmissions: timings then carry their stalls
  for ((r = 0; r < nhosts; ++r)); do
    drops=$(tc -s -n "$(ns $r)" qdisc show dev eth0 | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
    echo "netns_run: node$r tbf dropped ${drops:-?} packets"
  done
fi
exit "$code"
