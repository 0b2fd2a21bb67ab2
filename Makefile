# `make train` and `make test` each set everything up on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: help install train eval test test-fast test-audit test-peers data lint format peers bench \
	report profile bench-scale clean clean-cache gpu-kit

help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## the virtual environment (.venv), once

$(STAMP): requirements.txt pyproject.toml scripts/ensure_ffmpeg.sh
	./scripts/ensure_ffmpeg.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Bytecode compiled here, once: where PYTHONDONTWRITEBYTECODE is set (this machine) every
	# process would otherwise compile every module it imports, every time. compileall on every
	# core, not pip's one at a time (65 s -> 52 s for the whole install here). torch's one
	# file in 3.12 syntax (a test helper) is skipped by name; any other failure fails the
	# install, naming the file, rather than leave every run compiling it again.
	$(PY) -m pip install --no-compile -r requirements.txt
	$(PY) -m compileall -q -j 0 -x 'py312_intrinsics' \
		$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

train: install ## train.py ARGS='loader=memmap model=resnet18 ...'
	$(PY) train.py $(ARGS)

eval: install ## eval.py ARGS='model=from_checkpoint ...'
	$(PY) eval.py $(ARGS)

data: install ## the generated data set (data/)
	$(PY) -m loaderbench.data.synthetic

# Two pytest workers (pytest-xdist): most tests wait on subprocesses, so two keep both of a
# 2-core machine busy; tests sharing a module or session fixture (the quick bench, the local
# SLURM cluster) stay on one worker (--dist loadgroup). TEST_WORKERS=0: one process.
# test-fast, the everyday loop, leaves out every test that starts a process (marked slow; the
# suite fails a test that starts one unmarked); test, the whole suite, lists its 25 slowest.
# A worker ended by a test's timeout ends the run (--max-worker-restart=0): under loadgroup a
# replacement is never handed the crashed worker's tests, and the run would wait for ever.
# The checkout's own modules are compiled first (compileall skips what is current): where
# PYTHONDONTWRITEBYTECODE is set, every process the tests start would compile them again.
TEST_WORKERS ?= 2
BYTECODE = $(PY) -m compileall -q -j 0 src tests tools train.py eval.py
PYTEST = $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0 -ra
test: install ## the layers checked, then the whole suite (slow tests too); its 25 slowest
	$(VENV)/bin/lint-imports --no-cache
	$(BYTECODE)
	$(PYTEST) --durations=25 $(ARGS)

test-fast: install ## the everyday loop: the suite without the tests that start processes
	$(BYTECODE)
	$(PYTEST) -m "not slow" $(ARGS)

# The descriptor audit (opt-in): tests/fd_audit/closeshim.c, preloaded into every process of the
# run, reports any close that fails with EBADF or takes a live multiprocessing Connection's
# descriptor, with the culprit's native and Python stacks, in the session's summary; the audit
# fails the session where it finds one. No C compiler: no audit, said so.
FD_SHIM := $(VENV)/fd_audit/closeshim.so
$(FD_SHIM): tests/fd_audit/closeshim.c
	mkdir -p $(@D)
	$(CC) -O1 -shared -fPIC -o $@ $< -ldl
test-audit: install $(FD_SHIM) ## the suite under the file-descriptor audit (finds a stray close)
	FD_AUDIT_DIR=$$(mktemp -d) FD_AUDIT_STRICT=1 LD_PRELOAD=$(abspath $(FD_SHIM)) $(PYTEST) $(ARGS)

lint: install ## ruff check and format check; the layers and the loaders' independence (import-linter)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

format: install ## ruff fix and format
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# memmap caches unused for UNUSED_DAYS days (and held by no run) in CACHE_DIR: listed, removed.
CACHE_DIR ?= cache
UNUSED_DAYS ?= 30
clean-cache: install ## remove memmap caches unused for UNUSED_DAYS days
	$(PY) -m loaderbench.loaders.memmap.housekeeping --cache-dir $(CACHE_DIR) \
		--unused-days $(UNUSED_DAYS) --remove

clean: ## remove outputs, cache and bench/work
	rm -rf outputs cache bench/work .pytest_cache

# The benchmark report (bench/report.md, bench/report.png); BENCH_ARGS=--quick for a small run.
# Its runs write under bench/work/ (sweeps, the memmap cache), never cache/ or outputs/.
# NVIDIA DALI and FFCV, peers in the report, are installed here on demand (DALI: a 200 MB wheel;
# FFCV: built against libturbojpeg and OpenCV, from apt when root), not by make install; the
# report goes on without a peer's rows where it cannot be installed.
BENCH_ARGS ?=
DALI ?= nvidia-dali-cuda130==2.4.0
FFCV ?= ffcv==1.0.2
peers: install ## NVIDIA DALI and FFCV, the benchmark's peers (best effort, not in install)
	$(PY) -c "import nvidia.dali" 2>/dev/null || $(PY) -m pip install --quiet "$(DALI)" \
		|| echo "make peers: could not install $(DALI); no DALI rows"
	./scripts/ensure_ffcv.sh $(PY) "$(FFCV)" || echo "make peers: could not install $(FFCV); no FFCV rows"

bench: peers ## measure the benchmark and render bench/report.{json,md,png}
	$(PY) -m tools.bench $(BENCH_ARGS)

# make test skips the peers' rows where DALI and FFCV are not installed (a clean clone: a 200 MB
# wheel, and OpenCV's headers from apt to build FFCV, on every CI run); this installs them and
# runs the tests of the quick bench and of FFCV's stores with them.
test-peers: peers ## the benchmark's tests with DALI and FFCV installed (their rows run)
	$(PYTEST) tests/test_bench.py tests/test_bench_ffcv.py $(ARGS)

# A sampling profile (py-spy) of a model=none run's loader threads: profile/profile.{txt,md};
# ARGS='--gil ...': GIL-held ms per 1,000 images by thread instead (profile/gil.{md,json}).
profile: install ## a loader's hot path (ARGS='loader=memmap ...'), or its GIL per image (ARGS='--gil ...')
	$(PY) -m tools.bench.profile $(ARGS)

report: install ## draw bench/report.md and report.png from bench/report.json, measuring nothing
	$(PY) -m tools.bench.render $(ARGS)

# Start-up and memory on a generated 1000-class tree of 260,000 small JPEGs (generated once into
# data/), projected to ImageNet: bench/scale.md, bench/scale.json. Not part of `make test`.
bench-scale: install ## start-up and memory at ImageNet scale (bench/scale.md)
	$(PY) -W ignore::UserWarning -m tools.bench.scale $(BENCH_ARGS)

# The wheels a GPU machine without network lacks (cp312 manylinux, nvImageCodec and its nvJPEG
# among them; < 56 MiB, and < 64 MiB with the working tree, what can travel) in .gpu-kit/, for
# tools/gpu_check/gpu_check.sh there; fetched with pip from PyPI, quick when all are there.
gpu-kit: ## the wheels a GPU machine without network needs (.gpu-kit/)
	./tools/gpu_check/gpu_kit.sh
