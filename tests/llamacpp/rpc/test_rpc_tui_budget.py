"""``homelab tui --rpc … --rpc-budget BYTES``: the dashboard plans with the budget, as
plan/run/serve do, and its hardware panel shows it on each worker line.

Driven with Pilot against a real ``homelab worker`` on 127.0.0.1 and this machine's real
hardware; nothing is loaded through the worker (only probed), so it runs in-process.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from rpc_workers import Worker
from textual.pilot import Pilot
from textual.widgets import Static

from homelab.cli import tui as tui_cli
from homelab.tui.app import HomelabApp, make_app
from homelab.units import GIB

WAIT_S = 60.0  # only so a broken build fails instead of hanging


async def _wait_until(pilot: Pilot[None], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def _worker_line(app: HomelabApp) -> str:
    return str(app.screen.query_one("#rpc-workers", Static).render())


async def test_the_hardware_panel_shows_the_budgeted_worker(
    start_worker: Callable[[], Worker], demo_model: Callable[..., Path]
) -> None:
    worker = start_worker()
    app = make_app(
        str(demo_model("llama", "bench")),
        frozen_live=True,
        verify_plans=False,
        rpc=(worker.endpoint,),
        rpc_budget_bytes=1 * GIB,
    )
    async with app.run_test(size=(160, 48)) as pilot:
        await _wait_until(pilot, lambda: bool(app.hardware.workers), "the worker line")
        await _wait_until(pilot, lambda: app.plans.plan is not None, "the first plan")
        line = _worker_line(app)
        plan = app.plans.plan
    assert f"worker {worker.endpoint} · RPC0 · " in line and line.endswith("· budget 1.0 GiB")
    assert plan is not None
    remote = plan.memory.device(f"RPC0[{worker.endpoint}]")
    assert remote.budget_bytes == 1 * GIB  # the plan honours it, as `homelab plan` does


def test_tui_accepts_rpc_budget_like_the_other_verbs() -> None:
    parser = argparse.ArgumentParser()
    tui_cli.configure(parser)
    args = parser.parse_args(["--rpc", "127.0.0.1:50052", "--rpc-budget", "8GiB"])
    assert args.rpc_budget == "8GiB"
