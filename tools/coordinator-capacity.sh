#!/usr/bin/env bash
# coordinator-capacity.sh: how far one `mdag coordinator` goes, on the relay
# data plane (every frame through it), the direct one (frames worker to
# worker, the coordinator routes references; issue 25) and ingest (direct,
# and the cameras' frames kept by the workers: every worker has
# --ingest-listen and the source routes its streams there, so no pixel
# reaches the coordinator; issue 41), in one run.
#
#   tools/coordinator-capacity.sh [BIN] [PLANES] [STREAM COUNTS] [SECONDS]
#   tools/coordinator-capacity.sh bin/mdag "relay direct ingest" "4 8 16 24 32" 20
#
# The traffic example with emulated GPUs: the coordinator pinned to core 0
# with GOMAXPROCS=1 (taskset), so what it carries is what one core of it
# carries; 8 worker processes (3 V100, 2 P100, 3 CPU: the CPU workers run
# the real crop and count ops) and the synthetic sources on core 1
# (640x480 frames, 10 fps a stream, 3 objects a frame: detect's frame goes
# to crop, and 4 vehicle and 1 person crops to the classifiers). Per run:
# frames sent and finished within the SLO (from the coordinator's status),
# the coordinator's CPU per frame sent (/proc utime+stime), the cores the
# coordinator and its peers (the 8 workers and the source) used, the hop p50/p99
# (a task's time outside its module's run: down, the worker's queue, the
# fetch on the direct plane, up; the coordinator's summary line), the
# frames' end-to-end p50/p99 (capture to result) and the result pixel
# bytes it relayed, what it received on gRPC a frame, and the engine
# loop's busy time a frame (its /v1/status "loop"): the loop is one
# goroutine, so 1 s over that is the frames a second it can decide, however
# many cores the coordinator has. The capacity is the most streams at
# >= 99% finished. The fleet plane replaces the workers and the source by
# tools/coordload: hundreds of emulated workers and streams, metadata
# only, so the coordinator's core, not the machine's other one, is what
# runs out.
set -euo pipefail
BIN=${1:-bin/mdag}
PLANES=${2:-"relay direct"}
COUNTS=${3:-"4 8 16 24 32"}
SECS=${4:-20}
SIZE=${SIZE:-640x480}
HTTP=${HTTP_PORT:-18281}
GRPC=${GRPC_PORT:-17171}
command -v taskset >/dev/null || { echo "coordinator-capacity: taskset (util-linux) is needed" >&2; exit 2; }
command -v curl >/dev/null || { echo "coordinator-capacity: curl is needed" >&2; exit 2; }
[ "$(nproc)" -ge 2 ] || { echo "coordinator-capacity: needs 2 cores (the coordinator on one, workers and sources on the other)" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
LOAD=${LOAD:-bin/coordload}
case " $PLANES " in *" fleet "*) go build -o "$LOAD" ./tools/coordload ;; esac
printf "%-6s %7s %7s %8s %8s %9s %6s %11s %8s %8s %8s %8s %11s %9s %10s\n" plane streams sent finished finish cpu_us/fr cores peers_cores hop_p50 hop_p99 e2e_p50 e2e_p99 relayed_MB rcv_B/fr loop_us/fr
for n in $COUNTS; do
  for plane in $PLANES; do # the planes back to back at each load: what loads the machine meanwhile weighs on both
    dp=$plane; ingest=()
    if [ "$plane" = ingest ]; then dp=metadata; ingest=(--ingest-listen 127.0.0.1:0); fi
    extra=()
    if [ "$plane" = fleet ]; then # its hundreds of workers register from one address at once
      dp=metadata; extra=(--register-rate 1000 --register-burst 1000 --register-global-rate 1000 --register-global-burst 1000)
    fi
    GOMAXPROCS=1 taskset -c 0 "$BIN" coordinator --example traffic --grpc 127.0.0.1:$GRPC --listen 127.0.0.1:$HTTP \
      --data-plane "$dp" "${extra[@]}" >"$tmp/coord.out" 2>"$tmp/coord.log" &
    coord=$!; pids=($coord)
    for _ in $(seq 100); do curl -sf http://127.0.0.1:$HTTP/healthz >/dev/null 2>&1 && break; sleep 0.1; done
    if [ "$plane" = fleet ]; then
      # coordload plays the workers (P100s and CPUs enough for n streams:
      # mdag allocate gives ~0.19 P100 a stream) and the streams, metadata
      # only; the coordinator's CPU is counted once every stream has joined
      # and the joins' re-plans have settled
      rm -f "$tmp/ready"
      /usr/bin/time -f "%U %S" -o "$tmp/source.time" taskset -c 1 "$LOAD" --coordinator 127.0.0.1:$GRPC --streams "$n" --fps 10 \
        --duration "${SECS}s" --workers "P100=$((n / 4 + 3)),CPU=$((n / 50 + 2))" --ready "$tmp/ready" --settle 3s >"$tmp/load.out" 2>>"$tmp/workers.log" &
      load=$!; pids+=($load)
      for _ in $(seq 3000); do [ -e "$tmp/ready" ] && break; kill -0 $load 2>/dev/null || break; sleep 0.1; done
      [ -e "$tmp/ready" ] || { echo "coordinator-capacity: coordload never got its streams joined:" >&2; tail -5 "$tmp/workers.log" >&2; exit 1; }
      t0=$(ticks $coord); w0=0
      curl -sf http://127.0.0.1:$HTTP/v1/status >"$tmp/status0.json" || echo '{}' >"$tmp/status0.json"
      wait $load || true
      sleep 2
      t1=$(ticks $coord); w1=0
    else
    i=0
    for typ in V100 V100 V100 P100 P100 CPU CPU CPU; do
      taskset -c 1 "$BIN" worker --coordinator 127.0.0.1:$GRPC --type $typ --id "w$i-$typ" "${ingest[@]}" >/dev/null 2>>"$tmp/workers.log" &
      pids+=($!); i=$((i+1))
    done
    for _ in $(seq 100); do
      [ "$(curl -sf http://127.0.0.1:$HTTP/v1/status | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["instances"]))' 2>/dev/null)" = 8 ] && break
      sleep 0.1
    done
    t0=$(ticks $coord); w0=$(ticks "${pids[@]:1}")
    curl -sf http://127.0.0.1:$HTTP/v1/status >"$tmp/status0.json" || echo '{}' >"$tmp/status0.json"
    /usr/bin/time -f "%U %S" -o "$tmp/source.time" taskset -c 1 "$BIN" source --coordinator 127.0.0.1:$GRPC --app traffic --streams "$n" \
      --fps 10 --size "$SIZE" --objects 3 --duration "${SECS}s" >/dev/null 2>&1 || true
    sleep 2 # the last frames end (the SLO is 400 ms)
    t1=$(ticks $coord); w1=$(ticks "${pids[@]:1}")
    fi
    src=$(awk '{print int(100*($1+$2))}' "$tmp/source.time" 2>/dev/null || echo 0)
    curl -sf http://127.0.0.1:$HTTP/v1/status >"$tmp/status.json" || echo '{}' >"$tmp/status.json"
    for p in "${pids[@]:1}"; do kill -INT "$p" 2>/dev/null || true; done
    kill -INT $coord; wait 2>/dev/null || true
    pids=()
    python3 - "$plane" "$n" "$SECS" "$((t1-t0))" "$tmp/status.json" "$tmp/coord.out" "$((w1-w0+src))" <<'EOF'
import json, re, sys
plane, n, secs, ticks, status, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
peers = float(sys.argv[7])
try:
    ss = json.load(open(status))["sessions"][0]
    tot = ss["total"]
except Exception:
    print(f"{plane:6} {n:7d}  no status"); sys.exit()
sent, fin = tot["sent"], tot["finished"]
m = re.search(r"data plane \S+: (\d+) result frames by reference, (\d+) relayed \((\d+) bytes\); (\d+) hops, p50 ([\d.]+) ms, p99 ([\d.]+) ms", open(out).read())
refs, rel, relb, hops, p50, p99 = (m.groups() if m else ("?",) * 6)
cpu_us = ticks * 10000 / max(1, sent)
mb = float(relb) / 1e6 if m else float("nan")
r = re.search(r"received on gRPC: (\d+) bytes from workers, (\d+) from sources", open(out).read())
rcv = (int(r.group(1)) + int(r.group(2))) / max(1, sent) if r else float("nan")
try:
    busy = json.load(open(status))["loop"]["busy_ns"] - json.load(open(status.replace("status.json", "status0.json")))["loop"]["busy_ns"]
except Exception:
    busy = float("nan")
print(f"{plane:6} {n:7d} {sent:7d} {fin:8d} {100*fin/max(1,sent):7.2f}% {cpu_us:9.0f} {ticks/100/secs:6.2f} {peers/100/secs:11.2f} {p50:>8} {p99:>8} {ss['p50_ms']:8.1f} {ss['p99_ms']:8.1f} {mb:11.1f} {rcv:9.0f} {busy/1000/max(1,sent):10.0f}")
EOF
  done
done
