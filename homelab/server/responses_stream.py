"""The Responses API's server-sent events for one streamed response.

Each event is ``event: <type>`` plus ``data: {"type": <type>, "sequence_number": n, ...}``;
there is no ``[DONE]``. The order, as OpenAI sends it::

    response.created, response.in_progress
    per message:  response.output_item.added, response.content_part.added,
                  response.output_text.delta…, response.output_text.done,
                  response.content_part.done, response.output_item.done
    per call:     response.output_item.added, response.function_call_arguments.delta,
                  response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it)

Tool calls are found in the text as it streams (:class:`~homelab.server.tools.ToolCallStream`):
text before a call is the message, each whole call becomes a function_call item (its
arguments in one delta). An error after the stream started is an ``error`` event followed by
``response.failed``; a disconnect cancels the generation (see ``EventStreamResponse``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from homelab.engine.api import TokenEvent
from homelab.engine.chat import ToolCall
from homelab.server.errors import api_error_from
from homelab.server.responses import (
    Prepared,
    call_item,
    message_item,
    new_id,
    output_status,
    response_object,
    text_part,
)
from homelab.server.serving import (
    ChoiceState,
    HandleLike,
    RequestContext,
    cancel_all,
    check_finish,
    merged_events,
    record,
)
from homelab.server.tools import ContentDelta, Piece, ToolCallStream


class _Events:
    """Numbered ``response.*`` events, and the output items they have built so far."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None  # the message item being streamed

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    # --- the message item ------------------------------------------------------------------

    def text(self, delta: str) -> list[bytes]:
        chunks = [] if self._message is not None else self._open_message()
        assert self._message is not None
        self._message["content"][0]["text"] += delta
        chunks.append(
            self.event(
                "response.output_text.delta",
                **self._where(),
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return chunks

    def _open_message(self) -> list[bytes]:
        item = message_item(new_id("msg"), None, status="in_progress")
        self.items.append(item)
        self._message = item
        added = self.event(
            "response.output_item.added", output_index=len(self.items) - 1, item=item
        )
        item["content"].append(text_part(""))
        part = self.event(
            "response.content_part.added", **self._where(), content_index=0, part=text_part("")
        )
        return [added, part]

    def close_message(self) -> list[bytes]:
        item = self._message
        if item is None:
            return []
        self._message = None
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": self.items.index(item)}
        item["status"] = "completed"
        return [
            self.event(
                "response.output_text.done",
                **where,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self.event("response.content_part.done", **where, content_index=0, part=part),
            self.event("response.output_item.done", output_index=where["output_index"], item=item),
        ]

    def _where(self) -> dict[str, Any]:
        assert self._message is not None
        return {"item_id": self._message["id"], "output_index": len(self.items) - 1}

    # --- function calls ----------------------------------------------------------------------

    def call(self, call: ToolCall) -> list[bytes]:
        chunks = self.close_message()
        item_id = new_id("fc")
        index = len(self.items)
        done = call_item(item_id, call)
        self.items.append(done)
        where = {"item_id": item_id, "output_index": index}
        return [
            *chunks,
            self.event(
                "response.output_item.added",
                output_index=index,
                item=call_item(item_id, call, status="in_progress"),
            ),
            self.event("response.function_call_arguments.delta", **where, delta=done["arguments"]),
            self.event(
                "response.function_call_arguments.done",
                **where,
                name=call.name,
                arguments=done["arguments"],
            ),
            self.event("response.output_item.done", output_index=index, item=done),
        ]

    def pieces(self, pieces: Sequence[Piece]) -> list[bytes]:
        chunks: list[bytes] = []
        for piece in pieces:
            if isinstance(piece, ContentDelta):
                chunks += self.text(piece.text) if piece.text else []
            else:
                chunks += self.call(piece)
        return chunks

    def finish(self) -> list[bytes]:
        """Close what is open; a response with no output at all still gets its (empty)
        message, as the non-streamed response does."""
        if not self.items:
            return [*self._open_message(), *self.close_message()]
        return self.close_message()


async def response_events(
    ctx: RequestContext,
    prepared: Prepared,
    handles: Sequence[HandleLike],
    states: list[ChoiceState],
) -> AsyncIterator[bytes]:
    events = _Events()
    parser = ToolCallStream() if prepared.parse_tools else None
    completed = False
    try:
        started = response_object(ctx, prepared, "in_progress", [])
        yield events.event("response.created", response=started)
        yield events.event("response.in_progress", response=started)
        async for index, event in merged_events(handles):
            states[index].add(event)
            if isinstance(event, TokenEvent):
                pieces: list[Piece] = (
                    parser.feed(event.text) if parser else [ContentDelta(event.text)]
                )
                for chunk in events.pieces(pieces):
                    yield chunk
                continue
            finish = check_finish(event)  # raises: reported as an error event
            for chunk in events.pieces(parser.finish() if parser else []) + events.finish():
                yield chunk
            status = output_status(finish.reason, events.items)
            final = response_object(ctx, prepared, status, events.items, states[0])
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
            prepared,
            "failed",
            events.items,
            error={"code": code, "message": error.message},
        )
        yield events.event("response.failed", response=failed)
    finally:
        cancel_all(handles)
        record(ctx, states, cancelled=not completed)
