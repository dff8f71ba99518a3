"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API.

A Messages request becomes the messages the chat template takes (system prompt first, a
``tool_result`` block becomes a ``tool`` message, a ``tool_use`` block an assistant tool
call, a ``thinking`` block the turn's ``reasoning_content``) and then runs the chat path:
model name, template, tool rendering, the forced-call grammar, context and limits, the
tenant's prefix cache, metrics. A final assistant message is a prefill: the reply continues
it. What comes back is parsed by :mod:`homelab.server.replies` into ``thinking``, ``text`` and
``tool_use`` blocks, collected or streamed as Anthropic's events::

    message_start, ping, (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage), message_stop

``max_tokens`` is required; above :data:`MAX_TOKENS_CEILING` it is refused, below it the
context left after the prompt clamps it (clients such as Claude Code ask for 32000 whatever
the model), and ``stop_reason`` says ``max_tokens`` when that cut the reply. Stop sequences
apply to the answer text (not the thinking) and are matched here, so the response names the
one that matched. Errors on these routes take Anthropic's envelope
(:meth:`~homelab.server.errors.ApiError.anthropic_envelope`), also after streaming started.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from homelab.engine.api import FinishEvent, SamplingParams
from homelab.engine.chat import ToolCall
from homelab.engine.grammar import schema_to_grammar
from homelab.errors import EngineError
from homelab.server import chat
from homelab.server.anthropic_protocol import (
    MAX_TOKENS_CEILING,
    Conversation,
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from homelab.server.errors import api_error_from, context_length_exceeded, invalid_request
from homelab.server.reasoning import (
    THINK_CLOSE,
    THINK_OPEN,
    ReasoningDelta,
    after_thought,
    thinking_switches,
)
from homelab.server.replies import (
    ParsedChoice,
    ReplyFormat,
    ReplyPiece,
    merged_blocks,
    split_format,
)
from homelab.server.serving import (
    HandleLike,
    Prompt,
    RequestContext,
    cancel_all,
    check_finish,
    check_model_name,
    collect,
    merged_events,
    record,
    submit_choices,
    tokenize,
    usage,
)
from homelab.server.streaming import EventStreamResponse
from homelab.server.tools import ContentDelta, forced_call_grammar, uses_tagged_calls

__all__ = ["MAX_TOKENS_CEILING", "count_tokens", "create_message"]

CLIENT_GONE_STATUS = 499
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


@dataclass(frozen=True)
class Rendered:
    """A conversation rendered by the model's template and tokenized."""

    text: str  # the prompt, prefill included
    prefill: str
    tokens: tuple[int, ...]
    tools: list[dict[str, Any]] | None
    template: Any
    opened: bool  # the prompt leaves a <think> block open


@dataclass(frozen=True)
class Prepared:
    rendered: Rendered
    sampling: SamplingParams
    reply: ReplyFormat


async def create_message(ctx: RequestContext, req: MessagesRequest) -> Response:
    prepared = await prepare(ctx, req)
    ctx.request_id = f"msg_{secrets.token_hex(12)}"
    prompt = Prompt(prepared.rendered.tokens, prepared.rendered.text)
    handles, submitted = submit_choices(ctx, [prompt], 1, lambda _i, _p: prepared.sampling)
    choices = prepared.reply.choices(submitted, handles)
    if req.stream:
        return EventStreamResponse(_events(ctx, req, prepared, handles, choices))
    if not await collect(ctx, handles, choices):
        record(ctx, choices, cancelled=True)
        return Response(status_code=CLIENT_GONE_STATUS)
    record(ctx, choices)
    return JSONResponse(message_body(ctx, req, choices[0]))


async def count_tokens(ctx: RequestContext, req: CountTokensRequest) -> Response:
    rendered = await render_conversation(ctx, req)
    return JSONResponse({"input_tokens": len(rendered.tokens)})


# --- preparing -----------------------------------------------------------------------------


async def prepare(ctx: RequestContext, req: MessagesRequest) -> Prepared:
    rendered = await render_conversation(ctx, req)
    max_tokens = max(1, _max_tokens(ctx, req.max_tokens, len(rendered.tokens)))  # 0: one, unsent
    reasoning = split_format(rendered.template, ctx.config.reasoning_format)
    reply = ReplyFormat.for_prompt(
        ctx.engine,
        reasoning,
        rendered.text,
        parse_tools=rendered.tools is not None,
        stops=req.stop_sequences or (),
        opened=rendered.opened,
    )
    grammar = _tool_grammar(req, rendered) or _format_grammar(req)
    if grammar is not None and reply.opened:
        grammar = after_thought(grammar)
    defaults = SamplingParams()
    sampling = SamplingParams(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_k=defaults.top_k if req.top_k is None else req.top_k,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        max_tokens=max_tokens,
        grammar=grammar,
    )
    return Prepared(rendered, sampling, reply)


async def render_conversation(ctx: RequestContext, conv: Conversation) -> Rendered:
    check_model_name(ctx.config, conv.model)
    template = ctx.engine.chat_template
    if template is None:
        raise invalid_request("This model has no chat template; use /v1/completions.")
    tools = _offered_tools(conv, template)
    source = getattr(template, "source", "")
    switches = thinking_switches(
        source,
        enable_thinking=conv.thinking.enable_thinking() if conv.thinking else None,
        reasoning_effort=conv.output_config.reasoning_effort() if conv.output_config else None,
        default_enable_thinking=ctx.config.enable_thinking,
    )
    messages, prefill = template_messages(conv)
    base = await chat.render_messages(ctx, messages, tools, switches)
    text = base + prefill
    tokens = await tokenize(ctx.engine, text, add_bos=True)
    opened = base.rstrip().endswith(THINK_OPEN) and THINK_CLOSE not in prefill
    return Rendered(text, prefill, tokens, tools, template, opened)


def _offered_tools(conv: Conversation, template: Any) -> list[dict[str, Any]] | None:
    if not conv.tools or (conv.tool_choice is not None and conv.tool_choice.type == "none"):
        return None
    if not getattr(template, "supports_tools", False):
        raise invalid_request("This model's chat template does not support tools.")
    return [tool.as_function() for tool in conv.tools]


def _tool_grammar(req: MessagesRequest, rendered: Rendered) -> str | None:
    choice = req.tool_choice
    if rendered.tools is None or choice is None or choice.type not in ("any", "tool"):
        return None
    only = choice.name if choice.type == "tool" else None
    tagged = uses_tagged_calls(getattr(rendered.template, "source", ""))
    try:
        return forced_call_grammar(rendered.tools, only, tagged)
    except EngineError as exc:
        raise invalid_request(f"Unusable tool input_schema: {exc}") from exc


def _format_grammar(req: MessagesRequest) -> str | None:
    """``output_config.format``: the answer is JSON that the schema accepts."""
    fmt = req.output_config.format if req.output_config else None
    if fmt is None:
        return None
    try:
        return schema_to_grammar(fmt.schema_)
    except EngineError as exc:
        raise invalid_request(f"Unusable output_config.format schema: {exc}") from exc


def _max_tokens(ctx: RequestContext, requested: int, prompt_tokens: int) -> int:
    """``max_tokens`` within the context left after the prompt (and the server's limit)."""
    n_ctx = ctx.engine.n_ctx_per_slot
    room = n_ctx - prompt_tokens
    if room < 1:
        raise context_length_exceeded(prompt_tokens, 1, n_ctx)
    return min(requested, room, ctx.config.max_tokens_limit or room)


def template_messages(conv: Conversation) -> tuple[list[dict[str, Any]], str]:
    """(the messages the chat template takes, the prefill text of a final assistant turn)."""
    messages = list(conv.messages)
    prefill = ""
    if messages[-1].role == "assistant":
        prefill = messages.pop().text().rstrip()
    rendered: list[dict[str, Any]] = []
    system = conv.system_text()
    if system:
        rendered.append({"role": "system", "content": system})
    for message in messages:
        rendered += _user_turn(message) if message.role == "user" else [_assistant_turn(message)]
    return _joined_turns(rendered), prefill


def _user_turn(message: MessageParam) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for block in message.blocks():
        if isinstance(block, ToolResultBlock):
            text = f"Error: {block.content}" if block.is_error else str(block.content)
            turns.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
    text = message.text()
    if text:
        turns.append({"role": "user", "content": text})
    return turns


def _assistant_turn(message: MessageParam) -> dict[str, Any]:
    blocks = message.blocks()
    turn: dict[str, Any] = {"role": "assistant", "content": message.text()}
    thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    if thinking:
        turn["reasoning_content"] = thinking
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    if calls:
        turn["tool_calls"] = calls
    return turn


def _joined_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user turns (or assistant turns) as one, as the Messages API joins them."""
    joined: list[dict[str, Any]] = []
    for turn in turns:
        last = joined[-1] if joined else None
        if (
            last is None
            or last["role"] != turn["role"]
            or turn["role"] not in ("user", "assistant")
        ):
            joined.append(dict(turn))
            continue
        last["content"] = "\n\n".join(t for t in (last["content"], turn["content"]) if t)
        if turn.get("tool_calls"):
            last["tool_calls"] = [*last.get("tool_calls", []), *turn["tool_calls"]]
        if turn.get("reasoning_content"):
            last["reasoning_content"] = (
                last.get("reasoning_content", "") + turn["reasoning_content"]
            )
    return joined


# --- the response ----------------------------------------------------------------------------


def _finish(choice: ParsedChoice) -> FinishEvent:
    """The finish, or the error it stands for; our own cancel after a stop sequence is fine."""
    if choice.stopped_by_sequence and choice.finish is not None:
        return choice.finish
    return check_finish(choice.finish)


def stop_reason(
    req: MessagesRequest, choice: ParsedChoice, finish: FinishEvent, called: bool
) -> str:
    if req.max_tokens == 0:
        return "max_tokens"
    if called:
        return "tool_use"
    if choice.stopped_by_sequence:
        return "stop_sequence"
    return STOP_REASONS.get(finish.reason, "end_turn")


def message_usage(req: MessagesRequest, choice: ParsedChoice) -> dict[str, int]:
    """Anthropic's usage: input tokens not read from the cache, and those that were."""
    totals = usage([choice])
    cached = totals["prompt_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": totals["prompt_tokens"] - cached,
        "output_tokens": totals["completion_tokens"] if req.max_tokens else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def message_body(ctx: RequestContext, req: MessagesRequest, choice: ParsedChoice) -> dict[str, Any]:
    finish = _finish(choice)
    pieces = merged_blocks(shown(req, choice.output))
    called = any(isinstance(p, ToolCall) for p in pieces)
    blocks = [block for piece in pieces if (block := _block(piece, called)) is not None]
    return {
        **_message_head(ctx, req),
        "content": blocks,
        "stop_reason": stop_reason(req, choice, finish, called),
        "stop_sequence": choice.reply.stop_sequence,
        "usage": message_usage(req, choice),
    }


def shown(req: MessagesRequest, pieces: Sequence[ReplyPiece]) -> list[ReplyPiece]:
    """What the client sees: nothing for ``max_tokens`` 0, thinking emptied when "omitted"."""
    if req.max_tokens == 0:
        return []
    if req.thinking_hidden():
        return [ReasoningDelta("") if isinstance(p, ReasoningDelta) else p for p in pieces]
    return list(pieces)


def _message_head(ctx: RequestContext, req: MessagesRequest) -> dict[str, Any]:
    return {"id": ctx.request_id, "type": "message", "role": "assistant", "model": req.model}


def _block(piece: ReplyPiece, called: bool) -> dict[str, Any] | None:
    if isinstance(piece, ReasoningDelta):
        return {"type": "thinking", "thinking": piece.text, "signature": ""}
    if isinstance(piece, ContentDelta):
        text = piece.text.strip() if called else piece.text
        return {"type": "text", "text": text} if text else None
    return {**_tool_use_start(piece), "input": json.loads(piece.arguments_json)}


def _tool_use_start(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name}


# --- streaming -------------------------------------------------------------------------------


def sse(name: str, payload: Mapping[str, Any]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


class _Blocks:
    """Opens, fills and closes content blocks as pieces arrive."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking" or "text"
        self.calls = 0

    def piece(self, piece: ReplyPiece) -> list[bytes]:
        if isinstance(piece, ReasoningDelta):
            if not piece.text and self.open == "thinking":
                return []  # thinking "omitted": one empty block
            start = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": piece.text}
            return [*self._ensure("thinking", start), self._delta(delta)]
        if isinstance(piece, ContentDelta):
            delta = {"type": "text_delta", "text": piece.text}
            return [*self._ensure("text", {"type": "text", "text": ""}), self._delta(delta)]
        self.calls += 1
        json_delta = {"type": "input_json_delta", "partial_json": piece.arguments_json}
        events = [*self.close(), *self._start({**_tool_use_start(piece), "input": {}})]
        return [*events, self._delta(json_delta), *self.close(force=True)]

    def close(self, force: bool = False) -> list[bytes]:
        if self.open is None and not force:
            return []
        self.open = None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _ensure(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self.open == kind:
            return []
        events = self.close()
        self.open = kind
        return [*events, *self._start(block)]

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        self.index += 1
        payload = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [sse("content_block_start", payload)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        payload = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return sse("content_block_delta", payload)


async def _events(
    ctx: RequestContext,
    req: MessagesRequest,
    prepared: Prepared,
    handles: Sequence[HandleLike],
    choices: list[ParsedChoice],
) -> AsyncIterator[bytes]:
    choice, blocks, completed = choices[0], _Blocks(), False
    start_usage = {"input_tokens": len(prepared.rendered.tokens), "output_tokens": 0}
    message = {
        **_message_head(ctx, req),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    try:
        yield sse("message_start", {"type": "message_start", "message": message})
        yield sse("ping", {"type": "ping"})
        async for _, event in merged_events(handles):
            choice.add(event)
            for piece in shown(req, choice.take()):
                for chunk in blocks.piece(piece):
                    yield chunk
        finish = _finish(choice)
        for chunk in blocks.close():
            yield chunk
        delta = {
            "stop_reason": stop_reason(req, choice, finish, blocks.calls > 0),
            "stop_sequence": choice.reply.stop_sequence,
        }
        yield sse(
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": message_usage(req, choice)},
        )
        completed = True
        yield sse("message_stop", {"type": "message_stop"})
    except Exception as exc:  # after the stream started: Anthropic's error event
        completed = True
        yield sse("error", api_error_from(exc).anthropic_envelope())
    finally:
        cancel_all(handles)
        record(ctx, choices, cancelled=not completed)
