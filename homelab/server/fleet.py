"""Several models behind one endpoint: which are loaded, loading them on demand, evicting.

``homelab serve`` without MODEL serves the local library through a :class:`Fleet`. Each
servable model is a :class:`FleetModel` (``unloaded`` → ``loading`` → ``loaded``) with its own
engine — and so its own slots and tenant-isolated prefix cache — and its own counters.

Residency is the planner's decision, not a count. Loading a model plans it for the budgets
the loaded ones leave (each device's budget less what the residents take there: the larger of
their plan's bytes and what llama.cpp really allocated). When that plan fails, the
least-recently-used *idle* residents are unloaded one at a time until it fits — a model with
requests in flight (streams included) or waiting for it is never evicted; when even unloading
every idle one would not make room, the request gets a 503 with ``Retry-After`` and nothing is
unloaded. One residency decision (plan, evict, load, unload) runs at a time.

A request holds a :class:`Lease` on its model from the moment its body is parsed until its
response (stream) ends (:class:`LeaseRelease` returns it). Concurrent requests for a model
that is loading wait for the same load; at most ``max_waiting`` requests wait for loads.
An idle model is unloaded when its keep-alive runs out (``--keep-alive``, or a request's
``keep_alive``): ``0`` unloads as soon as it is idle, ``None`` (``-1``) never.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
from starlette.types import ASGIApp, Receive, Scope, Send

from homelab.errors import ConfigError, HomelabError, OutOfMemoryError, PlanError
from homelab.server.engine_seam import LoadedEngine
from homelab.server.errors import ApiError, service_unavailable
from homelab.server.metrics import ServerMetrics

if TYPE_CHECKING:
    from homelab.planner.budget import Hardware
    from homelab.planner.plan import Plan

log = logging.getLogger("homelab.server")

Status = Literal["unloaded", "loading", "loaded"]
LEASES_KEY = "homelab.leases"  # the scope's list of leases, returned when the response ends
DEFAULT_KEEP_ALIVE_S = 600.0
MAX_KEEP_ALIVE_S = 366 * 86400  # longer is a typo (or an attack): -1 keeps a model for good
DEFAULT_MAX_WAITING = 64
REAP_INTERVAL_S = 0.25
RETRY_AFTER_S = 5
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: object) -> float | None:
    """Seconds to keep a model after its last request: ``10m``, ``30s``, ``1h``, a number
    of seconds, ``0`` (unload when idle) or a negative value (never: None)."""
    if isinstance(value, bool):
        raise ConfigError(f"keep_alive {value!r} is not a duration.")
    if isinstance(value, int):  # compared as an int: 400 digits do not fit a float
        seconds = float(max(-1, min(value, MAX_KEEP_ALIVE_S + 1)))
    elif isinstance(value, float):
        seconds = value
    else:
        match = _DURATION.match(str(value)[:64])
        if match is None:
            raise ConfigError(
                f"keep_alive {str(value)[:64]!r} is not a duration.",
                hint="Write it like 10m, 30s or -1.",
            )
        seconds = float(match[1]) * _UNIT_S[match[2]]
    if math.isnan(seconds) or seconds > MAX_KEEP_ALIVE_S:
        raise ConfigError(
            f"keep_alive is more than {MAX_KEEP_ALIVE_S // 86400} days (or not a number).",
            hint="Give a shorter duration, or -1 to keep the model loaded for good.",
        )
    return None if seconds < 0 else seconds


@dataclass(frozen=True)
class Servable:
    """A model the fleet may load: its name on the wire and its file."""

    name: str
    path: Path
    ref: Any  # the homelab.models ref the plan and load functions take


PlanFn = Callable[[Servable, "Hardware"], "Plan"]
LoadFn = Callable[[Servable, "Plan"], LoadedEngine]


@dataclass
class FleetModel:
    """One servable model and its state."""

    servable: Servable
    status: Status = "unloaded"
    engine: LoadedEngine | None = None
    plan: Plan | None = None
    actual_bytes: dict[str, int] = field(default_factory=dict)  # per device, after loading
    in_flight: int = 0  # leases out (requests being served, streams included)
    waiting: int = 0  # requests waiting for this model's load
    last_used: float = 0.0  # monotonic
    expires_at: float | None = None  # monotonic; None: no expiry pending
    loaded_at: float = 0.0
    load_s: float = 0.0
    loading: asyncio.Future[None] | None = None
    last_error: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)

    @property
    def name(self) -> str:
        return self.servable.name

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or self.waiting > 0

    @property
    def loaded(self) -> bool:
        """Read afresh each time: another task loads or evicts the model between awaits."""
        return self.status == "loaded"

    def device_bytes(self) -> dict[str, int]:
        """What this resident takes on each device: planned, or more when llama.cpp took more."""
        planned = {d.name: d.total_bytes for d in self.plan.memory.devices} if self.plan else {}
        names = set(planned) | set(self.actual_bytes)
        return {n: max(planned.get(n, 0), self.actual_bytes.get(n, 0)) for n in names}


class Lease:
    """A request's hold on a loaded model (its engine cannot be unloaded while held)."""

    def __init__(self, fleet: Fleet, model: FleetModel, keep_alive_s: float | bool | None) -> None:
        self.fleet = fleet
        self.model = model
        assert model.engine is not None  # a lease is taken on a loaded model only
        self.engine: LoadedEngine = model.engine
        self.keep_alive_s = keep_alive_s  # False: the fleet's default
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.fleet._release(self)


class Fleet:
    def __init__(
        self,
        servables: Sequence[Servable],
        hardware: Hardware,
        plan_fn: PlanFn,
        load_fn: LoadFn,
        *,
        keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S,
        max_waiting: int = DEFAULT_MAX_WAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models: dict[str, FleetModel] = {s.name: FleetModel(s) for s in servables}
        self.hardware = hardware  # the whole machine, as resolved before anything was loaded
        self.plan_fn = plan_fn
        self.load_fn = load_fn
        self.keep_alive_s = keep_alive_s
        self.max_waiting = max_waiting
        self.clock = clock
        self.loads_total: dict[str, int] = {}
        self.evictions_total: dict[str, int] = {}
        self._lock: asyncio.Lock | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    # --- what is served --------------------------------------------------------------

    def names(self) -> list[str]:
        self._forget_deleted()
        return list(self.models)

    def model(self, name: str) -> FleetModel:
        self._forget_deleted()
        found = self.models.get(name)
        if found is None:
            served = ", ".join(self.models) or "none"
            raise ApiError(
                404,
                f"The model '{name}' does not exist on this server (it serves: {served}).",
                param="model",
                code="model_not_found",
            )
        return found

    def _forget_deleted(self) -> None:
        """A model whose file is gone stays while loaded; unloaded, it leaves the list."""
        for name, model in list(self.models.items()):
            if model.status == "unloaded" and not model.busy and not model.servable.path.exists():
                del self.models[name]

    def residents(self) -> list[FleetModel]:
        return [s for s in self.models.values() if s.status == "loaded"]

    # --- leases ----------------------------------------------------------------------

    async def acquire(self, name: str, keep_alive_s: float | bool | None = False) -> Lease:
        """A lease on ``name``'s engine, loading it first when needed (ApiError: 404, 503,
        500 naming the model)."""
        self._start_reaper()
        model = self.model(name)
        if model.status != "loaded":
            waiting = sum(s.waiting for s in self.models.values())
            if waiting >= self.max_waiting:
                raise service_unavailable(
                    f"Too many requests are waiting for models to load ({waiting}).",
                    code="load_queue_full",
                    retry_after_s=RETRY_AFTER_S,
                )
            model.waiting += 1
            try:
                while not model.loaded:  # loaded, it may be evicted before we resume
                    if model.loading is None:
                        model.loading = asyncio.ensure_future(self._load(model))
                    await asyncio.shield(model.loading)
            finally:
                model.waiting -= 1
        model.in_flight += 1
        model.expires_at = None
        model.last_used = self.clock()
        return Lease(self, model, keep_alive_s)

    def _release(self, lease: Lease) -> None:
        model = lease.model
        model.in_flight -= 1
        model.last_used = self.clock()
        if model.in_flight or model.engine is not lease.engine:
            return
        keep = self.keep_alive_s if lease.keep_alive_s is False else lease.keep_alive_s
        model.expires_at = None if keep is None else model.last_used + float(keep)
        if keep == 0:
            self._spawn(self._expire())

    # --- loading and unloading -------------------------------------------------------

    async def _load(self, model: FleetModel) -> None:
        try:
            async with self._residency():
                if model.status == "loaded":
                    return
                model.status = "loading"
                try:
                    await self._make_room_and_load(model)
                except BaseException:
                    model.status = "unloaded"
                    raise
        finally:
            model.loading = None

    async def _make_room_and_load(self, model: FleetModel) -> None:
        name = model.name
        if not model.servable.path.is_file():
            raise ApiError(
                404, f"The model '{name}' is no longer on disk.", param="model", code="model_gone"
            )
        others = [s for s in self.residents() if s is not model]
        busy = [s for s in others if s.busy]
        plans: dict[tuple[int, ...], Plan] = {}  # by budgets: evicting every idle one re-plans none
        try:  # would it fit with every idle model unloaded? If not, unload nothing
            plan = await self._plan(model, busy, plans)
        except PlanError as exc:
            raise self._no_room(model, busy, exc) from None
        idle = sorted((s for s in others if not s.busy), key=lambda s: s.last_used)
        while idle:  # the least recently used idle model goes first, until the plan fits
            staying = [s for s in self.residents() if s is not model]
            try:
                plan = await self._plan(model, staying, plans)
                break
            except PlanError as exc:
                victims = [s for s in idle if s.status == "loaded" and not s.busy]
                if not victims:
                    raise self._no_room(model, [s for s in staying if s.busy], exc) from None
                await self._unload(victims[0], reason=f"to make room for {name}")
                self.evictions_total[victims[0].name] = (
                    self.evictions_total.get(victims[0].name, 0) + 1
                )
        started = time.perf_counter()
        try:
            engine = await anyio.to_thread.run_sync(self.load_fn, model.servable, plan)
        except OutOfMemoryError as exc:
            log.error("model %s failed to load: %s", name, exc)
            model.last_error = str(exc)
            raise service_unavailable(
                f"The model '{name}' does not fit in memory now: {exc}",
                code="model_out_of_memory",
                retry_after_s=RETRY_AFTER_S,
            ) from None
        except (HomelabError, OSError, ValueError, RuntimeError) as exc:
            log.error("model %s failed to load: %s", name, exc)
            model.last_error = str(exc)
            raise ApiError(
                500, f"The model '{name}' failed to load: {exc}", code="model_load_failed"
            ) from None
        model.load_s = time.perf_counter() - started
        model.engine, model.plan, model.status = engine, plan, "loaded"
        model.actual_bytes = actual_device_bytes(engine, [d.name for d in self.hardware.devices])
        model.loaded_at = self.clock()
        model.last_used = model.loaded_at
        model.last_error = None
        model.expires_at = (
            None if self.keep_alive_s is None else model.loaded_at + self.keep_alive_s
        )
        self.loads_total[name] = self.loads_total.get(name, 0) + 1
        log.info(
            "model loaded: %s in %.2f s (planned %d bytes)",
            name,
            model.load_s,
            planned_bytes(model),
        )

    async def _plan(
        self, model: FleetModel, staying: Sequence[FleetModel], plans: dict[tuple[int, ...], Plan]
    ) -> Plan:
        """The plan for the budgets ``staying`` leave (PlanError: it does not fit them)."""
        hardware = self.hardware_left(staying)
        budgets = tuple(d.budget_bytes for d in hardware.devices)
        if budgets in plans:
            return plans[budgets]
        try:
            plans[budgets] = await anyio.to_thread.run_sync(self.plan_fn, model.servable, hardware)
            return plans[budgets]
        except PlanError:
            raise
        except (HomelabError, OSError, ValueError) as exc:  # a bad file: nothing to plan
            log.error("model %s cannot be planned: %s", model.name, exc)
            model.last_error = str(exc)
            raise ApiError(
                500, f"The model '{model.name}' failed to load: {exc}", code="model_load_failed"
            ) from None

    def _no_room(self, model: FleetModel, busy: Sequence[FleetModel], exc: PlanError) -> ApiError:
        if not busy:  # nothing loaded stands in the way: it cannot fit this machine at all
            return ApiError(
                500,
                f"The model '{model.name}' does not fit this machine: {exc.message}",
                code="model_does_not_fit",
            )
        names = ", ".join(s.name for s in busy)
        return service_unavailable(
            f"The model '{model.name}' does not fit beside the models serving requests now "
            f"({names}); retry when they are idle.",
            code="model_memory_busy",
            retry_after_s=RETRY_AFTER_S,
        )

    def hardware_left(self, staying: Sequence[FleetModel]) -> Hardware:
        """The machine's budgets less what ``staying`` take on each device."""
        taken: dict[str, int] = {}
        for model in staying:
            for device_name, n_bytes in model.device_bytes().items():
                taken[device_name] = taken.get(device_name, 0) + n_bytes
        devices = []
        for device in self.hardware.devices:
            used = taken.get(device.name, 0)
            if used:
                budget = max(device.budget_bytes - used, 0)
                note = f"{device.budget_note}, minus {used} bytes for the loaded models"
                device = replace(device, budget_bytes=budget, budget_note=note)
                if device.free_bytes is not None:
                    device = replace(device, free_bytes=max(device.free_bytes - used, 0))
            devices.append(device)
        return replace(self.hardware, devices=tuple(devices))

    async def _unload(self, model: FleetModel, reason: str) -> None:
        engine = model.engine
        model.engine, model.status, model.expires_at = None, "unloaded", None
        model.plan, model.actual_bytes = None, {}
        log.info("model unloaded: %s (%s)", model.name, reason)
        if engine is not None:
            await anyio.to_thread.run_sync(engine.close)

    async def load(self, name: str) -> FleetModel:
        """Load ``name`` now (the admin route); it then stays for its keep-alive."""
        lease = await self.acquire(name)
        lease.release()
        return lease.model

    async def unload(self, name: str) -> bool:
        """Unload ``name`` now (the admin route); ApiError 409 while it serves requests."""
        model = self.model(name)
        async with self._residency():
            if model.status != "loaded":
                return False
            if model.busy:
                raise ApiError(
                    409,
                    f"The model '{name}' is serving {model.in_flight} request(s); not unloaded.",
                    code="model_busy",
                )
            await self._unload(model, reason="asked to")
        self._forget_deleted()
        return True

    async def unload_all(self, reason: str) -> list[str]:
        """Unload every resident, busy or not (a yield: their requests have been drained or
        ended first); the names unloaded, least recently used first."""
        async with self._residency():
            residents = sorted(self.residents(), key=lambda s: s.last_used)
            for model in residents:
                await self._unload(model, reason=reason)
        return [model.name for model in residents]

    async def _expire(self) -> None:
        now = self.clock()
        due = [
            s
            for s in self.residents()
            if not s.busy and s.expires_at is not None and s.expires_at <= now
        ]
        if not due:
            return
        async with self._residency():
            for model in due:
                expired = model.expires_at is not None and model.expires_at <= self.clock()
                if model.status == "loaded" and not model.busy and expired:
                    await self._unload(model, reason="keep-alive expired")
        self._forget_deleted()

    # --- background ------------------------------------------------------------------

    def _residency(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _start_reaper(self) -> None:
        if self._reaper is None and not self._closed:
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        while not self._closed:
            await asyncio.sleep(REAP_INTERVAL_S)
            try:
                await self._expire()
            except Exception:  # never let the reaper die: the next round tries again
                log.exception("unloading idle models failed")

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def close(self) -> None:
        """Close every engine (the server has stopped)."""
        self._closed = True
        for model in self.models.values():
            engine, model.engine, model.status = model.engine, None, "unloaded"
            if engine is not None:
                engine.close()

    # --- reports ---------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        """What ``homelab ps`` and the admin route show, one entry per servable model."""
        now = self.clock()
        self._forget_deleted()
        return [self._describe(model, now) for model in self.models.values()]

    def _describe(self, model: FleetModel, now: float) -> dict[str, Any]:
        engine = model.engine
        snapshot = engine.metrics() if engine is not None else None
        loaded = model.status == "loaded"
        return {
            "model": model.name,
            "status": model.status,
            "path": str(model.servable.path),
            "on_disk": model.servable.path.exists(),
            "planned_bytes": planned_bytes(model) if loaded else None,
            "actual_bytes": sum(model.actual_bytes.values()) if loaded else None,
            "devices": model.device_bytes() if loaded else {},
            "n_ctx_per_slot": model.plan.settings.n_ctx_per_slot if model.plan else None,
            "slots_busy": snapshot.active_slots if snapshot else 0,
            "slots_total": snapshot.n_slots if snapshot else 0,
            "requests_in_flight": model.in_flight,
            "idle_s": round(now - model.last_used, 3) if loaded and not model.busy else 0.0,
            "expires_in_s": (
                round(max(model.expires_at - now, 0.0), 3)
                if loaded and model.expires_at is not None and not model.busy
                else None
            ),
            "load_s": round(model.load_s, 3) if loaded else None,
            "loads": self.loads_total.get(model.name, 0),
            "evictions": self.evictions_total.get(model.name, 0),
            "last_error": model.last_error,
        }


def planned_bytes(model: FleetModel) -> int:
    return model.plan.memory.total_bytes if model.plan is not None else 0


def actual_device_bytes(engine: LoadedEngine, device_names: Sequence[str]) -> dict[str, int]:
    """What llama.cpp allocated, per planner device: buffer names such as ``CPU_Mapped`` or
    ``CUDA0`` are counted for the device whose name they start with (the longest match)."""
    buffers = engine.load_report.buffers
    totals: dict[str, int] = {}
    by_length = sorted(device_names, key=len, reverse=True)
    for kind in (buffers.model, buffers.kv, buffers.recurrent, buffers.compute, buffers.output):
        for buffer_name, n_bytes in kind.items():
            device = next((d for d in by_length if buffer_name.upper().startswith(d.upper())), None)
            if device is not None:
                totals[device] = totals.get(device, 0) + int(n_bytes)
    return totals


class LeaseRelease:
    """Returns the leases a request took once its response, stream included, has ended."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in scope.get(LEASES_KEY, ()):
                lease.release()
