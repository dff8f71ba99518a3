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
from homelab.tui.messages import ServerToggleRequested

if TYPE_CHECKING:
    from homelab.server.middleware import RequestRecord

LOG_COLUMNS = ("status", "route", "tenant", "prompt tok", "answer tok", "tok/s")
MAX_LOG_ROWS = 200


class ServerPanel(Vertical):
    DEFAULT_CSS = """
    ServerPanel #server-bar { height: 1; }
    ServerPanel #server-toggle { min-width: 16; margin-right: 1; }
    ServerPanel #server-status { width: 1fr; height: auto; }
    ServerPanel DataTable { height: 1fr; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Server"
        self.running = False
        self.toggle = Button("Start server", id="server-toggle", variant="success", compact=True)
        self.status = Static("stopped", id="server-status")
        self.log_table: DataTable[str] = DataTable(
            id="request-log", cursor_type="row", zebra_stripes=True
        )

    def compose(self) -> ComposeResult:
        with Horizontal(id="server-bar"):
            yield self.toggle
            yield self.status
        if not self.log_table.columns:  # (a DataTable measures labels with the running app)
            self.log_table.add_columns(*LOG_COLUMNS)
        yield self.log_table

    @on(Button.Pressed, "#server-toggle")
    def _toggle(self) -> None:
        self.post_message(ServerToggleRequested())

    def show_starting(self, text: str) -> None:
        self.status.update(f"[dim]{escape(text)}[/]")

    def show_running(self, url: str, keys_on: bool) -> None:
        self.running = True
        keys = (
            "[b $success]keys on[/]" if keys_on else "[b $warning]keys off[/] (anyone can call it)"
        )
        self.status.update(f"[b]{escape(url)}[/b] · {keys}")
        self._button("Stop server", "error")

    def show_stopped(self) -> None:
        self.running = False
        self.status.update("stopped")
        self._button("Start server", "success")

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
