"""When to yield the GPU by itself, and when to take it back (``homelab serve``'s opt-in flags).

* ``--yield-on-pressure[=MARGIN]``: another process's VRAM use grew, and a GPU's free memory
  fell below MARGIN (default 1 GiB) → yield; resume once that GPU has MARGIN free plus what
  the yield freed there (the same plan fits again).
* ``--yield-to comfyui,steam``: a process whose name (or, for a process NVML lists on a GPU,
  command line — ComfyUI runs as ``python main.py``) contains one of the words is running →
  yield; resume when none is left (re-planned for the VRAM free then).
* ``--sleep-after 10m``: no request for that long → yield; the next request resumes.

Each round (``poll_s``, 0.25 s) reads the GPUs through NVML (the one doorway,
``hardware.gpu``) off the event loop and asks :func:`decide`, a pure function of what it read.
A yield is asked of the :class:`~homelab.server.yielding.YieldController`, which does the work.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio.to_thread
import psutil

from homelab.server.yielding import YieldController

if TYPE_CHECKING:
    from homelab.hardware.gpu import GpuSnapshot

log = logging.getLogger("homelab.server")

DEFAULT_MARGIN_BYTES = 1 << 30  # --yield-on-pressure without a value
DEFAULT_POLL_S = 0.25
PROCESS_POLL_S = 1.0  # listing every process costs more than reading the GPUs
GROWTH_SLACK_BYTES = 64 << 20  # others' use must grow by more than this to count as pressure
RESUME_RETRY_S = 5.0  # after a resume that did not fit


@dataclass(frozen=True)
class YieldTriggers:
    """The automatic triggers; all off by default."""

    pressure_margin_bytes: int | None = None
    yield_to: tuple[str, ...] = ()
    sleep_after_s: float | None = None
    poll_s: float = DEFAULT_POLL_S

    @property
    def any(self) -> bool:
        return bool(self.pressure_margin_bytes is not None or self.yield_to or self.sleep_after_s)


@dataclass(frozen=True)
class GpuReading:
    index: int
    free_bytes: int
    ours_bytes: int  # this process's, per NVML
    others_bytes: int  # every other process's (used - ours)


@dataclass(frozen=True)
class Observation:
    gpus: tuple[GpuReading, ...] = ()
    processes: tuple[str, ...] = ()  # running processes matching --yield-to


@dataclass(frozen=True)
class Decision:
    action: str  # "yield" or "resume"
    cause: str
    reason: str = ""


@dataclass
class WatchState:
    """What a decision needs besides the observation."""

    state: str  # the controller's
    cause: str | None  # of the yield in force
    idle_s: float
    in_flight: int
    baseline_others: dict[int, int] = field(default_factory=dict)  # others' use while serving
    freed_by_gpu: dict[int, int] = field(default_factory=dict)  # what the yield freed per GPU


def read_gpus(snapshots: Sequence[GpuSnapshot], pid: int) -> tuple[GpuReading, ...]:
    readings = []
    for snap in snapshots:
        ours = next((p.used_memory_bytes or 0 for p in snap.processes if p.pid == pid), 0)
        others = max(snap.memory_used_bytes - ours, 0)
        readings.append(GpuReading(snap.index, snap.memory_free_bytes, ours, others))
    return tuple(readings)


def decide(seen: Observation, now: WatchState, triggers: YieldTriggers) -> Decision | None:
    """Yield, resume or nothing, from what was read (pure: the tests call it directly)."""
    if now.state == "serving":
        return _yield_decision(seen, now, triggers)
    if now.state == "yielded":
        return _resume_decision(seen, now, triggers)
    return None


def _yield_decision(seen: Observation, now: WatchState, triggers: YieldTriggers) -> Decision | None:
    margin = triggers.pressure_margin_bytes
    if margin is not None:
        for gpu in seen.gpus:
            grew = gpu.others_bytes > now.baseline_others.get(gpu.index, 0) + GROWTH_SLACK_BYTES
            if grew and gpu.free_bytes < margin:
                return Decision(
                    "yield",
                    "pressure",
                    f"another process took VRAM on GPU {gpu.index}: {_mib(gpu.free_bytes)} "
                    f"free, under the {_mib(margin)} margin",
                )
    if seen.processes:
        return Decision("yield", "process", f"{seen.processes[0]} is running (--yield-to)")
    sleep_s = triggers.sleep_after_s
    if sleep_s and now.in_flight == 0 and now.idle_s >= sleep_s:
        return Decision("yield", "idle", f"no request for {sleep_s:g} s (--sleep-after)")
    return None


def _resume_decision(
    seen: Observation, now: WatchState, triggers: YieldTriggers
) -> Decision | None:
    if now.cause == "pressure" and triggers.pressure_margin_bytes is not None:
        margin = triggers.pressure_margin_bytes
        room = all(
            gpu.free_bytes >= margin + max(now.freed_by_gpu.get(gpu.index, 0), 0)
            for gpu in seen.gpus
        )
        return Decision("resume", "pressure") if room and seen.gpus else None
    if now.cause == "process" and not seen.processes:
        return Decision("resume", "process")
    return None


def matching_processes(
    words: Sequence[str], snapshots: Sequence[GpuSnapshot], own_pid: int
) -> tuple[str, ...]:
    """The running processes whose name contains one of ``words`` (any process, through
    psutil), or whose name or command line does (the processes NVML lists on a GPU)."""
    lowered = [w.lower() for w in words if w]
    found: list[str] = []
    for snap in snapshots:
        for process in snap.processes:
            if process.pid != own_pid:
                text = " ".join([process.name or "", *_cmdline(process.pid)]).lower()
                if any(w in text for w in lowered):
                    found.append(f"{process.name or 'a process'} (pid {process.pid})")
    for proc in psutil.process_iter(["name", "pid"]):
        name = (proc.info.get("name") or "").lower()
        if proc.info.get("pid") != own_pid and any(w in name for w in lowered):
            found.append(proc.info["name"])
    return tuple(dict.fromkeys(found))


def _cmdline(pid: int) -> list[str]:
    try:
        return list(psutil.Process(pid).cmdline()[:3])
    except (psutil.Error, OSError):
        return []


class YieldWatcher:
    """Polls the triggers on the server's event loop and asks the controller to act."""

    def __init__(
        self,
        controller: YieldController,
        triggers: YieldTriggers,
        *,
        processes: Callable[[Sequence[str], Sequence[GpuSnapshot], int], tuple[str, ...]]
        | None = None,
    ) -> None:
        self.controller = controller
        self.triggers = triggers
        self.processes = processes or matching_processes
        self.baseline_others: dict[int, int] = {}
        self._matches: tuple[str, ...] = ()
        self._processes_read_at = -PROCESS_POLL_S
        self._retry_at = 0.0
        self._was_serving = True
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.triggers.any:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.triggers.poll_s)
            try:
                await self.check()
            except Exception:  # never let the watcher die: the next round tries again
                log.exception("yield watcher round failed")

    async def check(self) -> Decision | None:
        """One round: read, decide, act (the action runs as its own task)."""
        controller = self.controller
        if controller.state in ("yielding", "resuming"):
            return None
        seen = await anyio.to_thread.run_sync(self.observe)
        now = self._watch_state()
        serving = controller.state == "serving"
        if serving and not self._was_serving:  # resumed: what others hold now is the base
            self.baseline_others = {}
        self._was_serving = serving
        if serving:
            self._track_baseline(seen)
        decision = decide(seen, now, self.triggers)
        if decision is None:
            return None
        if decision.action == "yield":
            controller.spawn(controller.yield_gpu(decision.cause, decision.reason))
        elif controller.clock() >= self._retry_at:
            self._retry_at = controller.clock() + RESUME_RETRY_S
            controller.spawn(controller.resume(decision.cause))
        return decision

    def observe(self) -> Observation:
        """Blocking: NVML (and the process list, every PROCESS_POLL_S)."""
        pid = os.getpid()
        needs_gpus = self.triggers.pressure_margin_bytes is not None or self.triggers.yield_to
        snapshots = tuple(self.controller.gpus()) if needs_gpus else ()
        clock = self.controller.clock()
        if self.triggers.yield_to and clock - self._processes_read_at >= PROCESS_POLL_S:
            self._matches = self.processes(self.triggers.yield_to, snapshots, pid)
            self._processes_read_at = clock
        return Observation(read_gpus(snapshots, pid), self._matches)

    def _watch_state(self) -> WatchState:
        controller = self.controller
        event = controller.current
        return WatchState(
            state=controller.state,
            cause=event.cause if event is not None else None,
            idle_s=controller.clock() - controller.last_request,
            in_flight=controller.in_flight,
            baseline_others=self.baseline_others,
            freed_by_gpu=dict(event.vram_freed_by_gpu) if event is not None else {},
        )

    def _track_baseline(self, seen: Observation) -> None:
        """Others' use while we serve; it only moves down (growth is what pressure means)."""
        for gpu in seen.gpus:
            known = self.baseline_others.get(gpu.index)
            if known is None or gpu.others_bytes < known:
                self.baseline_others[gpu.index] = gpu.others_bytes


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):.0f} MiB"
