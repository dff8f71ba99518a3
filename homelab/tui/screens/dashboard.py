"""The dashboard: hardware, model & plan, live run, chat and server on one screen.

Wide terminals (≥ 120×36) show every panel in a grid; smaller ones (80×24) show one page at
a time — Overview (hardware + live run), Plan, Chat, Server — switched with 1–4 or the tabs.
"""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Footer, Header, Tab, Tabs

from homelab.tui.widgets.chat import ChatPanel
from homelab.tui.widgets.hardware import HardwarePanel
from homelab.tui.widgets.live import LivePanel
from homelab.tui.widgets.plan import PlanPanel
from homelab.tui.widgets.server import ServerPanel

WIDE_MIN_COLUMNS = 120
WIDE_MIN_ROWS = 36
PAGES = ("overview", "plan", "chat", "server")
PAGE_OF_PANEL = {
    "hardware": "overview",
    "live": "overview",
    "plan": "plan",
    "chat": "chat",
    "server": "server",
}


class Dashboard(Screen[None]):
    AUTO_FOCUS = ""  # nothing focused: single-key bindings work at once
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "page('overview')", "Overview", show=False),
        Binding("2", "page('plan')", "Plan", show=False),
        Binding("3", "page('chat')", "Chat", show=False),
        Binding("4", "page('server')", "Server", show=False),
        Binding("i", "focus_prompt", "Chat", tooltip="Write a prompt"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.page = "overview"
        self.wide = False

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Tabs(
            *(
                Tab(f"{number} {page.title()}", id=f"tab-{page}")
                for number, page in enumerate(PAGES, 1)
            ),
            id="page-tabs",
        )
        with Grid(id="board"):
            yield HardwarePanel(id="hardware", classes="panel")
            yield LivePanel(id="live", classes="panel")
            yield PlanPanel(id="plan", classes="panel")
            yield ChatPanel(id="chat", classes="panel")
            yield ServerPanel(id="server", classes="panel")
        yield Footer()

    def on_mount(self) -> None:
        start_session = getattr(self.app, "start_session", None)
        if start_session is not None:
            start_session()

    def on_resize(self, event: Resize) -> None:
        wide = event.size.width >= WIDE_MIN_COLUMNS and event.size.height >= WIDE_MIN_ROWS
        self.wide = wide
        self.set_class(not wide, "-narrow")
        self._apply_page()

    def action_page(self, page: str) -> None:
        self.show_page(page)

    def show_page(self, page: str) -> None:
        self.page = page
        tabs = self.query_one("#page-tabs", Tabs)
        if tabs.active != f"tab-{page}":
            tabs.active = f"tab-{page}"
        self._apply_page()

    def show_panel(self, panel_id: str) -> None:
        """Make a panel visible (switching page on a narrow terminal)."""
        if not self.wide:
            self.show_page(PAGE_OF_PANEL[panel_id])

    @on(Tabs.TabActivated, "#page-tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        page = (event.tab.id or "tab-overview").removeprefix("tab-")
        if page != self.page:
            self.page = page
            self._apply_page()

    def _apply_page(self) -> None:
        for panel_id, page in PAGE_OF_PANEL.items():
            self.query_one(f"#{panel_id}").display = self.wide or page == self.page

    def action_focus_prompt(self) -> None:
        self.show_panel("chat")
        self.query_one("#prompt").focus()
