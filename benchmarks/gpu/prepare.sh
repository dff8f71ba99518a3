#!/usr/bin/env bash
# Run HERE (the CPU machine), in the checkout the session started in, before the one device
# call. It makes what benchmarks/gpu/run_on_gpu.sh needs and nothing can download there:
#
#   .gpu/llama-cpp-python-trimmed.tar.gz   the llama-cpp-python sdist without llama.cpp's
#                                          models/, docs/, tests/, benches/ and any build/
#                                          (76 MB -> about 12 MB: the whole tree may be 64 MiB)
#   .whl/*.whl                             pure-Python wheels the H200 image lacks
#
# and adds /.gpu/ and /.whl/ to .git/info/exclude (they travel only when `carry` names them).
# Prints the size that will travel. Safe to run twice.
set -euo pipefail

VERSION=0.3.36
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
CACHE=${HOMELAB_GPU_CACHE:-/tmp/homelab-gpu-cache}
LIMIT_BYTES=$((64 * 1024 * 1024))

# Wheels for the device's Python 3.12 (x86-64). Everything else the measurement imports is in
# the image already (numpy, jinja2, markupsafe, pyyaml, psutil, tqdm, requests,
# typing-extensions, nvidia-ml-py, scikit-build-core, cmake, ninja): see benchmarks/gpu/README.md
# for how that list was checked. pydantic/fastapi/huggingface-hub are not needed: the script
# imports neither homelab.server nor homelab.hub.
WHEELS=(gguf==0.19.0 diskcache==5.6.3 platformdirs==4.14.8)

say() { printf '%s\n' "$*" >&2; }

find_sdist() {
    local name="llama_cpp_python-$VERSION.tar.gz"
    for candidate in "/tmp/src/$name" "$CACHE/$name"; do
        if [ -f "$candidate" ]; then
            echo "$candidate"
            return
        fi
    done
    mkdir -p "$CACHE"
    say "downloading the llama-cpp-python $VERSION sdist into $CACHE"
    "$PY" -m pip download --no-deps --no-binary :all: -d "$CACHE" "llama-cpp-python==$VERSION" >&2
    echo "$CACHE/$name"
}

WORK=""
cleanup() { [ -z "$WORK" ] || rm -rf "$WORK"; }
trap cleanup EXIT

repack() {
    local sdist=$1 top
    WORK=$(mktemp -d)
    tar -xzf "$sdist" -C "$WORK"
    top="$WORK/llama_cpp_python-$VERSION"
    [ -f "$top/vendor/llama.cpp/CMakeLists.txt" ] || { say "no vendor/llama.cpp in $sdist"; exit 1; }
    mkdir -p .gpu
    # the sdist carries llama.cpp's git history (38 MB): keep only the commit it was built from
    git -C "$top/vendor/llama.cpp" rev-parse HEAD >.gpu/llama.cpp-commit.txt 2>/dev/null ||
        echo unknown >.gpu/llama.cpp-commit.txt
    # exact paths only: src/models and tools/mtmd/models are sources and must stay
    rm -rf "$top/.git" "$top/vendor/llama.cpp/.git" \
        "$top/vendor/llama.cpp/models" \
        "$top/docs" "$top/vendor/llama.cpp/docs" \
        "$top/tests" "$top/vendor/llama.cpp/tests" \
        "$top/vendor/llama.cpp/benches"
    find "$top" -type d -name build -prune -exec rm -rf {} +
    tar -czf .gpu/llama-cpp-python-trimmed.tar.gz.partial -C "$WORK" "llama_cpp_python-$VERSION"
    mv .gpu/llama-cpp-python-trimmed.tar.gz.partial .gpu/llama-cpp-python-trimmed.tar.gz
}

download_wheels() {
    mkdir -p .whl
    local spec name
    for spec in "${WHEELS[@]}"; do
        name=${spec%%==*}
        # one version of each distribution: two would stop the install on the device
        find .whl -maxdepth 1 -iname "${name//-/_}-*.whl" ! -iname "${name//-/_}-${spec##*==}-*" \
            -print -delete >&2
    done
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}" >&2
}

exclude() {
    local file line
    file=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$file")"
    touch "$file"
    for line in /.gpu/ /.whl/; do
        grep -qxF "$line" "$file" || echo "$line" >>"$file"
    done
}

duplicate_wheels() {
    ls .whl/*.whl 2>/dev/null | sed -E 's#.*/##; s#-[0-9].*##' | tr 'A-Z-' 'a-z_' | sort | uniq -d
}

mib() { awk -v b="$1" 'BEGIN {printf "%8.2f", b / 1048576}'; }

report_sizes() {
    local tree wheels archive total
    tree=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
        awk '{s += $1} END {print s + 0}')
    wheels=$(find .whl -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    archive=$(find .gpu -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
    total=$((tree + wheels + archive))
    echo "trimmed sdist    $(mib "$archive") MiB  .gpu/ ($(ls .gpu | tr '\n' ' '))"
    echo "wheels           $(mib "$wheels") MiB  .whl/ ($(ls .whl | tr '\n' ' '))"
    echo "working tree     $(mib "$tree") MiB  (tracked + untracked, not ignored)"
    echo "travels in all   $(mib "$total") MiB  of 64 MiB"
    if [ "$total" -ge "$LIMIT_BYTES" ]; then
        say "TOO BIG: the device call would be refused; ignore or remove large untracked files"
        exit 1
    fi
    if [ "$archive" -gt $((20 * 1024 * 1024)) ] || [ "$archive" -lt $((5 * 1024 * 1024)) ]; then
        say "warning: the trimmed sdist is not about 12 MB; check what repack() removed"
    fi
}

main() {
    repack "$(find_sdist)"
    download_wheels
    exclude
    local duplicates
    duplicates=$(duplicate_wheels)
    if [ -n "$duplicates" ]; then
        say "two versions of: $duplicates in .whl/ — remove one (the install there would stop)"
        exit 1
    fi
    report_sizes
}

main "$@"
