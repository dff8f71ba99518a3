"""The dashboard: hardware, model & plan, live run, chat and server on one screen.

Wide terminals (≥ 120×36) show every panel in a grid; smaller ones (80×24) show one page at
a time — Overview (hardware + live run), Plan, Chat, Server — switched with 1–4 or the tabs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.events import Resize
from textual.screen import Screen
from textual.widget import Widget
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
    """The panels, laid out; ``on_ready`` (the app) is called once they are mounted.

    Focus: whenever the chat is on screen at start, or its page is opened, the prompt box
    has it, so typed text reaches the model; the app's keys that work while typing are
    ctrl/F-keys. A hidden prompt never keeps the focus.
    """

    AUTO_FOCUS = ""  # placed by hand: the prompt, once the layout (wide or paged) is known
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "page('overview')", "Overview", show=False),
        Binding("2", "page('plan')", "Plan", show=False),
        Binding("3", "page('chat')", "Chat", show=False),
        Binding("4", "page('server')", "Server", show=False),
        Binding("i", "focus_prompt", "Chat", tooltip="Write a prompt"),
    ]

    def __init__(self, on_ready: Callable[[Dashboard], None] | None = None) -> None:
        super().__init__()
        self.on_ready = on_ready
        self.page = "overview"
        self.wide = False
        self._laid_out = False
        self.hardware_panel = HardwarePanel(id="hardware", classes="panel")
        self.live_panel = LivePanel(id="live", classes="panel")
        self.plan_panel = PlanPanel(id="plan", classes="panel")
        self.chat_panel = ChatPanel(id="chat", classes="panel")
        self.server_panel = ServerPanel(id="server", classes="panel")
        self.panels: dict[str, Widget] = {
            "hardware": self.hardware_panel,
            "live": self.live_panel,
            "plan": self.plan_panel,
            "chat": self.chat_panel,
            "server": self.server_panel,
        }
        self.tabs = Tabs(
            *(
                Tab(f"{number} {page.title()}", id=f"tab-{page}")
                for number, page in enumerate(PAGES, 1)
            ),
            id="page-tabs",
        )

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield self.tabs
        with Grid(id="board"):
            yield from self.panels.values()
        yield Footer()

    def on_mount(self) -> None:
        if self.on_ready is not None:
            self.on_ready(self)

    def on_resize(self, event: Resize) -> None:
        wide = event.size.width >= WIDE_MIN_COLUMNS and event.size.height >= WIDE_MIN_ROWS
        self.wide = wide
        self.set_class(not wide, "-narrow")
        self._apply_page()
        if not self._laid_out:  # the first layout: a newcomer's first words go to the chat
            self._laid_out = True
            if self.chat_panel.display:
                self.chat_panel.prompt.focus()

    def action_page(self, page: str) -> None:
        self.show_page(page)

    def show_page(self, page: str) -> None:
        if self.tabs.active != f"tab-{page}":
            self.tabs.active = f"tab-{page}"
        self._enter_page(page)

    def show_panel(self, panel_id: str) -> None:
        """Make a panel visible (switching page on a narrow terminal)."""
        if not self.wide:
            self.show_page(PAGE_OF_PANEL[panel_id])

    @on(Tabs.TabActivated, "#page-tabs")
    def _tab_activated(self, event: Tabs.TabActivated) -> None:
        self._enter_page((event.tab.id or "tab-overview").removeprefix("tab-"))

    def _enter_page(self, page: str) -> None:
        opened = page != self.page
        self.page = page
        self._apply_page()
        if opened and page == "chat":
            self.chat_panel.prompt.focus()

    def _apply_page(self) -> None:
        for panel_id, panel in self.panels.items():
            panel.display = self.wide or PAGE_OF_PANEL[panel_id] == self.page
        if not self.chat_panel.display and self.chat_panel.prompt.has_focus:
            self.set_focus(None)  # typed text must not go into a box nobody sees

    def action_focus_prompt(self) -> None:
        self.show_panel("chat")
        self.chat_panel.prompt.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While the prompt has the focus, ``i`` is a letter: leave it out of the footer."""
        return not (action == "focus_prompt" and self.chat_panel.prompt.has_focus)
