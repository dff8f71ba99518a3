"""The Chat panel: a transcript, a prompt box, the streamed answer with its tok/s."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Input, Static

from homelab.server.reasoning import THINK_CLOSE, THINK_OPEN, split_think_text
from homelab.tui.format import HIDDEN, rate, seconds
from homelab.tui.messages import CancelRequested, PromptSubmitted

if TYPE_CHECKING:
    from homelab.engine.api import RequestStats
    from homelab.images.decoded import DecodedImage


class ChatMessage(Static):
    """One turn; the assistant's grows while it streams. A reasoning model's thinking is shown
    dimmed while it lasts, then folded to one line above the answer."""

    DEFAULT_CSS = """
    ChatMessage { height: auto; margin: 0 0 1 0; padding: 0 1; }
    ChatMessage.user { color: $text; background: $boost; border-left: thick $accent; }
    ChatMessage.assistant { border-left: thick $success; }
    ChatMessage.assistant.-streaming { border-left: thick $warning; }
    ChatMessage.note { color: $text-muted; border-left: thick $panel; }
    """

    def __init__(self, role: str, text: str = "") -> None:
        super().__init__(Text(text), classes=role, markup=False)
        self.role = role
        self.text = text

    def append(self, text: str) -> None:
        self.text += text
        self.update(self.shown())

    def thinks(self) -> bool:
        return self.role == "assistant" and (THINK_OPEN in self.text or THINK_CLOSE in self.text)

    def shown(self) -> Text:
        if not self.thinks():
            return Text(self.text)
        reasoning, answer, closed = split_think_text(self.text)
        shown = Text()
        if reasoning and closed:
            shown.append(f"▸ thought ({len(reasoning.split())} words)\n", style="dim italic")
        elif reasoning:
            shown.append(reasoning + "\n", style="dim italic")
        shown.append(answer)
        return shown

    @property
    def answer(self) -> str:
        """The text without its thinking (what the next turn's template is given)."""
        return split_think_text(self.text)[1] if self.thinks() else self.text


class ChatPanel(Vertical):
    """Posts :class:`PromptSubmitted`; the app streams the answer back into it."""

    DEFAULT_CSS = """
    ChatPanel #transcript { height: 1fr; }
    ChatPanel #prompt { dock: bottom; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel / leave")]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.border_title = "Chat"
        self.history: list[dict[str, str]] = []  # role/content turns handed to the chat template
        self.images: list[DecodedImage] = []  # the conversation's images, in marker order
        self.streaming: ChatMessage | None = None
        self.transcript = VerticalScroll(id="transcript")
        self.prompt = Input(placeholder="Ask the model…  (Enter sends, Esc cancels)", id="prompt")

    def compose(self) -> ComposeResult:
        with self.transcript:
            yield ChatMessage("note", "Type a prompt and press Enter. Esc cancels an answer.")
        yield self.prompt

    @on(Input.Submitted, "#prompt")
    def _submitted(self, event: Input.Submitted) -> None:
        prompt = event.value.strip()
        if prompt:
            event.input.clear()
            self.post_message(PromptSubmitted(prompt))

    def action_cancel(self) -> None:
        if self.streaming is not None:
            self.post_message(CancelRequested())
        else:
            self.screen.set_focus(None)

    async def begin_answer(self, prompt: str, turn_text: str | None = None) -> None:
        """Show ``prompt`` and stream the answer below it; ``turn_text`` is what the template
        gets for the turn (its images' markers first), when it differs."""
        self.history.append({"role": "user", "content": turn_text or prompt})
        self.streaming = ChatMessage("assistant")
        self.streaming.add_class("-streaming")
        await self.transcript.mount_all([ChatMessage("user", prompt), self.streaming])
        self.transcript.scroll_end(animate=False)

    def stream(self, text: str) -> None:
        if self.streaming is not None and text:
            self.streaming.append(text)
            self.transcript.scroll_end(animate=False)

    def finish_answer(self, reason: str, stats: RequestStats | None, *, frozen: bool) -> None:
        message, self.streaming = self.streaming, None
        if message is None:
            return
        message.remove_class("-streaming")
        self.history.append({"role": "assistant", "content": message.answer})
        footer = answer_footer(reason, stats, frozen=frozen)
        message.append(f"\n— {footer}")

    async def add_note(self, text: str) -> None:
        await self.transcript.mount(ChatMessage("note", text))
        self.transcript.scroll_end(animate=False)


def answer_footer(reason: str, stats: RequestStats | None, *, frozen: bool) -> str:
    tokens = 0 if stats is None else stats.completion_tokens
    decode = HIDDEN if frozen else rate(None if stats is None else stats.decode_tok_s)
    ttft = HIDDEN if frozen else seconds(None if stats is None else stats.ttft_s)
    ending = {"stop": "done", "length": "hit max tokens", "cancelled": "cancelled"}.get(
        reason, reason
    )
    return f"{ending} · {tokens} tokens · {decode} tok/s · TTFT {ttft}"
