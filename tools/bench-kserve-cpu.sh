#!/usr/bin/env bash
# ResNet-50 (build/models, random weights) on ONNX Runtime CPU: the in-process onnx executor against the
# kserve executor through `mdag infer-server` on the same host (shared memory on, then off), alternated
# ROUNDS times (default 3) so that a loaded machine's drift hits each alike. Prints each round's p50 per
# batch (mdag profile, concurrency 1, 5 batches); docs/benchmarks.md takes the median of the rounds.
# Needs bin/mdag (make build) and build/models (make models).
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MDAG:-bin/mdag}
PY=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$M" infer-server --models examples/models.yaml --listen "127.0.0.1:$port" --intra-threads 2 --sessions 1 >"$tmp/infer.log" 2>&1 &
is=$!
trap 'kill $is 2>/dev/null; wait $is 2>/dev/null; rm -rf "$tmp"' EXIT
until grep -qs 'serving the Open Inference Protocol' "$tmp/infer.log"; do
	kill -0 "$is" 2>/dev/null || { cat "$tmp/infer.log" >&2; exit 1; }
	sleep 0.2
done
cat >"$tmp/models.yaml" <<YAML
models:
  resnet50:
    format: kserve
    kserve: {endpoint: "127.0.0.1:$port", model: resnet50}
    input: {name: input, dtype: float32, layout: NCHW, width: 224, height: 224, colour: rgb,
            scale: 0.00392156862745098, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
    max_batch: 32
    decoder: {name: classify, top_k: 5}
YAML
common=(--model resnet50 --worker-type cpu --price 1 --batches 1,8 --concurrency 1 --iterations 5 --warmup 1 --frame 224x224 -o json)
for round in $(seq "$rounds"); do
	for mode in inproc shm raw; do
		case $mode in
		inproc) "$M" profile --executor onnx --models examples/models.yaml --intra-threads 2 "${common[@]}" >"$tmp/out.json" 2>/dev/null ;;
		shm) "$M" profile --executor kserve --shared-memory on --models "$tmp/models.yaml" "${common[@]}" >"$tmp/out.json" 2>/dev/null ;;
		raw) "$M" profile --executor kserve --shared-memory off --models "$tmp/models.yaml" "${common[@]}" >"$tmp/out.json" 2>/dev/null ;;
		esac
		"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], sys.argv[3], " ".join("b%d=%.1fms" % (p["batch"], p["p50_ns"] / 1e6) for p in d["sweep"]["points"]))
' "$tmp/out.json" "$mode" "$round"
	done
done
