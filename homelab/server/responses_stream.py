"""The Responses API's server-sent events for one streamed response.

Each event is ``event: <type>`` plus ``data: {"type": <type>, "sequence_number": n, ...}``;
there is no ``[DONE]``. The order, as OpenAI sends it::

    response.created, response.in_progress
    per reasoning: response.output_item.added, response.content_part.added,
                   response.reasoning_text.delta…, response.reasoning_text.done,
                   response.content_part.done, response.output_item.done
    per message:   the same with response.output_text.delta… / .done
    per call:      response.output_item.added, response.function_call_arguments.delta,
                   response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it)

The pieces come from the choice's reply parser (:class:`~homelab.server.replies.ParsedChoice`:
reasoning, answer text and whole tool calls, as chat streams them); each whole call becomes a
function_call item with its arguments in one delta. An error after the stream started is an
``error`` event followed by ``response.failed``; a disconnect cancels the generation (see
``EventStreamResponse``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from homelab.server.engine_seam import HandleLike
from homelab.server.errors import api_error_from
from homelab.server.pieces import (
    ContentDelta,
    ReasoningDelta,
    StreamPiece,
    ToolCall,
    ToolCallArgs,
    ToolCallStart,
)
from homelab.server.replies import ParsedChoice
from homelab.server.responses_output import (
    ResponseEcho,
    call_item,
    message_item,
    output_status,
    reasoning_item,
    reasoning_part,
    response_object,
    sealed,
    text_part,
)
from homelab.server.serving import (
    RequestContext,
    cancel_all,
    check_finish,
    merged_events,
    new_id,
    record,
)
from homelab.server.streaming import numbered_text_events, sse_event

TEXT_KINDS = {  # item type -> (id prefix, delta event, done event)
    "message": ("msg_", "response.output_text.delta", "response.output_text.done"),
    "reasoning": ("rs_", "response.reasoning_text.delta", "response.reasoning_text.done"),
}


class _Events:
    """Numbered ``response.*`` events, and the output items they have built so far."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the message or reasoning item streaming
        # its text so far, joined when it closes (+= on the item's string copied the whole
        # text at every token: quadratic in a long reply)
        self._open_text: list[str] = []
        # its text deltas' events, their bytes around the number and text made once
        self._open_deltas: Callable[[int, str], bytes] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # call index -> its function_call item

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(payload, kind)

    # --- text items (message, reasoning) ----------------------------------------------------

    def text(self, item_type: str, delta: str) -> list[bytes]:
        chunks = []
        if self._open is None or self._open["type"] != item_type:
            chunks = [*self.close_open(), *self._open_item(item_type)]
        assert self._open is not None
        self._open_text.append(delta)
        if self._open_deltas is None:
            self._open_deltas = self._delta_events(item_type)
        chunks.append(self._open_deltas(self.sequence, delta))
        self.sequence += 1
        return chunks

    def _delta_events(self, item_type: str) -> Callable[[int, str], bytes]:
        """The open item's ``*.delta`` events: ``event(kind, ...)`` with the number and the
        text in their places (``numbered_text_events``)."""
        kind, where = TEXT_KINDS[item_type][1], self._where()
        extra: dict[str, Any] = {"logprobs": []} if item_type == "message" else {}

        def payload(number: Any, delta: str) -> dict[str, Any]:
            fields = {**where, "content_index": 0, "delta": delta, **extra}
            return {"type": kind, "sequence_number": number, **fields}

        return numbered_text_events(payload, kind)

    def _open_item(self, item_type: str) -> list[bytes]:
        make = message_item if item_type == "message" else reasoning_item
        item = make(new_id(TEXT_KINDS[item_type][0]), None, status="in_progress")
        self.items.append(item)
        self._open, self._open_text, self._open_deltas = item, [], None
        added = self.event(
            "response.output_item.added", output_index=len(self.items) - 1, item=item
        )
        part = text_part("") if item_type == "message" else reasoning_part("")
        item["content"].append(part)
        part_added = self.event(
            "response.content_part.added", **self._where(), content_index=0, part=part
        )
        return [added, part_added]

    def close_open(self) -> list[bytes]:
        item = self._open
        if item is None:
            return []
        where = self._where()
        self._sync_open_text()
        self._open = None
        part = item["content"][0]
        item["status"] = "completed"
        if item["type"] == "reasoning":
            sealed(item)
        extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
        done_kind = TEXT_KINDS[item["type"]][2]
        return [
            self.event(done_kind, **where, content_index=0, text=part["text"], **extra),
            self.event("response.content_part.done", **where, content_index=0, part=part),
            self.event("response.output_item.done", output_index=where["output_index"], item=item),
        ]

    def current_items(self) -> list[dict[str, Any]]:
        """The output items so far, the open one with its text up to now."""
        self._sync_open_text()
        return self.items

    def _sync_open_text(self) -> None:
        if self._open is not None:
            self._open["content"][0]["text"] = "".join(self._open_text)

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": self.items.index(self._open)}

    # --- function calls ----------------------------------------------------------------------

    def call_start(self, start: ToolCallStart) -> list[bytes]:
        """A function_call item, added as soon as the model has named the tool."""
        chunks = self.close_open()
        item = call_item(new_id("fc_"), ToolCall(start.id, start.name, ""), "in_progress")
        self.items.append(item)
        self._calls[start.index] = item
        added = self.event(
            "response.output_item.added", output_index=len(self.items) - 1, item=item
        )
        return [*chunks, added]

    def call_args(self, fragment: ToolCallArgs) -> list[bytes]:
        item = self._calls[fragment.index]
        item["arguments"] += fragment.fragment
        where = {"item_id": item["id"], "output_index": self.items.index(item)}
        return [
            self.event("response.function_call_arguments.delta", **where, delta=fragment.fragment)
        ]

    def call_done(self, call: ToolCall) -> list[bytes]:
        index = next((i for i, item in self._calls.items() if item["call_id"] == call.id), None)
        if index is None:
            return []
        item = self._calls.pop(index)
        output_index = self.items.index(item)
        done = call_item(item["id"], call)
        self.items[output_index] = done
        where = {"item_id": item["id"], "output_index": output_index}
        return [
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=call.name,
                arguments=done["arguments"],
            ),
            self.event("response.output_item.done", output_index=output_index, item=done),
        ]

    def pieces(self, pieces: Sequence[StreamPiece]) -> list[bytes]:
        chunks: list[bytes] = []
        for piece in pieces:
            if isinstance(piece, ReasoningDelta):
                chunks += self.text("reasoning", piece.text) if piece.text else []
            elif isinstance(piece, ContentDelta):
                chunks += self.text("message", piece.text) if piece.text else []
            elif isinstance(piece, ToolCallStart):
                chunks += self.call_start(piece)
            elif isinstance(piece, ToolCallArgs):
                chunks += self.call_args(piece)
            else:
                chunks += self.call_done(piece)
        return chunks

    def finish(self) -> list[bytes]:
        """Close what is open; a response without a message or call still gets its (empty)
        message, as the non-streamed response does."""
        chunks = self.close_open()
        for item in self._calls.values():  # begun, never finished: the model broke off
            item["status"] = "incomplete"
        self._calls.clear()
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            chunks += [*self._open_item("message"), *self.close_open()]
        return chunks


async def response_events(
    ctx: RequestContext,
    echo: ResponseEcho,
    handles: Sequence[HandleLike],
    states: Sequence[ParsedChoice],
) -> AsyncIterator[bytes]:
    events = _Events()
    state = states[0]
    completed = False
    try:
        started = response_object(ctx, echo, "in_progress", [])
        yield events.event("response.created", response=started)
        yield events.event("response.in_progress", response=started)
        async for _, event in merged_events(handles):
            state.add(event)  # parses: reasoning, text, tool calls
            for chunk in events.pieces(state.take()):
                yield chunk
        finish = check_finish(state.finish)  # raises: reported as an error event
        for chunk in events.finish():
            yield chunk
        status = output_status(finish.reason, events.items)
        final = echo.done(response_object(ctx, echo, status, events.items, state))
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        completed = True
        yield events.event(kind, response=final)
    except Exception as exc:  # after the stream started: an error event, then response.failed
        completed = True
        error = api_error_from(exc)
        code = error.code or error.type
        yield events.event("error", code=code, message=error.message, param=error.param)
        failed = response_object(
            ctx,
            echo,
            "failed",
            events.current_items(),
            error={"code": code, "message": error.message},
        )
        yield events.event("response.failed", response=failed)
    finally:
        cancel_all(handles)
        record(ctx, states, cancelled=not completed)
