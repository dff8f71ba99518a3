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

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from homelab.settings import Settings

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

    from homelab.llamacpp.backend import supports_gpu_offload
    from homelab.llamacpp.context import Context, ContextCreateError, ContextParams
    from homelab.llamacpp.log import last_line
    from homelab.llamacpp.model import Model, ModelLoadError, ModelParams

    started = time.perf_counter()
    try:
        model = Model.load(path, ModelParams.from_settings(settings, allocate=False))
    except ModelLoadError as error:
        return DryRunResult(
            ok=False, error=f"llama.cpp could not open {path}: {last_line(error.log_text)}"
        )
    with model:
        try:
            context = Context.create(model, ContextParams.from_settings(settings))
        except ContextCreateError as error:
            return DryRunResult(
                ok=False, error=f"context creation failed: {last_line(error.log_text)}"
            )
        context.close()
    result = parse_log(model.load_log + context.creation_log)
    return replace(
        result, seconds=time.perf_counter() - started, gpu_offload=supports_gpu_offload()
    )


def main() -> int:
    request = json.loads(sys.stdin.read())
    settings = Settings(**request["settings"])
    try:
        result = run_in_process(request["path"], settings)
    except Exception as error:  # report, don't crash: the parent maps this to a message
        result = DryRunResult(ok=False, error=f"{type(error).__name__}: {error}")
    print(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
