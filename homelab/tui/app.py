"""The homelab dashboard app: the composition root.

It shows the :class:`Dashboard` and, once the panels are mounted, gives each one its
controller (:mod:`homelab.tui.panels`: hardware, plan, live, chat, server, picker), which owns
that panel's state and workers. The app holds the keys and the command palette and routes
every message (:mod:`homelab.tui.messages`) to the controller it concerns; the few steps that
span panels are written here (another model unloads the loaded one; unloading stops the
server with it).

Keys: the chat's prompt has the focus whenever the chat is on screen at start, so typed text
reaches the model. Every action in the footer has a ctrl/F-key that works while typing; the
single letters (m, l, s, y, k, c, p, r, q, ?) are shortcuts for when the focus is elsewhere
(Esc leaves the prompt). ``ctrl+y`` / ``y`` gives the GPU back to another program and takes
it again (the live panel's controller; not in the footer: see the help and the palette).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from homelab.errors import EngineError, HomelabError
from homelab.tui import services
from homelab.tui.hardware_source import HardwareSource, LocalHardware
from homelab.tui.knobs import CONTEXT_CHOICES, KV_CHOICES, SLOT_CHOICES
from homelab.tui.messages import (
    AnswerFinished,
    DownloadRequested,
    FitComputed,
    HardwareDetected,
    ImageAttached,
    KnobsChanged,
    ModelChosen,
    ModelLoaded,
    ModelPulled,
    ModelsListed,
    PlanComputed,
    PlanFailed,
    PromptSubmitted,
    ServerStarted,
    TaskFailed,
)
from homelab.tui.panels.chat import ChatController
from homelab.tui.panels.hardware import HardwareController
from homelab.tui.panels.live import LOADING, LiveController
from homelab.tui.panels.picker import PickerController
from homelab.tui.panels.plan import PlanController
from homelab.tui.panels.server import ServerController
from homelab.tui.screens.dashboard import Dashboard
from homelab.tui.screens.error import ErrorScreen
from homelab.tui.screens.help import HelpScreen
from homelab.tui.services import ModelChoice

if TYPE_CHECKING:
    from homelab.engine.speculation.config import SpeculationConfig

HARDWARE_REFRESH_S = 1.0
CHAT_FLUSH_S = 0.1  # streamed text reaches the screen at 10 Hz, however fast tokens come


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


class HomelabApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "homelab"
    SUB_TITLE = "choosing a model…"
    BINDINGS: ClassVar[list[BindingType]] = [
        # shown in the footer; they work while typing in the prompt
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "help", "Help", key_display="F1"),
        Binding("ctrl+o", "pick_model", "Model"),
        Binding("ctrl+l", "toggle_load", "Load"),
        Binding("ctrl+s", "toggle_server", "Server"),
        Binding("ctrl+y", "toggle_yield", "Yield", tooltip="Give the GPU back, or take it again"),
        # ahead of the prompt's "cut", but only while an answer streams (see check_action)
        Binding("ctrl+x", "cancel_answer", "Cancel", show=False, priority=True),
        # single letters: when the focus is not in a text box
        Binding("q", "quit", "Quit", show=False),
        Binding("question_mark", "help", "Help", show=False),
        Binding("m", "pick_model", "Model", show=False),
        Binding("l", "toggle_load", "Load", show=False),
        Binding("s", "toggle_server", "Server", show=False),
        Binding("k", "cycle_knob('kv_type')", "KV type", show=False),
        Binding("c", "cycle_knob('n_ctx_per_slot')", "Context", show=False),
        Binding("p", "cycle_knob('n_parallel')", "Slots", show=False),
        Binding("r", "refresh_hardware", "Re-detect", show=False),
        Binding("u", "unload", "Unload", show=False),
        Binding("y", "toggle_yield", "Yield GPU", show=False),
    ]

    dashboard: Dashboard  # set once it is mounted

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
        chat_temperature: float = services.CHAT_TEMPERATURE,
        speculation: SpeculationConfig | None = None,
        rpc: tuple[str, ...] = (),
        rpc_budget_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.requested_model = model
        self.hardware_refresh_s = hardware_refresh_s
        self.frozen_live = frozen = frozen_live  # snapshots: hide numbers that vary per run
        # one controller per panel; each gets its widget once the dashboard is mounted
        source = hardware_provider or LocalHardware()
        budget = rpc_budget_bytes
        self.hardware = HardwareController(self, source, frozen=frozen, rpc=rpc, budget=budget)
        self.plans = PlanController(self, verify=verify_plans, rpc=rpc, rpc_budget_bytes=budget)
        loading = services.Loading(
            source, speculation, services.open_prompt_cache(), rpc, rpc_budget_bytes
        )
        self.live = LiveController(self, self.plans, frozen=frozen, loading=loading)
        self.chat = ChatController(
            self, self.live, max_tokens=chat_max_tokens, temperature=chat_temperature, frozen=frozen
        )
        self.serving = ServerController(
            self, self.live, host=server_host, port=server_port, frozen=frozen
        )
        self.picker = PickerController(self, self.plans, self.hardware, on_chosen=self.set_choice)
        self._started = False

    # --- lifecycle -----------------------------------------------------------------------

    def get_default_screen(self) -> Dashboard:
        return Dashboard(on_ready=self.start_session)

    def start_session(self, dashboard: Dashboard) -> None:
        """Called by the dashboard once its panels exist: detect, choose, plan, refresh."""
        if self._started:
            return
        self._started = True
        self.dashboard = dashboard
        self.hardware.attach(dashboard.hardware_panel)
        self.plans.attach(dashboard.plan_panel)
        self.live.attach(dashboard.live_panel)
        self.chat.attach(dashboard.chat_panel)
        self.serving.attach(dashboard)
        self.hardware.detect()
        self.plans.choose(self.requested_model)
        self.set_interval(CHAT_FLUSH_S, self.chat.flush)
        if self.frozen_live:  # a blinking cursor would make a different picture every 0.5 s
            dashboard.chat_panel.prompt.cursor_blink = False
        else:
            self.set_interval(self.hardware_refresh_s, self.hardware.sample)

    async def on_unmount(self) -> None:
        self.chat.cancel()
        server = self.serving.forget()
        if server is not None:
            server.stop()
        self.live.close()

    # --- steps that span panels ----------------------------------------------------------

    def set_choice(self, choice: ModelChoice) -> None:
        """Plan ``choice``; a different model than the loaded one unloads it."""
        if self.live.holds_model and self.plans.choice != choice:
            self.unload()
        self.plans.set_choice(choice)

    def unload(self) -> None:
        """Free the engine with the server and the answer that use it."""
        self.live.release(self.serving.forget(), self.chat.answer)

    # --- hardware ------------------------------------------------------------------------

    @while_running
    async def on_hardware_detected(self, message: HardwareDetected) -> None:
        await self.hardware.show_report(message.report, message.workers)
        self.plans.set_report(message.report)

    def action_refresh_hardware(self) -> None:
        self.hardware.detect()

    # --- model and plan ------------------------------------------------------------------

    @while_running
    def on_model_chosen(self, message: ModelChosen) -> None:
        self.set_choice(message.choice)

    @while_running
    async def on_plan_computed(self, message: PlanComputed) -> None:
        if await self.plans.show_plan(message, self.live.engine):
            self.live.plan_ready()

    @while_running
    async def on_plan_failed(self, message: PlanFailed) -> None:
        await self.plans.show_failure(message)

    def on_knobs_changed(self, message: KnobsChanged) -> None:
        self.plans.knobs_changed(message.knobs)

    def action_cycle_knob(self, name: str) -> None:
        value = self.plans.cycle_knob(name)
        self.notify(f"{name.replace('_', ' ')}: {value or 'auto'}", title="Re-planning", timeout=2)

    # --- loading and live numbers --------------------------------------------------------

    def action_toggle_load(self) -> None:
        if self.live.holds_model:
            self.unload()
        else:
            self.live.load()

    def action_unload(self) -> None:
        """Unload the model (the server panel's unload: it stops the server serving it)."""
        if self.live.holds_model:
            self.unload()

    # --- giving the GPU back -------------------------------------------------------------

    def action_toggle_yield(self) -> None:
        """Give the GPU back (the answer being written is cancelled first), or take it again."""
        if not self.live.yielded:
            self.chat.cancel()
        self.live.toggle_yield()

    @while_running
    def on_yield_changed(self) -> None:
        self.live.yield_changed()
        self.refresh_bindings()
        self.serving.show_models()

    def on_unload_requested(self) -> None:
        self.action_unload()

    @while_running
    async def on_model_loaded(self, message: ModelLoaded) -> None:
        await self.live.loaded(message)
        self.refresh_bindings()

    @while_running
    def on_model_unloaded(self) -> None:
        self.refresh_bindings()
        if self.live.engine is not None:
            return  # another model was loaded meanwhile
        self.live.show_unloaded()
        self.serving.show_stopped()
        self.plans.refresh_view()

    @while_running
    def on_metrics_updated(self) -> None:
        self.live.show_metrics()

    # --- chat ----------------------------------------------------------------------------

    async def on_prompt_submitted(self, message: PromptSubmitted) -> None:
        await self.chat.send(message.prompt)

    async def on_image_attached(self, message: ImageAttached) -> None:
        await self.chat.attached(message.attachment)

    @while_running
    def on_answer_finished(self, message: AnswerFinished) -> None:
        self.chat.finished(message)

    def action_cancel_answer(self) -> None:
        self.chat.cancel()

    def on_cancel_requested(self) -> None:
        self.chat.cancel()

    # --- server --------------------------------------------------------------------------

    def action_toggle_server(self) -> None:
        self.serving.toggle()

    def on_server_toggle_requested(self) -> None:
        self.serving.toggle()

    @while_running
    def on_server_started(self, message: ServerStarted) -> None:
        self.serving.started(message)

    @while_running
    def on_server_stopped(self) -> None:
        self.serving.show_stopped()

    @while_running
    def on_requests_logged(self) -> None:
        self.serving.show_log()

    # --- model picker --------------------------------------------------------------------

    def action_pick_model(self) -> None:
        self.picker.open()

    def on_download_requested(self, message: DownloadRequested) -> None:
        self.picker.download(message)

    @while_running
    def on_pull_progressed(self) -> None:
        self.picker.show_progress()

    @while_running
    def on_model_pulled(self, message: ModelPulled) -> None:
        self.picker.pulled(message)

    @while_running
    def on_models_listed(self, message: ModelsListed) -> None:
        self.picker.show_choices(message.choices)

    @while_running
    def on_fit_computed(self, message: FitComputed) -> None:
        self.picker.show_badge(message)

    # --- errors, help, palette -----------------------------------------------------------

    @while_running
    def on_task_failed(self, message: TaskFailed) -> None:
        if message.action == LOADING:
            self.live.load_failed(message.error)
        if message.modal:
            self.push_screen(ErrorScreen(message.action, message.error))
        else:
            self.notify(str(message.error), title=message.error.title, severity="error")

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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_answer":  # else ctrl+x is the prompt's "cut"
            return self.chat.answer is not None
        if action == "toggle_yield":  # None: shown dim, as nothing is loaded to give back
            return True if self.live.holds_model else None
        return True

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
            "Yield the GPU / resume",
            "Give the GPU to another program (conversations cached); again: take it back",
            self.action_toggle_yield,
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
                self.plans.knob_setter("kv_type", kv_type),
            )
        for n_ctx in ("auto", *map(str, CONTEXT_CHOICES)):
            yield SystemCommand(
                f"Context per slot: {n_ctx}",
                "Re-plan with this context",
                self.plans.knob_setter("n_ctx_per_slot", n_ctx),
            )
        for slots in ("auto", *map(str, SLOT_CHOICES)):
            yield SystemCommand(
                f"Slots: {slots}",
                "Re-plan with this many parallel slots",
                self.plans.knob_setter("n_parallel", slots),
            )
        yield SystemCommand("Help", "Panels and keys", self.action_help)

    def _focus_prompt(self) -> None:
        self.dashboard.action_focus_prompt()


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
    chat_temperature: float = services.CHAT_TEMPERATURE,
    speculation: SpeculationConfig | None = None,
    rpc: tuple[str, ...] = (),
    rpc_budget_bytes: int | None = None,
) -> HomelabApp:
    """The app, configured; tests reuse this with fixed hardware and a demo model.

    ``verify_plans`` (default: on unless ``frozen_live``) confirms each plan with a llama.cpp
    dry run, whose timing text would make snapshots differ run to run. ``speculation``
    (``--spec`` / ``--draft``) goes to every load; ``rpc`` (``--rpc``) workers are probed with
    the hardware, listed in its panel and planned with, each device capped at
    ``rpc_budget_bytes`` (``--rpc-budget``) when given.
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
        chat_temperature=chat_temperature,
        speculation=speculation,
        rpc=rpc,
        rpc_budget_bytes=rpc_budget_bytes,
    )
