"""The live panel's controller: the loaded model's life — load, unload — and its live numbers.

Loading blocks for seconds, so it runs in a worker; freeing a model (stopping its server,
joining the engine's thread) too, and a new load waits until the old model's memory is free.
Actions that need a model (a prompt, the server) queue here and run once it is loaded.
Metrics arrive from the engine's own thread through a :class:`Coalescer`: one UI message at
a time, whatever the token rate.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.handoff import Coalescer
from homelab.tui.messages import MetricsUpdated, ModelLoaded, ModelUnloaded, TaskFailed
from homelab.tui.panels import busy, in_thread
from homelab.tui.screens.error import ErrorScreen

if TYPE_CHECKING:
    from textual.app import App

    from homelab.engine.api import EngineMetrics
    from homelab.engine.loader import LoadReport
    from homelab.engine.speculation.config import SpeculationConfig
    from homelab.planner.plan import Plan
    from homelab.tui.panels.plan import PlanController
    from homelab.tui.protocols import AnswerStream, DashboardEngine, ServerLike
    from homelab.tui.services import ModelChoice
    from homelab.tui.widgets.live import LivePanel

METRICS_INTERVAL_S = 0.25
RELEASE_WAIT_S = 60.0
LOADING = "loading the model"  # the TaskFailed action of a failed load

AfterLoad = Callable[[], Awaitable[None] | None]


class LiveController:
    panel: LivePanel  # attached once the dashboard is mounted

    def __init__(
        self,
        app: App[None],
        plans: PlanController,
        *,
        frozen: bool,
        speculation: SpeculationConfig | None = None,
    ) -> None:
        self.app = app
        self.plans = plans  # what to load: the chosen model and its current plan
        self.frozen = frozen
        self.speculation = speculation  # --spec / --draft: how every load speculates
        self.engine: DashboardEngine | None = None
        self.load_report: LoadReport | None = None
        self.metrics: Coalescer[EngineMetrics] = Coalescer(
            lambda: app.post_message(MetricsUpdated())
        )
        self._unsubscribe: Callable[[], None] | None = None
        self._after_load: list[AfterLoad] = []
        self._load_when_planned = False  # a load was asked for before the first plan came
        self._released = threading.Event()  # set while no engine is being freed
        self._released.set()

    def attach(self, panel: LivePanel) -> None:
        self.panel = panel

    @property
    def loading(self) -> bool:
        return busy(self.app, "load")

    # --- loading -------------------------------------------------------------------------

    def load(self) -> None:
        choice, plan = self.plans.choice, self.plans.plan
        if choice is None or plan is None:
            if self._after_load:  # a prompt is waiting: load as soon as there is a plan
                self._load_when_planned = True
            else:
                self.app.notify("Wait for the plan to finish first.", title="Nothing to load yet")
            return
        if not choice.runnable:
            not_here = HomelabError(
                f"{choice.label} is not on this machine.",
                hint=f"Download it first: homelab pull {choice.ref}",
            )
            self.app.push_screen(ErrorScreen("loading", not_here))
            return
        if self.loading:
            return
        self.panel.show_state(f"Loading {choice.label}…")
        in_thread(self.app, lambda: self._load(choice, plan), name="load_model", group="load")

    def plan_ready(self) -> None:
        """A plan arrived: start the load that was waiting for one."""
        if self._load_when_planned:
            self._load_when_planned = False
            self.load()

    def after_load(self, action: AfterLoad) -> None:
        """Run ``action`` once a model is loaded, loading one now if needed."""
        if action not in self._after_load:
            self._after_load.append(action)
        if not self.loading:
            self.load()

    def _load(self, choice: ModelChoice, plan: Plan) -> None:
        self._released.wait(RELEASE_WAIT_S)  # the previous model's memory must be free first
        started = time.perf_counter()
        try:
            engine = services.load_engine(choice, plan, self.speculation)
        except HomelabError as error:
            self.app.post_message(TaskFailed(LOADING, error, modal=True))
        else:
            self.app.post_message(ModelLoaded(engine, time.perf_counter() - started))

    async def loaded(self, message: ModelLoaded) -> None:
        self.engine = message.engine
        self.load_report = services.load_report(message.engine)
        self._unsubscribe = message.engine.subscribe(self.metrics.put, METRICS_INTERVAL_S)
        load_s = "–" if self.frozen else f"{message.load_s:.1f} s"
        choice = self.plans.choice
        self.panel.show_state(services.loaded_line(choice, self.load_report, load_s))
        self.plans.refresh_view()
        self.app.notify(f"{choice.label if choice else 'model'} is ready.", title="Loaded")
        actions, self._after_load = self._after_load, []
        for action in actions:
            result = action()
            if inspect.isawaitable(result):
                await result

    def load_failed(self, error: HomelabError) -> None:
        self._after_load.clear()
        self._load_when_planned = False
        self.panel.show_state(f"[b $error]Load failed:[/] {error.title}")

    # --- unloading -----------------------------------------------------------------------

    def release(self, server: ServerLike | None, answer: AnswerStream | None) -> None:
        """Forget the engine now; free it, with the server and answer using it, in a worker
        (stopping a server and joining the engine's thread take a moment the UI must not wait
        for)."""
        engine = self.engine
        self._stop_metrics()
        self.engine = self.load_report = None
        self._released.clear()
        in_thread(
            self.app,
            lambda: self._free(engine, server, answer),
            name="release",
            group="release",
            exclusive=False,
        )

    def _free(
        self,
        engine: DashboardEngine | None,
        server: ServerLike | None,
        answer: AnswerStream | None,
    ) -> None:
        try:
            if answer is not None:
                answer.cancel()
            if server is not None:
                server.stop()
            if engine is not None:
                engine.close()
        finally:
            self._released.set()
            self.app.post_message(ModelUnloaded())

    def show_unloaded(self) -> None:
        self.panel.show_unloaded()

    def close(self) -> None:
        """The app is closing: free the engine here and now."""
        self._stop_metrics()
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _stop_metrics(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    # --- live numbers --------------------------------------------------------------------

    def show_metrics(self) -> None:
        metrics = self.metrics.take()
        if metrics is not None and self.engine is not None:
            self.panel.show_metrics(metrics, frozen=self.frozen)
