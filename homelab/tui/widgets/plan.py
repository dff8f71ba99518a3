"""The Model & plan panel: knobs that re-plan instantly, the verdict, memory per device,
the capacity table and the planner's reasons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Label, Select, Static

from homelab.tui.format import human_tokens
from homelab.tui.knobs import AUTO, CONTEXT_CHOICES, KV_CHOICES, SLOT_CHOICES, Knobs
from homelab.tui.messages import KnobsChanged
from homelab.tui.plan_view import DeviceView, PlanView
from homelab.tui.widgets.bars import StackedBar

KNOB_IDS = {
    "quant": "knob-quant",
    "kv_type": "knob-kv",
    "n_ctx_per_slot": "knob-ctx",
    "n_parallel": "knob-slots",
}


def _options(
    values: tuple[object, ...], label: Callable[[Any], str] = str
) -> list[tuple[str, str]]:
    return [("auto", AUTO), *((label(value), str(value)) for value in values)]


class Knob(Horizontal):
    DEFAULT_CSS = """
    Knob { height: 1; }
    Knob Label { color: $text-muted; width: 9; }
    Knob Select { width: 1fr; max-width: 18; }
    """

    def __init__(self, label: str, name: str, options: list[tuple[str, str]]) -> None:
        super().__init__()
        self.label = label
        self.knob_name = name
        self.select: Select[str] = Select(
            options, value=AUTO, allow_blank=False, compact=True, id=KNOB_IDS[name]
        )

    def compose(self) -> ComposeResult:
        yield Label(self.label)
        yield self.select


class DeviceMemory(Vertical):
    """One device's predicted (and, after load, measured) memory split."""

    DEFAULT_CSS = """
    DeviceMemory { height: auto; margin-bottom: 1; }
    DeviceMemory .device-title, DeviceMemory .legend { height: auto; }
    DeviceMemory .legend { color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.title = Static(classes="device-title")
        self.bar = StackedBar()
        self.legend = Static(classes="legend")

    def compose(self) -> ComposeResult:
        yield self.title
        yield self.bar
        yield self.legend

    def show(self, device: DeviceView) -> None:
        self.title.update(device.title)
        self.bar.update(device.segments)
        self.legend.update(device.legend)


class PlanPanel(VerticalScroll):
    """Shows a plan; posts :class:`KnobsChanged` when a knob is turned."""

    DEFAULT_CSS = """
    PlanPanel #model-line { height: auto; }
    PlanPanel #knobs {
        layout: grid; grid-size: 2; grid-columns: 1fr 1fr; grid-rows: 1;
        height: auto; margin: 1 0 0 0;
    }
    PlanPanel #verdict, PlanPanel #settings-line, PlanPanel #stale { height: auto; }
    PlanPanel #stale { display: none; }
    PlanPanel #devices { height: auto; margin-top: 1; }
    PlanPanel #capacity { height: auto; }
    PlanPanel #reasons { height: auto; color: $text-muted; }
    PlanPanel #quality { height: auto; display: none; margin-top: 1; }
    PlanPanel .section { height: 1; color: $accent; text-style: bold; margin-top: 1; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Model & plan"
        self.knobs = Knobs()
        self.quants: tuple[str, ...] = ()
        self.view: PlanView | None = None  # what is on screen
        self.model_line = Static("choosing a model…", id="model-line")
        self.knob_rows = {
            "quant": Knob("quant", "quant", _options(())),
            "kv_type": Knob("KV", "kv_type", _options(KV_CHOICES)),
            "n_ctx_per_slot": Knob(
                "context", "n_ctx_per_slot", _options(CONTEXT_CHOICES, human_tokens)
            ),
            "n_parallel": Knob("slots", "n_parallel", _options(SLOT_CHOICES)),
        }
        self.verdict = Static(id="verdict")
        self.stale = Static(
            "[b $warning]The loaded model still runs the previous plan:[/] press "
            "[b]ctrl+l[/b] to unload, then [b]ctrl+l[/b] to load this one.",
            id="stale",
        )
        self.settings_line = Static(id="settings-line")
        self.devices = Vertical(id="devices")
        self.device_rows: list[DeviceMemory] = []
        self.capacity = Static(id="capacity")
        self.quality = Static(id="quality")
        self.reasons = Static(id="reasons")

    def compose(self) -> ComposeResult:
        yield self.model_line
        with Vertical(id="knobs"):
            yield from self.knob_rows.values()
        yield self.verdict
        yield self.stale
        yield self.settings_line
        yield self.devices
        yield Static("Context reachable (tokens per slot)", classes="section")
        yield self.capacity
        yield self.quality
        yield Static("Why", classes="section")
        yield self.reasons

    # --- knobs ---------------------------------------------------------------------------

    def set_quant_options(self, quants: tuple[str, ...]) -> None:
        if quants == self.quants:
            return
        self.quants = quants
        select = self.knob_rows["quant"].select
        with self.prevent(Select.Changed):
            select.set_options(_options(quants))
            select.value = self.knobs.quant if self.knobs.quant in quants else AUTO

    def set_knobs(self, knobs: Knobs) -> None:
        """Show ``knobs`` in the selects without re-posting a change."""
        self.knobs = knobs
        with self.prevent(Select.Changed):
            for name, row in self.knob_rows.items():
                value = getattr(knobs, name)
                wanted = AUTO if value is None else str(value)
                if any(option_value == wanted for _, option_value in row.select._options):
                    row.select.value = wanted

    @on(Select.Changed)
    def _knob_changed(self, event: Select.Changed) -> None:
        event.stop()
        name = next(name for name, row in self.knob_rows.items() if row.select is event.select)
        self.knobs = self.knobs.with_value(name, str(event.value))
        self.post_message(KnobsChanged(self.knobs))

    # --- the plan ------------------------------------------------------------------------

    def show_model(self, text: str) -> None:
        self.model_line.update(text)

    def show_planning(self) -> None:
        self.verdict.update("[dim]planning…[/]")

    def show_stale_engine(self) -> None:
        self.stale.display = True

    async def show_failure(self, title: str, message: str) -> None:
        """No plan: say why and what to do; the bars and tables of the last plan go."""
        self.view = None
        self.verdict.update(f"[b $error]✘ {escape(title)}[/]\n{escape(message)}")
        for static in (self.settings_line, self.capacity, self.quality, self.reasons):
            static.update("")
        await self._show_devices([])

    async def show_plan(self, view: PlanView) -> None:
        self.view = view
        self.stale.display = False
        self.verdict.update(view.verdict)
        self.settings_line.update(view.settings_line)
        await self._show_devices(view.devices)
        self.capacity.update(view.capacity)
        self.quality.update(view.quality)
        self.quality.display = bool(view.quality)
        self.reasons.update(view.reasons)

    async def _show_devices(self, devices: list[DeviceView]) -> None:
        if len(self.device_rows) != len(devices):
            await self.devices.remove_children()
            self.device_rows = [DeviceMemory() for _ in devices]
            await self.devices.mount_all(self.device_rows)
        for row, device in zip(self.device_rows, devices, strict=True):
            row.show(device)
