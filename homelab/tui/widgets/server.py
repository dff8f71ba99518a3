"""The Server panel: start/stop the OpenAI endpoint, its URL, keys, and a request log.

The log shows status, tenant, tokens and tok/s — never prompt text.
"""

from __future__ import annotations

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, DataTable, Static

from homelab.tui.format import HIDDEN, rate

LOG_COLUMNS = ("status", "route", "tenant", "prompt tok", "answer tok", "tok/s")
MAX_LOG_ROWS = 200


class ServerPanel(Vertical):
    DEFAULT_CSS = """
    ServerPanel #server-bar { height: 1; }
    ServerPanel #server-toggle { min-width: 16; margin-right: 1; }
    ServerPanel #server-status { width: 1fr; height: auto; }
    ServerPanel DataTable { height: 1fr; }
    """

    class ToggleRequested(Message):
        pass

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Server"
        self.running = False

    def compose(self) -> ComposeResult:
        with Horizontal(id="server-bar"):
            yield Button("Start server", id="server-toggle", variant="success", compact=True)
            yield Static("stopped", id="server-status")
        table: DataTable[str] = DataTable(id="request-log", cursor_type="row", zebra_stripes=True)
        table.add_columns(*LOG_COLUMNS)
        yield table

    @on(Button.Pressed, "#server-toggle")
    def _toggle(self) -> None:
        self.post_message(self.ToggleRequested())

    def show_starting(self, text: str) -> None:
        self.query_one("#server-status", Static).update(f"[dim]{escape(text)}[/]")

    def show_running(self, url: str, keys_on: bool) -> None:
        self.running = True
        keys = (
            "[b $success]keys on[/]" if keys_on else "[b $warning]keys off[/] (anyone can call it)"
        )
        self.query_one("#server-status", Static).update(f"[b]{escape(url)}[/b] · {keys}")
        self._button("Stop server", "error")

    def show_stopped(self) -> None:
        self.running = False
        self.query_one("#server-status", Static).update("stopped")
        self._button("Start server", "success")

    def _button(self, label: str, variant: str) -> None:
        button = self.query_one("#server-toggle", Button)
        button.label = label
        button.variant = variant  # type: ignore[assignment]

    def log_requests(self, entries: list[object], *, frozen: bool) -> None:
        table = self.query_one("#request-log", DataTable)
        for entry in entries:
            table.add_row(*log_row(entry, frozen=frozen))
        while table.row_count > MAX_LOG_ROWS:
            table.remove_row(next(iter(table.rows)))
        if entries:
            table.move_cursor(row=table.row_count - 1)


def log_row(entry: object, *, frozen: bool) -> tuple[str, ...]:
    """A request record (homelab.server.middleware.RequestRecord) as table cells."""
    tok_s = getattr(entry, "completion_tok_s", None)
    return (
        str(getattr(entry, "status", "?")),
        str(getattr(entry, "route", "")),
        str(getattr(entry, "tenant", "?")),
        str(getattr(entry, "prompt_tokens", "")),
        str(getattr(entry, "completion_tokens", "")),
        HIDDEN if frozen else rate(tok_s),
    )
