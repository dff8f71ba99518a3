"""The hardware panel's controller: detect once (and on demand), sample about once a second."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homelab.tui import services
from homelab.tui.hardware_source import live_from_report
from homelab.tui.messages import HardwareDetected
from homelab.tui.panels import in_thread

if TYPE_CHECKING:
    from textual.app import App

    from homelab.hardware.report import HardwareReport
    from homelab.tui.hardware_source import HardwareSource, LiveHardware
    from homelab.tui.services import WorkerLine
    from homelab.tui.widgets.hardware import HardwarePanel


class HardwareController:
    panel: HardwarePanel  # attached once the dashboard is mounted

    def __init__(
        self,
        app: App[None],
        source: HardwareSource,
        *,
        frozen: bool,
        rpc: tuple[str, ...] = (),
        budget: int | None = None,
    ) -> None:
        self.app = app
        self.source = source
        self.frozen = frozen  # snapshots: hide sensor numbers that vary run to run
        self.rpc = rpc  # --rpc workers: listed with their free memory, planned with
        self.rpc_budget_bytes = budget  # --rpc-budget: what each worker device may hold
        self.report: HardwareReport | None = None
        self.workers: tuple[WorkerLine, ...] = ()

    def attach(self, panel: HardwarePanel) -> None:
        self.panel = panel

    def detect(self) -> None:
        in_thread(self.app, self._detect, name="detect_hardware", group="hardware")

    def _detect(self) -> None:
        report = self.source.detect()
        workers = services.probe_workers(self.rpc, self.rpc_budget_bytes) if self.rpc else ()
        self.app.post_message(HardwareDetected(report, workers))

    async def show_report(
        self, report: HardwareReport, workers: tuple[WorkerLine, ...] = ()
    ) -> None:
        self.report = report
        self.workers = workers
        await self.panel.show_report(report)
        self.panel.show_workers(workers)
        self.panel.show_live(live_from_report(report), frozen=self.frozen)

    def sample(self) -> None:
        in_thread(self.app, self._sample, name="sample_hardware", group="hardware-sample")

    def _sample(self) -> None:
        live = self.source.sample()
        self.app.call_from_thread(self._show_live, live)

    def _show_live(self, live: LiveHardware) -> None:
        if self.app.is_running and self.panel.report is not None:
            self.panel.show_live(live, frozen=self.frozen)
