"""A pip-route build's CUDA libraries are found without LD_LIBRARY_PATH (llamacpp.cuda).

No CUDA runtime or cuBLAS can be used on the machines these tests run on: small libraries
compiled here stand in for them, with their sonames (``libcudart.so.13``, ``libcublas.so.13``,
``libcublasLt.so.13``) and ``cudaRuntimeGetVersion``. ``libggml-cuda-like.so`` needs them by
soname and has no RUNPATH to them, as the library a pip-route build makes. What runs is real:
the dynamic loader, ctypes, the record reader and the doorway's import of llama-cpp-python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from homelab.llamacpp import cuda

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

CUDART_C = "int cudaRuntimeGetVersion(int *v) { *v = 13050; return 0; }\n"
CUBLAS_C = "int cublasCreate_v2(void **h) { *h = 0; return 0; }\n"
USER_C = (
    "int cudaRuntimeGetVersion(int *v);\nint cublasCreate_v2(void **h);\n"
    "int uses_cuda(void) { int v = 0; void *h; cudaRuntimeGetVersion(&v); cublasCreate_v2(&h);"
    " return v; }\n"
)


def compile_library(folder: Path, soname: str, source: str, *needed: str) -> Path:
    (folder / f"{soname}.c").write_text(source)
    links = [f"-l:{name}" for name in needed]
    output = folder / soname
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{soname}",
            "-o",
            str(output),
            str(folder / f"{soname}.c"),
            f"-L{folder}",
            *links,
        ],
        check=True,
    )
    return output


@pytest.fixture(scope="module")
def pip_cuda(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fake wheels' lib folder, a library that needs them by soname, built elsewhere)."""
    lib = tmp_path_factory.mktemp("cu13") / "lib"
    lib.mkdir()
    compile_library(lib, "libcudart.so.13", CUDART_C)
    compile_library(lib, "libcublasLt.so.13", "int cublasLt_marker = 1;\n")
    compile_library(lib, "libcublas.so.13", CUBLAS_C, "libcublasLt.so.13")
    elsewhere = tmp_path_factory.mktemp("wheel")
    for name in ("libcudart.so.13", "libcublas.so.13"):
        (elsewhere / name).symlink_to(lib / name)  # to link against, then removed
    user = compile_library(
        elsewhere, "libggml-cuda-like.so", USER_C, "libcudart.so.13", "libcublas.so.13"
    )
    for name in ("libcudart.so.13", "libcublas.so.13"):
        (elsewhere / name).unlink()
    return lib, user


def write_record(path: Path, lib: Path | None) -> Path:
    document = {
        "name": "pip",
        "reason": "test",
        "cuda_version": "13.5",
        "architectures": [89],
        "cuda_lib_dir": str(lib) if lib else None,
        "vmm": False,
    }
    path.write_text(json.dumps(document))
    return path


def run_python(code: str, record: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(PYTHONPATH=str(ROOT), HOMELAB_BUILD_RECORD=str(record))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


LOAD_USER = """
import ctypes, sys
from homelab.llamacpp import cuda
{before}
user = ctypes.CDLL({user!r})
print("uses_cuda", user.uses_cuda())
print("runtime", cuda.runtime_version())
"""


def test_the_recorded_libraries_are_opened_so_a_library_needing_them_loads(
    tmp_path: Path, pip_cuda: tuple[Path, Path]
) -> None:
    lib, user = pip_cuda
    record = write_record(tmp_path / "homelab-build.json", lib)
    code = LOAD_USER.format(before="print(cuda.preload(cuda.read_record()))", user=str(user))
    done = run_python(code, record)
    assert done.returncode == 0, done.stderr
    assert "uses_cuda 13050" in done.stdout
    assert "runtime 13.5" in done.stdout  # asked of the loaded runtime, not read from the record
    opened = done.stdout.splitlines()[0]
    assert all(name in opened for name in ("libcudart.so.13", "libcublasLt.so.13"))


def test_without_the_preload_the_same_library_does_not_load(
    tmp_path: Path, pip_cuda: tuple[Path, Path]
) -> None:
    """The control: the loader alone does not find the wheels' libraries."""
    if (
        "libcublas.so.13"
        in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    ):
        pytest.skip("this machine has a system cuBLAS 13 on the loader's path")
    _, user = pip_cuda
    record = write_record(tmp_path / "homelab-build.json", None)
    done = run_python(LOAD_USER.format(before="", user=str(user)), record)
    assert done.returncode != 0
    assert "libcublas.so.13: cannot open shared object file" in done.stderr


def test_the_doorway_opens_them_before_importing_llama_cpp(
    tmp_path: Path, pip_cuda: tuple[Path, Path]
) -> None:
    lib, _ = pip_cuda
    record = write_record(tmp_path / "homelab-build.json", lib)
    code = (
        "from homelab.llamacpp._lib import lib\nlib()\n"
        "maps = open('/proc/self/maps').read()\n"
        f"print([line.split()[-1] for line in maps.splitlines() if {str(lib)!r} in line])\n"
    )
    done = run_python(code, record)
    assert done.returncode == 0, done.stderr
    assert str(lib / "libcudart.so.13") in done.stdout
    assert str(lib / "libcublas.so.13") in done.stdout


def test_no_record_or_an_unreadable_one_opens_nothing(tmp_path: Path) -> None:
    assert cuda.read_record(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert cuda.read_record(tmp_path / "bad.json") is None
    assert cuda.preload(None) == ()


def test_the_record_make_writes_is_read(tmp_path: Path) -> None:
    record = cuda.read_record(write_record(tmp_path / "r.json", tmp_path))
    assert record == cuda.BuildRecord(
        route="pip",
        reason="test",
        cuda_version="13.5",
        architectures=(89,),
        cuda_lib_dir=str(tmp_path),
        vmm=False,
    )


@pytest.mark.parametrize(
    ("loader_error", "expected"),
    [
        ("libcuda.so.1: cannot open shared object file", "install or repair the NVIDIA driver"),
        ("libcublas.so.13: cannot open shared object file", "make rebuild-llama"),
        ("No module named 'llama_cpp'", "Reinstall it: .venv/bin/pip install llama-cpp-python"),
    ],
)
def test_a_build_that_does_not_load_says_what_to_do(loader_error: str, expected: str) -> None:
    from homelab.llamacpp._lib import LlamaCppUnavailable

    error = LlamaCppUnavailable(OSError(loader_error))
    assert loader_error in str(error)
    assert expected in (error.hint or "")
