#!/usr/bin/env bash
# `make cuda-build-check`: the CUDA build a GPU box without a CUDA toolkit gets, checked on a
# machine with no GPU. Not part of `make test` or CI: 20-40 minutes on 2 cores.
#
# A fake nvidia-smi stands in for an RTX 4090 (compute 8.9) with driver 580, which cannot exist
# here; the system CUDA toolkit is hidden (PATH without /usr/local/bin, HOMELAB_NO_SYSTEM_CUDA).
# tools/build_route.py must then take the pip route: NVIDIA's CUDA 13 toolchain from PyPI into
# $CHECK/venv/cuda, and llama-cpp-python built as a wheel for sm_89 only. Then it checks:
#   - the wheel has libggml-cuda.so;
#   - its device code is sm_89 only (cuobjdump --list-elf / --list-ptx, from NVIDIA's wheel);
#   - ldd resolves every dependency of every library in the wheel except the driver's libcuda
#     (with the folder homelab's doorway opens the CUDA libraries from);
#   - the wheel, installed, imports through homelab's doorway without LD_LIBRARY_PATH.
# Writes $CHECK/summary.txt (times, sizes, ldd) and exits non-zero when a check fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CHECK=${CHECK_DIR:-$ROOT/build/cuda-check}
PYTHON=${PYTHON:-python3}
VERSION=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | cut -d= -f3)
VENV=$CHECK/venv
SUMMARY=$CHECK/summary.txt
mkdir -p "$CHECK/fakebin" "$CHECK/dist"

cat >"$CHECK/fakebin/nvidia-smi" <<'EOF'
#!/bin/sh
# fake: an RTX 4090 with driver 580 (no GPU can exist on the machine that runs this check)
echo "8.9, 580.65.06"
EOF
chmod +x "$CHECK/fakebin/nvidia-smi"
export PATH="$CHECK/fakebin:/usr/bin:/bin"
export HOMELAB_NO_SYSTEM_CUDA=1
unset CUDA_HOME CUDA_PATH CUDACXX CMAKE_ARGS

say() { echo "$*" | tee -a "$SUMMARY"; }
: >"$SUMMARY"
START=$(date +%s)
say "cuda-build-check $(date -u +%FT%TZ) on $(nproc) cores: llama-cpp-python $VERSION"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

# the route, exactly as `make install` takes it
CMAKE_ARGS=$(make -s --no-print-directory cmake-args VENV="$VENV" 2>"$CHECK/route.txt")
tee -a "$SUMMARY" <"$CHECK/route.txt"
case "$CMAKE_ARGS" in *-DCMAKE_CUDA_ARCHITECTURES=89*) ;; *) say "FAIL: not a CUDA route for sm_89"; exit 1 ;; esac
"$PYTHON" tools/build_route.py --venv "$VENV" prepare
say "toolchain: $(du -sh "$VENV/cuda" | cut -f1) in $VENV/cuda after $(($(date +%s) - START)) s"
"$VENV/bin/pip" install -q --target "$CHECK/cuobjdump" nvidia-cuda-cuobjdump==13.5.37

SDIST=$CHECK/llama_cpp_python-$VERSION.tar.gz
[ -f "$SDIST" ] || "$VENV/bin/pip" download -q --no-deps --no-binary llama-cpp-python -d "$CHECK" \
    "llama-cpp-python==$VERSION"
BUILD_START=$(date +%s)
export CMAKE_ARGS
"$VENV/bin/pip" wheel -v --no-deps --no-cache-dir -w "$CHECK/dist" "$SDIST" >"$CHECK/build.log" 2>&1
BUILD_S=$(($(date +%s) - BUILD_START))
WHEEL=$(ls "$CHECK"/dist/llama_cpp_python-"$VERSION"-*.whl)
say "wheel built in ${BUILD_S} s ($((BUILD_S / 60)) min): $(basename "$WHEEL"), $(du -h "$WHEEL" | cut -f1)"

rm -rf "$CHECK/wheel" && mkdir -p "$CHECK/wheel"
(cd "$CHECK/wheel" && "$PYTHON" -m zipfile -e "$WHEEL" .)
LIBS=$CHECK/wheel/llama_cpp/lib
CUDA_LIB=$LIBS/libggml-cuda.so
FAILED=0
if [ -f "$CUDA_LIB" ]; then say "ok: libggml-cuda.so present, $(du -h "$CUDA_LIB" | cut -f1)"; else
    say "FAIL: no libggml-cuda.so in the wheel"; exit 1; fi

CUOBJDUMP=$(find "$CHECK/cuobjdump" -name cuobjdump -type f | head -1)
ELF=$("$CUOBJDUMP" --list-elf "$CUDA_LIB" | grep -o 'sm_[0-9a-z]*' | sort | uniq -c)
PTX=$("$CUOBJDUMP" --list-ptx "$CUDA_LIB" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort | uniq -c || true)
say "cubins by architecture:" "$ELF"
say "ptx by architecture:" "${PTX:-none}"
if echo "$ELF $PTX" | grep -o 'sm_[0-9a-z]*' | grep -qv '^sm_89$'; then
    say "FAIL: device code for another architecture than sm_89"; FAILED=1
else say "ok: sm_89 only"; fi

say "ldd $CUDA_LIB (no LD_LIBRARY_PATH):"
ldd "$CUDA_LIB" | tee -a "$SUMMARY"
say "readelf RUNPATH of libggml-cuda.so: $(readelf -d "$CUDA_LIB" | grep -E 'RUNPATH|RPATH' || echo none)"
# what homelab's doorway opens before the import (the record's cuda_lib_dir), as a search path
CUDA_LIB_DIR=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cuda_lib_dir"])' \
    "$VENV/homelab-build.json")
for lib in "$LIBS"/*.so; do
    missing=$(LD_LIBRARY_PATH=$CUDA_LIB_DIR ldd "$lib" | grep 'not found' | grep -v 'libcuda\.so' || true)
    if [ -n "$missing" ]; then say "FAIL: $(basename "$lib") lacks: $missing"; FAILED=1; fi
done
[ "$FAILED" = 0 ] && say "ok: with $CUDA_LIB_DIR, every dependency resolves except the driver's libcuda"

# the runtime: the wheel installed, imported through homelab's doorway with the record and no
# LD_LIBRARY_PATH (no GPU here: the CUDA backend finds no device, the library must still load)
"$VENV/bin/pip" install -q --no-deps "$WHEEL" && "$VENV/bin/pip" install -q numpy diskcache jinja2 \
    typing-extensions
if env -u LD_LIBRARY_PATH PYTHONPATH="$ROOT" HOMELAB_BUILD_RECORD="$VENV/homelab-build.json" \
    "$VENV/bin/python" - >>"$SUMMARY" 2>"$CHECK/import.log" <<'PY'
from homelab.llamacpp import cuda
from homelab.llamacpp._lib import lib
info = lib().llama_print_system_info().decode()
maps = open("/proc/self/maps").read().splitlines()
loaded = sorted({line.split()[-1] for line in maps if "libcu" in line or "ggml-cuda" in line})
print("import through the doorway: ok\n  system info:", info.split("|")[0:3])
print("  CUDA runtime loaded:", cuda.runtime_version(), "\n  " + "\n  ".join(loaded))
PY
then say "ok: llama_cpp imports with its CUDA backend, no LD_LIBRARY_PATH"; tail -8 "$SUMMARY"
else say "FAIL: the import (see $CHECK/import.log)"; tail -5 "$CHECK/import.log"; FAILED=1; fi
say "total $(($(date +%s) - START)) s"
exit "$FAILED"
