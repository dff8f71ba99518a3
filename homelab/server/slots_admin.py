"""The prompt cache over HTTP: slots saved, restored and erased by hand, and its metrics.

    GET    /admin/slots[?model=NAME]                   each slot: tenant, cached tokens, busy
    POST   /admin/slots/{id}?action=save|restore|erase[&model=NAME] (restore: {"tenant": T})
    GET    /admin/prompt-cache                         sizes, hit counts, the saved states
    DELETE /admin/prompt-cache[?tenant=T][&model=ID]   delete states, from RAM and disk

Like llama-server's ``/slots/{id}?action=…``, but a state is saved into homelab's prompt
cache (RAM, then the data folder) under the slot's tenant and model, never to a file the
caller names, and a restore names the tenant whose latest state it wants. Admin keys only
(every ``/admin/`` path is, see ``middleware``). ``/metrics`` gets the cache's sizes and
hit counts from :func:`metrics_lines`.

``homelab prompt-cache`` goes through the last two when a server runs (the server owns the
folder then). A delete empties the slots that hold the tenant's cells first
(:func:`forget_states`), so that no slot saves them back — not at its next admission, not
when the server stops; the server does the same for a tenant whose last key was removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

import anyio
from fastapi import FastAPI, Query, Request

from homelab.engine.prompt_cache.slot_states import SLOT_ACTIONS
from homelab.engine.prompt_cache.store import PromptCache
from homelab.errors import BusyError, EngineError
from homelab.server.errors import ApiError, invalid_request, json_body_name
from homelab.server.protocol import small_body_doc

log = logging.getLogger("homelab.server")


class SlotAdmin(Protocol):
    """What these routes need of an engine (``homelab.engine.engine.Engine`` has it)."""

    def slot_action(
        self, seq_id: int, action: str, tenant: str | None = None, timeout_s: float = 60.0
    ) -> dict[str, object]: ...

    def slot_states(self, timeout_s: float = 5.0) -> tuple[Any, ...]: ...


EngineFor = Callable[[str | None], Any]  # the engine of ?model= (or the only one), awaited


def add_routes(
    app: FastAPI,
    cache: PromptCache | None,
    engine_for: EngineFor,
    engines: Callable[[], list[Any]],
    identity_of: Callable[[str], str],
) -> None:
    """``engines``: the loaded engines; ``identity_of``: a tenant name's identity now."""

    @app.get("/admin/prompt-cache")
    async def prompt_cache_report() -> dict[str, Any]:
        if cache is None:
            return {"enabled": False}
        stats, entries, config = cache.stats(), cache.entries(), cache.config
        return {
            "enabled": True,
            "ram_budget_bytes": config.ram_budget_bytes,
            "disk_cap_bytes": config.disk_cap_bytes if config.directory is not None else 0,
            **asdict(stats),
            "entries": [asdict(e) for e in entries],
        }

    @app.delete("/admin/prompt-cache")
    async def clear_prompt_cache(tenant: str | None = None, model: str | None = None) -> Any:
        if cache is None:
            raise invalid_request("This server keeps no prompt cache (--no-prompt-cache).")
        if tenant == "" or model == "":
            raise invalid_request("Give tenant= and model= a value, or leave them out (any).")
        loaded = engines()
        removed = await anyio.to_thread.run_sync(forget_states, cache, loaded, tenant, model)
        return {"removed": removed, "tenant": tenant, "model": model}

    @app.get("/admin/slots")
    async def list_slots(model: str | None = None) -> dict[str, Any]:
        engine = _slot_admin(await engine_for(model))
        states = await anyio.to_thread.run_sync(engine.slot_states)
        return {"object": "list", "data": [asdict(state) for state in states]}

    @app.post("/admin/slots/{slot_id}", openapi_extra=small_body_doc(tenant="string"))
    async def act_on_slot(
        slot_id: int,
        request: Request,
        action: str = Query(json_schema_extra={"enum": list(SLOT_ACTIONS)}),
        model: str | None = None,
    ) -> dict[str, Any]:
        if action not in SLOT_ACTIONS:
            raise invalid_request(f"action must be one of {', '.join(SLOT_ACTIONS)}.", "action")
        tenant = identity_of(_tenant(await request.body())) if action == "restore" else None
        engine = _slot_admin(await engine_for(model))
        try:
            return await anyio.to_thread.run_sync(engine.slot_action, slot_id, action, tenant)
        except BusyError as exc:
            raise ApiError(409, f"{exc} {exc.hint or ''}".strip(), code="slot_busy") from None
        except EngineError as exc:
            raise invalid_request(f"{exc}. {exc.hint or ''}".strip()) from None


def forget_states(
    cache: PromptCache | None, engines: list[Any], tenant: str | None, model_id: str | None
) -> int:
    """Delete ``tenant``'s states (a name: each identity of it; an identity; None: every
    tenant) of ``model_id`` (None: any) from RAM and disk, after emptying the slots that hold
    them so that none is saved back; how many states. Blocks: run it off the event loop."""
    for engine in engines:
        forget = getattr(engine, "forget_tenant", None)  # an embedding model keeps no slots
        try:
            if forget is not None:
                forget(tenant, model_id)
        except Exception as exc:  # closing, or failed: its slots save nothing any more
            log.warning("prompt cache: slots not emptied for %s: %s", tenant or "all", exc)
    return cache.clear(tenant, model_id) if cache is not None else 0


def _slot_admin(engine: Any) -> SlotAdmin:
    if not hasattr(engine, "slot_action"):
        raise invalid_request("This model has no slots to manage (an embedding model).")
    return engine  # type: ignore[no-any-return]


def _tenant(raw: bytes) -> str:
    return json_body_name(raw, "tenant", "whose state to restore")


def metrics_lines(cache: PromptCache | None) -> str:
    """The prompt cache's gauges and counters in Prometheus text ("" without a cache)."""
    if cache is None:
        return ""
    stats = cache.stats()
    lines = [
        "# HELP homelab_prompt_cache_bytes Saved prompt states by tier",
        "# TYPE homelab_prompt_cache_bytes gauge",
        f'homelab_prompt_cache_bytes{{tier="ram"}} {stats.ram_bytes}',
        f'homelab_prompt_cache_bytes{{tier="disk"}} {stats.disk_bytes}',
        "# HELP homelab_prompt_cache_entries Saved prompt states by tier",
        "# TYPE homelab_prompt_cache_entries gauge",
        f'homelab_prompt_cache_entries{{tier="ram"}} {stats.ram_entries}',
        f'homelab_prompt_cache_entries{{tier="disk"}} {stats.disk_entries}',
        "# HELP homelab_prompt_cache_hits_total Prefixes restored instead of prefilled",
        "# TYPE homelab_prompt_cache_hits_total counter",
        f'homelab_prompt_cache_hits_total{{tier="ram"}} {stats.hits_ram}',
        f'homelab_prompt_cache_hits_total{{tier="disk"}} {stats.hits_disk}',
    ]
    for name, value, what in (
        ("misses", stats.misses, "Lookups that found nothing worth restoring"),
        ("saves", stats.saves, "Slot states saved"),
        ("skipped", stats.skipped, "Slot states not kept: RAM full of states not written yet"),
        ("evictions", stats.evicted, "States dropped for room"),
        ("expired", stats.expired, "States deleted unused for the TTL"),
        ("dropped_files", stats.dropped_files, "State files that failed their checks"),
    ):
        metric = f"homelab_prompt_cache_{name}_total"
        lines += [f"# HELP {metric} {what}", f"# TYPE {metric} counter", f"{metric} {value}"]
    return "\n".join(lines) + "\n"
