#!/usr/bin/env bash
# FFCV, a peer in `make bench`, is built from source against libturbojpeg and OpenCV: their -dev
# packages come from the OS (installed here when root), then FFCV from PyPI into the venv, with
# requirements.txt as constraints so that no pinned package moves (a conflict fails the install
# instead). Exits non-zero, with a line saying why, where FFCV cannot be had.
# Usage: ensure_ffcv.sh PYTHON [REQUIREMENT]
set -euo pipefail
PY=${1:?usage: ensure_ffcv.sh PYTHON [REQUIREMENT]}
REQ=${2:-ffcv==1.0.2}
PINS="$(cd "$(dirname "$0")/.." && pwd)/requirements.txt"
"$PY" -c "import ffcv.loader" 2>/dev/null && exit 0
PKGS="libturbojpeg0-dev libopencv-dev pkg-config"
if ! pkg-config --exists libturbojpeg opencv4 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "Installing FFCV's build dependencies: $PKGS"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS
    else
        echo "FFCV needs $PKGS to build (as root: apt-get install -y $PKGS)" >&2
        exit 1
    fi
fi
echo "Installing $REQ (builds its C extension: a minute or two)"
"$PY" -m pip install --quiet -c "$PINS" "$REQ"
