"""The chat panel's controller: submit the conversation, stream the answer, cancel it.

The answer is read in a worker thread; its text collects in a :class:`TextBuffer` that the
app flushes to the panel at a steady rate (``flush``), however fast tokens come. A prompt
sent before a model is loaded waits for the load, which it starts. ``/image PATH`` attaches an
image to the next prompt: read, decoded and counted in a worker (name, size, pixels and the
tokens the loaded projector gives it are shown), then sent first in that prompt's turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homelab.engine.api import TokenEvent
from homelab.errors import HomelabError
from homelab.tui import services
from homelab.tui.handoff import TextBuffer
from homelab.tui.messages import AnswerFinished, ImageAttached, TaskFailed
from homelab.tui.panels import in_thread

if TYPE_CHECKING:
    from textual.app import App

    from homelab.images.decoded import DecodedImage
    from homelab.tui.panels.live import LiveController
    from homelab.tui.protocols import AnswerStream, DashboardEngine
    from homelab.tui.services import ImageAttachment
    from homelab.tui.widgets.chat import ChatPanel

CHAT_TENANT = "tui"
ATTACH_COMMAND = "/image "


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
        self.attachments: list[ImageAttachment] = []  # sent with the next prompt
        self.ticks = 0  # steady-rate flushes: proof the loop keeps running during a load

    def attach(self, panel: ChatPanel) -> None:
        self.panel = panel

    async def send(self, prompt: str) -> None:
        if prompt.startswith(ATTACH_COMMAND):
            self.attach_image(prompt.removeprefix(ATTACH_COMMAND).strip())
            return
        if self.answer is not None:
            self.app.notify("Wait for the answer, or cancel it with Esc.", title="Still answering")
            return
        if self.live.yielded:  # never take the GPU back unasked: the prompt waits in its box
            self.panel.prompt.value = prompt
            await self.panel.add_note(f"{self.live.yield_hint()}; then send it again.")
            return
        engine = self.live.engine
        if engine is None:
            self.pending_prompt = prompt
            await self.panel.add_note("Loading the model first…")
            self.live.after_load(self.send_pending)
            return
        images = await self._images_for(engine)
        turn = services.marked_turn(engine, prompt, len(images))
        await self.panel.begin_answer(prompt, turn)
        self.panel.images.extend(images)
        try:
            self.answer = services.submit_chat(
                engine,
                self.panel.history,
                CHAT_TENANT,
                self.max_tokens,
                self.temperature,
                self.panel.images,
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

    def attach_image(self, path: str) -> None:
        """Read and decode ``path`` off the event loop; :meth:`attached` shows it."""
        engine = self.live.engine

        def work() -> None:
            try:
                self.app.post_message(ImageAttached(services.attach_image(path, engine)))
            except HomelabError as error:
                self.app.post_message(TaskFailed("attaching an image", error))

        in_thread(self.app, work, name="attach_image", group="attach", exclusive=False)

    async def attached(self, attachment: ImageAttachment) -> None:
        self.attachments.append(attachment)
        await self.panel.add_note(attachment.describe())

    async def _images_for(self, engine: DashboardEngine) -> list[DecodedImage]:
        """The attachments for this prompt (none, with a note, when the model sees none)."""
        attachments, self.attachments = self.attachments, []
        if attachments and engine.image_marker is None:
            names = ", ".join(a.name for a in attachments)
            await self.panel.add_note(
                f"{names} not sent: this model has no vision projector (mmproj) loaded"
            )
            return []
        return [a.image for a in attachments]

    async def send_pending(self) -> None:
        prompt, self.pending_prompt = self.pending_prompt, None
        if prompt is not None:
            await self.send(prompt)

    def _stream(self, answer: AnswerStream) -> None:
        try:
            for events in answer.chunks():  # the screen redraws per tick, not per token
                for event in events:
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
