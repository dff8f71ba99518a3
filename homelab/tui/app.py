"""The homelab dashboard app: state, workers and the glue between them and the panels.

Blocking work (hardware detection, choosing and planning a model, loading it, generating,
starting the server, computing fit badges) runs in thread workers that cannot crash the app
(``exit_on_error=False``) and report back with past-tense messages (:mod:`homelab.tui.messages`).
Live numbers arrive from the engine's own thread through a :class:`Coalescer` (one UI message
at a time, whatever the token rate); streamed text is flushed to the chat at a steady rate.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.worker import Worker, WorkerState, get_current_worker

from homelab.errors import EngineError, HomelabError
from homelab.hardware.report import HardwareReport
from homelab.tui import services
from homelab.tui.hardware_source import (
    HardwareSource,
    LiveHardware,
    LocalHardware,
    live_from_report,
)
from homelab.tui.knobs import CONTEXT_CHOICES, KV_CHOICES, SLOT_CHOICES, Knobs, cycle
from homelab.tui.live import Coalescer, Inbox, PullProgress, TextBuffer
from homelab.tui.messages import (
    AnswerFinished,
    FitComputed,
    HardwareDetected,
    ModelChosen,
    ModelLoaded,
    ModelPulled,
    ModelsListed,
    ModelUnloaded,
    PlanComputed,
    PlanFailed,
    ServerStarted,
    ServerStopped,
    TaskFailed,
)
from homelab.tui.plan_view import plan_view
from homelab.tui.screens.dashboard import Dashboard
from homelab.tui.screens.error import ErrorScreen
from homelab.tui.screens.help import HelpScreen
from homelab.tui.screens.picker import ModelPicker
from homelab.tui.services import ModelChoice
from homelab.tui.widgets.chat import ChatPanel
from homelab.tui.widgets.hardware import HardwarePanel
from homelab.tui.widgets.live import LivePanel
from homelab.tui.widgets.plan import PlanPanel
from homelab.tui.widgets.server import ServerPanel

HARDWARE_REFRESH_S = 1.0
CHAT_FLUSH_S = 0.1  # streamed text reaches the screen at 10 Hz, however fast tokens come
METRICS_INTERVAL_S = 0.25
CHAT_TENANT = "tui"
RELEASE_WAIT_S = 60.0


def while_running(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Drop a worker's message that arrives while the app shuts down (its panels are gone)."""

    @functools.wraps(handler)
    async def guarded(self: HomelabApp, *args: Any) -> None:
        if not self.is_running:
            return
        result = handler(self, *args)
        if inspect.isawaitable(result):
            await result

    return guarded


class MetricsUpdated(Message):
    """Wake-up posted (at most one in flight) when the engine published new metrics."""


class PullProgressed(Message):
    """Wake-up posted (at most one in flight) when a download made progress."""


class RequestsLogged(Message):
    """Wake-up posted when the server logged requests (drained from an :class:`Inbox`)."""


class HomelabApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "homelab"
    SUB_TITLE = "choosing a model…"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("m", "pick_model", "Model"),
        Binding("l", "toggle_load", "Load"),
        Binding("s", "toggle_server", "Server"),
        Binding("ctrl+x", "cancel_answer", "Cancel", show=False),
        Binding("k", "cycle_knob('kv_type')", "KV type", show=False),
        Binding("c", "cycle_knob('n_ctx_per_slot')", "Context", show=False),
        Binding("p", "cycle_knob('n_parallel')", "Slots", show=False),
        Binding("r", "refresh_hardware", "Re-detect", show=False),
    ]

    def __init__(
        self,
        model: str | None = None,
        *,
        hardware_provider: HardwareSource | None = None,
        frozen_live: bool = False,
        server_host: str = "127.0.0.1",
        server_port: int = 8080,
        hardware_refresh_s: float = HARDWARE_REFRESH_S,
        verify_plans: bool = True,
        chat_max_tokens: int = services.CHAT_MAX_TOKENS,
    ) -> None:
        super().__init__()
        self.requested_model = model
        self.hardware_source: HardwareSource = hardware_provider or LocalHardware()
        self.frozen_live = frozen_live  # snapshots: hide numbers that vary run to run
        self.verify_plans = verify_plans
        self.chat_max_tokens = chat_max_tokens
        self.server_host = server_host
        self.server_port = server_port
        self.hardware_refresh_s = hardware_refresh_s
        self.report: HardwareReport | None = None
        self.choice: ModelChoice | None = None
        self.knobs = Knobs()
        self.plan: Any = None
        self.plan_generation = 0
        self.engine: Any = None
        self.load_report: Any = None
        self.server: Any = None
        self.answer: Any = None  # the RequestHandle being streamed
        self.answer_text = TextBuffer()
        self.metrics = Coalescer[Any](lambda: self.post_message(MetricsUpdated()))
        self.request_log = Inbox[Any]()
        self.pull_progress = Coalescer[tuple[str, int, int]](
            lambda: self.post_message(PullProgressed())
        )
        self._unsubscribe_metrics: Any = None
        self._after_load: list[str] = []  # actions to run once a load finishes (chat, serve)
        self._pending_prompt: str | None = None
        self._started = False
        self._released = threading.Event()  # set while no engine is being freed
        self._released.set()
        self.ticks = 0  # steady-rate UI timer ticks: proof the loop keeps running during a load

    # --- lifecycle -----------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return Dashboard()

    def _dashboard(self) -> Dashboard:
        for screen in self.screen_stack:
            if isinstance(screen, Dashboard):
                return screen
        raise RuntimeError("the dashboard is not on the screen stack")

    def start_session(self) -> None:
        """Called by the dashboard once its panels exist: detect, choose, plan, refresh."""
        if self._started:
            return
        self._started = True
        self.detect_hardware()
        self.choose_model(self.requested_model)
        self.set_interval(CHAT_FLUSH_S, self._flush_answer)
        if not self.frozen_live:
            self.set_interval(self.hardware_refresh_s, self.sample_hardware)

    async def on_unmount(self) -> None:
        self._shutdown_engine_and_server()

    def _shutdown_engine_and_server(self) -> None:
        if self.answer is not None:
            self.answer.cancel()
        if self.server is not None:
            self.server.stop()
            self.server = None
        self._close_engine()

    def _close_engine(self) -> None:
        if self._unsubscribe_metrics is not None:
            self._unsubscribe_metrics()
            self._unsubscribe_metrics = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # --- hardware ------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="hardware", exclusive=True)
    def detect_hardware(self) -> None:
        self.post_message(HardwareDetected(self.hardware_source.detect()))

    @work(thread=True, exit_on_error=False, group="hardware-sample", exclusive=True)
    def sample_hardware(self) -> None:
        live = self.hardware_source.sample()
        self.call_from_thread(self._show_live_hardware, live)

    @while_running
    def _show_live_hardware(self, live: LiveHardware) -> None:
        panel = self._dashboard().query_one(HardwarePanel)
        if panel.report is not None:
            panel.show_live(live, frozen=self.frozen_live)

    @while_running
    async def on_hardware_detected(self, message: HardwareDetected) -> None:
        self.report = message.report
        panel = self._dashboard().query_one(HardwarePanel)
        await panel.show_report(message.report)
        panel.show_live(live_from_report(message.report), frozen=self.frozen_live)
        self.request_plan()

    def action_refresh_hardware(self) -> None:
        self.detect_hardware()

    # --- choosing and planning -----------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="choose", exclusive=True)
    def choose_model(self, requested: str | None) -> None:
        try:
            self.post_message(ModelChosen(services.choose_model(requested)))
        except HomelabError as error:
            self.post_message(TaskFailed("choosing the model", error, modal=True))

    @while_running
    def on_model_chosen(self, message: ModelChosen) -> None:
        self.set_choice(message.choice)

    def set_choice(self, choice: ModelChoice) -> None:
        if self.engine is not None and self.choice != choice:
            self.unload()
        self.choice = choice
        self.sub_title = choice.title
        panel = self._dashboard().query_one(PlanPanel)
        panel.show_model(services.model_line(choice))
        if self.knobs.quant is not None:  # another model's quants mean nothing here
            self.knobs = Knobs(
                None, self.knobs.kv_type, self.knobs.n_ctx_per_slot, self.knobs.n_parallel
            )
            panel.set_knobs(self.knobs)
        self.request_plan()

    def request_plan(self) -> None:
        if self.report is None or self.choice is None:
            return
        self.plan_generation += 1
        self._dashboard().query_one(PlanPanel).show_planning()
        self.compute_plan(self.choice, self.report, self.knobs, self.plan_generation)

    @work(thread=True, exit_on_error=False, group="plan", exclusive=True)
    def compute_plan(
        self, choice: ModelChoice, report: HardwareReport, knobs: Knobs, generation: int
    ) -> None:
        """Plan at once from the memory model, then (for a local file) confirm it with a
        llama.cpp dry run and show the verified plan too."""
        try:
            plan = services.plan_choice(choice, report, knobs)
            self.post_message(PlanComputed(plan, generation))
            if self.verify_plans and choice.runnable and not get_current_worker().is_cancelled:
                verified = services.plan_choice(choice, report, knobs, verify=True)
                self.post_message(PlanComputed(verified, generation))
        except HomelabError as error:
            self.post_message(PlanFailed(error, generation))

    @while_running
    async def on_plan_computed(self, message: PlanComputed) -> None:
        if message.generation != self.plan_generation:
            return  # a newer knob change superseded this plan
        self.plan = message.plan
        panel = self._dashboard().query_one(PlanPanel)
        panel.set_quant_options(services.quant_options(message.plan))
        view = plan_view(message.plan, self.load_report if self.engine is not None else None)
        await panel.show_plan(view)
        if self.engine is not None and self.engine.settings != message.plan.settings:
            panel.show_stale_engine()

    @while_running
    async def on_plan_failed(self, message: PlanFailed) -> None:
        if message.generation != self.plan_generation:
            return
        self.plan = None
        panel = self._dashboard().query_one(PlanPanel)
        await panel.show_failure(message.error.title, str(message.error))

    @on(PlanPanel.KnobsChanged)
    def _knobs_changed(self, message: PlanPanel.KnobsChanged) -> None:
        self.knobs = message.knobs
        self.request_plan()

    def action_cycle_knob(self, name: str) -> None:
        choices: dict[str, tuple[object, ...]] = {
            "kv_type": KV_CHOICES,
            "n_ctx_per_slot": CONTEXT_CHOICES,
            "n_parallel": SLOT_CHOICES,
        }
        value = cycle(getattr(self.knobs, name), choices[name])
        self.knobs = self.knobs.with_value(name, "auto" if value is None else str(value))
        self._dashboard().query_one(PlanPanel).set_knobs(self.knobs)
        self.notify(f"{name.replace('_', ' ')}: {value or 'auto'}", title="Re-planning", timeout=2)
        self.request_plan()

    # --- loading -------------------------------------------------------------------------

    def action_toggle_load(self) -> None:
        if self.engine is not None:
            self.unload()
        else:
            self.load()

    def load(self) -> None:
        if self.choice is None or self.plan is None:
            self.notify("Wait for the plan to finish first.", title="Nothing to load yet")
            return
        if not self.choice.runnable:
            self._show_error(
                "loading",
                HomelabError(
                    f"{self.choice.label} is not on this machine.",
                    hint=f"Download it first: homelab pull {self.choice.ref}",
                ),
            )
            return
        if self._loading():
            return
        self._dashboard().query_one(LivePanel).show_state(f"Loading {self.choice.label}…")
        self.load_model(self.choice, self.plan)

    def _loading(self) -> bool:
        return any(w.group == "load" and w.is_running for w in self.workers)

    @work(thread=True, exit_on_error=False, group="load", exclusive=True)
    def load_model(self, choice: ModelChoice, plan: Any) -> None:
        self._released.wait(RELEASE_WAIT_S)  # the previous model's memory must be free first
        started = time.perf_counter()
        try:
            engine = services.load_engine(choice, plan)
        except HomelabError as error:
            self.post_message(TaskFailed("loading the model", error, modal=True))
        else:
            self.post_message(ModelLoaded(engine, time.perf_counter() - started))

    @while_running
    async def on_model_loaded(self, message: ModelLoaded) -> None:
        self.engine = message.engine
        self.load_report = services.load_report(message.engine)
        self._unsubscribe_metrics = message.engine.subscribe(self.metrics.put, METRICS_INTERVAL_S)
        live = self._dashboard().query_one(LivePanel)
        load_s = "–" if self.frozen_live else f"{message.load_s:.1f} s"
        live.show_state(services.loaded_line(self.choice, self.load_report, load_s))
        self._refresh_plan_view()
        self.notify(f"{self.choice.label if self.choice else 'model'} is ready.", title="Loaded")
        for action in self._after_load:
            await self.run_action(action)
        self._after_load.clear()

    def _refresh_plan_view(self) -> None:
        """Re-render the plan so it shows predicted next to actual."""
        if self.plan is not None:
            self.post_message(PlanComputed(self.plan, self.plan_generation))

    def unload(self) -> None:
        """Forget the engine (and server) now; free them in a worker (stopping a server and
        joining the engine's thread take a moment the UI must not wait for)."""
        engine, server, answer = self.engine, self.server, self.answer
        if self._unsubscribe_metrics is not None:
            self._unsubscribe_metrics()
            self._unsubscribe_metrics = None
        self.engine = self.server = self.load_report = None
        self._released.clear()
        self.release(engine, server, answer)

    @work(thread=True, exit_on_error=False, group="release")
    def release(self, engine: Any, server: Any, answer: Any) -> None:
        try:
            if answer is not None:
                answer.cancel()
            if server is not None:
                server.stop()
            if engine is not None:
                engine.close()
        finally:
            self._released.set()
            self.post_message(ModelUnloaded())

    @while_running
    def on_model_unloaded(self) -> None:
        if self.engine is not None:
            return  # another model was loaded meanwhile
        dashboard = self._dashboard()
        dashboard.query_one(LivePanel).show_unloaded()
        dashboard.query_one(ServerPanel).show_stopped()
        self._refresh_plan_view()

    @while_running
    def on_metrics_updated(self) -> None:
        metrics = self.metrics.take()
        if metrics is not None and self.engine is not None:
            self._dashboard().query_one(LivePanel).show_metrics(metrics, frozen=self.frozen_live)

    # --- chat ----------------------------------------------------------------------------

    @on(ChatPanel.PromptSubmitted)
    async def _prompt_submitted(self, message: ChatPanel.PromptSubmitted) -> None:
        await self.send_prompt(message.prompt)

    async def send_prompt(self, prompt: str) -> None:
        chat = self._dashboard().query_one(ChatPanel)
        if self.answer is not None:
            self.notify("Wait for the answer, or cancel it with Esc.", title="Still answering")
            return
        if self.engine is None:
            self._pending_prompt = prompt
            await chat.add_note("Loading the model first…")
            self._queue_after_load("send_pending_prompt")
            return
        await chat.begin_answer(prompt)
        try:
            self.answer = services.submit_chat(
                self.engine, chat.history, CHAT_TENANT, self.chat_max_tokens
            )
        except HomelabError as error:
            chat.finish_answer("error", None, frozen=self.frozen_live)
            self.notify(str(error), title=error.title, severity="error")
            return
        self.stream_answer(self.answer)

    async def action_send_pending_prompt(self) -> None:
        prompt, self._pending_prompt = self._pending_prompt, None
        if prompt is not None:
            await self.send_prompt(prompt)

    def _queue_after_load(self, action: str) -> None:
        if action not in self._after_load:
            self._after_load.append(action)
        if not self._loading():
            self.load()

    @work(thread=True, exit_on_error=False, group="answer")
    def stream_answer(self, handle: Any) -> None:
        try:
            for event in handle:
                text = getattr(event, "text", None)
                if text is not None:
                    self.answer_text.append(text)
                else:
                    self.post_message(AnswerFinished(event))
        except HomelabError as error:
            self.post_message(TaskFailed("answering", error))
            self.post_message(AnswerFinished(None))

    def _flush_answer(self) -> None:
        self.ticks += 1
        text = self.answer_text.drain()
        if text:
            self._dashboard().query_one(ChatPanel).stream(text)

    @while_running
    def on_answer_finished(self, message: AnswerFinished) -> None:
        self._flush_answer()
        self.answer = None
        finish = message.finish
        reason = getattr(finish, "reason", "error")
        chat = self._dashboard().query_one(ChatPanel)
        chat.finish_answer(reason, getattr(finish, "stats", None), frozen=self.frozen_live)
        if reason == "error" and getattr(finish, "error", None):
            self.notify(str(finish.error), title="The answer failed", severity="error")

    def action_cancel_answer(self) -> None:
        if self.answer is not None:
            self.answer.cancel()

    @on(ChatPanel.CancelRequested)
    def _cancel_requested(self) -> None:
        self.action_cancel_answer()

    # --- server --------------------------------------------------------------------------

    def action_toggle_server(self) -> None:
        if self.server is not None:
            self.stop_server(self.server)
            self.server = None
            return
        self._dashboard().show_panel("server")
        if self.engine is None:
            self._dashboard().query_one(ServerPanel).show_starting("loading the model first…")
            self._queue_after_load("toggle_server")
            return
        self._dashboard().query_one(ServerPanel).show_starting("starting…")
        self.start_server(self.engine)

    @on(ServerPanel.ToggleRequested)
    def _server_toggle_requested(self) -> None:
        self.action_toggle_server()

    @work(thread=True, exit_on_error=False, group="server", exclusive=True)
    def start_server(self, engine: Any) -> None:
        try:
            handle = services.start_server(
                engine, self.server_host, self.server_port, on_request=self._request_logged
            )
        except HomelabError as error:
            self.post_message(TaskFailed("starting the server", error, modal=True))
            self.post_message(ServerStopped())
        else:
            self.post_message(ServerStarted(handle))

    def _request_logged(self, entry: Any) -> None:
        self.request_log.add(entry)
        self.post_message(RequestsLogged())

    @while_running
    def on_server_started(self, message: ServerStarted) -> None:
        self.server = message.handle
        panel = self._dashboard().query_one(ServerPanel)
        panel.show_running(services.server_url(message.handle), services.keys_on(message.handle))
        self.notify(services.server_url(message.handle), title="Server running")

    @work(thread=True, exit_on_error=False, group="server", exclusive=True)
    def stop_server(self, handle: Any) -> None:
        handle.stop()
        self.post_message(ServerStopped())

    @while_running
    def on_server_stopped(self) -> None:
        self._dashboard().query_one(ServerPanel).show_stopped()

    @while_running
    def on_requests_logged(self) -> None:
        entries = self.request_log.drain()
        if entries:
            self._dashboard().query_one(ServerPanel).log_requests(entries, frozen=self.frozen_live)

    # --- model picker --------------------------------------------------------------------

    def action_pick_model(self) -> None:
        if isinstance(self.screen, ModelPicker):
            return
        picker = ModelPicker(current=self.choice)
        self.push_screen(picker, self._model_picked)
        self.list_models()

    def _model_picked(self, choice: ModelChoice | None) -> None:
        if choice is not None and choice != self.choice:
            self.set_choice(choice)

    @work(thread=True, exit_on_error=False, group="picker", exclusive=True)
    def list_models(self) -> None:
        choices = services.picker_choices()
        self.post_message(ModelsListed(choices))
        if self.report is None:
            return
        for choice in choices:
            badge = services.fit_badge(choice, self.report)
            self.post_message(FitComputed(choice, badge))

    @on(ModelPicker.DownloadRequested)
    def _download_requested(self, message: ModelPicker.DownloadRequested) -> None:
        if any(w.group == "pull" and w.is_running for w in self.workers):
            self.notify("One download at a time.", title="Already downloading")
            return
        self.pull_model(message.choice, message.quant)

    @work(thread=True, exit_on_error=False, group="pull", exclusive=True)
    def pull_model(self, choice: ModelChoice, quant: str | None) -> None:
        progress = PullProgress(self.pull_progress)
        try:
            local = services.pull_choice(choice, quant, progress)
        except HomelabError as error:
            self.post_message(TaskFailed("downloading the model", error, modal=True))
        else:
            self.post_message(ModelPulled(local, progress.notes))

    @while_running
    def on_pull_progressed(self) -> None:
        progress = self.pull_progress.take()
        if progress is not None and isinstance(self.screen, ModelPicker):
            self.screen.show_progress(*progress)

    @while_running
    def on_model_pulled(self, message: ModelPulled) -> None:
        notes = "".join(f"\n{note}" for note in message.notes)
        self.notify(f"{message.choice.label}{notes}", title="Downloaded")
        if isinstance(self.screen, ModelPicker):
            self.screen.dismiss(message.choice)  # _model_picked switches to it
        else:
            self.set_choice(message.choice)

    @while_running
    def on_models_listed(self, message: ModelsListed) -> None:
        if isinstance(self.screen, ModelPicker):
            self.screen.show_choices(message.choices)

    @while_running
    def on_fit_computed(self, message: FitComputed) -> None:
        if isinstance(self.screen, ModelPicker):
            self.screen.show_badge(message.choice, message.badge)

    # --- errors, help, palette -----------------------------------------------------------

    @while_running
    def on_task_failed(self, message: TaskFailed) -> None:
        if message.action == "loading the model":
            self._after_load.clear()
            self._dashboard().query_one(LivePanel).show_state(
                f"[b $error]Load failed:[/] {message.error.title}"
            )
        if message.modal:
            self._show_error(message.action, message.error)
        else:
            self.notify(str(message.error), title=message.error.title, severity="error")

    def _show_error(self, action: str, error: HomelabError) -> None:
        self.push_screen(ErrorScreen(action, error))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A bug in a worker must not kill the dashboard: say what failed instead."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        wrapped = (
            error
            if isinstance(error, HomelabError)
            else EngineError(
                f"{type(error).__name__}: {error}",
                hint="This is a bug in homelab; the dashboard keeps running.",
            )
        )
        self.notify(str(wrapped), title=f"{event.worker.name or 'task'} failed", severity="error")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand(
            "Pick a model", "Local files, catalogue and demo models", self.action_pick_model
        )
        yield SystemCommand(
            "Load / unload the model", "Load the planned model", self.action_toggle_load
        )
        yield SystemCommand(
            "Start / stop the server", "OpenAI-compatible endpoint", self.action_toggle_server
        )
        yield SystemCommand(
            "Cancel the answer", "Stop the answer being generated", self.action_cancel_answer
        )
        yield SystemCommand("Write a prompt", "Focus the chat box", self._focus_prompt)
        yield SystemCommand(
            "Re-detect hardware", "Read GPUs, CPU and RAM again", self.action_refresh_hardware
        )
        for kv_type in ("auto", *KV_CHOICES):
            yield SystemCommand(
                f"KV cache type: {kv_type}",
                "Re-plan with this K/V cache type",
                self._knob_setter("kv_type", kv_type),
            )
        for n_ctx in ("auto", *map(str, CONTEXT_CHOICES)):
            yield SystemCommand(
                f"Context per slot: {n_ctx}",
                "Re-plan with this context",
                self._knob_setter("n_ctx_per_slot", n_ctx),
            )
        for slots in ("auto", *map(str, SLOT_CHOICES)):
            yield SystemCommand(
                f"Slots: {slots}",
                "Re-plan with this many parallel slots",
                self._knob_setter("n_parallel", slots),
            )
        yield SystemCommand("Help", "Panels and keys", self.action_help)

    def _knob_setter(self, name: str, raw: str) -> Any:
        def apply() -> None:
            self.knobs = self.knobs.with_value(name, raw)
            self._dashboard().query_one(PlanPanel).set_knobs(self.knobs)
            self.request_plan()

        return apply

    def _focus_prompt(self) -> None:
        self._dashboard().action_focus_prompt()


def make_app(
    model: str | None = None,
    *,
    hardware_provider: HardwareSource | None = None,
    frozen_live: bool = False,
    server_host: str = "127.0.0.1",
    server_port: int = 8080,
    hardware_refresh_s: float = HARDWARE_REFRESH_S,
    verify_plans: bool | None = None,
    chat_max_tokens: int = services.CHAT_MAX_TOKENS,
) -> HomelabApp:
    """The app, configured; tests reuse this with fixed hardware and a demo model.

    ``verify_plans`` (default: on unless ``frozen_live``) confirms each plan with a llama.cpp
    dry run, whose timing text would make snapshots differ run to run.
    """
    return HomelabApp(
        model,
        hardware_provider=hardware_provider,
        frozen_live=frozen_live,
        server_host=server_host,
        server_port=server_port,
        hardware_refresh_s=hardware_refresh_s,
        verify_plans=not frozen_live if verify_plans is None else verify_plans,
        chat_max_tokens=chat_max_tokens,
    )
