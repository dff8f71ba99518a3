#!/usr/bin/env python3
"""How ``make`` builds llama-cpp-python on this machine, and why (the build route).

Runs with the system Python before the virtual environment exists: standard library only.

    build_route.py route     one line: the route's name, then the CMake arguments
    build_route.py explain   the arguments, then the choice and the reason (``make cmake-args``)
    build_route.py prepare   for the pip route: NVIDIA's CUDA toolchain into <venv>/cuda; for
                             every route: the record <venv>/homelab-build.json (what homelab hw
                             and the runtime read); exit 1 with a message when no route works

The routes, in order:

    cpu           no ``nvidia-smi``: the CPU build (the RPC backend, the AMX rule)
    nvcc          an NVIDIA driver and a system CUDA toolkit it can run (with cuBLAS)
    pip           an NVIDIA driver that runs CUDA 13 (>= 580) and no usable toolkit: NVIDIA's
                  CUDA 13 toolchain from PyPI, installed into <venv>/cuda (never the system)
    cpu-fallback  a GPU but no CUDA route (driver too old, no compiler, no disk space): the CPU
                  build, and a message that names the fix

``CMAKE_ARGS`` set by the user wins; the Makefile does not call ``route`` then.
The GPUs come from ``nvidia-smi --query-gpu=compute_cap,driver_version``: the build is compiled
for the architecture of every GPU present (``89`` for an RTX 4090, ``86;89`` for a mixed box).
Linking ggml-cuda needs the driver's ``libcuda`` (NVIDIA's pip wheels have no stub of it): the
driver's own library is linked where there is one (``ldconfig``, or ``HOMELAB_LIBCUDA``), as on
any GPU box. Without one (a build machine without a driver, ``make cuda-build-check``) ggml's
virtual-memory pool is compiled out (``GGML_CUDA_NO_VMM=ON``). What that costs on a GPU: ggml's
temporary buffers (cuBLAS's converted operands, scratch of some kernels) then come from its older
pool, separate ``cudaMalloc`` chunks allocated 5 % larger than asked and kept (up to 256, reused
best-fit), instead of one virtual range that grows in place: more VRAM held for the same work,
and a synchronizing ``cudaMalloc`` whenever the pool grows. Correctness is unchanged; ``homelab
hw`` shows "VMM pool: no" for such a build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

BASE_ARGS = ("-DGGML_RPC=on",)
AMX_ARGS = ("-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8")
RECORD_NAME = "homelab-build.json"
PIP_PREFIX_NAME = "cuda"  # <venv>/cuda: the pip toolchain, removed with the venv
PIP_CUDA_ROOT = ("nvidia", "cu13")  # where NVIDIA's CUDA 13 wheels put bin/, lib/, include/
PIP_CUDA_VERSION = "13.5"
# the CUDA 13 toolchain on PyPI, pinned to the set `make cuda-build-check` built with
PIP_PACKAGES = (
    "nvidia-cuda-nvcc==13.5.37",  # brings nvidia-nvvm (cicc), -runtime (cudart), -crt
    "nvidia-cuda-runtime==13.5.37",
    "nvidia-cuda-crt==13.5.37",
    "nvidia-cublas==13.10.0.20",
    "nvidia-cuda-cccl==13.3.5.0.6",
)
PIP_LINKS = ("libcudart.so", "libcublas.so", "libcublasLt.so")  # CMake wants unversioned names
# the oldest driver branch that runs each CUDA major release (minor-version compatibility)
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
# the oldest GPU architecture each CUDA major release compiles for
MIN_ARCH = {13: 75, 12: 50, 11: 35}
MIN_FREE_BYTES = {"pip": 6 << 30, "nvcc": 3 << 30}
GIB = 1 << 30


@dataclass
class Machine:
    """What the route depends on, read once (tests build one by hand)."""

    gpus: list[tuple[str, str]]  # (compute capability "8.9", driver version "580.65.06")
    smi_error: str | None = None  # nvidia-smi is there but failed
    nvcc: Path | None = None
    nvcc_version: tuple[int, int] | None = None
    nvcc_has_cublas: bool = False
    host_compiler: str | None = None  # g++ / c++ found
    host_compiler_major: int | None = None
    driver_library: Path | None = None  # the driver's libcuda.so.1
    free_bytes: int = 0
    amx: bool = False


@dataclass
class Route:
    name: str  # cpu, nvcc, pip, cpu-fallback
    reason: str
    args: list[str] = field(default_factory=list)
    architectures: list[int] = field(default_factory=list)
    cuda_version: str | None = None
    cuda_lib_dir: str | None = None  # pip route: the libraries the runtime preloads
    vmm: bool | None = None  # ggml's virtual-memory pool compiled in (CUDA routes)
    fix: str | None = None  # cpu-fallback: what to do


def run(command: list[str], timeout_s: float = 20) -> str | None:
    """stdout of a command, or None when it is missing or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def read_gpus() -> tuple[list[tuple[str, str]], str | None]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None
    query = [smi, "--query-gpu=compute_cap,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return [], f"nvidia-smi failed: {error}"
    if done.returncode != 0:
        first = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
        return [], f"nvidia-smi failed: {first[0]}"
    gpus = []
    for line in done.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and re.fullmatch(r"\d+\.\d+", parts[0]):
            gpus.append((parts[0], parts[1]))
    return gpus, None if gpus else "nvidia-smi lists no GPU"


def find_nvcc() -> Path | None:
    if os.environ.get("HOMELAB_NO_SYSTEM_CUDA"):  # to take the pip route on purpose
        return None
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return Path(home) / "bin" / "nvcc"
    return None


def nvcc_version(nvcc: Path) -> tuple[int, int] | None:
    found = re.search(r"release (\d+)\.(\d+)", run([str(nvcc), "--version"]) or "")
    return (int(found[1]), int(found[2])) if found else None


def nvcc_has_cublas(nvcc: Path) -> bool:
    """Whether the toolkit nvcc belongs to has cuBLAS (some ship nvcc and cudart alone): the
    include and library folders nvcc itself uses, as its ``--dryrun`` prints them."""
    command = [str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    dry = done.stdout + done.stderr  # nvcc prints its --dryrun lines on stderr
    includes = [Path(p) for p in re.findall(r'"-I([^"]+)"', dry)]
    libraries = [Path(p) for p in re.findall(r'"-L([^"]+)"', dry)]
    header = any((folder / "cublas_v2.h").is_file() for folder in includes)
    library = any(any(folder.glob("libcublas.so*")) for folder in libraries if folder.is_dir())
    return header and library


def host_compiler() -> tuple[str | None, int | None]:
    for name in (os.environ.get("CUDAHOSTCXX"), "g++", "c++"):
        if name and shutil.which(name):
            version = run([name, "-dumpversion"]) or ""
            found = re.match(r"(\d+)", version.strip())
            return name, int(found[1]) if found else None
    return None, None


def driver_library() -> Path | None:
    """The driver's libcuda.so.1. HOMELAB_LIBCUDA names it where the loader's cache does not
    (set but empty: link none, as on a build machine without a driver)."""
    if "HOMELAB_LIBCUDA" in os.environ:
        given = os.environ["HOMELAB_LIBCUDA"]
        return Path(given) if given and Path(given).exists() else None
    listing = run(["ldconfig", "-p"]) or ""
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libcuda.so.1 ") and Path(path).exists():
            return Path(path)
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib", "/usr/lib"):
        if (Path(folder) / "libcuda.so.1").exists():
            return Path(folder) / "libcuda.so.1"
    return None


def has_amx(cpuinfo: Path) -> bool:
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"\bamx_tile\b", text) is not None


def free_bytes(venv: Path) -> int:
    folder = venv.resolve()
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def read_machine(venv: Path, cpuinfo: Path) -> Machine:
    gpus, smi_error = read_gpus()
    machine = Machine(gpus=gpus, smi_error=smi_error, amx=has_amx(cpuinfo))
    if not gpus:
        return machine
    machine.nvcc = find_nvcc()
    if machine.nvcc is not None:
        machine.nvcc_version = nvcc_version(machine.nvcc)
        machine.nvcc_has_cublas = nvcc_has_cublas(machine.nvcc)
    machine.host_compiler, machine.host_compiler_major = host_compiler()
    machine.driver_library = driver_library()
    machine.free_bytes = free_bytes(venv)
    return machine


def architectures(gpus: list[tuple[str, str]]) -> list[int]:
    return sorted({int(cc.replace(".", "")) for cc, _ in gpus})


def driver_major(gpus: list[tuple[str, str]]) -> int:
    return min(int(driver.split(".")[0]) for _, driver in gpus)


def max_gcc(cuda: tuple[int, int]) -> int:
    """The newest GCC major release nvcc of this CUDA release accepts as its host compiler."""
    major, minor = cuda
    if major >= 13:
        return 15
    if major == 12:
        return 13 if minor >= 4 else 12
    return 11


def cpu_args(machine: Machine) -> list[str]:
    return [*BASE_ARGS, *(AMX_ARGS if machine.amx else ())]


def choose(machine: Machine, venv: Path) -> Route:
    """The route for this machine (pure: everything it reads is in ``machine``)."""
    if not machine.gpus:
        if machine.smi_error:
            return fallback(
                machine,
                f"{machine.smi_error}, so no GPU can be used",
                "update or repair the NVIDIA driver (`nvidia-smi --query-gpu=compute_cap "
                "--format=csv` must list every GPU), then `make rebuild-llama`; or set "
                "CMAKE_ARGS yourself (README)",
            )
        return Route("cpu", "no nvidia-smi: no NVIDIA driver, the CPU build", cpu_args(machine))
    archs = architectures(machine.gpus)
    compiler = check_host_compiler(machine)
    if compiler is not None:
        return compiler
    system = nvcc_route(machine, archs)
    if system.name == "nvcc":
        return system
    return pip_route(machine, venv, archs, why_not_nvcc=system.reason)


def check_host_compiler(machine: Machine) -> Route | None:
    if machine.host_compiler is None:
        return fallback(
            machine,
            "no C++ compiler (g++), needed for any build",
            "install one: `sudo apt install build-essential` (Fedora: `sudo dnf install gcc-c++`)",
        )
    return None


def nvcc_route(machine: Machine, archs: list[int]) -> Route:
    """The system toolkit's route, or a Route named "no" whose reason says why not."""
    if machine.nvcc is None or machine.nvcc_version is None:
        return Route("no", "no system CUDA toolkit (nvcc)")
    cuda = machine.nvcc_version
    version = f"{cuda[0]}.{cuda[1]}"
    need = MIN_DRIVER.get(cuda[0], 10_000)
    if driver_major(machine.gpus) < need:
        return Route("no", f"the system nvcc is CUDA {version}, which needs driver >= {need}")
    if not machine.nvcc_has_cublas:
        return Route("no", f"the system CUDA {version} toolkit ({machine.nvcc}) has no cuBLAS")
    if min(archs) < MIN_ARCH.get(cuda[0], 0):
        return Route("no", f"CUDA {version} cannot compile for compute {min(archs) / 10}")
    if (machine.host_compiler_major or 0) > max_gcc(cuda):
        return Route("no", f"CUDA {version} does not accept {host_text(machine)}")
    if machine.free_bytes < MIN_FREE_BYTES["nvcc"]:
        return Route("no", f"only {machine.free_bytes / GIB:.1f} GiB free")
    args = [*cuda_args(archs), f"-DCMAKE_CUDA_COMPILER={machine.nvcc}", *host_args()]
    return Route(
        "nvcc",
        f"the system CUDA {version} toolkit ({machine.nvcc}), which driver "
        f"{machine.gpus[0][1]} runs",
        [*BASE_ARGS, *args, *amx(machine)],
        archs,
        version,
        vmm=True,
    )


def pip_route(machine: Machine, venv: Path, archs: list[int], why_not_nvcc: str) -> Route:
    driver = machine.gpus[0][1]
    if driver_major(machine.gpus) < MIN_DRIVER[13]:
        return fallback(
            machine,
            f"{why_not_nvcc}, and driver {driver} is too old for NVIDIA's CUDA 13 toolchain "
            f"from PyPI (it needs >= {MIN_DRIVER[13]})",
            f"either update the NVIDIA driver to {MIN_DRIVER[13]} or newer, or install a "
            f"{runs_text(machine)} toolkit with cuBLAS (`sudo apt install nvidia-cuda-toolkit`, "
            "or NVIDIA's cuda-toolkit package), then `make rebuild-llama`",
        )
    if min(archs) < MIN_ARCH[13]:
        return fallback(
            machine,
            f"{why_not_nvcc}, and CUDA 13 cannot compile for compute {min(archs) / 10}",
            "install a CUDA 12 toolkit (`sudo apt install nvidia-cuda-toolkit`), then "
            "`make rebuild-llama`",
        )
    if (machine.host_compiler_major or 0) > max_gcc((13, 0)):
        return fallback(
            machine,
            f"CUDA 13 does not accept {host_text(machine)} as its host compiler",
            f"install g++-{max_gcc((13, 0))} and run "
            f"`CUDAHOSTCXX=g++-{max_gcc((13, 0))} make rebuild-llama`",
        )
    if machine.free_bytes < MIN_FREE_BYTES["pip"]:
        return fallback(
            machine,
            f"the CUDA toolchain and its build need about {MIN_FREE_BYTES['pip'] // GIB} GiB, "
            f"and only {machine.free_bytes / GIB:.1f} GiB are free here",
            "free some disk space (`df -h .`), then `make rebuild-llama`",
        )
    return pip_toolchain_route(machine, venv, archs, why_not_nvcc)


def pip_toolchain_route(machine: Machine, venv: Path, archs: list[int], why: str) -> Route:
    root = pip_cuda_root(venv)
    driver_args, vmm = driver_link_args(machine)
    args = [
        *cuda_args(archs),
        f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
        f"-DCUDAToolkit_ROOT={root}",
        *driver_args,
        *host_args(),
    ]
    return Route(
        "pip",
        f"{why}: NVIDIA's CUDA {PIP_CUDA_VERSION} toolchain from PyPI, in {root.parent.parent}",
        [*BASE_ARGS, *args, *amx(machine)],
        archs,
        PIP_CUDA_VERSION,
        cuda_lib_dir=str(root / "lib"),
        vmm=vmm,
    )


def driver_link_args(machine: Machine) -> tuple[list[str], bool]:
    """Link ggml-cuda against the driver's own libcuda; without one, compile VMM out."""
    if machine.driver_library is not None:
        return [f"-DCUDA_cuda_driver_LIBRARY={machine.driver_library}"], True
    return ["-DGGML_CUDA_NO_VMM=ON"], False


def runs_text(machine: Machine) -> str:
    """ "CUDA 12" for a 550 driver: the newest CUDA major release the driver runs."""
    driver = driver_major(machine.gpus)
    majors = [major for major, need in MIN_DRIVER.items() if driver >= need]
    return f"CUDA {max(majors)}" if majors else "CUDA"


def cuda_args(archs: list[int]) -> list[str]:
    return ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(map(str, archs))]


def host_args() -> list[str]:
    chosen = os.environ.get("CUDAHOSTCXX")
    return [f"-DCMAKE_CUDA_HOST_COMPILER={chosen}"] if chosen else []


def host_text(machine: Machine) -> str:
    return f"{machine.host_compiler} {machine.host_compiler_major}"


def amx(machine: Machine) -> list[str]:
    return list(AMX_ARGS) if machine.amx else []


def fallback(machine: Machine, reason: str, fix: str) -> Route:
    return Route("cpu-fallback", reason, cpu_args(machine), fix=fix)


def pip_cuda_root(venv: Path) -> Path:
    return venv.resolve() / PIP_PREFIX_NAME / Path(*PIP_CUDA_ROOT)


def explain(route: Route, user_args: str | None) -> str:
    if user_args is not None:
        return f"{user_args}\n# route: user — CMAKE_ARGS set by you, used as given"
    lines = [" ".join(route.args), f"# route: {route.name} — {route.reason}"]
    if route.architectures:
        lines.append("# CUDA architectures: " + ";".join(map(str, route.architectures)))
    if route.vmm is False:
        lines.append(
            "# no driver library (libcuda.so.1) here: built with GGML_CUDA_NO_VMM=ON "
            "(no virtual-memory pool)"
        )
    if route.fix:
        lines.append(f"# to build with CUDA: {route.fix}")
    return "\n".join(lines)


def install_toolchain(route: Route, venv: Path, pip: list[str]) -> None:
    """NVIDIA's CUDA 13 wheels into <venv>/cuda, with the unversioned links CMake needs."""
    prefix = venv.resolve() / PIP_PREFIX_NAME
    root = pip_cuda_root(venv)
    if not (root / "bin" / "nvcc").is_file():
        print(f"homelab: installing NVIDIA's CUDA toolchain into {prefix} (~1.5 GB)", flush=True)
        command = [*pip, "install", "-q", "--upgrade", "--target", str(prefix), *PIP_PACKAGES]
        subprocess.run(command, check=True)
    lib = root / "lib"
    for name in PIP_LINKS:
        versioned = sorted(lib.glob(name + ".[0-9]*"))
        if versioned and not (lib / name).exists():
            (lib / name).symlink_to(versioned[0].name)


def record(route: Route, venv: Path, user_args: str | None) -> Path:
    document = asdict(route)
    if user_args is not None:
        document = {"name": "user", "reason": "CMAKE_ARGS set by you", "args": user_args.split()}
    path = venv / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def prepare(route: Route, venv: Path, pip: list[str], user_args: str | None) -> int:
    if user_args is None and route.name == "pip":
        try:
            install_toolchain(route, venv, pip)
        except (OSError, subprocess.CalledProcessError) as error:
            print(
                f"homelab: installing NVIDIA's CUDA toolchain failed ({error}).\n"
                "  Retry `make install`; or build for CPU only: "
                '`CMAKE_ARGS="$(make -s cmake-args-cpu)" make install`',
                file=sys.stderr,
            )
            return 1
    if user_args is None and route.name == "cpu-fallback":
        print(f"homelab: building llama.cpp for CPU only: {route.reason}.", file=sys.stderr)
        print(f"  To use the GPU: {route.fix}", file=sys.stderr)
    record(route, venv, user_args)
    return 0


def failed(route: Route, log: Path, user_args: str | None) -> int:
    """After a failed pip build: the few lines that say why, and what to do (not CMake's wall)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    marks = ("error", "Error", "ERROR", "No space left", "not found")
    errors = [line.strip() for line in lines if any(mark in line for mark in marks)]
    print(f"homelab: building llama-cpp-python failed (the whole log: {log}):", file=sys.stderr)
    for line in errors[:6] or lines[-6:]:
        print(f"  {line[:200]}", file=sys.stderr)
    if os.environ.get("CI"):  # no one can open the log afterwards: its end goes with the run
        print("\n".join(["--- the end of the log ---", *lines[-60:], "---"]), file=sys.stderr)
    used = f"your CMAKE_ARGS ({user_args})" if user_args is not None else f"route {route.name}"
    print(f"  It was built with {used}; `make cmake-args` says why.", file=sys.stderr)
    if any("No space left" in line for line in lines):
        print("  The disk is full: free some space (`df -h .`) and run it again.", file=sys.stderr)
    if user_args is not None or route.name in ("nvcc", "pip"):
        print(
            '  To build for the CPU instead: CMAKE_ARGS="$(make -s cmake-args-cpu)" make install',
            file=sys.stderr,
        )
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("route", "explain", "prepare", "cpu-args", "failed"))
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    parser.add_argument("--cpuinfo", type=Path, default=Path("/proc/cpuinfo"))
    parser.add_argument("--pip", default=None, help="the pip to install the toolchain with")
    parser.add_argument("--user-args", default=None, help="CMAKE_ARGS the user set, if any")
    parser.add_argument("--log", type=Path, default=Path(".venv/build.log"), help="for failed")
    args = parser.parse_args(argv)
    if args.action == "cpu-args":
        print(" ".join(cpu_args(Machine([], amx=has_amx(args.cpuinfo)))))
        return 0
    route = choose(read_machine(args.venv, args.cpuinfo), args.venv)
    if args.action == "route":
        print(route.name, *route.args)
    elif args.action == "explain":
        print(explain(route, args.user_args))
    elif args.action == "failed":
        return failed(route, args.log, args.user_args)
    else:
        pip = [args.pip] if args.pip else [str(args.venv / "bin" / "pip")]
        return prepare(route, args.venv, pip, args.user_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
