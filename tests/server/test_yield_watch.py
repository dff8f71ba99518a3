"""The yield triggers: the decision from what NVML and the process list show (a pure
function), and the process names matched on real processes of this machine."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from yield_double import GIB, MIB, shared_double, start_named_process

from homelab.server.yield_watch import (
    Decision,
    GpuReading,
    Observation,
    WatchState,
    YieldTriggers,
    decide,
    matching_processes,
    read_gpus,
)

PRESSURE = YieldTriggers(pressure_margin_bytes=GIB)


def serving(**fields: object) -> WatchState:
    return WatchState(state="serving", cause=None, idle_s=0.0, in_flight=0, **fields)  # type: ignore[arg-type]


def gpu(free_bytes: int, others_bytes: int) -> Observation:
    return Observation(gpus=(GpuReading(0, free_bytes, 0, others_bytes),))


def test_pressure_needs_another_process_to_grow_and_free_memory_under_the_margin() -> None:
    base = {0: 2 * GIB}
    assert decide(gpu(512 * MIB, 2 * GIB), serving(baseline_others=base), PRESSURE) is None
    assert decide(gpu(3 * GIB, 9 * GIB), serving(baseline_others=base), PRESSURE) is None
    found = decide(gpu(512 * MIB, 9 * GIB), serving(baseline_others=base), PRESSURE)
    assert found is not None and (found.action, found.cause) == ("yield", "pressure")
    assert "512 MiB free, under the 1024 MiB margin" in found.reason


def test_pressure_resumes_once_the_margin_and_what_was_freed_are_free_again() -> None:
    yielded = WatchState("yielded", "pressure", 0.0, 0, freed_by_gpu={0: 3 * GIB})
    assert decide(gpu(3 * GIB, 18 * GIB), yielded, PRESSURE) is None
    assert decide(gpu(4 * GIB + MIB, 17 * GIB), yielded, PRESSURE) == Decision("resume", "pressure")


def test_idle_yields_only_without_requests_and_a_request_is_what_resumes() -> None:
    sleepy = YieldTriggers(sleep_after_s=600)
    assert decide(Observation(), WatchState("serving", None, 599, 0), sleepy) is None
    assert decide(Observation(), WatchState("serving", None, 900, 1), sleepy) is None
    found = decide(Observation(), WatchState("serving", None, 601, 0), sleepy)
    assert found is not None and found.cause == "idle"
    assert decide(Observation(), WatchState("yielded", "idle", 900, 0), sleepy) is None


def test_a_yield_asked_by_hand_is_never_resumed_by_a_trigger() -> None:
    asked = WatchState("yielded", "asked", 0.0, 0)
    triggers = YieldTriggers(pressure_margin_bytes=GIB, yield_to=("steam",))
    assert decide(gpu(20 * GIB, 0), asked, triggers) is None


@pytest.fixture
def steam(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = start_named_process(tmp_path, "steam")
    yield process
    process.kill()
    process.wait()


def test_a_named_process_is_found_by_its_name(steam: subprocess.Popen[bytes]) -> None:
    assert any(name == "steam" for name in matching_processes(["Steam"], (), own_pid=0))
    assert matching_processes(["nosuchgame"], (), own_pid=0) == ()


def test_comfyui_on_the_gpu_is_found_by_its_command_line(tmp_path: Path) -> None:
    script = tmp_path / "ComfyUI" / "main.py"
    script.parent.mkdir()
    script.write_text("import time\ntime.sleep(60)\n")
    comfy = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 10
    while "ComfyUI" not in " ".join(psutil.Process(comfy.pid).cmdline()):
        assert time.monotonic() < deadline, "the child never showed its command line"
        time.sleep(0.01)
    try:  # NVML lists it on the GPU under its executable's name (the double says so)
        gpu_, _, read = shared_double(lambda: 0, {comfy.pid: "/usr/bin/python3"})
        gpu_.take(comfy.pid, 6 * GIB)
        snapshots = read()
        found = matching_processes(["comfyui"], snapshots, own_pid=0)
        assert found == (f"python3 (pid {comfy.pid})",), (found, comfy.poll())
        reading = read_gpus(snapshots, pid=0)[0]
        assert reading.others_bytes >= 6 * GIB and reading.ours_bytes == 0
    finally:
        comfy.kill()
        comfy.wait()
