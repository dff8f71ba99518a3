"""The model picker: local GGUF files, catalogue models and the demo, each with a fit badge."""

from __future__ import annotations

from typing import ClassVar

from rich.markup import escape
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, ProgressBar, Static

from homelab.tui.messages import DownloadRequested
from homelab.tui.services import FitBadge, ModelChoice
from homelab.units import format_size

COLUMNS = ("model", "size", "where", "fit on this machine")
BADGE_STYLES = {"good": "bold green", "ok": "green", "offload": "yellow", "no": "bold red"}


class ModelPicker(ModalScreen[ModelChoice | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Close"),
        Binding("enter", "choose", "Use model", priority=True),
        Binding("d", "download", "Download"),
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
    ModelPicker #pull { height: auto; display: none; }
    ModelPicker #pull.-active { display: block; }
    ModelPicker #pull-label { height: 1; }
    """

    def __init__(self, current: ModelChoice | None = None) -> None:
        super().__init__()
        self.current = current
        self.choices: list[ModelChoice] = []
        self.badges: dict[str, FitBadge] = {}
        self.filter = Input(placeholder="filter by name…", id="picker-filter", compact=True)
        self.table: DataTable[Text] = DataTable(id="picker-table", cursor_type="row")
        self.hint = Static("listing models…", id="picker-hint")
        self.pull = Vertical(id="pull")
        self.pull_label = Static(id="pull-label")
        self.pull_bar = ProgressBar(id="pull-bar", show_eta=False)

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Pick a model"
            box.border_subtitle = "enter: use · d: download · esc: close"
            yield self.filter
            if not self.table.columns:  # (a DataTable measures labels with the running app)
                for column in COLUMNS:
                    self.table.add_column(column, key=column)
            yield self.table
            yield self.hint
            with self.pull:
                yield self.pull_label
                yield self.pull_bar

    def on_mount(self) -> None:
        self.table.focus()

    def show_choices(self, choices: list[ModelChoice]) -> None:
        self.choices = choices
        self._fill()
        hint = f"{len(choices)} models · fit badges are computed by the planner for this machine"
        self.hint.update(hint)

    def show_badge(self, choice: ModelChoice, badge: FitBadge) -> None:
        self.badges[choice.ref] = badge
        if choice.ref in self.table.rows:
            self.table.update_cell(choice.ref, "fit on this machine", badge_text(badge))

    @on(Input.Changed, "#picker-filter")
    def _filter(self) -> None:
        self._fill()

    def _visible(self) -> list[ModelChoice]:
        wanted = self.filter.value.strip().lower()
        return [c for c in self.choices if wanted in f"{c.label} {c.detail} {c.ref}".lower()]

    def _fill(self) -> None:
        table = self.table
        table.clear()
        for choice in self._visible():
            badge = self.badges.get(choice.ref)
            table.add_row(
                Text(choice.title, style="bold" if choice == self.current else ""),
                Text(format_size(choice.size_bytes, digits=1), justify="right"),
                Text(choice.detail, style="dim"),
                badge_text(badge) if badge else Text("planning…", style="dim"),
                key=choice.ref,
            )

    def highlighted(self) -> ModelChoice | None:
        table = self.table
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((c for c in self.choices if c.ref == key), None)

    def action_choose(self) -> None:
        choice = self.highlighted()
        if choice is not None:
            self.dismiss(choice)

    def action_download(self) -> None:
        choice = self.highlighted()
        if choice is None:
            return
        if choice.runnable:
            self.notify(f"{choice.label} is already on this machine.", title="Nothing to download")
            return
        badge = self.badges.get(choice.ref)
        self.post_message(DownloadRequested(choice, badge.quant if badge else None))

    def show_progress(self, label: str, done_bytes: int, total_bytes: int) -> None:
        self.pull.add_class("-active")
        self.pull_label.update(
            f"Downloading {escape(label)}: "
            f"{format_size(done_bytes, digits=1)} of {format_size(total_bytes, digits=1)}"
        )
        self.pull_bar.update(total=max(total_bytes, 1), progress=done_bytes)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


def badge_text(badge: FitBadge) -> Text:
    return Text(badge.label, style=BADGE_STYLES.get(badge.level, ""))
