#!/usr/bin/env bash
# ingest-capacity.sh: how many live streams one core of `mdag serve` ingests
# at >= 98% finish rate (frames finished within the app's SLO / frames sent),
# per codec, beside the decode bound (ingest/vpx, ingest/avc benchmarks).
#
#   tools/ingest-capacity.sh [BIN] [CODECS] [STREAM COUNTS] [SECONDS]
#   tools/ingest-capacity.sh bin/mdag "vp8 h264" "10 20 30 40 50" 20
#
# The server is pinned to core 0 with GOMAXPROCS=1 (taskset); the clients
# to core 1, sending a 640x480 clip encoded once (`mdag client
# --encode-once`, 2 Mb/s like the decode benchmarks; BITRATE overrides) at
# 10 fps on every stream, so encoding does not bound
# them. The app is the traffic example with emulated GPUs and no emulated
# objects (`--emulate-objects none`): the per-frame work is ingest (SRTP,
# depacketizing, decoding, conversion) plus the engine's scheduling of one
# GPU module. Admission is opened up (ceiling 1, a tiny predicted cost per
# new stream, no shedding, 500 streams) so the measurement, not the
# admission rule, finds the limit; streams refused anyway are counted.
set -euo pipefail
BIN=${1:-bin/mdag}
CODECS=${2:-"vp8 h264"}
COUNTS=${3:-"10 20 30 40 50 60"}
SECS=${4:-20}
PORT=${PORT:-18181}
command -v taskset >/dev/null || { echo "ingest-capacity: taskset (util-linux) is needed" >&2; exit 2; }
[ "$(nproc)" -ge 2 ] || { echo "ingest-capacity: needs 2 cores (server on one, clients on the other)" >&2; exit 2; }
printf "%-5s %7s %8s %9s %9s %8s %7s %7s %6s\n" codec streams sent finished finish p50ms p99ms cores errors
for codec in $CODECS; do
  for n in $COUNTS; do
    log=$(mktemp)
    GOMAXPROCS=1 taskset -c 0 "$BIN" serve --example traffic --listen 127.0.0.1:$PORT --emulate-objects none \
      --cpu-cores 1 --cpu-ceiling 1 --stream-cost 0.001 --shed-after=-1s --max-streams 500 --max-pending 500 --offer-burst-ip 1000 --offer-burst 1000 --workers V100=32,P100=32,CPU=32 >/dev/null 2>"$log" &
    srv=$!
    sleep 0.5; kill -0 $srv 2>/dev/null || { echo "ingest-capacity: serve did not start:" >&2; cat "$log" >&2; exit 1; }
    for _ in $(seq 100); do curl -sf http://127.0.0.1:$PORT/healthz >/dev/null 2>&1 && break; sleep 0.1; done
    t0=$(awk '{print $14+$15}' /proc/$srv/stat)
    out=$(taskset -c 1 "$BIN" client --server http://127.0.0.1:$PORT --app traffic --clients "$n" --codec "$codec" \
      --encode-once 30 --size 640x480 --fps 10 --bitrate "${BITRATE:-2000}" --duration "${SECS}s" -o json 2>/dev/null || true)
    t1=$(awk '{print $14+$15}' /proc/$srv/stat)
    kill -INT $srv; wait $srv 2>/dev/null || true
    echo "$out" | python3 -c '
import json, sys
codec, n, secs, ticks = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
try:
    t = json.load(sys.stdin)["total"]
except Exception:
    print(f"{codec:5} {n:7d}  client failed"); sys.exit()
sent, fin, p50, p99, errs = t["frames_sent"], t["finished"], t["p50_ms"], t["p99_ms"], t["errors"]
print(f"{codec:5} {n:7d} {sent:8d} {fin:9d} {100*fin/max(1,sent):8.2f}% {p50:8.1f} {p99:7.1f} {ticks/100/secs:7.2f} {errs:6d}")
' "$codec" "$n" "$SECS" "$((t1-t0))"
    rm -f "$log"
  done
done
