"""Yield and resume over HTTP (admin keys, like every ``/admin/`` path):

    GET  /admin/yield                   the state, why, and the last yield's figures
    POST /admin/yield   {"wait": true}  give the GPU back (wait: until the memory is freed)
    POST /admin/resume                  take it back (re-planned for the VRAM free now)

``homelab yield`` / ``homelab resume`` and the TUI's server panel call these.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request

from homelab.server.errors import invalid_request
from homelab.server.protocol import small_body_doc
from homelab.server.yielding import YieldController


def add_routes(app: FastAPI, controller: YieldController) -> None:
    @app.get("/admin/yield")
    async def yield_status() -> dict[str, Any]:
        return controller.status()

    @app.post("/admin/yield", openapi_extra=small_body_doc(wait="boolean", reason="string"))
    async def yield_gpu(request: Request) -> dict[str, Any]:
        wait, reason = _yield_body(await request.body())
        task = controller.spawn(controller.yield_gpu("asked", reason))
        if wait:
            await asyncio.shield(task)
        else:
            await asyncio.sleep(0)  # the yield has begun: admission has stopped
        return controller.status()

    @app.post("/admin/resume")
    async def resume_gpu() -> dict[str, Any]:
        await asyncio.shield(controller.spawn(controller.resume("asked")))
        return controller.status()


def _yield_body(raw: bytes) -> tuple[bool, str]:
    if not raw.strip():
        return False, "asked to"
    try:
        body = json.loads(raw)
    except ValueError:
        raise invalid_request('The body must be JSON: {"wait": true}.') from None
    if not isinstance(body, dict) or not isinstance(body.get("wait", False), bool):
        raise invalid_request("wait must be true or false.", param="wait")
    reason = body.get("reason")
    return body.get("wait", False), reason if isinstance(reason, str) and reason else "asked to"


def lifespan(controller: YieldController) -> Any:
    """Binds the controller to the server's event loop and starts the watcher with it; both
    end with the server."""

    @contextlib.asynccontextmanager
    async def run(_app: FastAPI) -> AsyncIterator[None]:
        controller.bind_loop(asyncio.get_running_loop())
        watcher = controller.watcher
        if watcher is not None:
            watcher.start()
        try:
            yield
        finally:
            if watcher is not None:
                watcher.stop()
            controller.bind_loop(None)

    return run
