"""Snapshots of the dashboard (pytest-textual-snapshot) at 80×24 and 160×48, on a CPU-only
machine and on a faked 24 GB GPU. Hardware is fixed (tui_fakes), the model is the generated
demo, and live numbers are frozen, so the pictures are the same on every machine.

Update after an intended change: ``pytest tests/tui --snapshot-update``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from tui_fakes import FakeHardware, cpu_only_machine, gpu_24gb_machine

from homelab.tui.app import HomelabApp, make_app

SnapCompare = Callable[..., bool]
MACHINES = {"cpu_only": cpu_only_machine, "gpu_24gb": gpu_24gb_machine}


def settled(page_keys: tuple[str, ...] = ()) -> Callable[[Pilot[None]], Awaitable[None]]:
    """Wait until hardware is shown and the plan computed, then press ``page_keys``."""

    async def run_before(pilot: Pilot[None]) -> None:
        app = pilot.app
        assert isinstance(app, HomelabApp)
        deadline = time.monotonic() + 60
        while app.plans.plan is None and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press(*page_keys)

    return run_before


def frozen_app(machine: FakeHardware, model: Path) -> HomelabApp:
    return make_app(str(model), hardware_provider=machine, frozen_live=True)


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_dashboard(
    snap_compare: SnapCompare, lone_demo_model: Path, machine: str, size: tuple[int, int]
) -> None:
    app = frozen_app(MACHINES[machine](), lone_demo_model)
    assert snap_compare(app, terminal_size=size, run_before=settled())


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_plan_page_on_a_small_terminal(
    snap_compare: SnapCompare, lone_demo_model: Path, machine: str
) -> None:
    app = frozen_app(MACHINES[machine](), lone_demo_model)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settled(("2",)))
