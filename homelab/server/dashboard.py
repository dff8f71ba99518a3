"""``GET /admin/dashboard``: what the web page's dashboard draws, in one JSON document.

The same facts ``homelab ps`` (``/admin/models``), ``/admin/prompt-cache`` and ``/metrics``
give, gathered for one poll a second: the machine now (each GPU's free VRAM, host RAM), each
model (status, memory planned vs allocated, K/V type, context, slots busy, live tok/s), the
prompt cache per tenant (saved states and their bytes; requests whose prefix was cached) and
the recent requests (never their text). Admin keys only, like every ``/admin/`` route.

:class:`RequestLog` keeps the recent requests: the server's request subscribers feed it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio.to_thread
from fastapi import FastAPI

from homelab.engine.prompt_cache.store import PromptCache
from homelab.server.engine_seam import EngineLike
from homelab.server.fleet import Fleet
from homelab.server.middleware import GENERATION_PATHS, RequestRecord

RECENT_REQUESTS = 50  # shown; the per-tenant totals count every request


@dataclass
class TenantTally:
    """One tenant's generation requests since the server started."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0  # requests whose prompt started with a cached prefix
    last_request_at: float = 0.0  # Unix time


class RequestLog:
    """The latest generation requests and every tenant's tally (a request subscriber)."""

    def __init__(self, size: int = RECENT_REQUESTS) -> None:
        self.recent: deque[tuple[float, RequestRecord]] = deque(maxlen=size)
        self.tenants: dict[str, TenantTally] = {}

    def observe(self, record: RequestRecord) -> None:
        if record.route not in GENERATION_PATHS:
            return  # the page's own polls and files are not what a tenant asked for
        now = time.time()
        self.recent.append((now, record))
        tally = self.tenants.setdefault(record.tenant, TenantTally())
        tally.requests += 1
        tally.prompt_tokens += record.prompt_tokens
        tally.cached_tokens += record.cached_tokens
        tally.completion_tokens += record.completion_tokens
        tally.cache_hits += int(record.cached_tokens > 0)
        tally.last_request_at = now

    def recent_rows(self) -> list[dict[str, Any]]:
        """Newest first, with each answer's tokens per second."""
        return [
            {"at": at, **asdict(record), "completion_tok_s": round(record.completion_tok_s, 2)}
            for at, record in reversed(self.recent)
        ]


ModelsFn = Callable[[], list[dict[str, Any]]]


def add_routes(
    app: FastAPI,
    models: ModelsFn,
    log: RequestLog,
    cache: Callable[[], PromptCache | None],
    gpu_labels: dict[int, str],
) -> None:
    """``gpu_labels``: what the planner calls each GPU (by NVML index), where it knows."""

    @app.get("/admin/dashboard")
    async def dashboard() -> dict[str, Any]:
        hardware = await anyio.to_thread.run_sync(hardware_now, gpu_labels)  # NVML calls block
        return {
            "time": time.time(),
            "hardware": hardware,
            "models": models(),
            "tenants": tenant_rows(log, cache()),
            "prompt_cache": cache_summary(cache()),
            "recent_requests": log.recent_rows(),
        }


def hardware_now(gpu_labels: dict[int, str]) -> dict[str, Any]:
    """Each GPU's memory now (none without an NVIDIA driver) and the host's RAM."""
    from homelab.hardware.gpu import gpu_snapshot
    from homelab.hardware.host import read_memory

    gpus = [
        {
            "index": gpu.index,
            "label": gpu_labels.get(gpu.index, f"GPU {gpu.index}"),
            "memory_total_bytes": gpu.memory_total_bytes,
            "memory_free_bytes": gpu.memory_free_bytes,
            "memory_used_bytes": gpu.memory_used_bytes,
            "unified_memory": gpu.unified_memory,
            "utilization_gpu_percent": gpu.utilization_gpu_percent,
            "temperature_c": gpu.temperature_c,
        }
        for gpu in gpu_snapshot()
    ]
    memory = read_memory()
    return {
        "gpus": gpus,
        "ram_total_bytes": memory.ram_total_bytes,
        "ram_available_bytes": memory.ram_available_bytes,
    }


def tenant_rows(log: RequestLog, cache: PromptCache | None) -> list[dict[str, Any]]:
    """Per tenant: its requests and cached prefixes, and its saved states in the prompt cache."""
    saved: dict[str, dict[str, int]] = {}
    for entry in cache.entries() if cache is not None else []:
        row = saved.setdefault(entry.tenant, {"saved_states": 0, "saved_bytes": 0})
        row["saved_states"] += 1
        row["saved_bytes"] += entry.n_bytes
    names = sorted(set(log.tenants) | set(saved))
    empty = {"saved_states": 0, "saved_bytes": 0}
    return [
        {"tenant": name, **asdict(log.tenants.get(name, TenantTally())), **saved.get(name, empty)}
        for name in names
    ]


def cache_summary(cache: PromptCache | None) -> dict[str, Any]:
    if cache is None:
        return {"enabled": False}
    stats = cache.stats()
    return {
        "enabled": True,
        "ram_budget_bytes": cache.config.ram_budget_bytes,
        "ram_bytes": stats.ram_bytes,
        "disk_bytes": stats.disk_bytes,
        "hits": stats.hits_ram + stats.hits_disk,
        "misses": stats.misses,
    }


def fleet_gpu_labels(fleet: Fleet) -> dict[int, str]:
    """The fleet's local GPUs (``CUDA0``…) by index, as the planner labels them."""
    labels: dict[int, str] = {}
    for device in fleet.hardware.devices:
        index = device.name.removeprefix("CUDA")
        if device.kind == "gpu" and device.endpoint is None and index.isdigit():
            labels[int(index)] = device.label
    return labels


def fleet_models(fleet: Fleet) -> list[dict[str, Any]]:
    """``homelab ps``'s rows, each with its plan's K/V type and its engine's live figures."""
    rows = fleet.snapshot()
    for row in rows:
        model = fleet.models.get(row["model"])
        if model is None or model.engine is None:
            continue
        row.update(engine_figures(model.engine))
        if model.plan is not None:
            settings = model.plan.settings
            row.update(type_k=settings.type_k, type_v=settings.type_v)
            row.update(n_parallel=settings.n_parallel)
    return rows


def single_model(name: str, engine: EngineLike | None) -> list[dict[str, Any]]:
    """``homelab serve MODEL``: its one model (loading while ``engine`` is None)."""
    if engine is None:
        return [{"model": name, "status": "loading"}]
    row: dict[str, Any] = {"model": name, "status": "loaded", **engine_figures(engine)}
    report = getattr(engine, "load_report", None)  # an engine this server loaded has one
    if report is not None:
        settings = report.settings
        row.update(type_k=settings.type_k, type_v=settings.type_v, n_parallel=settings.n_parallel)
        row.update(actual_bytes=report.buffers.total_bytes(), n_ctx_per_slot=report.n_ctx_per_slot)
    return [row]


def engine_figures(engine: EngineLike) -> dict[str, Any]:
    """What the engine reports now: rolling tok/s, slots, queue, K/V cells."""
    m = engine.metrics()
    return {
        "decode_tok_s": round(m.decode_tok_s, 2),
        "prefill_tok_s": round(m.prefill_tok_s, 2),
        "slots_busy": m.active_slots,
        "slots_total": m.n_slots,
        "queue_depth": m.queue_depth,
        "kv_cells_used": m.kv_cells_used,
        "kv_cells_total": m.kv_cells_total,
        "n_ctx_per_slot": engine.n_ctx_per_slot,
        "completion_tokens_total": m.decode_tokens_total,
    }
