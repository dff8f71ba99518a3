"""The build: ``make`` compiles llama-cpp-python with the RPC backend and never reuses a cached
wheel (pip's wheel cache ignores CMAKE_ARGS, so a cached plain wheel would come back silently)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from homelab.hardware.build import read_build
from homelab.llamacpp.rpc import available

ROOT = Path(__file__).resolve().parents[3]
PRINT = 'print-cmake-args: ; @echo "$$CMAKE_ARGS|$(PIP_CACHE_FLAG)"'


def _make_variables(**env: str) -> tuple[str, str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    finished = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", PRINT, "print-cmake-args"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"} | env,
    )
    cmake_args, _, cache_flag = finished.stdout.strip().partition("|")
    return cmake_args, cache_flag


def test_make_builds_with_rpc_and_bypasses_the_wheel_cache() -> None:
    cmake_args, cache_flag = _make_variables()
    assert "-DGGML_RPC=on" in cmake_args.split()
    # with CUDA or not: tests/test_build_flags.py (the build route, with a fake nvidia-smi)
    assert cache_flag == "--no-cache-dir"


def test_custom_cmake_args_still_bypass_the_wheel_cache() -> None:
    cmake_args, cache_flag = _make_variables(CMAKE_ARGS="-DGGML_CUDA=on")
    assert cmake_args == "-DGGML_CUDA=on" and cache_flag == "--no-cache-dir"


def test_hw_reports_whether_the_build_has_rpc() -> None:
    build = read_build()
    assert build.rpc is available()
