#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR [--dry-run]: the prepared check for a GPU machine without network.
#
# On the GPU machine (Python 3.12 with torch at `python3`; `make gpu-kit` run at home and
# .gpu-kit/ carried along), in under 8 minutes, each phase with its own time limit:
#   kit    the kit's wheels installed into a temporary site folder (nothing else is touched)
#   env    the machine: nvidia-smi, torch / CUDA / cuDNN, the kit's versions, whether
#          torchcodec, spdl.io and nvImageCodec load (and which libnvjpeg nvImageCodec found),
#          the JPEG decoder the loaders choose on each device
#   data   a synthetic ImageNet-like set (100 classes, 4000 train + 1000 val JPEGs of
#          ImageNet's sizes)
#   decode batched JPEG decode of 2048 of its train images through loaderbench.decode:
#          nvImageCodec (whole images, and only each train crop's box) against TorchCodec's
#          and torchvision.io's batched nvJPEG decode (whole images, then cut), and their pixels
#   tests  pytest -m cuda
#   bench  every loader (memmap raw / jpeg store, spdl turbo / nvjpeg, torchvision) at 4 and 12
#          workers, 224 px: train.py model=resnet50 (bf16, channels_last), train.py model=none
#          and eval.py model=none; one Hydra multirun a loader setting, logger=none
# and writes to OUTDIR: report.md (a row a job: images/s, data_wait_frac, cpu_s_per_1k_images,
# ttfb_s, peak_rss_mb; the decode figures; the machine; the tests), check.log (everything
# printed), pytest.log, env.json, decode.json and runs.tar.gz (every job's metrics.json, log
# and .hydra/; no checkpoints).
# A failing job or phase does not stop the others; the exit code is 0 only when all passed.
#
# Without CUDA it refuses (exit 3) unless given --dry-run, which does what a CPU can: checks the
# kit, a small data set, the decode phase on CPU threads, pytest -m cuda (they skip), and the
# same sweeps on the CPU with a tiny model at 64 px and one worker count (no nvjpeg), with wandb
# and submitit made unimportable as on the GPU machine; then the same report. It runs with
# .venv's python and installs the kit into a fresh folder for `python3.12` where one is on the
# PATH; with PY312=PATH (a Python 3.12 holding the GPU machine's stack: torch 2.11, torchvision
# 0.26, ...) it runs every phase with that python and the kit installed as on the GPU machine.
# Environment: PYTHON (the interpreter, over all else), PY312, GPU_CHECK_BUDGET_S (the whole
# check's time limit), GPU_CHECK_DRY_NVJPEG=1 (the dry run tries nvjpeg too: failed rows).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

usage() {
    echo "usage: $0 OUTDIR [--dry-run]" >&2
    exit 2
}
OUT="" DRY=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
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
[[ -n $OUT ]] || usage

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

cuda_rc=0
cuda_msg=$("$PY" -c '
import sys
import torch
state = f"torch {torch.__version__}, CUDA build {torch.version.cuda}"
if not torch.cuda.is_available():
    print(f"torch.cuda.is_available() is False ({state})")
    sys.exit(3)
print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} ({state})")
' 2>&1) || cuda_rc=$?
if [[ $cuda_rc != 0 && $DRY == 0 ]]; then
    echo "gpu_check: no CUDA here: $(tail -n 1 <<<"$cuda_msg") [$PY]" >&2
    echo "gpu_check: this check needs a CUDA GPU; run it on the GPU machine, or add --dry-run" \
        "to check here everything a CPU can." >&2
    exit 3
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/report.md "$OUT"/check.log "$OUT"/pytest.log "$OUT"/env.json "$OUT"/decode.json \
    "$OUT"/runs.tar.gz
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
PLAN=$WORK/plan.tsv
PHASES=$WORK/phases.tsv
export PY WORK REPO DRY

now() { date +%s.%N; }
T0=$(now)
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
# The whole check's limit (8 minutes on the GPU machine, less a margin); the report and the
# archive at the end have RESERVE_S of it kept for them, and run whatever is left. The dry run
# takes about 2 minutes on 2 shared cores.
BUDGET_S=${GPU_CHECK_BUDGET_S:-440}
[[ $DRY == 1 ]] && BUDGET_S=${GPU_CHECK_BUDGET_S:-400}
RESERVE_S=25
FINAL=0
FAILED=0

# phase NAME BUDGET_S COMMAND...: COMMAND under `timeout` (its whole process group), within what
# is left of the check's budget; its exit code and time go to phases.tsv. PHASE_LOG=FILE: the
# output goes to FILE, then to the console.
phase() {
    local name=$1 budget=$2 start rc=0 left took
    shift 2
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
    "$REPO/scripts/gpu_kit.sh" --check || echo "gpu_check: the kit is incomplete (above)" >&2
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
    "$REPO/scripts/gpu_kit.sh" --check
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
    printf '%s\t%s\t%s\n' "$name" "$title" "$jobs" >>"$PLAN"
    phase "$name" "$budget" "$PY" "$script" --multirun "${COMMON[@]}" "$@" \
        "hydra.sweep.dir=$WORK/runs/$name" || true
}

main() {
    echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) CPUs," \
        "mode: $([[ $DRY == 1 ]] && echo dry run || echo GPU), python: $PY," \
        "kit: $([[ $STACK == gpu ]] && echo installed || echo checked)"
    echo "gpu_check: CUDA: $(tail -n 1 <<<"$cuda_msg")"
    echo "gpu_check: work folder $WORK, results in $OUT"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L || true
    else
        echo "gpu_check: no nvidia-smi"
    fi

    if [[ $STACK == home ]]; then
        phase kit 60 bash -c check_kit || true
        export PYTHONPATH=$REPO/src
    else
        phase kit 90 bash -c install_kit || true
        export PYTHONPATH=$WORK/site:$REPO/src
    fi
    if [[ $DRY == 1 ]]; then
        absent_modules
        export PYTHONPATH=$WORK/absent:$PYTHONPATH
    fi
    export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
    phase env 60 "$PY" -m loaderbench.bench.gpu env "$OUT/env.json" || true

    local classes train val
    if [[ $DRY == 1 ]]; then
        classes=10 train=20 val=10
    else
        classes=100 train=40 val=10
    fi
    PHASE_LOG=$WORK/data.log phase data 90 "$PY" -m loaderbench.bench.gpu data "$WORK/data" \
        --classes $classes --train $train --val $val || true
    local root
    root=$(tail -n 1 "$WORK/data.log" 2>/dev/null || true)

    # Batched decode, each case for a few seconds; the dry run's on CPU threads.
    local decode_args=(--device cuda --batch 256 --images 2048 --seconds 2)
    [[ $DRY == 1 ]] && decode_args=(--device cpu --batch 32 --images 96 --seconds 0.5)
    phase decode 60 "$PY" -m loaderbench.bench.gpu decode "$root" --out "$OUT/decode.json" \
        "${decode_args[@]}" || true

    PHASE_LOG=$OUT/pytest.log phase tests 150 "$PY" -m pytest -m cuda -p no:cacheprovider \
        --basetemp "$WORK/pytest" || true

    local workers size batch batches model=(model=resnet50 model.channels_last=true)
    if [[ $DRY == 1 ]]; then
        # One count a sweep: the rehearsal checks that every job runs, not how counts compare.
        workers=1 size=64 batch=32 batches=4 model=(model=test_resnet model.channels_last=true)
        COMMON=(device=cpu bench.warmup_batches=1)
    else
        workers=4,12 size=224 batch=256 batches=15
        COMMON=(device=cuda bench.warmup_batches=3)
    fi
    COMMON+=("dataset.root=$root" "dataset.index_dir=$WORK/cache" "image_size=$size"
        precision=bf16 logger=none "loader.batch_size=$batch" "bench.max_batches=$batches")
    local nvjpeg=1
    [[ $DRY == 1 && ${GPU_CHECK_DRY_NVJPEG:-0} != 1 ]] && nvjpeg=0

    # One multirun a loader setting (a key like loader.store exists for one loader only).
    # task: train.py with the model, train.py model=none (2 passes), eval.py model=none (4 passes
    # over the small val set).
    local task script label extra cap store counts
    counts=$(tr , '\n' <<<"$workers" | wc -l) # jobs a sweep: a job a count (and store)
    for task in train-model train-none eval-none; do
        store=loader.store # eval.py reads the val split, whose store is loader.val_store
        case $task in
            train-model)
                script=train.py label="train.py ${model[0]}" cap=100
                extra=("${model[@]}" epochs=1)
                ;;
            train-none)
                script=train.py label="train.py model=none" cap=60
                extra=(model=none bench.epochs=2)
                ;;
            eval-none)
                script=eval.py label="eval.py model=none" cap=50 store=loader.val_store
                extra=(model=none bench.epochs=4)
                ;;
        esac
        extra+=("loader.num_workers=$workers")
        sweep "$task-memmap" "$label, memmap, store raw and jpeg" "$script" $((2 * counts)) "$cap" \
            loader=memmap "$store=raw,jpeg" "loader.cache_dir=$WORK/cache" "${extra[@]}"
        sweep "$task-spdl-turbo" "$label, spdl, turbo (CPU) decoder" "$script" "$counts" "$cap" \
            loader=spdl loader.decoder=turbo "${extra[@]}"
        if [[ $nvjpeg == 1 ]]; then
            sweep "$task-spdl-nvjpeg" "$label, spdl, nvjpeg (GPU) decoder" "$script" "$counts" \
                "$cap" loader=spdl loader.decoder=nvjpeg "${extra[@]}"
        fi
        sweep "$task-torchvision" "$label, torchvision (DataLoader processes, PIL)" "$script" \
            "$counts" "$cap" loader=torchvision "${extra[@]}"
    done

    # num_workers=auto with the model: the probe's ladder up to this machine's CPUs (1, 2, ...,
    # 12, 16 on the GPU machine), its choice beside the pinned counts of train-model-spdl-turbo.
    local probe=(loader.autotune.max_probe_s=40)
    [[ $DRY == 1 ]] && probe+=(loader.autotune.window_s=0.5) # its ladder's rungs, not their figures
    sweep train-model-auto-spdl-turbo "train.py ${model[0]}, spdl, turbo, num_workers=auto" \
        train.py 1 100 loader=spdl loader.decoder=turbo loader.num_workers=auto "${probe[@]}" \
        "${model[@]}" epochs=1

    FINAL=1
    local mode notes=()
    mode="GPU check: $(tail -n 1 <<<"$cuda_msg")"
    [[ $DRY == 1 ]] && mode="GPU check, DRY RUN on the CPU (not GPU figures)"
    [[ $DRY == 1 && $STACK == gpu ]] && mode+=", in the GPU machine's stack with the kit installed"
    note() { notes+=("$*"); } # one note of all its arguments
    note "$(date -u +%Y-%m-%d\ %H:%M) UTC on $(hostname), $(nproc) CPUs; python $PY"
    note "CUDA: $(tail -n 1 <<<"$cuda_msg")"
    note "data: synthetic, $classes classes, $((classes * train)) train +" \
        "$((classes * val)) val JPEGs of ImageNet's sizes (${root##*/})"
    note "runs: image_size=$size, loader.batch_size=$batch, bench.max_batches=$batches," \
        "loader.num_workers=$workers (and auto, with the model, on spdl turbo)," \
        "precision=bf16, ${model[*]}; logger=none"
    [[ $nvjpeg == 0 ]] && note "spdl nvjpeg: not run (needs CUDA)"
    note "report written $(since "$T0") s into the check (budget ${BUDGET_S} s);" \
        "every job's files: runs.tar.gz"
    phase report 30 "$PY" -m loaderbench.bench.gpu report --out "$OUT/report.md" \
        --runs "$WORK/runs" --plan "$PLAN" --phases "$PHASES" --env "$OUT/env.json" \
        --pytest-log "$OUT/pytest.log" --decode "$OUT/decode.json" --title "$mode" \
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
main 2>&1 | tee "$OUT/check.log"
