# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both are idempotent: the virtual environment is installed once per change of
# pyproject.toml or constraints.txt (stamp files), the package itself is editable.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# the suite runs on this many pytest workers, each test file whole on one (CI has two cores and
# most tests use one); 1 runs it in one process
TEST_WORKERS ?= 2
PIP    := $(BIN)/python -m pip
CONSTRAINTS := constraints.txt

.PHONY: demo test docs lint typecheck pytest test-cpu-capability test-cuda-standin fuzz bench \
	clean help

help:
	@echo "make demo   create .venv, install curvcal, run 'curvcal demo' on the bundled example (plots in build/demo)"
	@echo "make test   install dev extras, run ruff, mypy, the whole test suite, and the float32"
	@echo "            goldens and curvature tests again under other CPU vector paths, and the"
	@echo "            CUDA tests with the CPU standing in for the device (make test-cuda-standin)"
	@echo "make docs   build the documentation site into build/site (mkdocs build --strict)"
	@echo "make lint   ruff check and format check"
	@echo "make fuzz   a long fuzz run of the file loaders (CURVCAL_FUZZ_CASES, CURVCAL_FUZZ_SEED)"
	@echo "make bench  install the peer libraries (bench extra) and run benchmarks/"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.stamp-base: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[plot]'
	touch $@

$(VENV)/.stamp-dev: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev,docs,plot,hf,timm,tables]'
	touch $(VENV)/.stamp-base $@

$(VENV)/.stamp-bench: pyproject.toml $(CONSTRAINTS) $(VENV)/.stamp-dev
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[dev,docs,plot,hf,timm,tables,bench]'
	touch $@

demo: $(VENV)/.stamp-base
	$(BIN)/curvcal demo --plot-dir build/demo --force

lint: $(VENV)/.stamp-dev
	$(BIN)/ruff check curvcal tests benchmarks examples
	$(BIN)/ruff format --check curvcal tests benchmarks examples

typecheck: $(VENV)/.stamp-dev
	$(BIN)/mypy

pytest: $(VENV)/.stamp-dev
	$(BIN)/python -m pytest -q $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# PyTorch picks a vector path per CPU (AVX-512, AVX2, scalar) and float32 results differ in the
# last bits between them. This reruns the float32 goldens and the curvature tests most exposed
# to that under the scalar path, and under AVX2 where the CPU has AVX-512, so that a
# CPU-dependent assertion fails here before it fails on a user's machine.
CPU_CAPABILITY_TESTS := tests/test_golden_json.py tests/curvature/test_eigen.py \
	tests/curvature/test_hvp.py tests/curvature/test_layers.py
CPU_CAPABILITY_SELECT := -k "not golden or float32 or comparison"

test-cpu-capability: $(VENV)/.stamp-dev
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -q -p no:cacheprovider \
		$(CPU_CAPABILITY_SELECT) $(CPU_CAPABILITY_TESTS)
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then \
		echo "ATEN_CPU_CAPABILITY=avx2 (this CPU has AVX-512)"; \
		ATEN_CPU_CAPABILITY=avx2 $(BIN)/python -m pytest -q -p no:cacheprovider \
			$(CPU_CAPABILITY_SELECT) $(CPU_CAPABILITY_TESTS); \
	fi

# The CUDA tests (tests/cuda) are skipped without a device. This runs every one of them with the
# CPU standing in for it, at smaller sizes (tests/cuda/conftest.py): every command line, option
# and file they use runs, so a defect in a test fails here rather than first on a GPU. It cannot
# check what only a device does (NCCL, pinned copies, real out-of-memory errors, CUDA kernels'
# rounding). About 50 CPU seconds.
test-cuda-standin: $(VENV)/.stamp-dev
	CURVCAL_CUDA_TESTS_DEVICE=cpu $(BIN)/python -m pytest -q -p no:cacheprovider -m cuda tests/cuda

test: lint typecheck pytest test-cpu-capability test-cuda-standin

docs: $(VENV)/.stamp-dev
	$(BIN)/mkdocs build --strict --site-dir build/site

# The suite runs a few hundred fuzz cases from a fixed seed; this runs many more from a fresh
# seed, printed first so a failure can be replayed (CURVCAL_FUZZ_SEED=... make fuzz).
fuzz: $(VENV)/.stamp-dev
	@seed=$${CURVCAL_FUZZ_SEED:-$$(date +%s)}; cases=$${CURVCAL_FUZZ_CASES:-5000}; \
	echo "fuzz: $$cases cases from seed $$seed"; \
	CURVCAL_FUZZ_SEED=$$seed CURVCAL_FUZZ_CASES=$$cases $(BIN)/python -m pytest -q -m fuzz tests/test_fuzz.py

bench: $(VENV)/.stamp-bench
	$(BIN)/python benchmarks/bench_hessian.py
	$(BIN)/python benchmarks/bench_calibration.py
	$(BIN)/python benchmarks/bench_krylov.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
