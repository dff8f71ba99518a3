# homelab — the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CPUINFO ?= /proc/cpuinfo
# How llama-cpp-python is built here (tools/build_route.py decides; `make cmake-args` says why):
# always with the RPC backend (`homelab worker`, `--rpc`); with CUDA when nvidia-smi shows a GPU,
# compiled for the architectures of the GPUs present, by the system nvcc when the driver runs
# it, else by NVIDIA's CUDA 13 toolchain from PyPI installed into $(VENV)/cuda; else (a driver
# too old, no compiler, no disk space) for the CPU, with a message naming the fix.
# On a CPU with AMX, -march=native compiles ggml's AMX matmul, which this llama.cpp cannot run:
# GCC 12 (Debian 12's) drops the stores that fill its tile configuration, so every quantized
# model dies of a general protection fault, and with those kept an MLA model (DeepSeek) fails
# an assertion while its context is made. -mno-amx-int8 leaves it out (AVX-512 VNNI does the
# work); benchmarks/llama_tools.py takes its compiler flags from `make cmake-args`.
# CMAKE_ARGS set by you wins over all of it.
ROUTE_TOOL := $(PYTHON) tools/build_route.py --venv $(VENV) --cpuinfo $(CPUINFO)
ifeq ($(origin CMAKE_ARGS),undefined)
ROUTE := $(shell $(ROUTE_TOOL) route)
CMAKE_ARGS := $(or $(wordlist 2,$(words $(ROUTE)),$(ROUTE)),-DGGML_RPC=on)
ROUTE_USER :=
else
ROUTE_USER := --user-args '$(CMAKE_ARGS)'
endif
export CMAKE_ARGS
# pip's wheel cache ignores CMAKE_ARGS: with custom build flags, never reuse a cached wheel
# (a plain CPU wheel without RPC would be installed silently).
PIP_CACHE_FLAG := $(if $(strip $(CMAKE_ARGS)),--no-cache-dir,)
LLAMA_CPP_PYTHON := $(shell grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
BUILD_LOG := $(VENV)/build.log
# the pip install that compiles llama.cpp: its output goes to $(BUILD_LOG); a failure prints a
# short summary and the fix (tools/build_route.py failed), not CMake's wall of text
define pip_build
	@echo "homelab: installing; llama-cpp-python compiles (5-15 min on 2 cores; log: $(BUILD_LOG))"
	$(BIN)/pip install -q $(PIP_CACHE_FLAG) $(1) >$(BUILD_LOG) 2>&1 || \
		{ $(ROUTE_TOOL) failed --log $(BUILD_LOG) $(ROUTE_USER); exit 1; }
endef

.PHONY: run test check lint typecheck install install-test clean bench cmake-args \
	cmake-args-cpu rebuild-llama cuda-build-check web-vendor

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(ROUTE_TOOL) prepare $(ROUTE_USER)
	$(call pip_build,-e .)
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(ROUTE_TOOL) prepare $(ROUTE_USER)
	$(call pip_build,-e '.[test]')
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
	@echo '$(CMAKE_ARGS)'
	@$(ROUTE_TOOL) explain $(ROUTE_USER) | tail -n +2 >&2

# the CPU build's arguments (the fallback a failed CUDA build offers)
cmake-args-cpu:
	@$(ROUTE_TOOL) cpu-args

# rebuild llama-cpp-python by the route above (after a driver update, a new GPU, `homelab hw`)
rebuild-llama: | $(BIN)/python
	$(ROUTE_TOOL) prepare $(ROUTE_USER)
	$(call pip_build,--force-reinstall --no-deps $(LLAMA_CPP_PYTHON))

# not part of `make test`/CI (20-40 min on 2 cores): a fake nvidia-smi (an RTX 4090, driver
# 580), no system CUDA, NVIDIA's pip toolchain, a CUDA wheel for sm_89; checks the library
cuda-build-check:
	bash tools/cuda_build_check.sh

clean:
	rm -rf $(VENV) build *.egg-info
