#!/usr/bin/env bash
# tools/traces.sh [BIN] [OUTDIR]: the objects-per-frame traces of issue 24 (`make traces`).
# Runs real detectors (HOG people, Haar faces, BlazeFace on ONNX Runtime, MOG2 motion) over
# opencv-doc's sample videos with `mdag trace` at 10 fps, writes OUTDIR/VIDEO-DETECTOR.csv and
# OUTDIR/README.md: the exact commands, the machine, and per trace its frames and mean/max objects.
# OPENCV_DATA moves the videos' directory (default Debian's opencv-doc).
set -euo pipefail
bin=${1:-bin/mdag}
out=${2:-examples/traces}
data=${OPENCV_DATA:-/usr/share/doc/opencv-doc/examples/data}
fps=10
# name video detector: what each trace is for
traces=(
	"vtest-hog vtest.avi hog"
	"vtest-motion vtest.avi motion"
	"megamind-haar Megamind.avi haar"
	"megamind-blazeface Megamind.avi blazeface"
	"megamind-motion Megamind.avi motion"
)
for t in "${traces[@]}"; do
	read -r _ video _ <<<"$t"
	[ -f "$data/$video" ] || { echo "traces: $data/$video absent (Debian package opencv-doc; make deps installs it)" >&2; exit 1; }
done
mkdir -p "$out"
rows=()
cmds=()
for t in "${traces[@]}"; do
	read -r name video det <<<"$t"
	cmd=("$bin" trace --video "$data/$video" --detector "$det" --fps "$fps" --out "$out/$name.csv")
	echo "traces: ${cmd[*]}" >&2
	start=$(date +%s.%N)
	"${cmd[@]}"
	secs=$(echo "$(date +%s.%N) - $start" | bc)
	cmds+=("${cmd[*]}")
	# frames, video seconds covered, mean and max objects, frames with none
	sum=$(awk -F, 'NR > 2 { n++; s += $2; if ($2 > m) m = $2; if ($2 == 0) z++; last = $1 }
		END { printf "%d | %.1f | %.2f | %d | %d", n, last, s / n, m, z }' "$out/$name.csv")
	rows+=("| \`$name.csv\` | $video | $det | $sum | $(printf '%.0f' "$secs") |")
done
header=$(head -n 1 "$out/${traces[0]%% *}.csv")
commit=$(sed -n 's/.* commit=\([^ ]*\).*/\1/p' <<<"$header")
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
{
	echo "# Objects-per-frame traces (issue 24)"
	echo
	echo "Measured by running real detectors over the sample videos of Debian's opencv-doc"
	echo "(\`$data\`)"
	echo "with \`mdag trace\` at $fps fps (frames sampled by timestamp: the first frame at or after each"
	echo "k/$fps s). Each CSV is \`t_s,objects\` per sampled frame after one comment line naming the"
	echo "video and its sha256, the detector with all its params, the rates, the frame size and the mdag"
	echo "commit that made it. \`make traces\` regenerates all of them and this file (\`tools/traces.sh\`);"
	echo "\`go test ./cmd/mdag -run TestCommittedTraces\` checks they parse, match the videos' sha256 and that"
	echo "the motion trace of vtest.avi is reproduced."
	echo
	echo "Detectors: \`hog\` is the hog-people op (OpenCV's HOG people detector, frames downscaled to 640 px"
	echo "wide), \`haar\` the haar-face op (Debian's frontal-face cascade), \`blazeface\` the registry's"
	echo "BlazeFace model (real MediaPipe weights, \`make models\`) on ONNX Runtime's CPU provider, and"
	echo "\`motion\` the motion op (MOG2 background subtraction on a 192 px wide copy, one model over the"
	echo "sampled frames, its first 5 frames learning, so they report 0)."
	echo
	echo "What they measure: vtest.avi is a still camera over a walkway, so hog counts people and motion counts"
	echo "moving blobs (a group walking together is one; a walker split in parts is several). Megamind.avi is a"
	echo "film clip with cuts and a moving camera: haar and blazeface count faces (they disagree on many frames),"
	echo "while motion counts fragments of a changing picture, often at the op's cap of 16 regions: it is"
	echo "change, not objects, and is kept as the extreme of an objects-per-frame trace."
	echo
	echo "| trace | video | detector | frames | video s | mean objects | max | frames with none | run s |"
	echo "|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "Made on $(date -u +%Y-%m-%d) on $(uname -sm), $cpu, $(nproc) cores, OpenCV $(pkg-config --modversion opencv4),"
	echo "mdag commit $commit, by:"
	echo
	echo '```'
	printf '%s\n' "${cmds[@]}"
	echo '```'
} >"$out/README.md"
echo "traces: wrote $out/README.md" >&2
