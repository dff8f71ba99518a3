"""llama.cpp's own tools (llama-bench, llama-batched-bench, llama-server), built for comparison.

The tools are built from the llama.cpp tree vendored in the llama-cpp-python sdist of the
version installed here, so both sides run the same llama.cpp commit. The sdist is found in
``$HOMELAB_LLAMA_SRC``, ``/tmp/src``, or the harness cache; otherwise it is downloaded with
``pip download --no-binary :all: --no-deps llama-cpp-python==<version>``. Sources, build tree
and binaries live under ``benchmarks/tools/`` (git-ignored) and are never committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS_DIR = HERE / "tools"
BUILD_DIR = TOOLS_DIR / "build"
SDIST_CACHE = TOOLS_DIR / "sdist"
TARGETS = ("llama-bench", "llama-batched-bench", "llama-server")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",  # like the pip build of llama-cpp-python on this host
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
COMPILER_FLAG_ARGS = ("-DCMAKE_C_FLAGS=", "-DCMAKE_CXX_FLAGS=")  # taken from the Makefile


def amx_workaround_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """The compiler flags of the Makefile's CMAKE_ARGS for a machine whose cpuinfo is
    ``cpuinfo`` (its AMX_ARGS: on a CPU with AMX, ``-mno-amx-int8``; see the Makefile), so
    the tools are built like the library they are compared with, by the same rule."""
    if shutil.which("make") is None:
        raise RuntimeError("make is needed to read the build flags (the Makefile's CMAKE_ARGS)")
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_ARGS"}  # the Makefile's own
    printed = subprocess.run(
        ["make", "-s", "-C", str(HERE.parent), "cmake-args", f"CPUINFO={cpuinfo}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(arg for arg in printed.split() if arg.startswith(COMPILER_FLAG_ARGS))


def llama_cpp_python_version() -> str:
    from importlib.metadata import version

    return version("llama-cpp-python")


def _vendored_tree(root: Path) -> Path | None:
    tree = root / "vendor" / "llama.cpp"
    return tree if (tree / "CMakeLists.txt").is_file() else None


def find_sources(version: str | None = None, *, download: bool = True) -> Path:
    """The vendored llama.cpp tree of the installed llama-cpp-python (downloaded if needed)."""
    version = version or llama_cpp_python_version()
    folder = f"llama_cpp_python-{version}"
    candidates = [Path(p) for p in (os.environ.get("HOMELAB_LLAMA_SRC"),) if p]
    candidates += [Path("/tmp/src") / folder, SDIST_CACHE / folder]
    for candidate in candidates:
        tree = _vendored_tree(candidate) or (
            candidate if (candidate / "CMakeLists.txt").is_file() else None
        )
        if tree is not None:
            return tree
    if not download:
        raise FileNotFoundError(f"no llama-cpp-python {version} sources found in {candidates}")
    return _download_sdist(version)


def _download_sdist(version: str) -> Path:
    SDIST_CACHE.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
        "--dest", str(SDIST_CACHE), f"llama-cpp-python=={version}",
    ]  # fmt: skip
    print("downloading the sdist:", " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True)
    archive = next(SDIST_CACHE.glob(f"llama_cpp_python-{version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(SDIST_CACHE, filter="data")
    tree = _vendored_tree(SDIST_CACHE / f"llama_cpp_python-{version}")
    if tree is None:
        raise FileNotFoundError(f"{archive} has no vendor/llama.cpp tree")
    return tree


def tool_path(name: str) -> Path:
    """A tool of the local build, or of ``$HOMELAB_LLAMA_TOOLS`` (the GPU machine's CUDA build)."""
    elsewhere = os.environ.get("HOMELAB_LLAMA_TOOLS")
    return Path(elsewhere) / name if elsewhere else BUILD_DIR / "bin" / name


def build_tools(jobs: int = 2, *, force: bool = False) -> dict[str, Path]:
    """Configure and build the comparison tools (about 10 minutes on 2 cores, once)."""
    paths = {name: tool_path(name) for name in TARGETS}
    if os.environ.get("HOMELAB_LLAMA_TOOLS") or (
        not force and all(path.is_file() for path in paths.values())
    ):
        return paths  # built elsewhere (the GPU machine's script builds its own)
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake is needed to build llama.cpp's benchmark tools")
    source = find_sources()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    configure = [
        "cmake", "-S", str(source), "-B", str(BUILD_DIR), *generator, *CMAKE_FLAGS,
        *amx_workaround_flags(),
    ]  # fmt: skip
    build = ["cmake", "--build", str(BUILD_DIR), "--target", *TARGETS, "-j", str(jobs)]
    for command in (configure, build):
        print("+", " ".join(command), file=sys.stderr)
        subprocess.run([*nice, *command], check=True)
    return paths


C_LOOP_SOURCE = HERE / "c_loop.c"


def installed_library_dir() -> Path:
    """Where the installed llama-cpp-python keeps the libllama it loads."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise RuntimeError("llama-cpp-python is not installed")
    return Path(spec.origin).parent / "lib"


def build_c_loop() -> Path:
    """``benchmarks/c_loop.c`` compiled against the installed llama-cpp-python's own libllama
    (headers from the same version's sources), rebuilt when the source is newer."""
    binary = BUILD_DIR / "bin" / "homelab-c-loop"
    if binary.is_file() and binary.stat().st_mtime >= C_LOOP_SOURCE.stat().st_mtime:
        return binary
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("a C compiler (cc) is needed to build benchmarks/c_loop.c")
    tree, library = find_sources(), installed_library_dir()
    binary.parent.mkdir(parents=True, exist_ok=True)
    command = [
        compiler, "-O2", "-o", str(binary), str(C_LOOP_SOURCE),
        f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}",
        f"-L{library}", "-lllama", f"-Wl,-rpath,{library}",
    ]  # fmt: skip
    print("+", " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True)
    return binary


if __name__ == "__main__":
    for tool, path in build_tools().items():
        print(f"{tool}: {path}")
    print(f"homelab-c-loop: {build_c_loop()}")
