"""The chat panel's controller: submit the conversation, stream the answer, cancel it.

The answer is read in a worker thread; its text collects in a :class:`TextBuffer` that the
app flushes to the panel at a steady rate (``flush``), however fast tokens come. A prompt
sent before a model is loaded waits for the load, which it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homelab.engine.api import TokenEvent
from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.handoff import TextBuffer
from homelab.tui.messages import AnswerFinished, TaskFailed
from homelab.tui.panels import in_thread

if TYPE_CHECKING:
    from textual.app import App

    from homelab.tui.panels.live import LiveController
    from homelab.tui.protocols import AnswerStream
    from homelab.tui.widgets.chat import ChatPanel

CHAT_TENANT = "tui"


class ChatController:
    panel: ChatPanel  # attached once the dashboard is mounted

    def __init__(
        self,
        app: App[None],
        live: LiveController,
        *,
        max_tokens: int,
        temperature: float,
        frozen: bool,
    ) -> None:
        self.app = app
        self.live = live  # the engine to ask, and the load to wait for
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.frozen = frozen
        self.answer: AnswerStream | None = None  # the answer being streamed
        self.text = TextBuffer()
        self.pending_prompt: str | None = None
        self.ticks = 0  # steady-rate flushes: proof the loop keeps running during a load

    def attach(self, panel: ChatPanel) -> None:
        self.panel = panel

    async def send(self, prompt: str) -> None:
        if self.answer is not None:
            self.app.notify("Wait for the answer, or cancel it with Esc.", title="Still answering")
            return
        engine = self.live.engine
        if engine is None:
            self.pending_prompt = prompt
            await self.panel.add_note("Loading the model first…")
            self.live.after_load(self.send_pending)
            return
        await self.panel.begin_answer(prompt)
        try:
            self.answer = services.submit_chat(
                engine, self.panel.history, CHAT_TENANT, self.max_tokens, self.temperature
            )
        except HomelabError as error:
            self.panel.finish_answer("error", None, frozen=self.frozen)
            self.app.notify(str(error), title=error.title, severity="error")
            return
        answer = self.answer
        in_thread(
            self.app,
            lambda: self._stream(answer),
            name="stream_answer",
            group="answer",
            exclusive=False,
        )

    async def send_pending(self) -> None:
        prompt, self.pending_prompt = self.pending_prompt, None
        if prompt is not None:
            await self.send(prompt)

    def _stream(self, answer: AnswerStream) -> None:
        try:
            for event in answer:
                if isinstance(event, TokenEvent):
                    self.text.append(event.text)
                else:
                    self.app.post_message(AnswerFinished(event))
        except HomelabError as error:
            self.app.post_message(TaskFailed("answering", error))
            self.app.post_message(AnswerFinished(None))

    def flush(self) -> None:
        self.ticks += 1
        text = self.text.drain()
        if text:
            self.panel.stream(text)

    def finished(self, message: AnswerFinished) -> None:
        self.flush()
        self.answer = None
        finish = message.finish
        reason = "error" if finish is None else finish.reason
        self.panel.finish_answer(
            reason, None if finish is None else finish.stats, frozen=self.frozen
        )
        if finish is not None and finish.reason == "error" and finish.error:
            self.app.notify(finish.error, title="The answer failed", severity="error")

    def cancel(self) -> None:
        if self.answer is not None:
            self.answer.cancel()
