"""Giving the GPU back and taking it again: ``homelab serve``'s yield and resume.

    serving --yield--> yielding --(memory freed)--> yielded --resume--> resuming --> serving

Yielding stops admitting requests (they wait, :meth:`YieldController.admit`), lets the
running ones finish within a grace period (``--yield-grace``; then each is ended with an error
that says why), closes every resident engine — which saves each slot's state into the prompt
cache (``Engine.close``, the same save path as ``/admin/slots save``) and frees the weights,
the KV cache and the compute buffers — and measures what was freed: this process's VRAM per
NVML and its resident set. While yielded, a request waits up to ``--yield-wait`` for a resume,
then gets a 503 with ``Retry-After`` in its dialect's envelope (the app's error handler picks
it from the route). Resuming re-detects the hardware (the VRAM free *now*), re-plans and
loads; each conversation's state comes back from the prompt cache on its next request (the
prompt cache's lookup at admission), so that turn is a cache hit, not a prefill.

With ``--yield-to-cpu`` (a residency whose ``serves_from_cpu`` is true) a yield other than
``--sleep-after``'s then loads the model from a CPU-only plan and admits requests again
(``yielded``, serving from the CPU); the resume drains those requests (the same grace
period), closes the CPU engine — its slots go to the prompt cache too — and loads the GPU
plan. When the CPU load or the resume fails, the server stays yielded on what it had.

What is yielded and loaded again is a :class:`Residency`: the fleet's resident models
(``yield_targets.FleetResidency``) or the one model of ``serve MODEL``
(``yield_targets.SingleResidency``). A speculation draft and RPC connections belong to their
engine: they go and come back with it. The triggers (another process's VRAM, a named process,
idle time) live in :mod:`homelab.server.yield_watch`; this module is the state machine.

It runs on its server's event loop (bound by the server's lifespan, :meth:`bind_loop`); the
TUI, which also yields with no server running, calls it from its threads through
:meth:`YieldController.call` and hears of every change (its own, or ``homelab yield``'s
against its server) through :meth:`YieldController.subscribe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import anyio.to_thread
import psutil

from homelab.errors import HomelabError
from homelab.server.errors import ApiError, service_unavailable
from homelab.server.fleet import LEASES_KEY

if TYPE_CHECKING:
    from homelab.engine.prompt_cache.store import PromptCache
    from homelab.hardware.gpu import GpuSnapshot
    from homelab.planner.budget import Hardware

log = logging.getLogger("homelab.server")

State = Literal["serving", "yielding", "yielded", "resuming"]
CAUSES = ("asked", "pressure", "process", "idle")
DEFAULT_GRACE_S = 10.0  # --yield-grace: running requests may finish this long
DEFAULT_WAIT_S = 30.0  # --yield-wait: a request waits this long for a resume, then 503
RETRY_AFTER_S = 10
ENDED_WAIT_S = 5.0  # after ending requests: their responses finish writing within this
ENDED_POLL_S = 0.1  # ... checked this often (ending again what was submitted since)
HISTORY = 32  # yields remembered for /admin/yield and the TUI

GpuReader = Callable[[], "Sequence[GpuSnapshot]"]
HardwareFn = Callable[[], "Hardware"]
T = TypeVar("T")


@dataclass(frozen=True)
class Resumed:
    """A model loaded again on resume, with the plan made for the VRAM free then."""

    model: str
    n_gpu_layers: int
    n_ctx_per_slot: int
    n_parallel: int
    type_k: str
    type_v: str
    device_bytes: dict[str, int]
    reasons: tuple[str, ...]


class Residency(Protocol):
    """What a yield unloads and a resume loads again (see ``yield_targets``)."""

    @property
    def serves_from_cpu(self) -> bool:
        """Whether a yield loads a CPU-only plan to serve from meanwhile."""
        ...

    def engines(self) -> list[Any]:
        """The engines serving now."""
        ...

    def planned_bytes(self) -> dict[str, int]:
        """What the residents take per device (planner names: ``CPU``, ``CUDA0``)."""
        ...

    async def unload(self, reason: str) -> list[str]:
        """Close every resident engine (their slot states go to the prompt cache)."""
        ...

    async def reload(self, hardware: Hardware) -> list[Resumed]:
        """Plan the unloaded models for ``hardware`` and load them."""
        ...

    async def load_on_cpu(self, hardware: Hardware) -> list[Resumed]:
        """Load the unloaded models from CPU-only plans for ``hardware``'s host."""
        ...


class Interruptible(Protocol):
    def end_requests(self, reason: str, timeout_s: float = ...) -> int: ...


@dataclass
class YieldEvent:
    """One yield: why, what it freed and saved, and (once resumed) how long it lasted."""

    cause: str  # asked | pressure | process | idle
    reason: str
    started_at: float  # wall clock (time.time())
    models: list[str] = field(default_factory=list)
    yield_s: float = 0.0  # from the trigger to the memory freed
    planned_bytes: int = 0  # what the plans of the unloaded models held
    planned_gpu_bytes: int = 0  # ... on GPUs
    vram_freed_bytes: int | None = None  # this process's VRAM before - after (NVML); None: no GPU
    vram_freed_by_gpu: dict[int, int] = field(default_factory=dict)
    rss_freed_bytes: int = 0
    saved_states: int = 0  # slot states the prompt cache took
    saved_bytes: int = 0
    ended_requests: int = 0  # still running when the grace period ran out
    yielded_s: float | None = None  # from yielded to resumed
    resume_s: float | None = None  # from the resume to the models loaded
    resumed: list[Resumed] = field(default_factory=list)
    resume_error: str | None = None
    cpu_plans: list[Resumed] = field(default_factory=list)  # --yield-to-cpu: served meanwhile
    cpu_load_s: float | None = None
    cpu_error: str | None = None  # why the CPU plan could not be loaded
    ended_on_resume: int = 0  # requests on the CPU plan still running after the grace period

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryReading:
    rss_bytes: int
    vram_bytes: dict[int, int]  # this process's, per GPU index (NVML)


class YieldController:
    """The yield/resume state machine of one server (runs on the server's event loop)."""

    def __init__(
        self,
        residency: Residency,
        hardware_fn: HardwareFn,
        *,
        gpus: GpuReader | None = None,
        prompt_cache: PromptCache | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        wait_s: float = DEFAULT_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.residency = residency
        self.hardware_fn = hardware_fn
        self.gpus: GpuReader = gpus or _real_gpus
        self.prompt_cache = prompt_cache
        self.grace_s = grace_s
        self.wait_s = wait_s
        self.clock = clock
        self.state: State = "serving"
        self.on_cpu = False  # yielded, and serving from a CPU-only plan (--yield-to-cpu)
        self.current: YieldEvent | None = None  # the yield in force (or the last one)
        self.history: deque[YieldEvent] = deque(maxlen=HISTORY)
        self.counts: dict[str, int] = dict.fromkeys(CAUSES, 0)
        self.yielded_total_s = 0.0
        self.in_flight = 0
        self.last_request = clock()
        self.watcher: Any = None  # the yield_watch.YieldWatcher, when triggers are on
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, while it serves
        self._listeners: list[Callable[[], object]] = []
        self._yielded_at = 0.0
        self._lock: asyncio.Lock | None = None
        self._serving: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None

    # --- admission ----------------------------------------------------------------------

    async def admit(self, scope: MutableMapping[str, Any]) -> None:
        """Let a generation request in: now while serving, else after a resume within
        ``wait_s`` (a 503 with Retry-After otherwise). Its ticket is returned when its
        response has ended (``fleet.LeaseRelease``)."""
        self.last_request = self.clock()
        deadline = self.clock() + self.wait_s
        while not self._admits():
            if self.state == "yielded" and self._wakes_on_request():
                self.spawn(self.resume("request"))
            left_s = deadline - self.clock()
            if left_s <= 0:
                raise self.unavailable()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._serving_event().wait(), left_s)
        self.in_flight += 1
        self._drained_event().clear()
        scope.setdefault(LEASES_KEY, []).append(_Ticket(self))
        self.last_request = self.clock()

    def _released(self) -> None:
        self.in_flight -= 1
        self.last_request = self.clock()
        if self.in_flight == 0:
            self._drained_event().set()

    def _admits(self) -> bool:
        return self.state == "serving" or (self.state == "yielded" and self.on_cpu)

    def _wakes_on_request(self) -> bool:
        return self.current is not None and self.current.cause == "idle"

    def unavailable(self) -> ApiError:
        """The 503 a request gets when the GPU has not come back in time."""
        event = self.current
        why = event.reason if event is not None else "asked to"
        return service_unavailable(
            f"The server has given its GPU back ({why}) and resumes {self.resumes_when()}. "
            f"Retry in {RETRY_AFTER_S} s.",
            code="server_yielded",
            retry_after_s=RETRY_AFTER_S,
        )

    def resumes_when(self) -> str:
        cause = self.current.cause if self.current is not None else "asked"
        return {
            "asked": "on `homelab resume` (POST /admin/resume)",
            "pressure": "when the other program frees the VRAM",
            "process": "when that program exits",
            "idle": "on the next request",
        }.get(cause, "later")

    # --- yield --------------------------------------------------------------------------

    async def yield_gpu(self, cause: str, reason: str) -> YieldEvent:
        """Stop admitting, drain (grace), save and unload, measure; idempotent."""
        async with self._transition():
            if self.state != "serving":
                assert self.current is not None
                return self.current
            self.state = "yielding"
            self._serving_event().clear()
            event = YieldEvent(cause, reason, time.time())
            self.current = event
            started = time.perf_counter()
            try:
                await self._free(event)
            finally:
                event.yield_s = time.perf_counter() - started
                self.state, self._yielded_at = "yielded", self.clock()
                self.counts[cause] = self.counts.get(cause, 0) + 1
                self.history.append(event)
            log.info("yielded the GPU (%s) in %.2f s: %s", cause, event.yield_s, _freed(event))
            if self.residency.serves_from_cpu and cause != "idle":
                await self._serve_from_cpu(event)
            self._changed()
            return event

    async def _serve_from_cpu(self, event: YieldEvent) -> None:
        """Load the CPU-only plans and admit requests again (``--yield-to-cpu``)."""
        started = time.perf_counter()
        try:
            hardware = await anyio.to_thread.run_sync(self.hardware_fn)
            event.cpu_plans = await self.residency.load_on_cpu(hardware)
        except (HomelabError, ApiError, OSError) as exc:
            event.cpu_error = str(exc)
            log.warning("yielded, but cannot serve from the CPU meanwhile: %s", exc)
            return
        event.cpu_load_s, event.cpu_error = time.perf_counter() - started, None
        self.on_cpu = True
        self._serving_event().set()
        log.info("serving from the CPU while yielded (loaded in %.2f s)", event.cpu_load_s)

    async def _leave_cpu(self, event: YieldEvent) -> None:
        """Before a resume: drain the requests on the CPU plan, close it (slots saved)."""
        self.on_cpu = False
        message = (
            f"The server took its GPU back and ended this request, which ran on the CPU "
            f"meanwhile, after the {self.grace_s:g} s grace period. Send it again: the "
            f"conversation is cached."
        )
        event.ended_on_resume = await self._drain(message)
        await self.residency.unload("resuming on the GPU")

    async def _free(self, event: YieldEvent) -> None:
        message = (
            f"The server gave its GPU back ({event.reason}) and ended this request after the "
            f"{self.grace_s:g} s grace period. Send it again: the conversation is cached and "
            f"continues {self.resumes_when()}."
        )
        event.ended_requests = await self._drain(message)
        before = await anyio.to_thread.run_sync(self._reading)
        saved_before = self._cache_totals()
        planned = self.residency.planned_bytes()
        event.planned_bytes = sum(planned.values())
        event.planned_gpu_bytes = sum(n for d, n in planned.items() if d != "CPU")
        event.models = await self.residency.unload(event.reason)
        after = await anyio.to_thread.run_sync(self._reading_trimmed)
        saves, n_bytes = (a - b for a, b in zip(self._cache_totals(), saved_before, strict=True))
        event.saved_states, event.saved_bytes = saves, max(n_bytes, 0)
        event.rss_freed_bytes = before.rss_bytes - after.rss_bytes
        if before.vram_bytes or after.vram_bytes:
            gpus = set(before.vram_bytes) | set(after.vram_bytes)
            event.vram_freed_by_gpu = {
                i: before.vram_bytes.get(i, 0) - after.vram_bytes.get(i, 0) for i in gpus
            }
            event.vram_freed_bytes = sum(event.vram_freed_by_gpu.values())

    async def _drain(self, message: str) -> int:
        """Wait for the running requests (the grace period), then end those left with
        ``message``; how many were ended."""
        if await self._wait_drained(self.grace_s):
            return 0
        ended = self.in_flight
        deadline = time.monotonic() + ENDED_WAIT_S
        while time.monotonic() < deadline:  # again: a request admitted before may submit late
            for engine in self.residency.engines():
                if hasattr(engine, "end_requests"):
                    await anyio.to_thread.run_sync(_end_requests, engine, message)
            if await self._wait_drained(ENDED_POLL_S):
                break
        return ended

    async def _wait_drained(self, timeout_s: float) -> bool:
        if self.in_flight == 0:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained_event().wait(), timeout_s)
        return self.in_flight == 0

    # --- resume -------------------------------------------------------------------------

    async def resume(self, cause: str = "asked") -> YieldEvent | None:
        """Re-plan for the VRAM free now and load; the state stays ``yielded`` (the event
        says why) when the models do not fit yet."""
        async with self._transition():
            event = self.current
            if self.state != "yielded" or event is None:
                return event
            self.state = "resuming"
            self._serving_event().clear()  # (set while serving from the CPU)
            started = time.perf_counter()
            try:
                if self.on_cpu:
                    await self._leave_cpu(event)
                hardware = await anyio.to_thread.run_sync(self.hardware_fn)
                event.resumed = await self.residency.reload(hardware)
            except (HomelabError, ApiError, OSError) as exc:
                event.resume_error = str(exc)
                self.state = "yielded"
                log.warning("resume (%s) failed, still yielded: %s", cause, exc)
                if self.residency.serves_from_cpu and event.cause != "idle":
                    await self._serve_from_cpu(event)
                self._changed()
                return event
            event.resume_s = time.perf_counter() - started
            event.yielded_s = self.clock() - self._yielded_at
            event.resume_error = None
            self.yielded_total_s += event.yielded_s
            self.state = "serving"
            self._serving_event().set()
            log.info("resumed (%s) in %.2f s after %.1f s", cause, event.resume_s, event.yielded_s)
            self._changed()
            return event

    # --- reports ------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What ``/admin/yield``, ``/health`` and ``homelab ps`` show."""
        event = self.current
        holding = self.state != "serving"
        return {
            "state": self.state,
            "shown": self.shown_state(),
            "serving_from_cpu": self.on_cpu,
            "cause": event.cause if holding and event else None,
            "reason": event.reason if holding and event else None,
            "resumes": self.resumes_when() if holding else None,
            "since_s": round(self.clock() - self._yielded_at, 3)
            if self.state == "yielded"
            else None,
            "requests_in_flight": self.in_flight,
            "yields": dict(self.counts),
            "yielded_total_s": round(self.yielded_total_s, 3),
            "last": event.as_dict() if event is not None else None,
        }

    def shown_state(self) -> str:
        """The state in words: ``yielded (serving from CPU)`` with ``--yield-to-cpu``."""
        return "yielded (serving from CPU)" if self.on_cpu else self.state

    def metrics_lines(self) -> str:
        """Prometheus lines: each yield by cause, time yielded, bytes saved and freed."""
        last = self.current
        holding = self.state != "serving"
        lines = _metric(
            "homelab_yielded",
            "gauge",
            "1 while the GPU is given back",
            [
                (f'{{cause="{c}"}}', int(holding and last is not None and last.cause == c))
                for c in CAUSES
            ],
        )
        lines += _metric(
            "homelab_yields_total",
            "counter",
            "Yields by cause",
            [(f'{{cause="{c}"}}', n) for c, n in self.counts.items()],
        )
        saved = sum(e.saved_bytes for e in self.history)
        resume_s = last.resume_s if last is not None and last.resume_s is not None else 0.0
        for name, kind, what, value in (
            ("homelab_yield_seconds_total", "counter", "Time spent yielded", self.yielded_total_s),
            ("homelab_yield_saved_bytes_total", "counter", "Slot states saved by yields", saved),
            (
                "homelab_yield_freed_bytes",
                "gauge",
                "Planned bytes the last yield freed",
                last.planned_bytes if last else 0,
            ),
            (
                "homelab_yield_last_seconds",
                "gauge",
                "How long the last yield took",
                last.yield_s if last else 0.0,
            ),
            ("homelab_resume_last_seconds", "gauge", "How long the last resume took", resume_s),
            (
                "homelab_yield_serving_from_cpu",
                "gauge",
                "1 while yielded and serving from a CPU-only plan",
                int(self.on_cpu),
            ),
        ):
            lines += _metric(name, kind, what, [("", value)])
        return "\n".join(lines) + "\n"

    # --- from other threads ---------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """The loop that runs this controller from now on (None: none). asyncio's locks and
        events belong to one loop: they are made anew for it."""
        self.loop = loop
        self._lock = self._serving = self._drained = None

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` (``yield_gpu(...)``, ``resume()``) from a thread that runs no
        loop, blocking: on the server's loop while one serves, else on a loop of its own."""
        if self.loop is not None:
            return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()
        self.bind_loop(None)
        return asyncio.run(coroutine)

    def subscribe(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (from the loop's thread) after each yield and resume."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for callback in self._listeners:
            callback()

    # --- plumbing -----------------------------------------------------------------------

    def _reading(self) -> MemoryReading:
        pid = os.getpid()
        vram: dict[int, int] = {}
        for snapshot in self.gpus():
            used = next((p.used_memory_bytes for p in snapshot.processes if p.pid == pid), None)
            vram[snapshot.index] = used or 0
        return MemoryReading(psutil.Process(pid).memory_info().rss, vram)

    def _reading_trimmed(self) -> MemoryReading:
        _trim_heap()  # freed llama.cpp buffers go back to the system, not to malloc's free lists
        return self._reading()

    def _cache_totals(self) -> tuple[int, int]:
        if self.prompt_cache is None:
            return 0, 0
        stats = self.prompt_cache.stats()
        return stats.saves, stats.ram_bytes + stats.disk_bytes

    def _transition(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _serving_event(self) -> asyncio.Event:
        if self._serving is None:
            self._serving = asyncio.Event()
            if self._admits():
                self._serving.set()
        return self._serving

    def _drained_event(self) -> asyncio.Event:
        if self._drained is None:
            self._drained = asyncio.Event()
            if self.in_flight == 0:
                self._drained.set()
        return self._drained

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(_log_failure)
        return task


class _Ticket:
    """A request's place in the count a yield drains (released like a fleet lease)."""

    def __init__(self, controller: YieldController) -> None:
        self._controller: YieldController | None = controller

    def release(self) -> None:
        controller, self._controller = self._controller, None
        if controller is not None:
            controller._released()


def _end_requests(engine: Interruptible, message: str) -> None:
    try:
        engine.end_requests(message)
    except Exception as exc:  # a closed engine: nothing left to end
        log.debug("ending requests: %s", exc)


def _metric(name: str, kind: str, what: str, samples: list[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {what}", f"# TYPE {name} {kind}"]
    return lines + [f"{name}{labels} {value:g}" for labels, value in samples]


def _freed(event: YieldEvent) -> str:
    from homelab.units import format_size

    vram = "n/a" if event.vram_freed_bytes is None else format_size(event.vram_freed_bytes)
    return (
        f"planned {format_size(event.planned_bytes)}, VRAM {vram} (NVML), RSS "
        f"{format_size(event.rss_freed_bytes)}; {event.saved_states} slot states saved "
        f"({format_size(event.saved_bytes)}), {event.ended_requests} requests ended"
    )


def _real_gpus() -> Sequence[GpuSnapshot]:
    from homelab.hardware.gpu import gpu_snapshot

    return gpu_snapshot()


def _trim_heap() -> None:
    """glibc keeps large freed blocks in its arenas: ``malloc_trim`` hands them back."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("yield/resume failed: %s", task.exception())
