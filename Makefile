# homelab — the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Build llama-cpp-python with the RPC backend (`homelab worker`, `--rpc`), and with CUDA when
# an NVIDIA driver is visible; CMAKE_ARGS overrides both.
CUDA_ARGS := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "-DGGML_CUDA=on")
export CMAKE_ARGS ?= -DGGML_RPC=on $(CUDA_ARGS)
# pip's wheel cache ignores CMAKE_ARGS: with custom build flags, never reuse a cached wheel
# (a plain CPU wheel without RPC would be installed silently).
PIP_CACHE_FLAG := $(if $(strip $(CMAKE_ARGS)),--no-cache-dir,)

.PHONY: run test check lint typecheck install install-test clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(PIP_CACHE_FLAG) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(PIP_CACHE_FLAG) -e '.[test]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/homelab

test: install-test
	$(BIN)/python -m pytest -q

lint: install-test
	$(BIN)/ruff format --check homelab tests benchmarks
	$(BIN)/ruff check homelab tests benchmarks

typecheck: install-test
	$(BIN)/mypy homelab

check: lint typecheck test

bench: install-test
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info
