#!/bin/bash
# ucx_bw.sh - transport limit: UCX point-to-point (UCP tag_bw, 2 processes, one direction) on loopback,
# per transport, plus iperf3 TCP loopback. Interleaved rounds; summarize with the median.
# Env: ROUNDS=3  TLS_LIST="posix sysv posix,cma sysv,cma tcp"  SIZES="65536 1048576 16777216 67108864"
#      OUT=build/anchors/results/ucx_raw.csv  IPERF=1 (also run iperf3 -c 127.0.0.1, 1 and 2 streams, 3 s each)
# In the CSV a comma in UCX_TLS is written as '+'. ucx_perftest prints MB/s with MB = 2^20 bytes; the CSV converts to GB/s = 1e9 B/s.
# UCX_TLS=posix / sysv: data copied through the shared-memory FIFO (eager; rendezvous via AM pipeline).
# UCX_TLS=posix,cma: large messages go rendezvous with process_vm_readv zero-copy (one copy).
# UCX_TLS=tcp: UCX_NET_DEVICES=lo (loopback only).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${ROUNDS:-3}
TLS_LIST=${TLS_LIST:-"posix sysv posix,cma sysv,cma tcp"}
SIZES=${SIZES:-"65536 1048576 16777216 67108864"}
OUT=${OUT:-$(cd "$HERE/../.." && pwd)/build/anchors/results/ucx_raw.csv}
IPERF=${IPERF:-1}
mkdir -p "$(dirname "$OUT")"
echo "# round,test,tls,bytes,iters,bw_MiBps,bw_GBps,lat_avg_us" > "$OUT"
port=14000
read -r -a tls_arr <<< "$TLS_LIST"
nt=${#tls_arr[@]}
for ((r = 0; r < ROUNDS; r++)); do
  for s in $SIZES; do
    n=$(( (2 << 30) / s )); [ $n -lt 32 ] && n=32; [ $n -gt 20000 ] && n=20000
    w=$(( n / 10 )); [ $w -lt 4 ] && w=4
    for ((j = 0; j < nt; j++)); do
      tl=${tls_arr[$(((j + r) % nt))]}
      port=$((port + 1))
      envs=(UCX_TLS="$tl" UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n)
      env "${envs[@]}" timeout 60 ucx_perftest -p $port -t tag_bw -s "$s" -n $n -w $w -f > /dev/null 2>&1 &
      spid=$!
      sleep 0.3
      line=$(env "${envs[@]}" timeout 60 ucx_perftest 127.0.0.1 -p $port -t tag_bw -s "$s" -n $n -w $w -f 2>/dev/null \
        | grep -E '^ +[0-9]+ ' | tail -1)
      wait $spid 2>/dev/null
      if [ -n "$line" ]; then
        # fields: iters p50_lat avg_lat overall_lat bw_avg bw_overall msgrate_avg msgrate_overall
        echo "$line" | awk -v r=$r -v tl="${tl//,/+}" -v s="$s" '{printf "%d,tag_bw,%s,%s,%s,%.1f,%.3f,%.2f\n", r, tl, s, $1, $6, $6*1048576/1e9, $3}' >> "$OUT"
      else
        echo "$r,tag_bw,${tl//,/+},$s,0,fail,fail,fail" >> "$OUT"
      fi
    done
  done
  if [ "$IPERF" = 1 ] && command -v iperf3 > /dev/null; then
    for P in 1 2; do
      port=$((port + 1))
      timeout 20 iperf3 -s -1 -B 127.0.0.1 -p $port > /dev/null 2>&1 &
      spid=$!
      sleep 0.3
      bps=$(timeout 20 iperf3 -c 127.0.0.1 -p $port -t 3 -P $P -J 2>/dev/null | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null)
      wait $spid 2>/dev/null
      if [ -n "$bps" ]; then
        awk -v r=$r -v P=$P -v b="$bps" 'BEGIN{printf "%d,iperf3_tcp_lo,P%d,0,0,%.1f,%.3f,0\n", r, P, b/8/1048576, b/8/1e9}' >> "$OUT"
      else
        echo "$r,iperf3_tcp_lo,P$P,0,0,fail,fail,fail" >> "$OUT"
      fi
    done
  fi
done
# summary: median GB/s over rounds
python3 - "$OUT" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith('#'): continue
    f = l.strip().split(',')
    if f[6] == 'fail': d[(f[1], f[2], int(f[3]))].append(None); continue
    d[(f[1], f[2], int(f[3]))].append(float(f[6]))
print("test,tls,bytes,median_GBps,min_GBps,max_GBps,rounds")
for k in sorted(d):
    v = [x for x in d[k] if x is not None]
    if not v: print(f"{k[0]},{k[1]},{k[2]},fail,,,{len(d[k])}"); continue
    print(f"{k[0]},{k[1]},{k[2]},{statistics.median(v):.2f},{min(v):.2f},{max(v):.2f},{len(v)}")
EOF
