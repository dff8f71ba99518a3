"""Confirm a plan with llama.cpp itself: a dry run that allocates nothing.

The model is opened with ``no_alloc = True`` and ``load_mode = LLAMA_LOAD_MODE_NONE`` (the
mmap path asserts in this mode) and a context is created with the plan's settings; llama.cpp
sizes every buffer and logs it without allocating (milliseconds). The log gives:

* ``llama_kv_cache: size = X MiB (...)`` for each KV cache (two for sliding-window models),
* ``llama_memory_recurrent: size = X MiB (...)`` for recurrent state,
* ``sched_reserve: <device> compute buffer size = X MiB`` per backend,
* ``llama_context: <device> output buffer size = X MiB``.

Buffer *allocation* lines print 0.00 MiB in this mode, so weights are not read from the log.
The log prints MiB with two decimals, so engine figures are exact to ±0.005 MiB.

It runs in a subprocess (``python -m homelab.planner.dryrun`` reading a JSON request on stdin
and writing a JSON result on stdout): llama.cpp aborts the process on some invalid inputs and
its log callback is process-wide.
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from homelab.errors import EngineError
from homelab.planner.cache import GGML_TYPE_IDS
from homelab.settings import Settings

MIB = 1 << 20
DRY_RUN_TIMEOUT_S = 60.0
_KV_SIZE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers")
_RS_SIZE = re.compile(r"llama_memory_recurrent: size =\s*([\d.]+) MiB")
_COMPUTE = re.compile(r"(\S+) compute buffer size =\s*([\d.]+) MiB")
_OUTPUT = re.compile(r"(\S+)\s+output buffer size =\s*([\d.]+) MiB")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


@dataclass(frozen=True)
class KvCacheLine:
    mib: float
    cells: int
    layers: int


@dataclass(frozen=True)
class DryRunResult:
    """What llama.cpp reported for a configuration (sizes in MiB as logged, 2 decimals)."""

    ok: bool
    error: str | None = None
    kv_caches: tuple[KvCacheLine, ...] = ()
    recurrent_mib: float | None = None
    compute_mib: dict[str, float] = field(default_factory=dict)
    output_mib: dict[str, float] = field(default_factory=dict)
    offloaded_layers: int | None = None
    seconds: float = 0.0
    gpu_offload: bool = False  # whether this llama.cpp build can use a GPU

    @property
    def kv_mib(self) -> float:
        return sum(line.mib for line in self.kv_caches)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_log(text: str) -> DryRunResult:
    """The figures of a llama.cpp context-creation log."""
    kv = tuple(KvCacheLine(float(m[1]), int(m[2]), int(m[3])) for m in _KV_SIZE.finditer(text))
    recurrent = [float(m[1]) for m in _RS_SIZE.finditer(text)]
    compute = {m[1]: float(m[2]) for m in _COMPUTE.finditer(text)}
    output = {m[1]: float(m[2]) for m in _OUTPUT.finditer(text)}
    offloaded = _OFFLOADED.search(text)
    return DryRunResult(
        ok=True,
        kv_caches=kv,
        recurrent_mib=sum(recurrent) if recurrent else None,
        compute_mib=compute,
        output_mib=output,
        offloaded_layers=int(offloaded[1]) if offloaded else None,
    )


def dry_run(
    path: str | Path, settings: Settings, timeout_s: float = DRY_RUN_TIMEOUT_S
) -> DryRunResult:
    """Run the dry run for ``path`` with ``settings`` in a subprocess."""
    request = json.dumps({"path": str(path), "settings": settings.to_dict()})
    try:
        finished = subprocess.run(
            [sys.executable, "-m", "homelab.planner.dryrun"],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return DryRunResult(ok=False, error=f"the dry run took longer than {timeout_s:.0f} s")
    try:
        document = json.loads(finished.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (finished.stderr or "").strip().splitlines()[-3:]
        return DryRunResult(
            ok=False, error=f"llama.cpp exited ({finished.returncode}): {' '.join(tail)}"
        )
    return _result_from_dict(document)


def _result_from_dict(document: dict[str, Any]) -> DryRunResult:
    kv = tuple(KvCacheLine(**line) for line in document.get("kv_caches", ()))
    return DryRunResult(
        ok=bool(document.get("ok")),
        error=document.get("error"),
        kv_caches=kv,
        recurrent_mib=document.get("recurrent_mib"),
        compute_mib=dict(document.get("compute_mib", {})),
        output_mib=dict(document.get("output_mib", {})),
        offloaded_layers=document.get("offloaded_layers"),
        seconds=float(document.get("seconds", 0.0)),
        gpu_offload=bool(document.get("gpu_offload", False)),
    )


# --- in the subprocess ---------------------------------------------------------------------


def run_in_process(path: str, settings: Settings) -> DryRunResult:
    """Open ``path`` without allocating and create a context; parse what llama.cpp logged."""
    import time

    from homelab.llamacpp import capture_log, joined, llama

    lib = llama()
    started = time.perf_counter()
    with capture_log() as lines:
        model = lib.llama_model_load_from_file(path.encode(), _model_params(lib, settings))
        if not model:
            return DryRunResult(
                ok=False, error=f"llama.cpp could not open {path}: {_last_error(lines)}"
            )
        try:
            context = lib.llama_init_from_model(model, context_params(lib, settings))
            if not context:
                return DryRunResult(
                    ok=False, error=f"context creation failed: {_last_error(lines)}"
                )
            lib.llama_free(context)
        finally:
            lib.llama_model_free(model)
    result = parse_log(joined(lines))
    return replace(
        result,
        seconds=time.perf_counter() - started,
        gpu_offload=bool(lib.llama_supports_gpu_offload()),
    )


_keepalive: list[object] = []  # ctypes buffers the model params point to


def _model_params(lib: Any, settings: Settings) -> Any:
    params = lib.llama_model_default_params()
    params.no_alloc = True
    params.load_mode = lib.LLAMA_LOAD_MODE_NONE
    params.n_gpu_layers = settings.n_gpu_layers
    if settings.n_cpu_moe > 0:
        params.tensor_buft_overrides = cpu_moe_overrides(settings.n_cpu_moe)
    return params


def context_params(lib: Any, settings: Settings) -> Any:
    """llama.cpp context parameters for ``settings`` (also used by the real-load tests)."""
    params = lib.llama_context_default_params()
    params.n_ctx = settings.n_ctx
    params.n_batch = settings.n_batch
    params.n_ubatch = settings.n_ubatch
    params.n_seq_max = settings.n_parallel
    params.type_k = GGML_TYPE_IDS[settings.type_k]
    params.type_v = GGML_TYPE_IDS[settings.type_v]
    params.flash_attn_type = (
        lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if settings.flash_attn
        else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    params.swa_full = settings.swa_full
    params.kv_unified = settings.kv_unified
    if settings.n_threads is not None:
        params.n_threads = params.n_threads_batch = settings.n_threads
    return params


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_moe_overrides(n_cpu_moe: int) -> int:
    """A NULL-terminated override list keeping the experts of blocks < n_cpu_moe on the CPU.

    The same pattern llama.cpp's ``--n-cpu-moe`` uses; returns the array's address.
    """
    layers = "|".join(str(i) for i in range(n_cpu_moe))
    pattern = rf"blk\.({layers})\.ffn_(up|down|gate|gate_up)_(ch|)exps".encode()
    array = (_BuftOverride * 2)()
    array[0].pattern = pattern
    array[0].buft = _cpu_buffer_type()
    _keepalive.extend([pattern, array])
    return ctypes.addressof(array)


def _cpu_buffer_type() -> int:
    import llama_cpp

    library = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    ggml_cpu = ctypes.CDLL(str(library))
    ggml_cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    return int(ggml_cpu.ggml_backend_cpu_buffer_type())


def _last_error(lines: list[str]) -> str:
    """llama.cpp's last log line before giving up says why."""
    text = [line.strip() for line in "".join(lines).splitlines() if line.strip()]
    return text[-1] if text else "llama.cpp logged nothing"


def main() -> int:
    request = json.loads(sys.stdin.read())
    settings = Settings(**request["settings"])
    try:
        result = run_in_process(request["path"], settings)
    except Exception as error:  # report, don't crash: the parent maps this to a message
        result = DryRunResult(ok=False, error=f"{type(error).__name__}: {error}")
    print(json.dumps(result.to_dict()))
    return 0


def require_ok(result: DryRunResult) -> DryRunResult:
    if not result.ok:
        raise EngineError(f"The llama.cpp dry run failed: {result.error}")
    return result


if __name__ == "__main__":
    sys.exit(main())
