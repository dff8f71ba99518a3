"""Drive the dashboard with Pilot in a process of its own: plan and load MODEL over the RPC
worker ENDPOINT, print one JSON document (the worker line, the plan, what was allocated).

    python tests/tui/rpc_tui_child.py MODEL_PATH ENDPOINT

Registering RPC workers is process-wide in ggml (and llama.cpp aborts the process when a
worker is gone), so no test loads through a worker inside the pytest process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from textual.widgets import Static
from tui_fakes import cpu_only_machine

from homelab.tui.app import make_app

WAIT_S = 60.0


async def drive(model: str, endpoint: str) -> dict[str, object]:
    app = make_app(model, hardware_provider=cpu_only_machine(), frozen_live=True, rpc=(endpoint,))
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + WAIT_S
        while app.plans.plan is None and time.monotonic() < deadline:
            await pilot.pause(0.05)
        plan = app.plans.plan
        assert plan is not None, "no plan"
        await pilot.press("escape", "l")
        while app.live.engine is None and time.monotonic() < deadline:
            await pilot.pause(0.05)
        engine = app.live.engine
        assert engine is not None, "no load"
        document = {
            "workers": str(app.screen.query_one("#rpc-workers", Static).render()),
            "plan_rpc_servers": list(plan.settings.rpc_servers),
            "planned": {d.name: d.weights_bytes for d in plan.memory.devices},
            "loaded_rpc_servers": list(engine.settings.rpc_servers),
            "allocated": dict(engine.load_report.buffers.model),
        }
        await pilot.press("l")  # unload before the worker goes
        while app.live.engine is not None and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await pilot.pause(0.5)
    return document


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drive(sys.argv[1], sys.argv[2]))))
