"""A modal for errors the user must read: a title, what was wrong, what to do."""

from __future__ import annotations

from typing import ClassVar

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from homelab.errors import HomelabError


class ErrorScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,enter", "dismiss", "Close")]
    DEFAULT_CSS = """
    ErrorScreen { align: center middle; }
    ErrorScreen > Vertical {
        width: 80%; max-width: 90; height: auto; max-height: 90%;
        border: thick $error; background: $surface; padding: 1 2;
    }
    ErrorScreen #error-message { height: auto; }
    ErrorScreen #error-hint { height: auto; margin-top: 1; color: $text-muted; }
    ErrorScreen Button { margin-top: 1; }
    """

    def __init__(self, action: str, error: HomelabError) -> None:
        super().__init__()
        self.action = action
        self.error = error

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"{self.error.title} — {self.action}"
            yield Static(escape(self.error.message), id="error-message")
            if self.error.hint:
                yield Static(f"[b]What to do:[/b] {escape(self.error.hint)}", id="error-hint")
            yield Button("OK", variant="primary", id="error-ok")

    def on_button_pressed(self) -> None:
        self.dismiss()
