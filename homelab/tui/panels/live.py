"""The live panel's controller: the loaded model's life — load, unload — and its live numbers.

Loading blocks for seconds, so it runs in a worker; freeing a model (stopping its server,
joining the engine's thread) too, and a new load waits until the old model's memory is free.
Actions that need a model (a prompt, the server) queue here and run once it is loaded.
Metrics arrive from the engine's own thread through a :class:`Coalescer`: one UI message at
a time, whatever the token rate.

A loaded model can give its GPU back (``y``): the yield controller of ``homelab serve``
(:mod:`homelab.server.yielding`, one per load, made by ``services.yield_controller``) closes
the engine — its slots saved in the dashboard's prompt cache — and a second ``y`` re-plans for
the VRAM free then and loads it again. The engine lives in ``holder``, which the server
serves from; every change (also ``homelab yield`` against the dashboard's server) arrives as
a :class:`YieldChanged`, and :meth:`yield_changed` follows the engine it leaves.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.handoff import Coalescer
from homelab.tui.messages import (
    MetricsUpdated,
    ModelLoaded,
    ModelUnloaded,
    TaskFailed,
    YieldChanged,
)
from homelab.tui.panels import busy, in_thread
from homelab.tui.screens.error import ErrorScreen

if TYPE_CHECKING:
    from textual.app import App

    from homelab.engine.api import EngineMetrics
    from homelab.engine.loader import LoadReport
    from homelab.planner.plan import Plan
    from homelab.server.yielding import YieldController
    from homelab.tui.panels.plan import PlanController
    from homelab.tui.protocols import AnswerStream, DashboardEngine, ServerLike
    from homelab.tui.services import Loading, ModelChoice
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
        loading: Loading,
    ) -> None:
        self.app = app
        self.plans = plans  # what to load: the chosen model and its current plan
        self.frozen = frozen
        self.loading = loading  # --spec / --draft, the prompt cache: how every load is made
        self.engine: DashboardEngine | None = None
        self.holder = services.engine_holder()  # the engine the server serves (None: yielded)
        self.yielding: YieldController | None = None  # the loaded model's yield and resume
        self.served_name = "model"  # the id the server answers to (the loaded file's stem)
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
    def is_loading(self) -> bool:
        return busy(self.app, "load")

    @property
    def yielded(self) -> bool:
        """The loaded model has given its GPU back (or is giving it, or taking it again)."""
        return self.yielding is not None and self.yielding.state != "serving"

    @property
    def holds_model(self) -> bool:
        """A model is loaded, or yielded and waiting to be resumed."""
        return self.engine is not None or self.yielded

    # --- loading -------------------------------------------------------------------------

    def load(self) -> None:
        if self.yielded:
            self.app.notify(self.yield_hint(), title="The GPU is given back")
            return
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
        if self.is_loading:
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
        if not self.is_loading:
            self.load()

    def _load(self, choice: ModelChoice, plan: Plan) -> None:
        self._released.wait(RELEASE_WAIT_S)  # the previous model's memory must be free first
        started = time.perf_counter()
        loading = self.loading
        try:
            engine = services.load_engine(choice, plan, loading.speculation, loading.prompt_cache)
        except HomelabError as error:
            self.app.post_message(TaskFailed(LOADING, error, modal=True))
        else:
            took_s = time.perf_counter() - started
            self.app.post_message(ModelLoaded(engine, took_s, choice, plan))

    async def loaded(self, message: ModelLoaded) -> None:
        self._follow(message.engine)
        choice = message.choice or self.plans.choice
        if choice is not None and message.plan is not None:
            self.yielding = services.yield_controller(
                self.holder, choice, message.plan, self.plans.knobs, self.loading
            )
            self.yielding.subscribe(lambda: self.app.post_message(YieldChanged()))
        load_s = "–" if self.frozen else f"{message.load_s:.1f} s"
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
        self.engine = self.load_report = self.holder.engine = self.yielding = None
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
        """The app is closing: free the engine (and the prompt cache) here and now."""
        self._stop_metrics()
        if self.engine is not None:
            self.engine.close()
            self.engine = self.holder.engine = None
        if self.loading.prompt_cache is not None:
            self.loading.prompt_cache.close()

    # --- giving the GPU back -------------------------------------------------------------

    def toggle_yield(self) -> None:
        """Give the GPU back, or take it again (re-planned for the VRAM free now)."""
        controller = self.yielding
        if controller is None:
            self.app.notify("Load a model first.", title="Nothing to give back")
            return
        if busy(self.app, "yield"):
            return
        giving = controller.state == "serving"
        if giving:
            self._stop_metrics()
        self.panel.show_state("Giving the GPU back…" if giving else "Taking the GPU again…")
        work = functools.partial(services.yield_or_resume, controller)
        in_thread(self.app, work, name="yield_gpu", group="yield")

    def yield_changed(self) -> None:
        """Follow the engine a yield closed or a resume loaded; show the state and history."""
        controller = self.yielding
        if controller is None:
            return
        if self.holder.engine is not self.engine:
            self._follow(self.holder.engine)  # type: ignore[arg-type]
        self.panel.show_yields(list(controller.history), frozen=self.frozen)
        event = controller.current
        if self.yielded:
            self.panel.show_yielded(self.yield_hint())
            if event is not None and event.resume_error:
                self.app.notify(event.resume_error, title="Still yielded", severity="error")
            return
        resume_s = event.resume_s if event is not None and event.resume_s is not None else 0.0
        took = "–" if self.frozen else f"{resume_s:.1f} s (resumed)"
        self.panel.show_state(services.loaded_line(self.plans.choice, self.load_report, took))
        plan = getattr(controller.residency, "plan", None)
        if plan is not None:
            self.plans.adopt(plan)

    def yield_hint(self) -> str:
        status = self.yielding.status() if self.yielding is not None else {}
        reason = status.get("reason") or "asked"
        return f"yielded: {reason} — the GPU is free for other programs; y (ctrl+y) resumes"

    def _follow(self, engine: DashboardEngine | None) -> None:
        """Show ``engine`` (None: none is loaded) and take its metrics."""
        self._stop_metrics()
        self.engine = self.holder.engine = engine
        self.load_report = services.load_report(engine) if engine is not None else None
        if engine is not None:
            self.served_name = services.served_name(engine)
            self._unsubscribe = engine.subscribe(self.metrics.put, METRICS_INTERVAL_S)

    def _stop_metrics(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    # --- live numbers --------------------------------------------------------------------

    def show_metrics(self) -> None:
        metrics = self.metrics.take()
        if metrics is not None and self.engine is not None:
            self.panel.show_metrics(metrics, frozen=self.frozen)
