#!/usr/bin/env bash
# served-ratio.sh: served frames/s at >= 99% finished divided by the raw executor throughput, both
# measured in the same run on this machine, for face-live and the bring-your-own-model pipeline
# (issue 35; docs/benchmarks.md "Served against raw").
#
#   tools/served-ratio.sh [BIN]          # BIN: the mdag binary (default bin/mdag; make build models first)
#
# Per app and run:
#  1. raw: `mdag profile` with its defaults (only the two required flags, --worker-type and --price) on
#     each model of the app; the best items/s of any point is that model's raw throughput, and the
#     pipeline's raw frames/s is 1 / sum(items per frame / items/s) over its models (face-live: one
#     BlazeFace item per frame; byom: one detection and three classifications);
#  2. served: the profiles as written (one document: each run's entries after the first's; the CPU ops
#     by `mdag profile --op` where the binary has it, else the examples' hand-written 0.5 ms) served by
#     `mdag serve --synthetic N --executor onnx` for DURATION; the highest N whose frames finish >= 99%
#     within the SLO (doubling, then bisection) gives served frames/s = N x fps x finished/sent;
#  3. ratio = served / raw.
# Prints one line per run and the medians. Env: RUNS (3), DURATION (15s), APPS ("face-live byom"),
# SERVE_FLAGS (extra flags for serve, default none: serve's defaults), KEEP=1 keeps the work directory,
# MAX_STREAMS (default: the raw capacity's streams, so the search never offers more than raw),
# FACE_PROFILES=committed serves face-live on examples/face-live/profiles.yaml instead of this run's
# (raw is this run's measurement either way).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-bin/mdag}
RUNS=${RUNS:-3}
DURATION=${DURATION:-15s}
APPS=${APPS:-face-live byom}
SERVE_FLAGS=${SERVE_FLAGS:-}
PY=${MODELS_PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d /tmp/served-ratio.XXXXXX)
[[ ${KEEP:-} == 1 ]] || trap 'rm -rf "$WORK"' EXIT
[[ -x $BIN ]] || { echo "served-ratio: $BIN: not built (make build models)" >&2; exit 2; }

WORKER=CPU PRICE=0.1
secs() { local d=$1; case $d in *ms) echo "scale=3; ${d%ms}/1000" | bc ;; *s) echo "${d%s}" ;; *m) echo "${d%m}*60" | bc ;; esac; }
DUR_S=$(secs "$DURATION")

# best_items TARGET FILE: the best throughput of any point of TARGET's profiles in FILE
best_items() {
	awk -v t="$1" '
		/^  - target:/ { gsub(/"/, ""); cur = $3 }
		cur == t && /throughput:/ { match($0, /throughput: [0-9.]+/); v = substr($0, RSTART + 12, RLENGTH - 12) + 0; if (v > best) best = v }
		END { printf "%.3f\n", best }' "$2"
}

has_op() { "$BIN" profile -h 2>&1 | grep -Eq '^\s+-op\b'; }

# ops_profiles DIR TARGET:OP[:BOXES] ...: the CPU ops' profiles, measured (--op) or the 0.5 ms points
ops_profiles() {
	local dir=$1; shift
	local spec target op boxes
	for spec in "$@"; do
		IFS=: read -r target op boxes <<<"$spec"
		if has_op; then
			"$BIN" profile --op "$op" --target "$target" ${boxes:+--boxes "$boxes"} --worker-type $WORKER --price $PRICE >"$dir/op-$target.yaml" 2>>"$dir/profile.log"
		else
			printf 'workers:\n  - {type: %s, price: %s}\nprofiles:\n  - target: %s\n    worker: %s\n    points:\n      - {batch: 1, concurrency: 1, latency: 0.5ms}\n' \
				$WORKER $PRICE "$target" $WORKER >"$dir/op-$target.yaml"
		fi
		echo "$dir/op-$target.yaml"
	done
}

# join FILE...: one profiles document: the first file, then each other's lines after its profiles: line
join_profiles() {
	cat "$1"; shift
	local f
	for f in "$@"; do sed -n '/^profiles:$/,$p' "$f" | tail -n +2; done
}

# serve_rate DIR N: serves N synthetic streams; prints "sent finished"
serve_rate() {
	local dir=$1 n=$2 out
	# shellcheck disable=SC2086
	out=$("$BIN" serve -f "$dir/app.yaml" -p "$dir/profiles.yaml" --executor onnx --models "$dir/models.yaml" \
		--synthetic "$n" --duration "$DURATION" --listen 127.0.0.1:0 $SERVE_FLAGS 2>>"$dir/serve.log")
	echo "$out" >"$dir/serve-$n.txt"
	echo "$out" | sed -nE 's/.*frames sent ([0-9]+), finished ([0-9]+),.*/\1 \2/p'
}

passes() { awk -v s="$1" -v f="$2" 'BEGIN { exit !(s > 0 && f / s >= 0.99) }'; }

# setup APP DIR: models, registry, app and profiles in DIR; prints the raw frames/s and the app's fps
setup() {
	local app=$1 dir=$2 docs=() items=() ops=()
	case $app in
	face-live)
		# examples/models.yaml with its files (../build/models/, make models) made absolute
		sed "s#file: \.\./#file: $PWD/#" examples/models.yaml >"$dir/models.yaml"
		cp examples/face-live/app.yaml "$dir/app.yaml"
		"$BIN" profile --models "$dir/models.yaml" --model blazeface --worker-type $WORKER --price $PRICE >"$dir/m-blazeface.yaml" 2>>"$dir/profile.log"
		items=("blazeface:1")
		mapfile -t ops < <(ops_profiles "$dir" faces:count boxes:sink)
		docs=("$dir/m-blazeface.yaml" "${ops[@]}")
		;;
	byom)
		"$PY" tools/models/byom.py "$dir"
		cp cmd/mdag/testdata/byom/models.yaml cmd/mdag/testdata/byom/app.yaml "$dir/"
		for m in byom-detector byom-classifier; do
			"$BIN" profile --models "$dir/models.yaml" --model $m --worker-type $WORKER --price $PRICE >"$dir/m-$m.yaml" 2>>"$dir/profile.log"
		done
		items=("byom-detector:1" "byom-classifier:3")
		mapfile -t ops < <(ops_profiles "$dir" crop:crop:3 count:count)
		docs=("$dir/m-byom-detector.yaml" "$dir/m-byom-classifier.yaml" "${ops[@]}")
		;;
	*) echo "served-ratio: unknown app $app" >&2; exit 2 ;;
	esac
	join_profiles "${docs[@]}" >"$dir/measured.yaml"
	cp "$dir/measured.yaml" "$dir/profiles.yaml"
	if [[ $app == face-live && ${FACE_PROFILES:-measured} == committed ]]; then
		cp examples/face-live/profiles.yaml "$dir/profiles.yaml" # served on these; raw stays this run's measurement
	fi
	"$BIN" validate -f "$dir/app.yaml" --profiles "$dir/profiles.yaml" --models "$dir/models.yaml" >/dev/null
	local sum=0 spec m k b
	for spec in "${items[@]}"; do
		IFS=: read -r m k <<<"$spec"
		b=$(best_items "$m" "$dir/measured.yaml")
		echo "  $app: $m best $b items/s (x$k per frame)" >&2
		sum=$(echo "scale=9; $sum + $k / $b" | bc)
	done
	local fps
	fps=$(sed -nE 's/^fps: *([0-9.]+).*/\1/p' "$dir/app.yaml")
	echo "$(echo "scale=3; 1 / $sum" | bc) $fps"
}

# search DIR FPS MAXN: the highest N <= MAXN at >= 99% finished; prints "N served_fps"
search() {
	local dir=$1 fps=$2 maxn=$3 lo=0 hi n sent fin best_s=0 best_f=0
	n=1
	while :; do # doubling: lo passes, hi fails
		read -r sent fin < <(serve_rate "$dir" $n)
		echo "    N=$n: $fin of $sent finished" >&2
		if passes "$sent" "$fin"; then
			lo=$n best_s=$sent best_f=$fin
			((n >= maxn)) && { hi=$((maxn + 1)); break; }
			n=$((n * 2 > maxn ? maxn : n * 2))
		else
			hi=$n
			break
		fi
	done
	while ((hi - lo > 1)); do
		n=$(((lo + hi) / 2))
		read -r sent fin < <(serve_rate "$dir" $n)
		echo "    N=$n: $fin of $sent finished" >&2
		if passes "$sent" "$fin"; then lo=$n best_s=$sent best_f=$fin; else hi=$n; fi
	done
	if ((lo == 0)); then echo "0 0"; return; fi
	echo "$lo $(echo "scale=3; $lo * $fps * $best_f / $best_s" | bc)"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# served-ratio: $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $BIN ($("$BIN" version 2>/dev/null | head -1 | cut -c1-40 || true), commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- . 2>/dev/null || echo +dirty)), duration $DURATION, serve flags '${SERVE_FLAGS}', face-live profiles ${FACE_PROFILES:-measured}, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# app run raw_frames_per_s N_at_99pct served_frames_per_s ratio"
for app in $APPS; do
	: >"$WORK/$app.ratios"
	: >"$WORK/$app.raw"
	: >"$WORK/$app.served"
	for r in $(seq 1 "$RUNS"); do
		dir="$WORK/$app-$r"
		mkdir -p "$dir"
		read -r raw fps < <(setup "$app" "$dir")
		maxn=${MAX_STREAMS:-$(echo "($raw / $fps + 0.999) / 1" | bc)}
		((maxn >= 1)) || maxn=1
		read -r n served < <(search "$dir" "$fps" "$maxn")
		ratio=$(printf "%.3f" "$(echo "scale=6; $served / $raw" | bc)")
		echo "$app $r $raw $n $served $ratio"
		echo "$ratio" >>"$WORK/$app.ratios"
		echo "$raw" >>"$WORK/$app.raw"
		echo "$served" >>"$WORK/$app.served"
	done
	echo "# $app median of $RUNS: raw $(median <"$WORK/$app.raw") frames/s, served $(median <"$WORK/$app.served") frames/s, ratio $(median <"$WORK/$app.ratios")"
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ ${KEEP:-} == 1 ]] && echo "# work directory kept: $WORK"
exit 0
