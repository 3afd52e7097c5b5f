#!/usr/bin/env bash
# ort-fetch.sh: install the ONNX Runtime shared library the onnx executor loads (make ort).
#
# The library is the linux-x64 CPU build inside the npm package onnxruntime-node@1.30.0
# (libonnxruntime.so.1, 45.8 MB; needs only libc, libm and libstdc++). The tarball is 113 MB, so it
# and the extracted library live in a cache outside the clone:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/mdag/onnxruntime-node-1.30.0/libonnxruntime.so.1
# (MDAG_ORT_CACHE overrides the directory). Both the tarball and the library are checked against pinned
# sha256 sums; the script does nothing when the library is there with the right sum.
# `npm pack` only downloads the tarball: no install scripts run.
set -euo pipefail

VERSION=1.30.0
TGZ_SHA256=6e3390d6b783e7be946fad629292799da28d0b42f84856e50d2c1b0383291e75
LIB_SHA256=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
MEMBER=package/bin/napi-v6/linux/x64/libonnxruntime.so.1

dir=${MDAG_ORT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mdag/onnxruntime-node-$VERSION}
lib=$dir/libonnxruntime.so.1
tgz=$dir/onnxruntime-node-$VERSION.tgz

sum() { sha256sum "$1" | cut -d' ' -f1; }

# --print-path: where the library is (or will be), nothing else
if [ "${1:-}" = --print-path ]; then
	echo "$lib"
	exit 0
fi

if [ "$(uname -sm)" != "Linux x86_64" ]; then
	echo "ort: onnxruntime-node carries the library used here for Linux x86_64 only (this is $(uname -sm)); set MDAG_ORT_LIB to a libonnxruntime.so of version >= 1.24" >&2
	exit 1
fi
if [ -f "$lib" ] && [ "$(sum "$lib")" = "$LIB_SHA256" ]; then
	echo "ort: present ($lib)"
	exit 0
fi
mkdir -p "$dir"
if ! [ -f "$tgz" ] || [ "$(sum "$tgz")" != "$TGZ_SHA256" ]; then
	if ! command -v npm >/dev/null; then
		# Debian's npm (make deps installs what the build needs; this is the one package it needs first)
		sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
		echo "ort: installing npm (Debian) to fetch onnxruntime-node@$VERSION"
		$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null ||
			{ echo "ort: npm is needed to fetch onnxruntime-node@$VERSION and could not be installed (apt-get install npm)" >&2; exit 1; }
	fi
	echo "ort: npm pack onnxruntime-node@$VERSION (113 MB) into $dir"
	rm -f "$tgz"
	(cd "$dir" && npm pack --silent "onnxruntime-node@$VERSION" >/dev/null)
	got=$(sum "$tgz")
	if [ "$got" != "$TGZ_SHA256" ]; then
		echo "ort: $tgz has sha256 $got, want $TGZ_SHA256; removed" >&2
		rm -f "$tgz"
		exit 1
	fi
fi
tar -xzf "$tgz" -O "$MEMBER" >"$lib.tmp"
got=$(sum "$lib.tmp")
if [ "$got" != "$LIB_SHA256" ]; then
	echo "ort: $MEMBER in $tgz has sha256 $got, want $LIB_SHA256" >&2
	rm -f "$lib.tmp"
	exit 1
fi
mv "$lib.tmp" "$lib"
echo "ort: installed $lib (sha256 verified)"
