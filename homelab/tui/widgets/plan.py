"""The Model & plan panel: knobs that re-plan instantly, the verdict, memory per device,
the capacity table and the planner's reasons."""

from __future__ import annotations

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Label, Select, Static

from homelab.tui.format import human_tokens
from homelab.tui.knobs import AUTO, CONTEXT_CHOICES, KV_CHOICES, SLOT_CHOICES, Knobs
from homelab.tui.plan_view import PlanView
from homelab.tui.widgets.bars import StackedBar

KNOB_IDS = {
    "quant": "knob-quant",
    "kv_type": "knob-kv",
    "n_ctx_per_slot": "knob-ctx",
    "n_parallel": "knob-slots",
}


def _options(values: tuple[object, ...], label: object = str) -> list[tuple[str, str]]:
    return [("auto", AUTO), *((label(value), str(value)) for value in values)]  # type: ignore[operator]


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
        self.options = options

    def compose(self) -> ComposeResult:
        yield Label(self.label)
        yield Select(
            self.options, value=AUTO, allow_blank=False, compact=True, id=KNOB_IDS[self.knob_name]
        )


class DeviceMemory(Vertical):
    """One device's predicted (and, after load, measured) memory split."""

    DEFAULT_CSS = """
    DeviceMemory { height: auto; margin-bottom: 1; }
    DeviceMemory .device-title, DeviceMemory .legend { height: auto; }
    DeviceMemory .legend { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static(classes="device-title")
        yield StackedBar()
        yield Static(classes="legend")


class PlanPanel(VerticalScroll):
    """Shows a plan; posts :class:`PlanPanel.KnobsChanged` when a knob is turned."""

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

    class KnobsChanged(Message):
        def __init__(self, knobs: Knobs) -> None:
            super().__init__()
            self.knobs = knobs

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Model & plan"
        self.knobs = Knobs()
        self.quants: tuple[str, ...] = ()
        self.view: PlanView | None = None  # what is on screen

    def compose(self) -> ComposeResult:
        yield Static("choosing a model…", id="model-line")
        with Vertical(id="knobs"):
            yield Knob("quant", "quant", _options(()))
            yield Knob("KV", "kv_type", _options(KV_CHOICES))
            yield Knob("context", "n_ctx_per_slot", _options(CONTEXT_CHOICES, human_tokens))
            yield Knob("slots", "n_parallel", _options(SLOT_CHOICES))
        yield Static(id="verdict")
        yield Static(
            "[b $warning]The loaded model still runs the previous plan:[/] press [b]l[/b] to "
            "unload, then [b]l[/b] to load this one.",
            id="stale",
        )
        yield Static(id="settings-line")
        yield Vertical(id="devices")
        yield Static("Context reachable (tokens per slot)", classes="section")
        yield Static(id="capacity")
        yield Static(id="quality")
        yield Static("Why", classes="section")
        yield Static(id="reasons")

    # --- knobs ---------------------------------------------------------------------------

    def set_quant_options(self, quants: tuple[str, ...]) -> None:
        if quants == self.quants:
            return
        self.quants = quants
        select = self.query_one(f"#{KNOB_IDS['quant']}", Select)
        with self.prevent(Select.Changed):
            select.set_options(_options(quants))
            select.value = self.knobs.quant if self.knobs.quant in quants else AUTO

    def set_knobs(self, knobs: Knobs) -> None:
        """Show ``knobs`` in the selects without re-posting a change."""
        self.knobs = knobs
        with self.prevent(Select.Changed):
            for name, select_id in KNOB_IDS.items():
                value = getattr(knobs, name)
                select = self.query_one(f"#{select_id}", Select)
                wanted = AUTO if value is None else str(value)
                if any(option_value == wanted for _, option_value in select._options):
                    select.value = wanted

    @on(Select.Changed)
    def _knob_changed(self, event: Select.Changed) -> None:
        event.stop()
        name = next(name for name, select_id in KNOB_IDS.items() if select_id == event.select.id)
        self.knobs = self.knobs.with_value(name, str(event.value))
        self.post_message(self.KnobsChanged(self.knobs))

    # --- the plan ------------------------------------------------------------------------

    def show_model(self, text: str) -> None:
        self.query_one("#model-line", Static).update(text)

    def show_planning(self) -> None:
        self.query_one("#verdict", Static).update("[dim]planning…[/]")

    def show_stale_engine(self) -> None:
        self.query_one("#stale").display = True

    async def show_failure(self, title: str, message: str) -> None:
        """No plan: say why and what to do; the bars and tables of the last plan go."""
        self.view = None
        self.query_one("#verdict", Static).update(
            f"[b $error]✘ {escape(title)}[/]\n{escape(message)}"
        )
        for selector in ("#settings-line", "#capacity", "#quality", "#reasons"):
            self.query_one(selector, Static).update("")
        await self.query_one("#devices", Vertical).remove_children()

    async def show_plan(self, view: PlanView) -> None:
        self.view = view
        self.query_one("#stale").display = False
        self.query_one("#verdict", Static).update(view.verdict)
        self.query_one("#settings-line", Static).update(view.settings_line)
        await self._show_devices(view)
        self.query_one("#capacity", Static).update(view.capacity)
        quality = self.query_one("#quality", Static)
        quality.update(view.quality)
        quality.display = bool(view.quality)
        self.query_one("#reasons", Static).update(view.reasons)

    async def _show_devices(self, view: PlanView) -> None:
        devices = self.query_one("#devices", Vertical)
        rows = list(devices.query(DeviceMemory))
        if len(rows) != len(view.devices):
            await devices.remove_children()
            rows = [DeviceMemory() for _ in view.devices]
            await devices.mount_all(rows)
        for row, device in zip(rows, view.devices, strict=True):
            row.query_one(".device-title", Static).update(device.title)
            row.query_one(StackedBar).update(device.segments)
            row.query_one(".legend", Static).update(device.legend)
