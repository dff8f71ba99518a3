"""A llama.cpp build whose AMX matrix multiply crashes, caught before it ends the process.

On a CPU with AMX tiles (Intel Sapphire Rapids and later) ggml built with ``-march=native``
compiles an AMX matrix multiply for quantized weights, and Debian 12's GCC 12.2 drops the
stores that fill its tile configuration: the first prompt of every quantized model ends the
process with a general protection fault (benchmarks/RESULTS.md, 2026-12-04). homelab's
Makefile builds llama-cpp-python without it (``make cmake-args``); one built elsewhere may
still carry it. So before a quantized model loads on such a CPU with such a build, a child
process reads a prompt with the generated tiny Q8_0 demo model, once per build (the CPU
library's path, size and time): a child killed by a signal turns every later quantized load
into an :class:`EngineError` that says how to rebuild, instead of a dead server.

    python -m homelab.engine.amx_check MODEL      # the child: exit 0 when the prompt was read
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from homelab.errors import EngineError

log = logging.getLogger("homelab.engine")

AMX_KERNELS = "AMX_INT8 = 1"  # in llama.cpp's system info when its AMX matmul is compiled
UNQUANTIZED_FILE_TYPES = frozenset({"F32", "F16", "BF16"})  # no AMX path for these weights
CANARY_MODEL = "demo:llama:tiny:Q8_0"
CANARY_TIMEOUT_S = 300.0
VERDICTS_FILE = "amx-canary.json"
OK, CRASHED, UNKNOWN = "ok", "crashed", "unknown"

Canary = Callable[[], str]  # runs the child; OK, CRASHED or UNKNOWN


def refuse_crashing_build(file_type: str) -> None:
    """Raise before a model of ``file_type`` (``Q8_0``, ``F16``...) loads when this build's
    AMX matrix multiply crashes on this CPU (checked once per build, see the module)."""
    if file_type.upper() in UNQUANTIZED_FILE_TYPES or not this_machine_at_risk():
        return
    if verdict(run_canary) == CRASHED:
        from homelab.hardware.build import AMX_REBUILD_COMMAND

        raise EngineError(
            "this llama-cpp-python build crashes on quantized models on this CPU: it was "
            "compiled with llama.cpp's AMX matrix multiply, and a test process that read a "
            f"prompt with a {CANARY_MODEL} model was killed",
            hint="Rebuild llama-cpp-python without it, from the homelab checkout: "
            f"{AMX_REBUILD_COMMAND} (F16 models run as they are).",
        )


@functools.cache
def this_machine_at_risk() -> bool:
    """``at_risk()``, once per process (the CPU and the loaded build do not change)."""
    return at_risk()


def at_risk(cpu_has_amx: bool | None = None, system_info: str | None = None) -> bool:
    """An AMX CPU and a build with the AMX kernels (this machine's, unless given)."""
    if cpu_has_amx is None:
        from homelab.hardware.host import read_cpu

        cpu_has_amx = read_cpu().has_amx
    if not cpu_has_amx:
        return False
    if system_info is None:
        from homelab.hardware.build import read_build

        system_info = read_build().system_info or ""
    return AMX_KERNELS in system_info


def verdict(canary: Canary, verdicts_path: Path | None = None) -> str:
    """This build's verdict: recorded, or the canary's (recorded when it is OK or CRASHED)."""
    from homelab.llamacpp.backend import cpu_library_stamp

    path = verdicts_path or _verdicts_path()
    stamp = cpu_library_stamp()
    known = _read(path)
    if stamp in known:
        return known[stamp]
    found = canary()
    if found != UNKNOWN:
        known[stamp] = found
        path.write_text(json.dumps(known, indent=1))
    return found


def run_canary() -> str:
    """Read a prompt with the tiny Q8_0 demo model in a child process."""
    from homelab.gguf.demo import demo_ref_path

    model = demo_ref_path(CANARY_MODEL)
    log.info("checking that this llama.cpp build's AMX kernels run (%s)", model.name)
    command = [sys.executable, "-m", "homelab.engine.amx_check", str(model)]
    return canary_verdict(command)


def canary_verdict(command: list[str]) -> str:
    """CRASHED when ``command`` is killed by a signal, OK when it exits 0, else UNKNOWN (it
    could not tell: the check never blocks a load for a reason of its own)."""
    try:
        finished = subprocess.run(command, capture_output=True, timeout=CANARY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("the AMX check could not run: %s", exc)
        return UNKNOWN
    if finished.returncode < 0:
        return CRASHED
    if finished.returncode != 0:
        log.warning("the AMX check failed: %s", finished.stderr.decode(errors="replace")[-500:])
        return UNKNOWN
    return OK


def _verdicts_path() -> Path:
    from homelab.locations import cache_dir, ensure_dir

    return ensure_dir(cache_dir()) / VERDICTS_FILE


def _read(path: Path) -> dict[str, str]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): str(v) for k, v in loaded.items() if v in (OK, CRASHED)}


def _read_a_prompt(model_path: str) -> int:
    """The child: read a 32-token prompt on the CPU (the AMX path); 0 when it was read."""
    from homelab.llamacpp.batch import Batch
    from homelab.llamacpp.context import Context, ContextParams
    from homelab.llamacpp.model import Model, ModelParams

    model = Model.load(model_path, ModelParams(n_gpu_layers=0))
    context = Context.create(model, ContextParams(n_ctx=256, n_threads=2))
    batch = Batch(32)
    batch.add_run([1 + i % 8 for i in range(32)], 0, 0, output_last=True)
    return 0 if context.decode(batch) == 0 else 3


if __name__ == "__main__":
    sys.exit(_read_a_prompt(sys.argv[1]))
