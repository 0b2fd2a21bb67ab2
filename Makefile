# `make train` and `make test` each set everything up on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: install train eval test test-fast data lint format bench bench-scale clean clean-cache gpu-kit

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml scripts/ensure_ffmpeg.sh
	./scripts/ensure_ffmpeg.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# Bytecode compiled here, once: where PYTHONDONTWRITEBYTECODE is set (this machine) every
	# process would otherwise compile every module it imports, every time.
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

train: install
	$(PY) train.py $(ARGS)

eval: install
	$(PY) eval.py $(ARGS)

data: install
	$(PY) -m loaderbench.synthetic

# Two pytest workers (pytest-xdist): most tests wait on subprocesses, so two keep both of a
# 2-core machine busy; tests sharing a module or session fixture (the quick bench, the local
# SLURM cluster) stay on one worker (--dist loadgroup). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
# About one whole-suite run in twelve, something in a pytest worker closes a descriptor it does
# not own, and the next DataLoader start fails with EBADF (issue 21: not found yet). A test that
# fails with exactly that error runs once more; any other failure fails at once; -rR names every
# test that ran again (the flaky-marked speed comparisons too).
RERUN_EBADF = -raR --reruns 1 --only-rerun 'OSError: \[Errno 9\] Bad file descriptor'
# ... and the descriptor audit is there to name it: tests/fd_audit/closeshim.c, preloaded into
# every process of the run, reports any close that fails with EBADF or takes a live
# multiprocessing Connection's descriptor, with the culprit's native and Python stacks, in the
# session's summary (FD_AUDIT_STRICT=1: such a report fails the session). FD_AUDIT=0: off; no C
# compiler: off, said so.
FD_AUDIT ?= 1
FD_SHIM := $(VENV)/fd_audit/closeshim.so
$(FD_SHIM): tests/fd_audit/closeshim.c
	mkdir -p $(@D)
	$(CC) -O1 -shared -fPIC -o $@ $< -ldl || echo "no C compiler: the descriptor audit is off"
AUDITED = FD_AUDIT_DIR=$$(mktemp -d) \
	LD_PRELOAD="$$(test "$(FD_AUDIT)" = 1 && test -f $(FD_SHIM) && echo $(abspath $(FD_SHIM)))"
test: install $(FD_SHIM)
	$(AUDITED) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(RERUN_EBADF) $(ARGS)

test-fast: install $(FD_SHIM)
	$(AUDITED) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(RERUN_EBADF) -m "not slow" $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# memmap caches unused for UNUSED_DAYS days (and held by no run) in CACHE_DIR: listed, removed.
CACHE_DIR ?= cache
UNUSED_DAYS ?= 30
clean-cache: install
	$(PY) -m loaderbench.loaders.memmap.housekeeping --cache-dir $(CACHE_DIR) \
		--unused-days $(UNUSED_DAYS) --remove

clean:
	rm -rf outputs cache bench/work .pytest_cache

# The benchmark report (bench/report.md, bench/report.png); BENCH_ARGS=--quick for a small run.
# Its runs write under bench/work/ (sweeps, the memmap cache), never cache/ or outputs/.
# NVIDIA DALI and FFCV, peers in the report, are installed here on demand (DALI: a 200 MB wheel;
# FFCV: built against libturbojpeg and OpenCV, from apt when root), not by make install; the
# report goes on without a peer's rows where it cannot be installed.
BENCH_ARGS ?=
DALI ?= nvidia-dali-cuda130==2.4.0
FFCV ?= ffcv==1.0.2
bench: install
	$(PY) -c "import nvidia.dali" 2>/dev/null || $(PY) -m pip install --quiet "$(DALI)" \
		|| echo "make bench: could not install $(DALI); the report will have no DALI rows"
	./scripts/ensure_ffcv.sh $(PY) "$(FFCV)" \
		|| echo "make bench: could not install $(FFCV); the report will have no FFCV rows"
	$(PY) -m loaderbench.bench $(BENCH_ARGS)

# Start-up and memory on a generated 1000-class tree of 260,000 small JPEGs (generated once into
# data/), projected to ImageNet: bench/scale.md, bench/scale.json. Not part of `make test`.
bench-scale: install
	$(PY) -W ignore::UserWarning -m loaderbench.bench.scale $(BENCH_ARGS)

# The wheels a GPU machine without network lacks (cp312 manylinux, nvImageCodec and its nvJPEG
# among them; < 56 MiB, and < 64 MiB with the working tree, what can travel) in .gpu-kit/, for
# scripts/gpu_check.sh there; fetched with pip from PyPI, quick when they are all there already.
gpu-kit:
	./scripts/gpu_kit.sh
