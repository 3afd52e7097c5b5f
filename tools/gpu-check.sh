#!/usr/bin/env bash
# The GPU check (README, "GPU check"): mdag's GPU path end to end on one machine, with a report.
#
#   tools/gpu-check.sh [--device cuda|cpu] [--out DIR] [--streams 8,32,64,128] [--duration 20s] [--quick]
#                      [--ingest worker|coordinator] [--slots 2]
#
# What it runs, all on this machine:
#   1. runners/torch --bench: the raw model time per batch size (CUDA graphs on a GPU), the reference;
#   2. runners/torch serving resnet50 (and the zoo models) over the Open Inference Protocol, --slots
#      batches at once (CUDA streams; the profiles measure concurrency 1, 2, 4 ... up to it);
#   3. mdag profile --executor kserve for each model: the time per batch through mdag's kserve
#      executor (preprocessing, the protocol, shared memory, the runner) -> profiles of this GPU;
#   4. the lean coordinator with examples/gpu-check (a detector, then ResNet-50 on every crop, 50 ms
#      SLO), one worker on the kserve executor (the detector emulated: it echoes the synthetic
#      ground truth, so the classifier batches real crops), synthetic sources at each load of --streams;
#      the sources stream to the worker, which ingests them (--ingest worker, the default:
#      coordinator --data-plane metadata, worker --ingest-listen; no pixel crosses the coordinator),
#      or to the coordinator (--ingest coordinator, the relay of earlier runs);
#   5. tools/gpu_report.py: DIR/gpu-report.md and DIR/gpu-report.json: the finish rate per load, the
#      scheduler's batch sizes, GPU utilisation (NVML, through the coordinator's /metrics), goodput
#      against the runner's raw throughput at the batch the scheduler ran, the protocol's cost against
#      the raw model time, and the zoo's profiles beside Symphony's Tables 5 and 6.
#
# Needs: bin/mdag-lean (make lean; or build/gpu-bundle/mdag-lean from make gpu-bundle; or MDAG=path), python3 with torch, torchvision, grpcio, protobuf
# (timm for InceptionResNetV2; skipped without it); curl if there (else python fetches). No network. --device cpu runs the same check
# on the CPU (small: it proves the wiring, not a GPU's figures).
set -euo pipefail
cd "$(dirname "$0")/.."

device=cuda
out=
streams=
duration=
quick=0
ingest=worker
slots=2
while [ $# -gt 0 ]; do
	case $1 in
	--device) device=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--streams) streams=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--quick) quick=1; shift ;;
	--ingest) ingest=$2; shift 2 ;;
	--slots) slots=$2; shift 2 ;;
	-h | --help) sed -n '2,26p' "$0"; exit 0 ;;
	*) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case $device in cuda | cpu) ;; *) echo "gpu-check: --device $device: want cuda or cpu" >&2; exit 2 ;; esac
case $ingest in worker | coordinator) ;; *) echo "gpu-check: --ingest $ingest: want worker or coordinator" >&2; exit 2 ;; esac
case $slots in [1-8]) ;; *) echo "gpu-check: --slots $slots: want 1 to 8" >&2; exit 2 ;; esac
conc=1
for c in 2 4 8; do [ "$c" -le "$slots" ] && conc="$conc,$c"; done

MDAG=${MDAG:-bin/mdag-lean}
[ -x "$MDAG" ] || [ ! -x build/gpu-bundle/mdag-lean ] || MDAG=build/gpu-bundle/mdag-lean
PY=${PYTHON:-python3}
# make gpu-bundle's ONNX Runtime, for the onnx executor on this machine (the check itself runs
# every model in runners/torch)
if [ -z "${MDAG_ORT_LIB:-}" ] && [ -f build/gpu-bundle/libonnxruntime.so.1.xz ]; then
	ortdir=$(mktemp -d) # removed by cleanup (below), or on an early exit:
	trap 'rm -rf "$ortdir"' EXIT
	xz -dc build/gpu-bundle/libonnxruntime.so.1.xz >"$ortdir/libonnxruntime.so.1"
	export MDAG_ORT_LIB=$ortdir/libonnxruntime.so.1
fi
[ -x "$MDAG" ] || { echo "gpu-check: $MDAG is not built: run make lean (or set MDAG=path/to/mdag)" >&2; exit 2; }
if ! "$PY" -c 'import torch, grpc, google.protobuf' 2>/dev/null; then
	# a python3 first on PATH (a virtualenv, pyenv) without torch: the system's may have it
	if [ -z "${PYTHON:-}" ] && /usr/bin/python3 -c 'import torch, grpc, google.protobuf' 2>/dev/null; then
		PY=/usr/bin/python3
	else
		echo "gpu-check: $PY lacks torch, grpcio or protobuf (PYTHON=path picks another interpreter)" >&2
		exit 2
	fi
fi
if [ "$device" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
	echo "gpu-check: torch sees no CUDA device; --device cpu runs the check on the CPU" >&2
	exit 2
fi

if [ "$device" = cuda ]; then
	: "${streams:=8,32,64,128,192}"
	batches=1,2,4,8,16,32
	zoo="resnet50=torchvision:resnet50 mobilenetv2=torchvision:mobilenet_v2 densenet121=torchvision:densenet121 resnet152=torchvision:resnet152"
	"$PY" -c 'import timm' 2>/dev/null && zoo="$zoo inception_resnet_v2=timm:inception_resnet_v2"
	objects=4
	fps=30
	slo=50ms
else
	: "${streams:=1,2}"
	batches=1,2,4,8
	zoo="resnet50=torchvision:resnet50 mobilenetv2=torchvision:mobilenet_v2"
	objects=1
	fps=1
	slo=4s
fi
[ "$quick" = 1 ] && { zoo=${zoo%% *}; : "${duration:=8s}"; }
: "${duration:=20s}"
if [ -z "$out" ]; then
	out=build/gpu-check/$(date -u +%Y%m%dT%H%M%SZ)
fi
mkdir -p "$out/profiles" "$out/sweep"
echo "gpu-check: device $device, report in $out"

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	[ -z "${ortdir:-}" ] || rm -rf "$ortdir"
}
trap cleanup EXIT
fail() {
	echo "gpu-check: FAIL: $*" >&2
	for f in "$out"/*.log "$out"/sweep/*.log; do
		[ -s "$f" ] && { echo "--- $f (last lines)" >&2; tail -n 20 "$f" >&2; }
	done
	exit 1
}
poll() { # poll DESC SECONDS CMD...
	local desc=$1 limit=$2
	shift 2
	local deadline=$((SECONDS + limit))
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${limit}s waiting for $desc"
		sleep 0.2
	done
}
get() { # get URL: the body on stdout, or fail (curl, or python where a GPU image has no curl)
	if command -v curl >/dev/null; then
		curl -fsS --max-time 5 "$1"
	else
		"$PY" -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=5).read())' "$1"
	fi
}
freeport() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

models=()
specs=()
for z in $zoo; do
	models+=("${z%%=*}")
	specs+=(--model "$z")
done
size_of() { [ "$1" = inception_resnet_v2 ] && echo 299 || echo 224; }

# the machine
{
	echo "{\"device\": \"$device\", \"date\": \"$(date -u +%FT%TZ)\", \"mdag\": \"$("$MDAG" version 2>&1 | head -n 1)\","
	echo " \"host\": \"$(uname -srm)\", \"cpus\": $(nproc),"
	echo " \"gpu\": \"$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || true)\","
	echo " \"torch\": \"$("$PY" -c 'import torch; print(torch.__version__)')\", \"streams\": \"$streams\", \"duration\": \"$duration\","
	echo " \"objects\": $objects, \"fps\": $fps, \"slo\": \"$slo\", \"batches\": \"$batches\", \"ingest\": \"$ingest\", \"slots\": $slots}"
} >"$out/meta.json"

# 1. The raw model times: the runner alone, no protocol.
echo "gpu-check: 1/5 raw model time per batch (runners/torch --bench)"
for i in "${!models[@]}"; do
	m=${models[$i]}
	"$PY" runners/torch/runner.py --bench --device "$device" --model "${specs[$((2 * i + 1))]}" \
		--size "$(size_of "$m")" --input uint8-nhwc --batches "$batches" >"$out/raw-$m.json" 2>>"$out/bench.log" ||
		fail "runners/torch --bench $m"
done

# 2. The runner, serving every model.
port=$(freeport)
echo "gpu-check: 2/5 runners/torch on 127.0.0.1:$port: ${models[*]}"
runner_args=(--listen "127.0.0.1:$port" --device "$device" --input uint8-nhwc --batches "$batches" --max-batch "${batches##*,}" --slots "$slots"
	--stats "$out/runner-stats.json")
for i in "${!models[@]}"; do
	# NAME=SPEC@SIZE: the model's own input size (InceptionResNetV2's 299) beside --size 224
	runner_args+=(--model "${specs[$((2 * i + 1))]}@$(size_of "${models[$i]}")")
done
"$PY" runners/torch/runner.py "${runner_args[@]}" >"$out/runner.out" 2>"$out/runner.log" &
runner=$!
pids+=("$runner")
ready() {
	kill -0 "$runner" 2>/dev/null || fail "the runner exited"
	"$PY" - "$port" <<'EOF' 2>/dev/null
import sys, grpc
sys.path.insert(0, "runners/torch")
import inference_pb2 as pb, inference_pb2_grpc as pbg
with grpc.insecure_channel("127.0.0.1:" + sys.argv[1]) as ch:
    sys.exit(0 if pbg.GRPCInferenceServiceStub(ch).ServerReady(pb.ServerReadyRequest(), timeout=2).ready else 1)
EOF
}
poll "the runner to be ready (CUDA graphs are captured at load)" 600 ready

# The registry: examples/gpu-check/models.yaml with this runner's port, one entry per zoo model.
reg=$out/models.yaml
{
	echo "# examples/gpu-check/models.yaml, generated for runners/torch on 127.0.0.1:$port"
	echo "models:"
	for m in "${models[@]}"; do
		s=$(size_of "$m")
		echo "  $m:"
		echo "    format: kserve"
		echo "    kserve: {endpoint: \"127.0.0.1:$port\", model: $m}"
		echo "    input: {name: input, dtype: uint8, layout: NHWC, width: $s, height: $s, colour: rgb}"
		echo "    outputs: [output]"
		echo "    max_batch: ${batches##*,}"
		echo "    decoder: {name: classify, top_k: 1, softmax: true}"
		echo "    devices: [cuda, cpu]"
	done
} >"$reg"

# 3. Profiles through mdag's kserve executor.
echo "gpu-check: 3/5 mdag profile --executor kserve (${models[*]})"
gpuname=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr ' ' '-' || true)
[ -n "$gpuname" ] || gpuname=CPU-torch
iters=30
[ "$device" = cpu ] && iters=4
for m in "${models[@]}"; do
	"$MDAG" profile --executor kserve --models "$reg" --model "$m" --worker-type gpu-check --price 1 --gpu "$gpuname" \
		--batches "$batches" --concurrency "$conc" --iterations "$iters" --frame 224x224 -o json \
		>"$out/profiles/$m.json" 2>>"$out/profile.log" || fail "mdag profile --executor kserve --model $m"
done

# the runner's own time per request at concurrency 1 (its stats, written every second, before and
# after one more sweep of resnet50 alone at concurrency 1): the report sets the difference beside
# the executor's call
sleep 2
cp "$out/runner-stats.json" "$out/runner-stats-c1-before.json" 2>/dev/null || true
"$MDAG" profile --executor kserve --models "$reg" --model resnet50 --worker-type gpu-check --price 1 --gpu "$gpuname" \
	--batches "$batches" --concurrency 1 --iterations "$iters" --frame 224x224 -o json >/dev/null 2>>"$out/profile.log" ||
	fail "mdag profile --executor kserve --model resnet50 (concurrency 1, the runner's stats)"
sleep 2
cp "$out/runner-stats.json" "$out/runner-stats-c1-after.json" 2>/dev/null || true

# The app's profiles: resnet50 as measured; the emulated detector (l(b) = 0.1 ms*b + 1 ms, what
# the worker's --emulate detector takes); the CPU ops measured below (mdag profile --op).
"$PY" - "$out/profiles/resnet50.json" >"$out/profiles.yaml" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
print(doc["yaml"].rstrip("\n"))
w = doc["worker"]["type"]
print("  - target: detector\n    worker: %s\n    points:" % w)
for b in (1, 2, 4, 8, 16, 32):
    print("      - {batch: %d, concurrency: 1, latency: %.2fms}" % (b, 1 + 0.1 * b))
EOF
# the CPU ops on this machine, at the sources' frame size and objects per frame, with up to half
# its cores in flight (the other half packs the classifier's batches, and runs the runner and
# the coordinator); measured, as every profile mdag plans with (they were a fixed 0.5 ms at
# concurrency 1 before: at 32 streams the plan then needed two workers for count alone)
half=$(($(nproc) / 2))
opconc=1
for c in 2 4 8; do [ "$c" -le "$half" ] && opconc="$opconc,$c"; done
for op in crop count; do
	"$MDAG" profile --op "$op" --target "$op" --boxes "$objects" --frame 640x480 --concurrency "$opconc" \
		--worker-type gpu-check --append "$out/profiles.yaml" 2>>"$out/profile.log" || fail "mdag profile --op $op"
done

# 4. The live sweep: coordinator, worker, sources.
echo "gpu-check: 4/5 live: coordinator, a kserve worker, synthetic sources at $streams streams (ingest on the $ingest)"
# the app at this device's SLO and fps (examples/gpu-check: 50 ms, 30 fps; on a CPU, ResNet-50 alone
# takes longer than 50 ms)
app=$out/app.yaml
sed -e "s/^slo: .*/slo: $slo/" -e "s/^fps: .*/fps: $fps/" examples/gpu-check/app.yaml >"$app"
plane=()
ingest_args=()
if [ "$ingest" = worker ]; then
	plane=(--data-plane metadata)
	ingest_args=(--ingest-listen 127.0.0.1:0)
fi
"$MDAG" coordinator -f "$app" -p "$out/profiles.yaml" --grpc 127.0.0.1:0 --listen 127.0.0.1:0 "${plane[@]}" >"$out/coordinator.out" 2>"$out/coordinator.log" &
coord=$!
pids+=("$coord")
started() {
	kill -0 "$coord" 2>/dev/null || fail "the coordinator exited"
	grep -qs 'msg=coordinating' "$out/coordinator.log"
}
poll "the coordinator to listen" 30 started
grpc=$(sed -nE 's/.*msg=coordinating .* grpc=([^ ]+) .*/\1/p' "$out/coordinator.log")
server=$(sed -nE 's/.*msg=coordinating .* status=(http:\/\/[^ ]+)\/v1\/status.*/\1/p' "$out/coordinator.log")
"$MDAG" worker --coordinator "$grpc" --type gpu-check --id gpu-check-0 --executor kserve --slots "$((slots > 4 ? slots : 4))" --models "$reg" --emulate detector "${ingest_args[@]}" \
	>"$out/worker.out" 2>"$out/worker.log" &
pids+=("$!")
registered() { get "$server/v1/status" 2>/dev/null | grep -q '"gpu-check-0"'; }
poll "the worker to register" 60 registered
drained() { # no session has a frame open
	get "$server/v1/status" 2>/dev/null | "$PY" -c 'import json, sys; sys.exit(any(s.get("open", 0) for s in json.load(sys.stdin).get("sessions") or []))'
}
IFS=, read -r -a loads <<<"$streams"
for n in "${loads[@]}"; do
	echo "gpu-check:    $n streams x $fps fps x $objects objects, $duration"
	get "$server/metrics" >"$out/sweep/$n.metrics-before.txt"
	get "$server/v1/status" >"$out/sweep/$n.status-before.json"
	# GPU utilisation (NVML, the coordinator's /metrics) once a second while the load runs
	(while :; do
		{ get "$server/metrics" 2>/dev/null | sed -nE 's/^mdag_gpu_utilization_ratio\{[^}]*\} ([0-9.eE+-]+)$/\1/p' | head -n 1; } || true
		sleep 1
	done >"$out/sweep/$n.gpu.txt") &
	sampler=$!
	pids+=("$sampler")
	"$MDAG" source --coordinator "$grpc" --ingest "$([ "$ingest" = worker ] && echo route || echo coordinator)" --app gpu-check --streams "$n" --fps "$fps" --objects "$objects" --size 640x480 \
		--prefix "load$n" --duration "$duration" >"$out/sweep/$n.source.out" 2>"$out/sweep/$n.source.log" || fail "mdag source ($n streams)"
	kill "$sampler" 2>/dev/null || true
	wait "$sampler" 2>/dev/null || true
	# the frames still in flight when the source stopped end within the SLO: wait for them, so
	# that the totals count them (finished, late or dropped) rather than as unfinished
	poll "the last frames of $n streams to end" 30 drained
	get "$server/v1/status" >"$out/sweep/$n.status.json"
	get "$server/metrics" >"$out/sweep/$n.metrics-after.txt"
done

# 5. The report.
echo "gpu-check: 5/5 report"
"$PY" tools/gpu_report.py "$out" || fail "tools/gpu_report.py"
echo "gpu-check: done: $out/gpu-report.md"
