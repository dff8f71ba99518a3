"""The hardware panel says what the llama.cpp build can do here: its CUDA version and
architectures, and each mismatch with its fix (the verdict of `homelab hw`).

A 24 GB GPU with driver CUDA 12.4 (tui_fakes: no GPU can exist here) and a CUDA 13.5 build for
sm_89 (BuildInfo: no CUDA build can load here); the verdict and the panel are real.
"""

from __future__ import annotations

import time
from dataclasses import replace

from textual.widgets import Static
from tui_fakes import FakeHardware, gpu_24gb_machine

from homelab.hardware.build import CUDA_REBUILD_COMMAND, BuildInfo
from homelab.hardware.verdict import build_verdict
from homelab.tui.app import make_app
from homelab.tui.widgets.hardware import HardwarePanel

CUDA_13_BUILD = BuildInfo(
    "0.3.36", True, "CUDA : ARCHS = 890 | CPU : AVX2 = 1", ("CUDA", "CPU"), cuda_version="13.5"
)


def machine_with(build: BuildInfo) -> FakeHardware:
    report = gpu_24gb_machine().report  # driver 550.54.14: CUDA 12.4
    verdict = build_verdict(report.gpus, build, report.cuda_driver_version)
    return FakeHardware(
        replace(report, build=build, warnings=verdict.warnings, build_verdict=verdict.summary)
    )


async def test_the_panel_shows_the_builds_cuda_and_a_driver_too_old_for_it() -> None:
    app = make_app("demo", hardware_provider=machine_with(CUDA_13_BUILD), frozen_live=True)
    async with app.run_test(size=(160, 48)) as pilot:
        panel = app.screen.query_one(HardwarePanel)
        deadline = time.monotonic() + 60
        while panel.report is None:
            assert time.monotonic() < deadline, "timed out waiting for the hardware report"
            await pilot.pause(0.05)
        await pilot.pause()
        assert panel.border_subtitle == "llama.cpp 0.3.36 · CUDA 13.5 sm_89, CPU"
        warnings = str(panel.query_one("#hw-warnings", Static).render())
        assert "supports CUDA 12.4, older than this build's CUDA 13.5" in warnings
        assert CUDA_REBUILD_COMMAND in warnings
