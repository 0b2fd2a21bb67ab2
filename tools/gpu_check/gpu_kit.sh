#!/usr/bin/env bash
# `make gpu-kit`: the wheels a GPU machine without network lacks, in the git-ignored .gpu-kit/.
#
# The machine (gpu_check.sh, beside this script, runs there) has Python 3.12 with torch 2.11
# (cu130), torchvision 0.26, timm, numpy, pillow, psutil, matplotlib, tqdm, pytest, pyyaml,
# cloudpickle, packaging and filelock; this fetches the rest of what the code and the tests
# import, as cp312 manylinux x86_64 (or pure-Python) wheels, one version each. At most 64 MiB
# travel to the machine, the kit and the working tree together: the kit fails above KIT_MAX_MB
# (56 MiB), and --check also fails when kit + working tree pass TRAVEL_MAX_MB (60 MiB: room
# under the 64 MiB a call carries). wandb and submitit stay home (logger=none there; submitit only
# serves the SLURM launchers).
#
#   tools/gpu_check/gpu_kit.sh            download what is missing (quick when all is there)
#   tools/gpu_check/gpu_kit.sh --check    download nothing: every wheel present, tags, size
#   tools/gpu_check/gpu_kit.sh --list     the kit's NAME==VERSION, one a line
#   tools/gpu_check/gpu_kit.sh --travel   the size that travels (kit + working tree), its limit
set -euo pipefail
cd "$(dirname "$0")/../.." # the repository root: requirements.txt, the working tree

KIT=${KIT_DIR:-.gpu-kit}
KIT_MAX_MB=${KIT_MAX_MB:-56}
TRAVEL_MAX_MB=${TRAVEL_MAX_MB:-60}
PYTHON=${PYTHON:-python3}
PY_VERSION=3.12
PY_TAG=cp312
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)

die() {
    echo "gpu-kit: $*" >&2
    exit 1
}

# requirements.txt's pin of NAME (case and -/_ insensitive).
pin() {
    local want line name
    want=$(norm "$1")
    while IFS= read -r line; do
        line=${line%%#*}
        [[ $line == *==* ]] || continue
        name=$(norm "${line%%==*}")
        if [[ $name == "$want" ]]; then
            echo "${line##*==}" | tr -d '[:space:]'
            return 0
        fi
    done <requirements.txt
    die "$1 is not pinned in requirements.txt"
}

# A distribution name as wheel file names spell it: lower case, runs of -_. as one _.
norm() {
    echo "$1" | tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/_/g'
}

# Versions not pinned in requirements.txt (dependencies of what is): the ones .venv holds.
# antlr4-python3-runtime: omegaconf and hydra-core pin 4.9.*; pyvers: tensordict's only
# dependency the machine lacks; spdl 0.8 is a meta package over spdl_core (pure Python) and
# spdl_io (compiled); pytest-timeout: the tests use @pytest.mark.timeout under --strict-markers;
# tabulate (pure Python): every markdown table, the check's report among them (loaderbench.platform.tables).
# torchcodec 0.17 (built for torch 2.14) loads on torch 2.11 too and decodes JPEGs there, its
# batched nvJPEG decode included (0.15 and older have no image decoders); GPU_KIT_TORCHCODEC=V
# takes another release.
# nvidia-nvjpeg: nvImageCodec's nvJPEG extension dlopens libnvjpeg.so.13, found through its
# RUNPATH ($ORIGIN/../../cu13/lib: nvidia-nvjpeg's folder in the same site). torch 2.11's CUDA
# wheels bring no nvJPEG (cuda-toolkit 13.0.2 without its nvjpeg extra), and the copies in
# torchvision.libs and torchcodec.libs are renamed, so the kit carries the release cuda-toolkit
# 13.0.2 pins for its nvjpeg extra (the one torchvision and torchcodec bundle), which the
# machine's CUDA 13.0 driver runs; it exports every nvjpeg* symbol the extension asks for.
declare -A EXTRA_PINS=(
    [antlr4-python3-runtime]=4.9.3
    [pyvers]=0.2.3
    [torchcodec]=${GPU_KIT_TORCHCODEC:-0.17.0}
    [nvidia-nvjpeg]=13.0.1.86
)
# From requirements.txt, in this order; spdl_core and spdl_io take spdl's version.
PINNED=(hydra-core omegaconf tensordict spdl pytest-timeout nvidia-nvimgcodec-cu13 tabulate)

# NAME==VERSION of every wheel the kit holds.
specs() {
    local name spdl_version
    for name in "${PINNED[@]}"; do
        echo "$name==$(pin "$name")"
    done
    spdl_version=$(pin spdl)
    echo "spdl_core==$spdl_version"
    echo "spdl_io==$spdl_version"
    for name in "${!EXTRA_PINS[@]}"; do
        echo "$name==${EXTRA_PINS[$name]}"
    done | sort
}

# The kit's wheels of distribution NAME (any version), one a line.
wheels_of() {
    local want file
    want=$(norm "$1")
    for file in "$KIT"/*.whl; do
        [[ -e $file ]] || continue
        [[ $(norm "$(basename "$file" | cut -d- -f1)") == "$want" ]] && echo "$file"
    done
    return 0
}

# True when a wheel's tags install on CPython 3.12, Linux x86_64 (manylinux or pure Python).
tags_ok() {
    local base python abi platform tag ok=1
    base=$(basename "$1" .whl)
    platform=${base##*-}
    base=${base%-*}
    abi=${base##*-}
    base=${base%-*}
    python=${base##*-}
    [[ ".$python." =~ \.($PY_TAG|py3|py312)\. ]] || return 1
    [[ ".$abi." =~ \.(none|abi3|$PY_TAG)\. ]] || return 1
    [[ $platform == any ]] && return 0
    for tag in ${platform//./ }; do
        [[ $tag =~ ^manylinux.*_x86_64$ ]] && ok=0
    done
    return $ok
}

total_bytes() {
    local file total=0
    for file in "$KIT"/*.whl; do
        [[ -e $file ]] && total=$((total + $(stat -c %s "$file")))
    done
    echo "$total"
}

download() {
    local spec=$1 args=()
    local platform
    for platform in "${PLATFORMS[@]}"; do
        args+=(--platform "$platform")
    done
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version "$PY_VERSION" --implementation cp "${args[@]}" -d "$KIT" "$spec"
}

# Bytes of the working tree that travels (tracked and untracked-not-ignored files); fails
# outside a git checkout.
travelling_tree_bytes() {
    git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 1
    local file files=()
    while IFS= read -r -d '' file; do
        [[ -f $file ]] && files+=("$file") # a deleted file stays home
    done < <(git ls-files -z --cached --others --exclude-standard)
    ((${#files[@]})) || {
        echo 0
        return 0
    }
    stat -c %s -- "${files[@]}" | awk '{ total += $1 } END { print total + 0 }'
}

# antlr4-python3-runtime 4.9.3 is published as an sdist only: build its (pure-Python) wheel.
build_wheel() {
    local spec=$1 tmp
    tmp=$(mktemp -d)
    "$PYTHON" -m pip wheel --quiet --no-deps --no-binary="${spec%%==*}" -w "$tmp" "$spec"
    for file in "$tmp"/*.whl; do
        tags_ok "$file" || die "built $(basename "$file"), which is not pure Python"
        mv "$file" "$KIT/"
    done
    rm -rf "$tmp"
}

# One line: the kit's and the working tree's MiB, their sum against TRAVEL_MAX_MB; fails above.
travel_report() {
    local kit tree
    kit=$(total_bytes)
    tree=$(travelling_tree_bytes) || tree=0 # outside a checkout (the GPU machine): the kit only
    awk -v k="$kit" -v t="$tree" -v m="$TRAVEL_MAX_MB" -v d="$KIT" 'BEGIN {
        M = 1048576
        printf "gpu-kit: travels: kit %.2f MiB (%s) + working tree %.2f MiB = %.2f MiB", k / M, d, t / M, (k + t) / M
        printf " (limit %s MiB)%s\n", m, (k == 0 ? "; no kit yet: `make gpu-kit`" : "")
        exit (k + t > m * M) }' || {
        echo "gpu-kit: over the ${TRAVEL_MAX_MB} MiB that travel to the GPU machine" >&2
        return 1
    }
}

check_only=0
case "${1:-}" in
    --check) check_only=1 ;;
    --list)
        specs
        exit 0
        ;;
    --travel)
        travel_report
        exit
        ;;
    "") ;;
    *) die "usage: $0 [--check | --list | --travel]" ;;
esac

[[ $check_only == 1 ]] || mkdir -p "$KIT"
problems=0
while IFS= read -r spec; do
    name=${spec%%==*}
    version=${spec##*==}
    present=""
    while IFS= read -r file; do
        [[ -n $file ]] || continue
        if [[ $(basename "$file" | cut -d- -f2) == "$version" ]]; then
            present=$file
        elif [[ $check_only == 0 ]]; then
            echo "gpu-kit: removing $(basename "$file") (not $spec)"
            rm -f "$file"
        else
            echo "gpu-kit: extra version $(basename "$file") (want $spec)" >&2
            problems=1
        fi
    done < <(wheels_of "$name")
    if [[ -z $present ]]; then
        if [[ $check_only == 1 ]]; then
            echo "gpu-kit: missing $spec" >&2
            problems=1
            continue
        fi
        echo "gpu-kit: fetching $spec"
        if ! download "$spec" 2>"$KIT/.pip.err"; then
            echo "gpu-kit: no cp312 manylinux wheel of $spec; building it (pure Python)"
            build_wheel "$spec" || {
                cat "$KIT/.pip.err" >&2
                die "could neither download nor build $spec"
            }
        fi
        rm -f "$KIT/.pip.err"
        present=$(wheels_of "$name" | head -n 1)
        [[ -n $present ]] || die "no wheel of $spec after the download"
    fi
    if ! tags_ok "$present"; then
        echo "gpu-kit: $(basename "$present") does not install on CPython 3.12 x86_64" >&2
        problems=1
    fi
done < <(specs)

# Anything else in the folder (a package dropped from the list) does not travel.
expected=$(specs | cut -d= -f1 | while IFS= read -r n; do norm "$n"; done)
for file in "$KIT"/*.whl; do
    [[ -e $file ]] || continue
    if ! grep -qx "$(norm "$(basename "$file" | cut -d- -f1)")" <<<"$expected"; then
        if [[ $check_only == 1 ]]; then
            echo "gpu-kit: unexpected $(basename "$file")" >&2
            problems=1
        else
            echo "gpu-kit: removing $(basename "$file") (not in the kit)"
            rm -f "$file"
        fi
    fi
done

mib() {
    awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'
}
for file in "$KIT"/*.whl; do
    [[ -e $file ]] || continue
    printf '  %8s MiB  %s\n' "$(mib "$(stat -c %s "$file")")" "$(basename "$file")"
done
bytes=$(total_bytes)
printf 'gpu-kit: %d wheels, %s MiB in %s (limit %s MiB)\n' \
    "$(find "$KIT" -maxdepth 1 -name '*.whl' 2>/dev/null | wc -l)" "$(mib "$bytes")" "$KIT" "$KIT_MAX_MB"
if ((bytes > KIT_MAX_MB * 1048576)); then
    echo "gpu-kit: over the ${KIT_MAX_MB} MiB limit" >&2
    problems=1
fi
# What travels besides the kit: tracked files and untracked ones git does not ignore.
if tree_bytes=$(travelling_tree_bytes); then
    printf 'gpu-kit: the kit and the working tree travel together: %s + %s = %s MiB' \
        "$(mib "$bytes")" "$(mib "$tree_bytes")" "$(mib $((bytes + tree_bytes)))"
    printf ' (limit %s MiB)\n' "$TRAVEL_MAX_MB"
    if ((bytes + tree_bytes > TRAVEL_MAX_MB * 1048576)); then
        echo "gpu-kit: over the ${TRAVEL_MAX_MB} MiB that travel to the GPU machine" >&2
        problems=1
    fi
fi
if ((problems)) && [[ $check_only == 1 ]]; then
    echo "gpu-kit: the kit is incomplete: run \`make gpu-kit\` (pip, from PyPI) first" >&2
fi
exit "$problems"
