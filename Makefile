# homelab — the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Build llama-cpp-python with the RPC backend (`homelab worker`, `--rpc`), and with CUDA when
# an NVIDIA driver is visible; CMAKE_ARGS overrides both.
CUDA_ARGS := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "-DGGML_CUDA=on")
# On a CPU with AMX, -march=native compiles ggml's AMX matmul, which this llama.cpp cannot run:
# GCC 12 (Debian 12's) drops the stores that fill its tile configuration, so every quantized
# model dies of a general protection fault, and with those kept an MLA model (DeepSeek) fails
# an assertion while its context is made. -mno-amx-int8 leaves it out (AVX-512 VNNI does the
# work); benchmarks/llama_tools.py takes its compiler flags from `make cmake-args`.
CPUINFO ?= /proc/cpuinfo
AMX_ARGS := $(shell grep -qw amx_tile $(CPUINFO) 2>/dev/null && echo "-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8")
export CMAKE_ARGS ?= -DGGML_RPC=on $(CUDA_ARGS) $(AMX_ARGS)
# pip's wheel cache ignores CMAKE_ARGS: with custom build flags, never reuse a cached wheel
# (a plain CPU wheel without RPC would be installed silently).
PIP_CACHE_FLAG := $(if $(strip $(CMAKE_ARGS)),--no-cache-dir,)

.PHONY: run test check lint typecheck install install-test clean bench cmake-args web-vendor

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

# The web page's two libraries (marked, DOMPurify), fetched from npm at the versions that
# tools/web_vendor/package-lock.json pins, their browser builds copied into the package.
WEB_VENDOR := homelab/server/web/vendor
WEB_NPM := tools/web_vendor/node_modules
web-vendor:
	cd tools/web_vendor && npm ci --ignore-scripts --no-audit --no-fund
	sed '/sourceMappingURL/d' $(WEB_NPM)/marked/lib/marked.esm.js > $(WEB_VENDOR)/marked.esm.js
	sed '/sourceMappingURL/d' $(WEB_NPM)/dompurify/dist/purify.es.mjs > $(WEB_VENDOR)/purify.es.mjs
	cp $(WEB_NPM)/marked/LICENSE $(WEB_VENDOR)/marked.LICENSE.txt
	cp $(WEB_NPM)/dompurify/LICENSE $(WEB_VENDOR)/dompurify.LICENSE.txt

# what pip builds llama-cpp-python with on this machine (for a bug report, or to rebuild it)
cmake-args:
	@echo $(CMAKE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
