"""Ollama's own API on the same port: ``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``, ``/api/pull``.

A chat (or a templated generate) is mapped into :class:`~homelab.server.prompting.ChatInputs`
by :func:`chat_inputs` / :func:`generate_inputs` and walks the one chat preparation, so the
tenant (from ``Authorization: Bearer``), its prefix cache, tools, JSON grammars, images and
thinking work as in every other dialect. Replies are one JSON object, or (Ollama's default)
NDJSON lines: a line per piece of text, ``thinking`` apart, each tool call whole with its
arguments as an object, then a last line with ``done: true``, ``done_reason`` and the timing
fields in nanoseconds (``prompt_eval_count`` counts the prompt tokens evaluated, not those
reused from the tenant's cache). ``keep_alive`` goes to the fleet (``app.serving_context``).

The context a model gives one request (its slot, not its trained maximum) is what
``/api/show`` reports as ``<arch>.context_length`` and ``/api/ps`` as ``context_length``.
Errors are ``{"error": "..."}`` (:meth:`~homelab.server.errors.ApiError.ollama_envelope`),
also as a last NDJSON line after streaming started.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from homelab import __version__
from homelab.engine.api import FinishEvent, SamplingParams
from homelab.server.config import ServerConfig
from homelab.server.embeddings import embed_texts
from homelab.server.engine_seam import EngineLike, HandleLike
from homelab.server.errors import ApiError, api_error_from, invalid_request
from homelab.server.fleet import Fleet
from homelab.server.ollama_models import (
    capabilities,
    listed_models,
    ps_entry,
    show_body,
    tag_entry,
)
from homelab.server.ollama_protocol import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaMessage,
    OllamaModelRequest,
    OllamaOptions,
)
from homelab.server.pieces import ContentDelta, ReasoningDelta, StreamPiece, ToolCall
from homelab.server.prompting import AnswerFormat, ChatInputs, prepare_chat
from homelab.server.protocol import body_doc
from homelab.server.replies import ParsedChoice, ReplyFormat
from homelab.server.serving import (
    Prompt,
    RequestContext,
    SamplingKnobs,
    cancel_all,
    check_finish,
    check_model_name,
    merged_events,
    off_the_loop_when_long,
    record,
    respond,
    sampling_params,
    submit_choices,
    tokenize,
)
from homelab.server.streaming import EventStreamResponse, next_event_ready

OLLAMA_API_VERSION = "0.12.0"  # the Ollama API level answered: clients gate features on it
FILL_CONTEXT = 2**31  # num_predict -1 / -2: until the end of text or of the window
NS_PER_S = 1_000_000_000
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

Body = TypeVar("Body", bound=BaseModel)
ParseFn = Callable[[Request, type[Body]], Awaitable[Body]]
ContextFn = Callable[[Request, str], Awaitable[RequestContext]]


class OllamaHost(Protocol):
    """What the routes read of the app's state (``app.ServerState``)."""

    config: ServerConfig
    fleet: Fleet | None
    engine_provider: Callable[[], EngineLike | None]


class NdjsonResponse(EventStreamResponse):
    """Ollama's stream: one JSON object a line (the SSE response's disconnect handling)."""

    media_type = "application/x-ndjson"


def ndjson(payload: dict[str, Any]) -> bytes:
    return _COMPACT.encode(payload).encode() + b"\n"


@dataclass(frozen=True)
class Timing:
    """When the request came (``perf_counter``) and how long its model took to load."""

    started_s: float
    load_s: float


# --- the wire request as chat inputs ---------------------------------------------------------


def chat_inputs(req: OllamaChatRequest) -> ChatInputs:
    """An ``/api/chat`` request in the chat template's terms."""
    answer_format, schema = _answer_format(req.format)
    return ChatInputs(
        messages=[_template_message(m) for m in req.messages],
        tools=[tool.model_dump(exclude_none=True) for tool in req.tools] if req.tools else None,
        answer_format=answer_format,
        answer_schema=schema,
        **_thinking(req.think),
    )


def generate_inputs(req: OllamaGenerateRequest) -> ChatInputs:
    """A templated ``/api/generate``: its ``system`` and ``prompt`` (with its images) as a
    two-message chat."""
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": req.system})
    messages.append({"role": "user", "content": _content(req.prompt, req.images)})
    answer_format, schema = _answer_format(req.format)
    return ChatInputs(
        messages=messages, answer_format=answer_format, answer_schema=schema, **_thinking(req.think)
    )


def _answer_format(fmt: str | dict[str, Any] | None) -> tuple[AnswerFormat, dict[str, Any] | None]:
    if isinstance(fmt, dict):
        return "json_schema", fmt
    return ("json_object", None) if fmt == "json" else ("text", None)


def _thinking(think: bool | str | None) -> dict[str, Any]:
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    return {"enable_thinking": True, "reasoning_effort": think}


def _content(text: str, images: list[Any] | None) -> str | list[dict[str, Any]]:
    """Text, or the images (Ollama puts them before the text) then the text as parts."""
    if not images:
        return text
    parts = [{"type": "image", "image": image} for image in images]
    return [*parts, *([{"type": "text", "text": text}] if text else [])]


def _template_message(message: OllamaMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "role": message.role,
        "content": _content(message.content or "", message.images),
    }
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id or f"call_{index}",
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": json.dumps(call.function.arguments, ensure_ascii=False),
                },
            }
            for index, call in enumerate(message.tool_calls)
        ]
    if message.thinking and message.role == "assistant":
        rendered["reasoning_content"] = message.thinking
    if message.role == "tool" and (message.tool_name or message.tool_call_id):
        if message.tool_name:
            rendered["name"] = message.tool_name
        if message.tool_call_id:
            rendered["tool_call_id"] = message.tool_call_id
    return rendered


def ollama_knobs(options: OllamaOptions) -> SamplingKnobs:
    return SamplingKnobs(
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        min_p=options.min_p,
        repetition_penalty=options.repeat_penalty or None,  # 0: off, as 1.0
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        seed=options.seed,
        stop=tuple(s for s in options.stop or () if s),
    )


def _requested_tokens(options: OllamaOptions) -> int | None:
    """``num_predict``: None (the server's default), -1 / -2 (the window), or N."""
    if options.num_predict is None:
        return None
    return FILL_CONTEXT if options.num_predict < 0 else max(options.num_predict, 1)


def _windowed(
    sampling_for: Callable[[int, Prompt], SamplingParams], num_ctx: int | None, n_prompt: int
) -> Callable[[int, Prompt], SamplingParams]:
    """``num_ctx`` below the slot's context bounds prompt + completion (above it: the slot's,
    as Ollama caps it at what the model has)."""
    if num_ctx is None or num_ctx <= n_prompt:
        return sampling_for

    def bounded(index: int, prompt: Prompt) -> SamplingParams:
        params = sampling_for(index, prompt)
        return replace(params, max_tokens=min(params.max_tokens, num_ctx - n_prompt))

    return bounded


# --- the routes' work ------------------------------------------------------------------------


def check_think(engine: EngineLike, think: bool | str | None) -> None:
    if think and "thinking" not in capabilities(engine):
        raise invalid_request(
            f"The model '{engine.model_info.name}' does not support thinking; "
            "leave 'think' unset or false.",
            param="think",
        )


async def chat(ctx: RequestContext, req: OllamaChatRequest, timing: Timing) -> Response:
    if not req.messages:  # Ollama's way to load (or, keep_alive 0, unload) a model
        return JSONResponse(_loaded_only(req.model, req.keep_alive, timing, chat=True))
    check_think(ctx.engine, req.think)
    inputs = await off_the_loop_when_long(ctx, partial(chat_inputs, req), len(req.messages))
    return await _generation(ctx, req, inputs, timing, chat=True)


async def generate(ctx: RequestContext, req: OllamaGenerateRequest, timing: Timing) -> Response:
    if not req.prompt and not req.images:
        return JSONResponse(_loaded_only(req.model, req.keep_alive, timing, chat=False))
    check_think(ctx.engine, req.think)
    if req.raw:
        return await _raw_generation(ctx, req, timing)
    return await _generation(ctx, req, generate_inputs(req), timing, chat=False)


def _loaded_only(model: str, keep_alive: Any, timing: Timing, chat: bool) -> dict[str, Any]:
    unload = keep_alive in (0, "0", "0s", "0m")
    body = _head(model) | {"done": True, "done_reason": "unload" if unload else "load"}
    body |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return body | {"total_duration": _ns(time.perf_counter() - timing.started_s)}


async def _generation(
    ctx: RequestContext,
    req: OllamaChatRequest | OllamaGenerateRequest,
    inputs: ChatInputs,
    timing: Timing,
    chat: bool,
) -> Response:
    options = req.sampling_options()
    knobs = ollama_knobs(options)
    prepared = await prepare_chat(ctx, inputs, knobs, _requested_tokens(options), budget="clamp")
    n_prompt = prepared.rendered.n_prompt_tokens
    sampling_for = _windowed(prepared.sampling_for, options.num_ctx, n_prompt)
    return await _submitted(ctx, req, prepared.prompt, sampling_for, prepared.reply, timing, chat)


async def _raw_generation(
    ctx: RequestContext, req: OllamaGenerateRequest, timing: Timing
) -> Response:
    """``raw: true``: the prompt as written, no template (nor tools, thinking or JSON)."""
    if req.format is not None:
        raise invalid_request("format needs the chat template: leave raw unset.", param="format")
    options = req.sampling_options()
    tokens = await tokenize(ctx.engine, req.prompt, add_bos=True)
    room = ctx.engine.n_ctx_per_slot - len(tokens)
    wanted = _requested_tokens(options) or ctx.config.default_max_tokens
    max_tokens = max(1, min(wanted, room, ctx.config.max_tokens_limit or room))
    n_vocab = ctx.engine.model_info.n_vocab

    def sampling_for(index: int, _: Prompt) -> SamplingParams:
        knobs = ollama_knobs(options)
        return sampling_params(
            knobs, max_tokens=max_tokens, n_vocab=n_vocab, grammar=None, choice_index=index
        )

    prompt = Prompt(tokens, req.prompt)
    sampling = _windowed(sampling_for, options.num_ctx, len(tokens))
    return await _submitted(ctx, req, prompt, sampling, ReplyFormat(), timing, chat=False)


async def _submitted(
    ctx: RequestContext,
    req: OllamaChatRequest | OllamaGenerateRequest,
    prompt: Prompt,
    sampling_for: Callable[[int, Prompt], SamplingParams],
    reply: ReplyFormat,
    timing: Timing,
    chat: bool,
) -> Response:
    ctx.new_id("ollama-")
    handles, submitted = submit_choices(ctx, [prompt], 1, sampling_for)
    choices = reply.choices(submitted, handles)
    writer = _Writer(req.model, chat, timing)
    if req.stream:
        return NdjsonResponse(_lines(ctx, writer, handles, choices), next_event_ready(handles))
    return await respond(ctx, handles, choices, lambda: writer.whole(choices[0]))


# --- response shapes -------------------------------------------------------------------------


def _head(model: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {"model": model, "created_at": now}


def _ns(seconds: float) -> int:
    return max(int(seconds * NS_PER_S), 0)


def _call_json(call: ToolCall, index: int) -> dict[str, Any]:
    arguments = json.loads(call.arguments_json)
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}}


class _Writer:
    """Shapes a reply as ``/api/chat`` (``message``) or ``/api/generate`` (``response``)."""

    def __init__(self, model: str, chat: bool, timing: Timing) -> None:
        self.model, self.chat, self.timing = model, chat, timing
        self.calls = 0

    def body(
        self, content: str, thinking: str = "", calls: Sequence[ToolCall] = ()
    ) -> dict[str, Any]:
        if not self.chat:
            body = {"response": content}
            return body | ({"thinking": thinking} if thinking else {})
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [_call_json(c, self.calls + i) for i, c in enumerate(calls)]
            self.calls += len(calls)
        return {"message": message}

    def piece_line(self, piece: StreamPiece) -> bytes | None:
        if isinstance(piece, ContentDelta):
            body = self.body(piece.text)
        elif isinstance(piece, ReasoningDelta):
            body = self.body("", thinking=piece.text)
        elif isinstance(piece, ToolCall) and self.chat:
            body = self.body("", calls=[piece])
        else:
            return None  # a call's start and fragments: Ollama sends each call whole
        return ndjson(_head(self.model) | body | {"done": False})

    def done(self, choice: ParsedChoice, body: dict[str, Any]) -> dict[str, Any]:
        finish = check_finish(choice.finish)
        called = self.calls > 0 or any(isinstance(p, ToolCall) for p in choice.output)
        reason = "stop" if called or choice.stopped_by_sequence else finish.reason
        return _head(self.model) | body | {"done": True, "done_reason": reason} | self.stats(finish)

    def stats(self, finish: FinishEvent) -> dict[str, int]:
        s = finish.stats
        eval_s = s.completion_tokens / s.decode_tok_s if s.decode_tok_s > 0 else 0.0
        return {
            "total_duration": _ns(time.perf_counter() - self.timing.started_s),
            "load_duration": _ns(self.timing.load_s),
            "prompt_eval_count": s.evaluated_tokens or s.prompt_tokens - s.cached_tokens,
            "prompt_eval_duration": _ns(max(s.ttft_s - s.queue_s, 0.0)),
            "eval_count": s.completion_tokens,
            "eval_duration": _ns(eval_s),
        }

    def whole(self, choice: ParsedChoice) -> dict[str, Any]:
        reasoning, content, calls = choice.parts()
        return self.done(choice, self.body(content, reasoning, calls if self.chat else ()))


async def _lines(
    ctx: RequestContext,
    writer: _Writer,
    handles: Sequence[HandleLike],
    choices: list[ParsedChoice],
) -> AsyncIterator[bytes]:
    choice, completed = choices[0], False
    try:
        async for _, event in merged_events(handles):
            choice.add(event)
            for piece in choice.take():
                line = writer.piece_line(piece)
                if line is not None:
                    yield line
        completed = True
        yield ndjson(writer.done(choice, writer.body("")))
    except Exception as exc:  # after the stream started: Ollama's error line
        completed = True
        yield ndjson(api_error_from(exc).ollama_envelope())
    finally:
        cancel_all(handles)
        record(ctx, choices, cancelled=not completed)


async def embed(ctx: RequestContext, req: OllamaEmbedRequest, timing: Timing) -> Response:
    vectors, prompt_tokens = await embed_texts(
        ctx, req.model, req.texts(), req.dimensions, truncate=req.truncate
    )
    return JSONResponse(
        {
            "model": req.model,
            "embeddings": [[float(x) for x in v] for v in vectors],
            "total_duration": _ns(time.perf_counter() - timing.started_s),
            "load_duration": _ns(timing.load_s),
            "prompt_eval_count": prompt_tokens,
        }
    )


async def legacy_embeddings(ctx: RequestContext, req: OllamaEmbeddingsRequest) -> Response:
    vectors, _ = await embed_texts(ctx, req.model, [req.prompt], None, truncate=True)
    return JSONResponse({"embedding": [float(x) for x in vectors[0]]})


# --- the routes ------------------------------------------------------------------------------


def served_name(host: OllamaHost, name: str) -> str:
    """``name``, or without Ollama's default tag (``tiny:latest`` -> ``tiny``) when that is
    what this server serves."""
    base = name.removesuffix(":latest")
    if base == name:
        return name
    if host.fleet is not None:
        return base if base in host.fleet.models else name
    return base if host.config.accepts_model(base) else name


def add_routes(app: FastAPI, host: OllamaHost, parse: ParseFn[Any], context: ContextFn) -> None:
    """Ollama's routes; ``parse`` and ``context`` are the app's body parser and serving
    context (the tenant, the fleet's lease, ``keep_alive``)."""

    async def opened(request: Request, name: str) -> tuple[RequestContext, Timing]:
        started_s = time.perf_counter()
        served = served_name(host, name)
        ctx = await context(request, served)
        check_model_name(ctx.config, served)
        return ctx, Timing(started_s, time.perf_counter() - started_s)

    @app.post("/api/chat", tags=["ollama"], openapi_extra=body_doc("OllamaChatRequest"))
    async def ollama_chat(request: Request) -> Response:
        body = await parse(request, OllamaChatRequest)
        ctx, timing = await opened(request, body.model)
        return await chat(ctx, body, timing)

    @app.post("/api/generate", tags=["ollama"], openapi_extra=body_doc("OllamaGenerateRequest"))
    async def ollama_generate(request: Request) -> Response:
        body = await parse(request, OllamaGenerateRequest)
        ctx, timing = await opened(request, body.model)
        return await generate(ctx, body, timing)

    @app.post("/api/embed", tags=["ollama"], openapi_extra=body_doc("OllamaEmbedRequest"))
    async def ollama_embed(request: Request) -> Response:
        body = await parse(request, OllamaEmbedRequest)
        ctx, timing = await opened(request, body.model)
        return await embed(ctx, body, timing)

    @app.post("/api/embeddings", tags=["ollama"], openapi_extra=body_doc("OllamaEmbeddingsRequest"))
    async def ollama_embeddings(request: Request) -> Response:
        body = await parse(request, OllamaEmbeddingsRequest)
        ctx, _ = await opened(request, body.model)
        return await legacy_embeddings(ctx, body)

    _add_model_routes(app, host, parse)


def _add_model_routes(app: FastAPI, host: OllamaHost, parse: ParseFn[Any]) -> None:
    @app.get("/api/version", tags=["ollama"])
    async def ollama_version() -> JSONResponse:
        return JSONResponse({"version": OLLAMA_API_VERSION, "homelab": __version__})

    @app.get("/api/tags", tags=["ollama"])
    async def ollama_tags() -> JSONResponse:
        listed = await listed_models(host.config, host.fleet, host.engine_provider)
        return JSONResponse({"models": [tag_entry(m) for m in listed]})

    @app.get("/api/ps", tags=["ollama"])
    async def ollama_ps() -> JSONResponse:
        listed = await listed_models(host.config, host.fleet, host.engine_provider)
        return JSONResponse({"models": [ps_entry(m) for m in listed if m.engine is not None]})

    @app.post("/api/show", tags=["ollama"], openapi_extra=body_doc("OllamaModelRequest"))
    async def ollama_show(request: Request) -> JSONResponse:
        body = await parse(request, OllamaModelRequest)
        name = served_name(host, body.model_name)
        listed = await listed_models(host.config, host.fleet, host.engine_provider)
        found = next((m for m in listed if m.name == name), None)
        if found is None:
            raise ApiError(404, f"model '{body.model_name}' not found", param="model")
        return JSONResponse(await show_body(found, host.fleet))

    @app.post("/api/pull", tags=["ollama"], openapi_extra=body_doc("OllamaModelRequest"))
    async def ollama_pull(request: Request) -> Response:
        body = await parse(request, OllamaModelRequest)
        name = served_name(host, body.model_name)
        listed = await listed_models(host.config, host.fleet, host.engine_provider)
        if any(m.name == name for m in listed):  # here already: nothing to download
            return _pull_done(body.stream)
        raise ApiError(
            403,
            f"homelab does not download models over HTTP ('{body.model_name}' is not served "
            "here). On the server's machine run `homelab pull MODEL` (it plans the download "
            "for this hardware first), then restart `homelab serve`.",
            code="pull_not_allowed",
        )


def _pull_done(stream: bool) -> Response:
    if stream:
        return Response(ndjson({"status": "success"}), media_type="application/x-ndjson")
    return JSONResponse({"status": "success"})
