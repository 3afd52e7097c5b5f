#!/usr/bin/env bash
# make test (after make lean): checks the lean binary (default bin/mdag-lean), in about 20 s.
#   1. ldd lists only the C runtime (no OpenCV, libvpx, lp_solve, colamd, C++ runtime, OpenMP, ...).
#   2. The CLI: version says lean; validate works; an app naming an OpenCV op is refused, naming the
#      op; client, demo, WHIP flags and --executor opencv are refused, naming the full build.
#   3. serve --synthetic finishes frames, on the emulated executor, on onnx (ONNX Runtime, dlopened)
#      and on kserve against the lean binary's own infer-server (the GPU path without a GPU).
#   4. Loopback smoke test: coordinator + one worker per worker type the traffic app uses (emulated
#      executor) + source streaming synthetic frames; passes when the source's frames are accepted
#      and the coordinator's status shows them finished.
# Every wait polls with a deadline; every process is stopped on exit. Prints what failed and the
# logs of the processes involved.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bin/mdag-lean}
[ -x "$bin" ] || { echo "lean-check: $bin is not built (make lean)" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "lean-check: FAIL: $*" >&2
	for f in "$tmp"/*.log; do
		[ -s "$f" ] && { echo "--- $(basename "$f") (last lines)" >&2; tail -n 15 "$f" >&2; }
	done
	exit 1
}
# expect CODE DESC WANT -- ARGS...: runs the binary (20 s at most) and checks its exit code and
# that WANT appears in its output (stdout and stderr).
expect() {
	local want_code=$1 desc=$2 want=$3 code=0
	shift 4
	timeout 20 "$bin" "$@" >"$tmp/out.txt" 2>&1 || code=$?
	[ "$code" = "$want_code" ] || fail "$desc: mdag-lean $* exited $code, want $want_code:
$(tail -n 20 "$tmp/out.txt")"
	grep -qF -- "$want" "$tmp/out.txt" || fail "$desc: mdag-lean $* does not say '$want':
$(tail -n 20 "$tmp/out.txt")"
	echo "lean-check: ok: $desc"
}
# poll DESC SECONDS CMD...: runs CMD every 100 ms until it succeeds; fails after SECONDS.
poll() {
	local desc=$1 limit=$2
	shift 2
	local deadline=$((SECONDS + limit))
	until "$@"; do
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${limit}s waiting for $desc"
		sleep 0.1
	done
}

# 1. Shared libraries: the C runtime only.
if ! libs=$(ldd "$bin" 2>&1); then
	grep -q "not a dynamic executable" <<<"$libs" || fail "ldd $bin: $libs"
	libs=
fi
allowed='^(linux-vdso|linux-gate|libc|libm|libdl|libpthread|librt|libresolv|ld-linux(-[a-z0-9_-]+)?)\.so'
bad=$(while read -r name _; do
	[ -n "$name" ] || continue
	base=${name##*/}
	[[ $base =~ $allowed ]] || grep -F -- "$name" <<<"$libs"
done <<<"$libs")
[ -z "$bad" ] || fail "$bin links libraries other than the C runtime (allowed: linux-vdso, libc, libm, libdl, libpthread, librt, libresolv, ld-linux):
$bad"
echo "lean-check: ok: ldd lists only the C runtime: $(awk '{print $1}' <<<"$libs" | xargs)"

# 2. The CLI.
expect 0 "version names the lean build" "lean build" -- version
expect 0 "validate traffic" "app traffic: valid" -- validate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml
sed -e 's/op: crop/op: resize/' -e 's/params: {pad: 16}/params: {width: 64, height: 64}/' examples/face/app.yaml >"$tmp/resize.yaml"
grep -q 'op: resize' "$tmp/resize.yaml" || fail "could not make an app with the OpenCV op resize from examples/face/app.yaml"
expect 2 "serving an app with an OpenCV op is refused" "op resize: op has no implementation in this binary" -- \
	serve -f "$tmp/resize.yaml" -p examples/face/profiles.yaml --listen 127.0.0.1:0 --duration 1s
expect 2 "client is refused" "not in the lean build" -- client --app traffic
expect 2 "demo is refused" "not in the lean build" -- demo --duration 1s
expect 2 "WHIP flags are refused" "WHIP ingest is not in the lean build" -- serve --example traffic --token-file /dev/null --listen 127.0.0.1:0
expect 2 "a non-loopback --listen without --tokens is refused" "is not a loopback address and no --tokens" -- coordinator --example traffic --listen 0.0.0.0:0 --grpc 127.0.0.1:0 --duration 1s
expect 2 "--executor opencv is refused" "the lean build has emulated, onnx and kserve" -- worker --type V100 --executor opencv

# 3. serve with synthetic streams (embedded mode).
expect 0 "serve --synthetic finishes frames" "frames sent" -- serve --example traffic --synthetic 2 --duration 2s --listen 127.0.0.1:0
finished=$(sed -nE 's/^ *frames sent [0-9]+, finished ([0-9]+),.*/\1/p' "$tmp/out.txt" | head -n 1)
[ "${finished:-0}" -gt 0 ] || fail "serve --synthetic finished no frame:
$(cat "$tmp/out.txt")"
echo "lean-check: ok: serve --synthetic finished $finished frames"
# 3b. The onnx executor: ONNX Runtime opened at run time (make deps installs the library), real batches.
expect 0 "serve --executor onnx finishes frames" "frames sent" -- serve -f cmd/mdag/testdata/onnx/app.yaml -p cmd/mdag/testdata/onnx/profiles.yaml \
	--executor onnx --models cmd/mdag/testdata/onnx/models.yaml --synthetic 2 --duration 2s --listen 127.0.0.1:0
finished=$(sed -nE 's/^ *frames sent [0-9]+, finished ([0-9]+),.*/\1/p' "$tmp/out.txt" | head -n 1)
[ "${finished:-0}" -gt 0 ] && ! grep -q 'executor=' "$tmp/out.txt" || fail "serve --executor onnx finished no frame or dropped frames in the executor:
$(cat "$tmp/out.txt")"
echo "lean-check: ok: serve --executor onnx finished $finished frames on ONNX Runtime"

# 3c. The kserve executor against the lean binary's own Open Inference Protocol server (onnx on CPU):
# the GPU path (mdag-lean + a KServe runner) without a GPU.
"$bin" infer-server --executor onnx --models cmd/mdag/testdata/onnx/models.yaml --listen 127.0.0.1:0 --intra-threads 1 --duration 120s \
	>"$tmp/infer.out" 2>"$tmp/infer.log" &
pids+=("$!")
infer_up() { grep -qs 'msg="serving the Open Inference Protocol' "$tmp/infer.log"; }
poll "mdag-lean infer-server to listen" 30 infer_up
iaddr=$(sed -nE 's/.*serving the Open Inference Protocol.* grpc=([^ ]+).*/\1/p' "$tmp/infer.log" | head -n 1)
[ -n "$iaddr" ] || fail "no address in infer-server's log"
sed -e 's/format: onnx/format: kserve/' -e "s|file: .*|kserve: {endpoint: \"$iaddr\", model: tiny}|" -e '/devices:/d' \
	cmd/mdag/testdata/onnx/models.yaml >"$tmp/kserve.yaml"
expect 0 "serve --executor kserve finishes frames" "frames sent" -- serve -f cmd/mdag/testdata/onnx/app.yaml -p cmd/mdag/testdata/onnx/profiles.yaml \
	--executor kserve --models "$tmp/kserve.yaml" --synthetic 2 --duration 2s --listen 127.0.0.1:0
finished=$(sed -nE 's/^ *frames sent [0-9]+, finished ([0-9]+),.*/\1/p' "$tmp/out.txt" | head -n 1)
[ "${finished:-0}" -gt 0 ] && ! grep -q 'executor=' "$tmp/out.txt" || fail "serve --executor kserve finished no frame or dropped frames in the executor:
$(cat "$tmp/out.txt")"
echo "lean-check: ok: serve --executor kserve finished $finished frames through mdag-lean infer-server at $iaddr"

# 4. Loopback: coordinator, workers, source. --duration bounds each process should the trap not run.
"$bin" coordinator --example traffic --grpc 127.0.0.1:0 --listen 127.0.0.1:0 --heartbeat 200ms --duration 120s \
	>"$tmp/coordinator.out" 2>"$tmp/coordinator.log" &
coord=$!
pids+=("$coord")
started() {
	kill -0 "$coord" 2>/dev/null || fail "the coordinator exited"
	grep -qs 'msg=coordinating' "$tmp/coordinator.log"
}
poll "the coordinator to listen" 30 started
grpc=$(sed -nE 's/.*msg=coordinating .* grpc=([^ ]+) .*/\1/p' "$tmp/coordinator.log")
server=$(sed -nE 's/.*msg=coordinating .* status=(http:\/\/[^ ]+)\/v1\/status.*/\1/p' "$tmp/coordinator.log")
[ -n "$grpc" ] && [ -n "$server" ] || fail "no gRPC or status address in the coordinator's log"
# The worker types the traffic app's plan uses here: the GPU modules on V100, the CPU ones on CPU.
types=(V100 CPU)
for t in "${types[@]}"; do
	"$bin" worker --coordinator "$grpc" --type "$t" --id "lean-$t" --duration 120s >/dev/null 2>"$tmp/worker-$t.log" &
	pids+=("$!")
done
instances() {
	timeout 10 "$bin" status --server "$server" >"$tmp/status.txt" 2>&1 || return 1
	[ "$(awk '/^INSTANCE/ {f = 1; next} /^last re-plans/ {f = 0} f && NF {n++} END {print n + 0}' "$tmp/status.txt")" -ge "${#types[@]}" ]
}
poll "${#types[@]} workers to register" 30 instances
echo "lean-check: ok: coordinator at $server, workers ${types[*]} registered"
timeout 30 "$bin" source --coordinator "$grpc" --app traffic --streams 2 --fps 10 --duration 3s >"$tmp/source.out" 2>"$tmp/source.log" ||
	fail "mdag-lean source failed: $(cat "$tmp/source.out")"
accepted=$(sed -nE 's/.*: ([0-9]+) frames accepted.*/\1/p' "$tmp/source.out" | awk '{n += $1} END {print n + 0}')
[ "$accepted" -gt 0 ] || fail "the coordinator accepted no frame: $(cat "$tmp/source.out")"
finished() {
	timeout 10 "$bin" status --server "$server" >"$tmp/status.txt" 2>&1 || return 1
	grep -qE '^ *frames sent [0-9]+, finished [1-9][0-9]*,.* open 0;' "$tmp/status.txt"
}
poll "finished frames in the coordinator's status" 30 finished
echo "lean-check: ok: source: $accepted frames accepted; coordinator: $(grep -m1 -E '^ *frames sent' "$tmp/status.txt" | sed -E 's/^ *//; s/;.*//')"
kill -TERM "$coord"
summary() { grep -qs 'frames sent' "$tmp/coordinator.out"; }
poll "the coordinator's summary after SIGTERM" 15 summary
wait "$coord" || fail "the coordinator exited $? after SIGTERM"
echo "lean-check: PASS"
