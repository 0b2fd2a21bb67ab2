#!/usr/bin/env bash
# SPDL's CPU decoder loads FFmpeg's shared libraries at run time; they come from the OS.
set -euo pipefail
PKGS="libavutil57 libavcodec59 libavformat59 libavfilter8 libavdevice59"
LIBS="libavutil libavcodec libavformat libavfilter libavdevice"
missing=0
for lib in $LIBS; do
    if ! ldconfig -p 2>/dev/null | grep -q "${lib}\.so\."; then missing=1; fi
done
[ "$missing" = 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing FFmpeg shared libraries for SPDL: $PKGS"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PKGS
else
    echo "FFmpeg's shared libraries are missing. Run, as root:" >&2
    echo "    apt-get update && apt-get install -y $PKGS" >&2
    exit 1
fi
