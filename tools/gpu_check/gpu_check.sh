#!/usr/bin/env bash
# tools/gpu_check/gpu_check.sh OUTDIR [--dry-run | --plan]: the prepared check for a GPU machine
# without network (scripts/gpu_check.sh forwards here).
#
# On the GPU machine (Python 3.12 with torch at `python3`; `make gpu-kit` run at home and
# .gpu-kit/ carried along), in under 8 minutes, each phase with its own time limit, the most
# valuable first (a slow start cuts the last ones):
#   env-quick  env.json at once: nvidia-smi, torch / CUDA (without the kit's libraries)
#   kit    the kit's wheels installed into a temporary site folder (nothing else is touched)
#   env    the machine: nvidia-smi, torch / CUDA / cuDNN, the kit's versions, whether
#          torchcodec, spdl.io and nvImageCodec load (and which libnvjpeg nvImageCodec found),
#          the JPEG decoder the loaders choose on each device
#   data   a synthetic ImageNet-like set (100 classes, 8000 train + 300 val JPEGs of
#          ImageNet's sizes)
#   projection  the plan's projected time (a row a phase and multirun, summed, start-up apart
#          from measuring): fails when it does not fit the budget with room; and the size
#          that travels (kit + tree)
#   ceiling  train.py loader=resident, model=resnet50,resnet18 (bf16, channels_last, 224 px,
#          batch 256, 2 epochs: 62 batches): the models' own rates, every row's ceiling
#   model  the same jobs with every loader: spdl nvjpeg and memmap raw and jpeg on CUDA (8
#          reading threads: their work is on the GPU), then torchvision and spdl turbo (14)
#   tests  pytest -m cuda
#   decode the decoder table (decode_bench.py): 1024 of its train JPEGs in batches of 256,
#          whole and region: the loaders' choice, each nvImageCodec engine alone with and
#          without fancy upsampling, the hardware engine/CUDA split, TorchCodec and
#          torchvision.io; images/s, CPU ms an image, |difference| from Pillow
#   sharing  the GPU's JPEG decoder driven from one thread a batch at a time, by 4 threads
#          sharing it behind a lock, or by 4 threads with a decoder and stream each
#          (sharing.py)
#   ladder train.py model=none, spdl turbo and torchvision at 2, 4, 8 and 14 threads or
#          workers (12 batches of 128 each)
# One Hydra multirun a loader setting, logger=none. The report (report.md) has a row a job
# with its metrics by their catalog names: images_per_s, ceiling_frac (over the resident row
# with the same model), steady_batches, images_per_s_end_to_end, data_wait_frac,
# cpu_s_per_1k_images (CPU ms per image), ttfb_s, peak_rss_mb; the decode and sharing figures;
# the machine; the tests. OUTDIR also gets check.log (everything printed), pytest.log,
# env.json, decode.json, sharing.json and runs.tar.gz (every job's metrics.json, log and
# .hydra/; no checkpoints).
# A failing job or phase does not stop the others; the exit code is 0 only when all passed.
#
# --plan prints the projection and the size that travels, and runs nothing (exit 1: over budget).
# Without CUDA it refuses (exit 3) unless given --dry-run, which does what a CPU can: checks the
# kit, a small data set (256 px at most), the decode phase on CPU threads, pytest -m cuda (they
# skip), and the same sweeps on the CPU with a tiny model at 32 px and small counts (no
# nvjpeg), with wandb and submitit made unimportable as on the GPU machine; then the same
# report. It runs with .venv's python and installs the kit into a fresh folder for `python3.12`
# where one is on the PATH; with PY312=PATH (a Python 3.12 holding the GPU machine's stack:
# torch 2.11, torchvision 0.26, ...) it runs every phase with that python and the kit installed
# as on the GPU machine.
# Environment: PYTHON (the interpreter, over all else), PY312, GPU_CHECK_BUDGET_S (the whole
# check's time limit), GPU_CHECK_DRY_NVJPEG=1 (the dry run tries nvjpeg too: failed rows).
set -euo pipefail
# The repository root: the Python beside this script runs from there (python -m tools.gpu_check).
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
KIT_SCRIPT=$REPO/tools/gpu_check/gpu_kit.sh

usage() {
    echo "usage: $0 OUTDIR [--dry-run]" >&2
    exit 2
}
OUT="" DRY=0 WALKING_PLAN=0 PRINT_PLAN=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        --plan) PRINT_PLAN=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        -*) usage ;;
        *)
            [[ -z $OUT ]] || usage
            OUT=$arg
            ;;
    esac
done
[[ -n $OUT || $PRINT_PLAN == 1 ]] || usage
[[ $PRINT_PLAN == 1 ]] && DRY=1 # the projection is the GPU plan's, wherever it is printed

# The interpreter: PYTHON where given; else on a dry run PY312 (the GPU machine's stack, the kit
# installed as there: STACK=gpu) or this checkout's .venv; else the machine's python3.
STACK=gpu
if [[ -n ${PYTHON:-} ]]; then
    PY=$PYTHON
elif [[ $DRY == 1 && -n ${PY312:-} ]]; then
    PY=$PY312
elif [[ $DRY == 1 && -x $REPO/.venv/bin/python ]]; then
    PY=$REPO/.venv/bin/python
else
    PY=python3
fi
[[ $DRY == 1 && $PY != "${PY312:-}" ]] && STACK=home

cuda_rc=0 cuda_msg="not asked (--plan)"
[[ $PRINT_PLAN == 1 ]] || cuda_msg=$("$PY" -c '
import sys
import torch
state = f"torch {torch.__version__}, CUDA build {torch.version.cuda}"
if not torch.cuda.is_available():
    print(f"torch.cuda.is_available() is False ({state})")
    sys.exit(3)
print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} ({state})")
' 2>&1) || cuda_rc=$?
if [[ $cuda_rc != 0 && $DRY == 0 && $PRINT_PLAN == 0 ]]; then
    echo "gpu_check: no CUDA here: $(tail -n 1 <<<"$cuda_msg") [$PY]" >&2
    echo "gpu_check: this check needs a CUDA GPU; run it on the GPU machine, or add --dry-run" \
        "to check here everything a CPU can." >&2
    exit 3
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
if [[ $PRINT_PLAN == 0 ]]; then
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    rm -f "$OUT"/report.md "$OUT"/check.log "$OUT"/pytest.log "$OUT"/env.json \
        "$OUT"/decode.json "$OUT"/sharing.json "$OUT"/runs.tar.gz
fi
PLAN=$WORK/plan.tsv
PHASES=$WORK/phases.tsv
PROJECTED=$WORK/projected.tsv # the plan walked without running: phases and sweeps in order
export PY WORK REPO DRY PROJECTED KIT_SCRIPT

now() { date +%s.%N; }
T0=$(now)
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
# The whole check's limit (8 minutes on the GPU machine, less a margin); the report and the
# archive at the end have RESERVE_S of it kept for them, and run whatever is left. The dry run
# took 12 minutes on 2 cores shared at a load of 16 (2026-12-04).
BUDGET_S=${GPU_CHECK_BUDGET_S:-460}
[[ $DRY == 1 ]] && BUDGET_S=${GPU_CHECK_BUDGET_S:-840}
GPU_BUDGET_S=${GPU_CHECK_BUDGET_S:-460} # what the projection holds the GPU plan to
RESERVE_S=25
export GPU_BUDGET_S RESERVE_S
FINAL=0
FAILED=0

# phase NAME BUDGET_S COMMAND...: COMMAND under `timeout` (its whole process group), within what
# is left of the check's budget; its exit code and time go to phases.tsv. PHASE_LOG=FILE: the
# output goes to FILE, then to the console.
phase() {
    local name=$1 budget=$2 start rc=0 left took
    shift 2
    if [[ $WALKING_PLAN == 1 ]]; then
        printf 'phase\t%s\n' "$name" >>"$PROJECTED"
        return 0
    fi
    # The dry run's CPU stand-ins on a shared machine: twice the GPU's limit a phase.
    [[ $DRY == 1 ]] && budget=$((budget * 2))
    left=$(awk -v b="$BUDGET_S" -v t="$(since "$T0")" -v r="$RESERVE_S" \
        'BEGIN { printf "%d", b - t - r }')
    ((FINAL == 0 && left < budget)) && budget=$left
    if ((budget < 5)); then
        echo "=== [$name] skipped: the check is out of time"
        printf '%s\t0\t0\tskipped (out of time)\n' "$name" >>"$PHASES"
        FAILED=1
        return 1
    fi
    echo
    echo "=== [$name] limit ${budget}s, $(since "$T0")s into the check: $*"
    start=$(now)
    if [[ -n ${PHASE_LOG:-} ]]; then
        timeout -k 10 "$budget" "$@" >"$PHASE_LOG" 2>&1 || rc=$?
        cat "$PHASE_LOG"
    else
        timeout -k 10 "$budget" "$@" || rc=$?
    fi
    took=$(since "$start")
    local state=$rc
    [[ $rc == 124 || $rc == 137 ]] && state="$rc (timed out)"
    printf '%s\t%s\t%s\t%s\n' "$name" "$took" "$budget" "$state" >>"$PHASES"
    echo "=== [$name] exit $state after ${took}s"
    if [[ $rc != 0 ]]; then
        FAILED=1
        return 1
    fi
}

# The kit into a fresh site folder with the machine's python (pip, or unzip where pip is absent).
install_kit() {
    set -euo pipefail
    "$KIT_SCRIPT" --check || echo "gpu_check: the kit is incomplete (above)" >&2
    shopt -s nullglob
    local wheels=("$REPO"/.gpu-kit/*.whl)
    if ((${#wheels[@]} == 0)); then
        echo "gpu_check: no wheels in .gpu-kit/: run \`make gpu-kit\` and carry .gpu-kit" >&2
        return 1
    fi
    mkdir -p "$WORK/site"
    if "$PY" -m pip --version >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$WORK/site" "${wheels[@]}"
    else
        echo "gpu_check: no pip for $PY: unpacking the wheels instead"
        local wheel
        for wheel in "${wheels[@]}"; do
            "$PY" -m zipfile -e "$wheel" "$WORK/site"
        done
    fi
    echo "installed ${#wheels[@]} wheels into $WORK/site:"
    ls "$WORK/site"
}

# The dry run's kit phase: tags and completeness; an install where a Python 3.12 exists.
check_kit() {
    set -euo pipefail
    "$KIT_SCRIPT" --check
    local py312=${PY312:-python3.12}
    if "$py312" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; then
        mkdir -p "$WORK/site312"
        "$py312" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$WORK/site312" "$REPO"/.gpu-kit/*.whl
        echo "kit installed into a fresh Python 3.12 site folder ($("$py312" -V), $WORK/site312)"
    else
        echo "no Python 3.12 here: kit install skipped (the wheels' tags are checked above)"
    fi
}

# The dry run makes wandb and submitit unimportable, as they are on the GPU machine.
absent_modules() {
    local name
    for name in wandb submitit; do
        mkdir -p "$WORK/absent/$name"
        echo "raise ImportError('$name is absent on the GPU machine (gpu_check --dry-run)')" \
            >"$WORK/absent/$name/__init__.py"
    done
}

export -f install_kit check_kit

# sweep NAME TITLE SCRIPT JOBS BUDGET_S OVERRIDES...: one Hydra multirun of the benchmark.
sweep() {
    local name=$1 title=$2 script=$3 jobs=$4 budget=$5
    shift 5
    if [[ $WALKING_PLAN == 1 ]]; then
        { printf 'sweep\t%s\t%s' "$name" "$jobs" && printf '\t%s' "$@" && echo; } >>"$PROJECTED"
        return 0
    fi
    printf '%s\t%s\t%s\n' "$name" "$title" "$jobs" >>"$PLAN"
    phase "$name" "$budget" "$PY" "$script" --multirun "${COMMON[@]}" "$@" \
        "hydra.sweep.dir=$WORK/runs/$name" || true
}

# Dry-run settings only when running the dry run for real: the plan walked first is the GPU's.
dry_settings() { [[ $DRY == 1 && $WALKING_PLAN == 0 ]]; }

# The projection of the GPU plan (walked with WALKING_PLAN=1 into $PROJECTED) and what travels.
project() {
    local rc=0
    "$PY" -m tools.gpu_check.plan "$PROJECTED" --budget "$GPU_BUDGET_S" \
        --reserve "$RESERVE_S" || rc=$?
    "$KIT_SCRIPT" --travel || rc=1
    return $rc
}
export -f project

# Every phase and multirun of the check, the most valuable first: walked once with
# WALKING_PLAN=1 (nothing runs: the projection's plan), then for real.
checks() {
    setup_phases
    run_phases
}

# The machine record, the kit, the data and the projection; sets PYTHONPATH, root and the data
# set's size for the runs and the report.
setup_phases() {
    PYTHONPATH=$REPO/src phase env-quick 30 "$PY" -m tools.gpu_check env "$OUT/env.json" \
        --quick || true
    if [[ $STACK == home ]]; then
        phase kit 60 bash -c check_kit || true
        export PYTHONPATH=$REPO/src
    else
        phase kit 90 bash -c install_kit || true
        export PYTHONPATH=$WORK/site:$REPO/src
    fi
    if [[ $DRY == 1 && $WALKING_PLAN == 0 ]]; then
        absent_modules
        export PYTHONPATH=$WORK/absent:$PYTHONPATH
    fi
    export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
    phase env 60 "$PY" -m tools.gpu_check env "$OUT/env.json" || true

    if dry_settings; then
        # Small images: the dry run checks the plumbing (every later phase decodes them); over
        # memmap's store side (192), so that its shrinking of larger images runs too.
        classes=10 train=20 val=10 sizes=(--max-side 256) shape="of 256 px at most"
    else
        classes=100 train=80 val=3 sizes=() shape="of ImageNet's sizes"
    fi
    PHASE_LOG=$WORK/data.log phase data 90 "$PY" -m tools.gpu_check data "$WORK/data" \
        --classes $classes --train $train --val $val ${sizes[@]+"${sizes[@]}"} || true
    root=$(tail -n 1 "$WORK/data.log" 2>/dev/null || true)
    phase projection 30 bash -c project || true
}

# The benchmark's multiruns, the tests and the decode phases; sets the runs' settings (size,
# batch, models, workers, nvjpeg) the report's notes name.
run_phases() {
    # GPU-side loaders (their decode and crops run on the GPU, the reading threads feed it):
    # one count. CPU decoders: 14 with the models (two cores left to the main loop and the
    # device stage), and the ladder without a model.
    local gpu_side=8 cpu_side=14 ladder=2,4,8,14 models=resnet50,resnet18 jobs_models=2
    if dry_settings; then
        # Small counts: the rehearsal checks that every job runs, not how counts compare.
        gpu_side=1 cpu_side=1 ladder=1,2 size=32 batch=16 models=test_resnet jobs_models=1
        # fp32: bf16 convolutions on a CPU without native bf16 run ~10x slower (and every
        # model job also measures its own ceiling), so a bf16 rehearsal outruns its limits.
        epochs=1 ladder_batches=3 precision=fp32
        COMMON=(device=cpu bench.warmup_batches=1)
    else
        # 2 epochs of 8000 train images: 62 batches a job, 40 or more of them steady.
        size=224 batch=256 epochs=2 ladder_batches=12 precision=bf16
        COMMON=(device=cuda bench.warmup_batches=3)
    fi
    workers="$gpu_side (GPU-side), $cpu_side with the models and $ladder alone (CPU decoders)"
    model=("model=$models" model.channels_last=true)
    COMMON+=("dataset.root=$root" "dataset.index_dir=$WORK/cache" "image_size=$size"
        "precision=$precision" logger=none)
    nvjpeg=1
    dry_settings && [[ ${GPU_CHECK_DRY_NVJPEG:-0} != 1 ]] && nvjpeg=0
    local with_model=("${model[@]}" "epochs=$epochs" "loader.batch_size=$batch")
    local cache=("loader.cache_dir=$WORK/cache")
    # The ladder in batches of half the size: 12 of them (9 past warm-up) for 1,536 images.
    local alone=(model=none bench.epochs=1 "bench.max_batches=$ladder_batches"
        "loader.batch_size=$((batch / 2))")
    local label="train.py model=$models"

    # The most valuable first: the ceiling, then the GPU-side loaders against it.
    sweep ceiling-resident "$label, loader=resident: the model's ceiling" train.py \
        "$jobs_models" 60 loader=resident "${with_model[@]}"
    loader_sweep nvjpeg model "$label" "$gpu_side" "$jobs_models" 100 "${with_model[@]}"
    sweep model-memmap "$label, memmap, store raw and jpeg" train.py $((2 * jobs_models)) 100 \
        loader=memmap loader.store=raw,jpeg "${cache[@]}" "${with_model[@]}" \
        "loader.num_workers=$gpu_side"

    PHASE_LOG=$OUT/pytest.log phase tests 90 "$PY" -m pytest -m cuda -p no:cacheprovider \
        --basetemp "$WORK/pytest" || true
    # Batched decode, each case for a second; the dry run's on CPU threads.
    local decode_args=(--device cuda --batch 256 --images 1024 --seconds 0.3)
    local sharing_args=(--device cuda --images 1024 --seconds 1.5)
    if dry_settings; then
        decode_args=(--device cpu --batch 32 --images 96 --seconds 0.2)
        sharing_args=(--device cpu --images 64 --seconds 0.3)
    fi
    phase decode 45 "$PY" -m tools.gpu_check decode "$root" --out "$OUT/decode.json" \
        "${decode_args[@]}" || true
    phase sharing 40 "$PY" -m tools.gpu_check sharing "$root" --out "$OUT/sharing.json" \
        "${sharing_args[@]}" || true

    loader_sweep torchvision model "$label" "$cpu_side" "$jobs_models" 100 "${with_model[@]}"
    loader_sweep turbo model "$label" "$cpu_side" "$jobs_models" 120 "${with_model[@]}"
    local counts
    counts=$(tr , '\n' <<<"$ladder" | wc -l)
    label="train.py model=none, the CPU decoders' ladder"
    loader_sweep turbo ladder "$label" "$ladder" "$counts" 60 "${alone[@]}"
    loader_sweep torchvision ladder "$label" "$ladder" "$counts" 70 "${alone[@]}"
}

# loader_sweep nvjpeg|turbo|torchvision KIND LABEL WORKERS JOBS CAP OVERRIDES...: one train.py
# multirun of one loader setting (over the models and the worker counts WORKERS in OVERRIDES).
loader_sweep() {
    local which=$1 kind=$2 label=$3 counts=$4 jobs=$5 cap=$6
    shift 6
    case $which in
        nvjpeg)
            [[ $nvjpeg == 1 ]] || return 0
            sweep "$kind-spdl-nvjpeg" "$label, spdl, nvjpeg (GPU) decoder" train.py "$jobs" \
                "$cap" loader=spdl loader.decoder=nvjpeg "$@" "loader.num_workers=$counts"
            ;;
        turbo)
            sweep "$kind-spdl-turbo" "$label, spdl, turbo (CPU) decoder" train.py "$jobs" \
                "$cap" loader=spdl loader.decoder=turbo "$@" "loader.num_workers=$counts"
            ;;
        torchvision)
            sweep "$kind-torchvision" "$label, torchvision (DataLoader processes, PIL)" \
                train.py "$jobs" "$cap" loader=torchvision "$@" "loader.num_workers=$counts"
            ;;
    esac
}

main() {
    # The CPUs it may run on (nproc answers OMP_NUM_THREADS instead where that is set).
    local cpus
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $cpus CPUs," \
        "mode: $([[ $DRY == 1 ]] && echo dry run || echo GPU), python: $PY," \
        "kit: $([[ $STACK == gpu ]] && echo installed || echo checked)"
    echo "gpu_check: CUDA: $(tail -n 1 <<<"$cuda_msg")"
    echo "gpu_check: work folder $WORK, results in $OUT"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L || true
    else
        echo "gpu_check: no nvidia-smi"
    fi
    # The GPU plan, walked first without running anything: the projection phase prints it.
    WALKING_PLAN=1 checks
    checks

    FINAL=1
    local mode notes=()
    mode="GPU check: $(tail -n 1 <<<"$cuda_msg")"
    [[ $DRY == 1 ]] && mode="GPU check, DRY RUN on the CPU (not GPU figures)"
    [[ $DRY == 1 && $STACK == gpu ]] && mode+=", in the GPU machine's stack with the kit installed"
    note() { notes+=("$*"); } # one note of all its arguments
    note "$(date -u +%Y-%m-%d\ %H:%M) UTC on $(hostname), $cpus CPUs; python $PY"
    note "CUDA: $(tail -n 1 <<<"$cuda_msg")"
    note "data: synthetic, $classes classes, $((classes * train)) train +" \
        "$((classes * val)) val JPEGs $shape (${root##*/})"
    note "runs: image_size=$size, loader.batch_size=$batch, epochs=$epochs with a model," \
        "bench.max_batches=$ladder_batches of $((batch / 2)) alone," \
        "loader.num_workers=$workers," \
        "precision=$precision, ${model[*]}; logger=none"
    [[ $nvjpeg == 0 ]] && note "spdl nvjpeg: not run (needs CUDA)"
    note "report written $(since "$T0") s into the check (budget ${BUDGET_S} s);" \
        "every job's files: runs.tar.gz"
    # The report's tables need tabulate (loaderbench.platform.tables), a wheel of the kit: where the kit
    # did not install, the wheel itself (pure Python: importable as a zip), last on the path.
    local tabulate_wheel
    tabulate_wheel=$(compgen -G "$REPO/.gpu-kit/tabulate-*.whl" | head -n 1 || true)
    PYTHONPATH=$PYTHONPATH${tabulate_wheel:+:$tabulate_wheel} \
        phase report 30 "$PY" -m tools.gpu_check report --out "$OUT/report.md" \
        --runs "$WORK/runs" --plan "$PLAN" --phases "$PHASES" --env "$OUT/env.json" \
        --pytest-log "$OUT/pytest.log" --decode "$OUT/decode.json" \
        --sharing "$OUT/sharing.json" --title "$mode" \
        "${notes[@]/#/--note=}" || true

    mkdir -p "$WORK/runs"
    cp "$PLAN" "$PHASES" "$WORK/runs/" 2>/dev/null || true
    phase pack 30 tar -czf "$OUT/runs.tar.gz" -C "$WORK" --exclude='*.pt' runs || true
    local bytes
    bytes=$(stat -c %s "$OUT/runs.tar.gz" 2>/dev/null || echo 0)
    if ((bytes > 16 * 1048576)); then
        echo "gpu_check: runs.tar.gz is over 16 MiB: keeping metrics, logs and summaries only"
        (cd "$WORK" && find runs -name metrics.json -o -name '*.log' -o -name 'summary.*' \
            -o -name '*.tsv' | tar -czf "$OUT/runs.tar.gz" -T -)
    fi

    echo
    echo "gpu_check: $(since "$T0") s in all; $OUT:"
    ls -l "$OUT"
    if [[ -f $OUT/report.md ]]; then
        echo
        cat "$OUT/report.md"
    fi
    if [[ $FAILED != 0 ]]; then
        echo "gpu_check: FAILED: see the phases and rows above" >&2
        return 1
    fi
    echo "gpu_check: all phases passed"
}

cleanup() {
    rm -rf "$WORK"
}
trap cleanup EXIT
if [[ $PRINT_PLAN == 1 ]]; then
    WALKING_PLAN=1 checks
    export PYTHONPATH=$REPO/src
    plan_rc=0
    project || plan_rc=$?
    exit $plan_rc
fi
main 2>&1 | tee "$OUT/check.log"
