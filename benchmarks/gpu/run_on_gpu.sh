#!/usr/bin/env bash
# What the device machine runs (one H200, no internet), from the repository root:
#
#   bash benchmarks/gpu/run_on_gpu.sh [TOTAL_SECONDS]      # default 540; carry [".gpu", ".whl"]
#   GPU_SECTIONS=kv_speed,table bash benchmarks/gpu/run_on_gpu.sh 240   # a rerun, warm machine
#
# On a machine still warm from an earlier call the build (kept under /tmp) and the models are
# reused, so a rerun goes straight to measuring.
#
# 1. installs the carried wheels into /tmp/site;
# 2. starts generating the F16 models in the background (numpy only);
# 3. builds llama-cpp-python with CUDA for sm_90 from .gpu/llama-cpp-python-trimmed.tar.gz
#    (pip, no index, no build isolation) into a build folder it keeps, then reconfigures that
#    folder with the llama.cpp tools on and builds llama-bench + llama-batched-bench in the
#    background (same objects, same flags: only the two tools compile);
# 4. runs benchmarks/gpu/measure.py with a deadline, so it stops in time and keeps what it has.
#
# GPU_SMOKE=1 (tiny models, for checking this script on a CPU machine with GPU_BUILD_DIR set to
# a CPU build that has bin/llama-bench and /tmp/lcpp-built.ok touched) is not for the device.
#
# Every step has its own timeout. Files written under $OUT come back: build.log, generate.log,
# tools.log, measure.log, results.json, steps.txt (at most 8 files).
set -u
set -o pipefail

TOTAL_S=${1:-540}
START=$(date +%s)
DEADLINE=$((START + TOTAL_S))
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
# shellcheck source=benchmarks/gpu/cuda_hints.sh
source benchmarks/gpu/cuda_hints.sh

SRC=/tmp/lcpp-src
BUILD=${GPU_BUILD_DIR:-/tmp/lcpp-build}
SITE=/tmp/site
MODELS=/tmp/homelab-models
TOOLS_DONE=/tmp/lcpp-tools.done
BUILT_OK=/tmp/lcpp-built.ok
CUDA_CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
export PYTHONPATH="$SITE:$ROOT" PYTHONUNBUFFERED=1 HOMELAB_HOME=/tmp/homelab-home
export CMAKE_BUILD_PARALLEL_LEVEL=16
SMOKE=()
[ -n "${GPU_SMOKE:-}" ] && SMOKE=(--cpu-smoke)

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((DEADLINE - $(date +%s))); }
step() { echo "[+$(elapsed)s, $(left)s left] $*" | tee -a "$OUT/steps.txt" >&2; }

machine_facts() {
    step "machine facts"
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm \
            --format=csv 2>&1
        nvcc --version 2>&1 | tail -2
        cmake --version 2>&1 | head -1
        ninja --version 2>&1
        python3 -c 'import sys, numpy; print(sys.version); print("numpy", numpy.__version__)'
        python3 -m pip --version
        python3 -m pip show scikit-build-core nvidia-ml-py 2>&1 | grep -E '^(Name|Version)'
        command -v nvcc python3 cmake
        ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libcublas' | head -5
        echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        nproc
        free -g | head -2
    } >>"$OUT/build.log" 2>&1
}

find_nvcc() {
    if ! command -v nvcc >/dev/null; then
        for dir in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
            [ -x "$dir/nvcc" ] && export PATH="$PATH:$dir" && break
        done
    fi
    command -v nvcc >/dev/null && export CUDACXX=${CUDACXX:-$(command -v nvcc)}
}

install_wheels() {
    step "wheels -> $SITE"
    timeout 90 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target "$SITE" .whl/*.whl >>"$OUT/build.log" 2>&1
}

generate_models() {
    step "generating the F16 models in the background"
    timeout 240 python3 -m benchmarks.gpu.measure generate --models "$MODELS" "${SMOKE[@]}" \
        >"$OUT/generate.log" 2>&1 &
    GENERATE_PID=$!
}

build_llama_cpp_python() {
    # nothing can be measured without it: give it all but a minimal measuring time
    local limit=$(($(left) - 75))
    [ "$limit" -gt 460 ] && limit=460
    step "pip build of llama-cpp-python with CUDA (at most ${limit}s)"
    rm -rf "$SRC" "$BUILD" && mkdir -p "$SRC" &&
        tar -xzf .gpu/llama-cpp-python-trimmed.tar.gz -C "$SRC" --strip-components=1 || return 1
    # a local folder builds in place, so $BUILD keeps pointing at $SRC for the tools below
    timeout "$limit" python3 -m pip install -v --no-index \
        --no-deps --no-build-isolation --no-cache-dir --target "$SITE" \
        --config-settings=build-dir="$BUILD" "$SRC" >>"$OUT/build.log" 2>&1 &&
        touch "$BUILT_OK"
}

build_tools() {
    if [ -x "$BUILD/bin/llama-bench" ] && [ -x "$BUILD/bin/llama-batched-bench" ] && [ -x "$BUILD/bin/llama-server" ]; then
        echo "exit 0 (built by an earlier call)" >"$TOOLS_DONE"
        return
    fi
    step "llama-bench and llama-batched-bench in the background (same build folder)"
    (
        timeout 60 cmake -DLLAMA_BUILD_TOOLS=ON "$BUILD" &&
            timeout 180 cmake --build "$BUILD" --target llama-bench llama-batched-bench llama-server -j 16
        echo "exit $?" >"$TOOLS_DONE"
    ) >"$OUT/tools.log" 2>&1 &
}

check_import() {
    step "import llama_cpp"
    timeout 60 python3 -c 'import llama_cpp; print(llama_cpp.__file__);
print(llama_cpp.llama_print_system_info().decode());
print("gpu offload:", llama_cpp.llama_supports_gpu_offload())' >>"$OUT/build.log" 2>&1
}

measure() {
    step "measure (deadline in $(left)s)"
    local sections=()
    [ -n "${GPU_SECTIONS:-}" ] && sections=(--sections "$GPU_SECTIONS")
    timeout $(($(left) + 5)) python3 -m benchmarks.gpu.measure run --models "$MODELS" \
        --tools "$BUILD/bin" --tools-ready "$TOOLS_DONE" --out "$OUT/results.json" \
        --deadline $((DEADLINE - 5)) "${sections[@]}" "${SMOKE[@]}" 2>&1 | tee "$OUT/measure.log" |
        grep -E '^\[|FAILED' >&2
}

main() {
    rm -f "$TOOLS_DONE"
    find_nvcc
    cuda_hints 2>>"$OUT/build.log"
    export CMAKE_ARGS="$CUDA_CMAKE_ARGS$CUDA_HINT_ARGS" # read by the pip build; recorded by measure
    machine_facts
    install_wheels || { step "wheel install failed (see build.log)"; exit 1; }
    generate_models
    if [ -f "$BUILT_OK" ]; then
        step "reusing the llama-cpp-python build of an earlier call"
    elif ! build_llama_cpp_python; then
        step "llama-cpp-python build FAILED (tail of build.log follows)"
        grep -E 'error|Error|FAILED' "$OUT/build.log" | tail -15 >&2
        tail -25 "$OUT/build.log" >&2
        exit 1
    else
        step "llama-cpp-python built"
    fi
    build_tools
    check_import
    wait "$GENERATE_PID" || step "model generation failed (generate.log); measure retries it"
    measure
    step "done; tools: $(cat "$TOOLS_DONE" 2>/dev/null || echo 'still building')"
    ls -la "$OUT" >&2
}

main
