"""The model picker: local GGUF files, catalogue models and the demo, each with a fit badge."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from homelab.tui.format import human_bytes
from homelab.tui.services import FitBadge, ModelChoice

COLUMNS = ("model", "size", "where", "fit on this machine")
BADGE_STYLES = {"good": "bold green", "ok": "green", "offload": "yellow", "no": "bold red"}


class ModelPicker(ModalScreen[ModelChoice | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Close"),
        Binding("enter", "choose", "Use model", priority=True),
    ]
    DEFAULT_CSS = """
    ModelPicker { align: center middle; }
    ModelPicker > Vertical {
        width: 96%; max-width: 140; height: 90%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    ModelPicker #picker-filter { margin-bottom: 1; }
    ModelPicker DataTable { height: 1fr; }
    ModelPicker #picker-hint { height: 1; color: $text-muted; }
    """

    def __init__(self, current: ModelChoice | None = None) -> None:
        super().__init__()
        self.current = current
        self.choices: list[ModelChoice] = []
        self.badges: dict[str, FitBadge] = {}

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Pick a model"
            box.border_subtitle = "enter: use · esc: close"
            yield Input(placeholder="filter by name…", id="picker-filter", compact=True)
            table: DataTable[Text] = DataTable(id="picker-table", cursor_type="row")
            for column in COLUMNS:
                table.add_column(column, key=column)
            yield table
            yield Static("listing models…", id="picker-hint")

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()

    def show_choices(self, choices: list[ModelChoice]) -> None:
        self.choices = choices
        self._fill()
        hint = f"{len(choices)} models · fit badges are computed by the planner for this machine"
        self.query_one("#picker-hint", Static).update(hint)

    def show_badge(self, choice: ModelChoice, badge: FitBadge) -> None:
        self.badges[choice.ref] = badge
        table = self.query_one(DataTable)
        if choice.ref in table.rows:
            table.update_cell(choice.ref, "fit on this machine", badge_text(badge))

    @on(Input.Changed, "#picker-filter")
    def _filter(self) -> None:
        self._fill()

    def _visible(self) -> list[ModelChoice]:
        wanted = self.query_one("#picker-filter", Input).value.strip().lower()
        return [c for c in self.choices if wanted in f"{c.label} {c.detail} {c.ref}".lower()]

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for choice in self._visible():
            badge = self.badges.get(choice.ref)
            table.add_row(
                Text(choice.title, style="bold" if choice == self.current else ""),
                Text(human_bytes(choice.size_bytes), justify="right"),
                Text(choice.detail, style="dim"),
                badge_text(badge) if badge else Text("planning…", style="dim"),
                key=choice.ref,
            )

    def action_choose(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        self.dismiss(next((c for c in self.choices if c.ref == key), None))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


def badge_text(badge: FitBadge) -> Text:
    return Text(badge.label, style=BADGE_STYLES.get(badge.level, ""))
