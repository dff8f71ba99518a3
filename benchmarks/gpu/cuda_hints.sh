# Sourced by run_on_gpu.sh (bash). CMake finds cuBLAS and libcuda in a full CUDA toolkit. An
# image whose toolkit was assembled from NVIDIA's pip wheels (this workplace's CPU image is one:
# /usr/local/cuda-13.0 holds nvcc and cudart but no cuBLAS) keeps cuBLAS in
# site-packages/nvidia/cu13 (PyTorch's wheels) and libcuda only with the driver. cuda_hints
# finds what the toolkit lacks and sets:
#
#   CUDA_HINT_ARGS    extra CMake -D arguments (empty when CMake will find everything itself)
#   LD_LIBRARY_PATH   extended with the wheel's library folder, for loading at run time
#
# GPU_EXTRA_CUDA_ROOTS (folders, space-separated) adds places to search, for testing this.

_cuda_find() { # NAME ROOT... -> the first matching file or link, sorted
    local name=$1
    shift
    [ $# -gt 0 ] || return 0
    find "$@" -maxdepth 5 \( -type f -o -type l \) -name "$name" 2>/dev/null | sort | head -1
}

_cuda_toolkits() {
    local root
    for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
        [ -n "$root" ] && [ -d "$root" ] && echo "$root"
    done
}

_cuda_wheel_roots() {
    local folder
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null |
        while read -r folder; do
            [ -d "$folder/nvidia" ] && echo "$folder/nvidia"
        done
    for folder in ${GPU_EXTRA_CUDA_ROOTS:-}; do
        [ -d "$folder" ] && echo "$folder"
    done
}

_cuda_cublas_hints() {
    local header lib lt include=/tmp/homelab-cublas-include
    header=$(_cuda_find cublas_v2.h "${_WHEELS[@]}")
    lib=$(_cuda_find 'libcublas.so*' "${_WHEELS[@]}")
    lt=$(_cuda_find 'libcublasLt.so*' "${_WHEELS[@]}")
    if [ -z "$header" ] || [ -z "$lib" ] || [ -z "$lt" ]; then
        echo "cuda_hints: no cuBLAS in the toolkit nor in pip wheels; CMake will fail" >&2
        return
    fi
    # only the cuBLAS headers: the wheel's other CUDA headers may not match this nvcc
    mkdir -p "$include"
    ln -sf "$(dirname "$header")"/cublas*.h "$include"/
    CUDA_HINT_ARGS+=" -DCUDA_cublas_LIBRARY=$lib -DCUDA_cublasLt_LIBRARY=$lt"
    CUDA_HINT_ARGS+=" -DCMAKE_CUDA_FLAGS=-I$include -DCMAKE_CXX_FLAGS=-I$include"
    export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

_cuda_driver_hint() {
    local driver
    driver=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" {print $NF; exit}')
    if [ -z "$driver" ]; then
        driver=$(_cuda_find 'libcuda.so.1' /usr/local/nvidia /usr/lib/x86_64-linux-gnu \
            /usr/lib64 /usr/lib ${GPU_EXTRA_CUDA_ROOTS:-})
    fi
    if [ -n "$driver" ]; then
        CUDA_HINT_ARGS+=" -DCUDA_cuda_driver_LIBRARY=$driver"
    else
        echo "cuda_hints: no libcuda.so.1 found; CMake may fail to link ggml-cuda" >&2
    fi
}

cuda_hints() {
    CUDA_HINT_ARGS=""
    local toolkits=()
    mapfile -t toolkits < <(_cuda_toolkits)
    mapfile -t _WHEELS < <(_cuda_wheel_roots)
    if [ -z "$(_cuda_find cublas_v2.h "${toolkits[@]}")" ]; then
        _cuda_cublas_hints
    fi
    # a full toolkit has lib64/stubs/libcuda.so; a driver with its dev link has libcuda.so
    if [ -z "$(_cuda_find libcuda.so "${toolkits[@]}" /usr/lib/x86_64-linux-gnu /usr/lib64)" ]; then
        _cuda_driver_hint
    fi
    echo "cuda_hints: toolkits: ${toolkits[*]:-none}; wheels: ${_WHEELS[*]:-none}" >&2
    echo "cuda_hints: CMake args:${CUDA_HINT_ARGS:- (none needed)}" >&2
}
