"""The Server panel: start/stop the OpenAI endpoint, its URL, keys, and a request log.

The log shows status, tenant, tokens and tok/s — never prompt text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Static
from textual.widgets.button import ButtonVariant

from homelab.tui.format import HIDDEN, rate
from homelab.tui.messages import ServerToggleRequested, UnloadRequested
from homelab.units import format_size

if TYPE_CHECKING:
    from homelab.server.middleware import RequestRecord
    from homelab.tui.services import ServedModel

LOG_COLUMNS = ("status", "route", "tenant", "prompt tok", "answer tok", "tok/s")
MAX_LOG_ROWS = 200


class ServerPanel(Vertical):
    DEFAULT_CSS = """
    ServerPanel #server-bar { height: 1; }
    ServerPanel #server-toggle { min-width: 16; margin-right: 1; }
    ServerPanel #server-status { width: 1fr; height: auto; }
    ServerPanel DataTable { height: 1fr; }
    ServerPanel #served { height: auto; display: none; }
    ServerPanel.-running #served { display: block; }
    ServerPanel #served-models { width: 1fr; height: auto; }
    ServerPanel #server-unload { min-width: 10; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Server"
        self.running = False
        self.toggle = Button("Start server", id="server-toggle", variant="success", compact=True)
        self.status = Static("stopped", id="server-status")
        self.served_list = Static(id="served-models")
        self.unload_button = Button("Unload", id="server-unload", variant="warning", compact=True)
        self.log_table: DataTable[str] = DataTable(
            id="request-log", cursor_type="row", zebra_stripes=True
        )

    def compose(self) -> ComposeResult:
        with Horizontal(id="server-bar"):
            yield self.toggle
            yield self.status
        with Horizontal(id="served"):
            yield self.served_list
            yield self.unload_button
        if not self.log_table.columns:  # (a DataTable measures labels with the running app)
            self.log_table.add_columns(*LOG_COLUMNS)
        yield self.log_table

    @on(Button.Pressed, "#server-toggle")
    def _toggle(self) -> None:
        self.post_message(ServerToggleRequested())

    @on(Button.Pressed, "#server-unload")
    def _unload(self) -> None:
        self.post_message(UnloadRequested())

    def show_models(self, models: tuple[ServedModel, ...]) -> None:
        """The models the running server has loaded, with planned and allocated memory."""
        self.served_list.update("\n".join(served_text(model) for model in models))

    def show_yielded(self, name: str, text: str) -> None:
        """The model the server serves has given its GPU back: requests wait, then 503."""
        self.served_list.update(f"[b $warning]yielded[/] {escape(name)} · {escape(text)}")

    def show_starting(self, text: str) -> None:
        self.status.update(f"[dim]{escape(text)}[/]")

    def show_running(self, url: str, keys_on: bool) -> None:
        self.running = True
        keys = (
            "[b $success]keys on[/]" if keys_on else "[b $warning]keys off[/] (anyone can call it)"
        )
        self.status.update(f"[b]{escape(url)}[/b] · {keys}")
        self._button("Stop server", "error")
        self.add_class("-running")

    def show_stopped(self) -> None:
        self.running = False
        self.status.update("stopped")
        self._button("Start server", "success")
        self.remove_class("-running")
        self.served_list.update("")

    def _button(self, label: str, variant: ButtonVariant) -> None:
        self.toggle.label = label
        self.toggle.variant = variant

    def log_requests(self, entries: list[RequestRecord], *, frozen: bool) -> None:
        table = self.log_table
        for entry in entries:
            table.add_row(*log_row(entry, frozen=frozen))
        while table.row_count > MAX_LOG_ROWS:
            table.remove_row(next(iter(table.rows)))
        if entries:
            table.move_cursor(row=table.row_count - 1)


def served_text(model: ServedModel) -> str:
    """ "loaded qwen3-8b · 2 slots · planned 5.1 GiB · allocated 5.0 GiB  (u unloads)"."""
    planned = "–" if model.planned_bytes is None else format_size(model.planned_bytes, digits=1)
    allocated = (
        "–" if model.allocated_bytes is None else format_size(model.allocated_bytes, digits=1)
    )
    noun = "slot" if model.n_slots == 1 else "slots"
    return (
        f"[b]loaded[/b] {escape(model.name)} · {model.n_slots} {noun} · "
        f"planned {planned} · allocated {allocated}  [dim](u unloads)[/]"
    )


def log_row(entry: RequestRecord, *, frozen: bool) -> tuple[str, ...]:
    """A request record as table cells."""
    return (
        str(entry.status),
        entry.route,
        entry.tenant,
        str(entry.prompt_tokens),
        str(entry.completion_tokens),
        HIDDEN if frozen else rate(entry.completion_tok_s),
    )
