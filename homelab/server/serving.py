"""What every generating route (chat, completions, Anthropic's messages, responses) shares
below its dialect: the :class:`RequestContext` of one request, checks that need the loaded
model (model name, choices, token ids, logit bias, context room and ``max_tokens``),
:class:`SamplingKnobs` -> :class:`~homelab.engine.api.SamplingParams`, tokenizing off the
event loop, submitting choices as :class:`~homelab.engine.api.GenerationRequest` items for
the key's tenant, reading their events back (merged, cancellable), usage, ids, and the
request's record in the metrics.

The routes parse and validate the wire request (``*_protocol.py``) and map it themselves;
the only wire shape read here is the sampling fields OpenAI's chat and text completions share
(:meth:`SamplingKnobs.of`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from homelab.engine.api import (
    FinishEvent,
    GenerationRequest,
    RequestStats,
    SamplingParams,
    TokenLogprob,
)
from homelab.engine.image_prompt import ImagePrompt
from homelab.errors import BusyError, ContextLengthError, EngineClosedError, EngineError
from homelab.server.auth import PREPARATION_LANE_KEY, Tenant
from homelab.server.config import ServerConfig
from homelab.server.engine_seam import EngineLike, Event, HandleLike
from homelab.server.errors import (
    ApiError,
    context_length_exceeded,
    invalid_request,
    prompt_too_long,
)
from homelab.server.metrics import ServerMetrics
from homelab.server.protocol import SamplingRequest
from homelab.server.streaming import run_while_connected

log = logging.getLogger("homelab.server")

SEED_MODULUS = 2**32
INLINE_CHARS = 8192  # shorter texts are tokenized / rendered on the event loop (microseconds)
INLINE_TURNS = 64  # shorter conversations are converted and prepared on the event loop
T = TypeVar("T")
CLIENT_GONE_STATUS = 499  # nobody reads it: the client disconnected before the answer


def new_id(prefix: str) -> str:
    """The one id scheme: ``prefix`` (with its separator, as each dialect spells its ids:
    ``chatcmpl-``, ``msg_``, ``resp_``…) and 24 random hex digits."""
    return f"{prefix}{secrets.token_hex(12)}"


@dataclass
class RequestContext:
    """Everything one request's handling needs besides the wire request."""

    engine: EngineLike
    config: ServerConfig
    metrics: ServerMetrics
    tenant: Tenant
    usage: dict[str, Any]  # filled for the request log (see middleware.USAGE_KEY)
    http: Request
    request_id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def new_id(self, prefix: str) -> str:
        """This request's id (see :func:`new_id`)."""
        self.request_id = new_id(prefix)
        return self.request_id


@dataclass(frozen=True)
class Prompt:
    tokens: tuple[int, ...]
    text: str | None  # None for token-id prompts
    images: ImagePrompt | None = None  # a chat with images: its tokens are these tokens


@dataclass
class ChoiceState:
    """One choice's accumulated output."""

    index: int
    prompt_index: int
    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)  # where each logprob's token starts
    finish: FinishEvent | None = None
    _length: int = 0

    def add(self, event: Event) -> None:
        if isinstance(event, FinishEvent):
            self.finish = event
            return
        if event.logprob is not None:
            self.logprobs.append(event.logprob)
            self.text_offsets.append(self._length)
        self.pieces.append(event.text)
        self._length += len(event.text)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


# --- checks that need the model -------------------------------------------------------------


def check_model_name(config: ServerConfig, name: str) -> None:
    if not config.accepts_model(name):
        message = (
            f"The model '{name}' does not exist on this server; it serves '{config.model_id}'."
        )
        raise ApiError(404, message, param="model", code="model_not_found")


def check_choices(config: ServerConfig, n_choices: int) -> None:
    if n_choices > config.max_choices:
        message = f"At most {config.max_choices} choices per request are allowed, got {n_choices}."
        raise invalid_request(message, param="n")


def logit_bias_ids(bias: Mapping[str, float] | None, n_vocab: int) -> dict[int, float]:
    ids = {int(token): value for token, value in (bias or {}).items()}
    outside = [token for token in ids if token >= n_vocab]
    if outside:
        message = (
            f"Token id {outside[0]} in logit_bias is outside the vocabulary (0..{n_vocab - 1})."
        )
        raise invalid_request(message, param="logit_bias")
    return ids


def check_token_ids(tokens: Sequence[int], n_vocab: int, param: str) -> None:
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise invalid_request(
            f"Token id {bad} is outside the vocabulary (0..{n_vocab - 1}).", param=param
        )


def max_tokens_for(
    ctx: RequestContext,
    requested: int | None,
    default: int,
    prompt_tokens: int,
    min_tokens: int = 0,
) -> int:
    """The completion budget: as requested (within the server's limit) or the default (but
    at least ``min_tokens``), and always within the context left after the prompt."""
    n_ctx = ctx.engine.n_ctx_per_slot
    limit = min(ctx.config.max_tokens_limit or n_ctx, n_ctx)
    if requested is not None and requested > limit:
        message = (
            f"max_tokens is too large: {requested}. "
            f"This model supports at most {limit} completion tokens."
        )
        raise invalid_request(message, param="max_tokens")
    if requested is not None and min_tokens > requested:
        message = f"min_tokens ({min_tokens}) is larger than max_tokens ({requested})."
        raise invalid_request(message, param="min_tokens")
    room = n_ctx - prompt_tokens
    wanted = requested if requested is not None else max(min_tokens, 1)
    if room < 1 or wanted > room:
        raise context_length_exceeded(prompt_tokens, wanted, n_ctx)
    return requested if requested is not None else max(min(default, room), min_tokens)


@dataclass(frozen=True)
class SamplingKnobs:
    """A request's sampling choices in any dialect (None: the engine's default)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    logit_bias: Mapping[str, float] | None = None
    stop: tuple[str, ...] = ()  # matched by the engine, never emitted
    logprobs: int | None = None  # None: off; N: the chosen token's and the top N
    ignore_eos: bool = False  # generate to max_tokens: end-of-text is never sampled
    min_tokens: int = 0  # end-of-text is not sampled before this many tokens

    @classmethod
    def of(cls, req: SamplingRequest, logprobs: int | None = None) -> SamplingKnobs:
        """Chat and text completions' knobs (``logprobs`` as each of them spells it)."""
        return cls(
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            min_p=req.min_p,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=req.seed,
            logit_bias=req.logit_bias,
            stop=req.stop_strings(),
            logprobs=logprobs,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
        )


def sampling_params(
    knobs: SamplingKnobs,
    *,
    max_tokens: int,
    n_vocab: int,
    grammar: str | None,
    choice_index: int,
) -> SamplingParams:
    defaults = SamplingParams()
    seed = None if knobs.seed is None else (knobs.seed + choice_index) % SEED_MODULUS
    return SamplingParams(
        temperature=defaults.temperature if knobs.temperature is None else knobs.temperature,
        top_k=defaults.top_k if knobs.top_k is None else knobs.top_k,
        top_p=defaults.top_p if knobs.top_p is None else knobs.top_p,
        min_p=defaults.min_p if knobs.min_p is None else knobs.min_p,
        repeat_penalty=knobs.repetition_penalty or defaults.repeat_penalty,
        presence_penalty=knobs.presence_penalty or 0.0,
        frequency_penalty=knobs.frequency_penalty or 0.0,
        seed=seed,
        logit_bias=logit_bias_ids(knobs.logit_bias, n_vocab),
        max_tokens=max_tokens,
        stop=knobs.stop,
        logprobs=knobs.logprobs,
        grammar=grammar,
        ignore_eos=knobs.ignore_eos,
        min_tokens=knobs.min_tokens,
    )


async def off_the_loop_when_long(ctx: RequestContext, work: Callable[[], T], turns: int) -> T:
    """``work``, a Python loop over a request's turns: on the event loop for a short request,
    else in the tenant's preparation lane (16,000 Anthropic turns held the loop ~150 ms)."""
    if turns <= INLINE_TURNS:
        return work()
    return await anyio.to_thread.run_sync(work, limiter=preparation_lane(ctx.http.scope))


def preparation_lane(scope: Mapping[str, Any]) -> anyio.CapacityLimiter | None:
    """The request's tenant's lane for long preparations (None: anyio's shared threads)."""
    lane = scope.get(PREPARATION_LANE_KEY)
    return lane if isinstance(lane, anyio.CapacityLimiter) else None


async def tokenize(engine: EngineLike, text: str, add_bos: bool) -> tuple[int, ...]:
    """Tokenize a prompt that must fit the context; a long one off the event loop.

    A text that cannot fit is refused after work bounded by the context, not by its size
    (see ``Engine.tokenize_within``): a multi-megabyte prompt costs milliseconds, not minutes.
    """
    limit = engine.n_ctx_per_slot - 1  # at least one completion token must fit

    def run() -> Sequence[int]:
        return engine.tokenize_within(text, limit, add_bos=add_bos, special=True)

    try:
        tokens = run() if len(text) <= INLINE_CHARS else await anyio.to_thread.run_sync(run)
    except ContextLengthError as exc:
        raise prompt_too_long(engine.n_ctx_per_slot, exc.message) from None
    return tuple(tokens)


# --- running choices ------------------------------------------------------------------------


def submit_choices(
    ctx: RequestContext,
    prompts: Sequence[Prompt],
    n: int,
    sampling_for: Callable[[int, Prompt], SamplingParams],
) -> tuple[list[HandleLike], list[ChoiceState]]:
    """Submit ``n`` choices per prompt; on any failure cancel what was already submitted."""
    handles: list[HandleLike] = []
    states: list[ChoiceState] = []
    if ctx.config.log_prompts:
        for prompt in prompts:
            log.info(
                "prompt %s tenant=%s: %r",
                ctx.request_id,
                ctx.tenant.name,
                prompt.text or prompt.tokens,
            )
    try:
        for prompt_index, prompt in enumerate(prompts):
            for _ in range(n):
                index = len(handles)
                request = GenerationRequest(
                    tenant=ctx.tenant.identity,
                    prompt=prompt.tokens,
                    sampling=sampling_for(index, prompt),
                    request_id=f"{ctx.request_id}-{index}",
                    add_bos=False,
                    images=prompt.images,
                )
                handles.append(_submit(ctx.engine, request))
                states.append(ChoiceState(index, prompt_index))
    except BaseException:
        cancel_all(handles)
        raise
    return handles, states


def _submit(engine: EngineLike, request: GenerationRequest) -> HandleLike:
    """Submit; the engine's synchronous refusals are about this request (400), except
    context (400 with its code), a full queue (503) and a closed engine (503), which
    :func:`~homelab.server.errors.api_error_from` maps."""
    try:
        return engine.submit(request)
    except (ContextLengthError, BusyError, EngineClosedError):
        raise
    except EngineError as exc:
        raise invalid_request(f"The request cannot be served: {exc}") from exc


def cancel_all(handles: Sequence[HandleLike]) -> None:
    for handle in handles:
        handle.cancel()


async def merged_events(handles: Sequence[HandleLike]) -> AsyncIterator[tuple[int, Event]]:
    """Events of all handles as they come, tagged with the choice index."""
    if len(handles) == 1:
        async for event in handles[0].events():
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, Event | BaseException]] = asyncio.Queue()

    async def pump(index: int, handle: HandleLike) -> None:
        try:
            async for event in handle.events():
                queue.put_nowait((index, event))
        except Exception as exc:
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(handles)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            remaining -= isinstance(item, FinishEvent)
            yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def collect(
    ctx: RequestContext, handles: Sequence[HandleLike], states: Sequence[ChoiceState]
) -> bool:
    """Read every choice to its end; False when the client went away first (all cancelled)."""

    async def read_all() -> None:
        if len(handles) == 1:
            every = [await handles[0].all_events()]
        else:
            every = await asyncio.gather(*(handle.all_events() for handle in handles))
        for state, events in zip(states, every, strict=True):
            for event in events:
                state.add(event)

    try:
        return await run_while_connected(ctx.http.receive, read_all())
    finally:
        cancel_all(handles)  # no-op for finished ones


async def respond(
    ctx: RequestContext,
    handles: Sequence[HandleLike],
    states: Sequence[ChoiceState],
    body: Callable[[], Mapping[str, Any]],
) -> Response:
    """A whole (non-streamed) response: every choice collected, recorded, then ``body()``;
    the client-gone status when the client left first (everything cancelled)."""
    if not await collect(ctx, handles, states):
        record(ctx, states, cancelled=True)
        return Response(status_code=CLIENT_GONE_STATUS)
    record(ctx, states)
    return JSONResponse(body())


def check_finish(finish: FinishEvent | None) -> FinishEvent:
    """A finish that ended in an engine error becomes the error to report."""
    if finish is None or finish.reason == "cancelled":
        raise ApiError(
            503, "The generation was cancelled (the server is shutting down).", code="cancelled"
        )
    if finish.reason == "error":
        log.error("generation failed: %s", finish.error)
        if finish.fatal:  # the engine is failed for good (a lost RPC worker): say why
            raise ApiError(503, finish.error or "The engine has failed.", code="engine_failed")
        raise ApiError(
            500, "The model failed while generating the response.", code="generation_failed"
        )
    return finish


# --- accounting -----------------------------------------------------------------------------


def usage(states: Sequence[ChoiceState]) -> dict[str, Any]:
    """OpenAI usage: each prompt counted once; cached tokens are this tenant's reuse."""
    prompt_stats: dict[int, RequestStats] = {}
    completion_tokens = 0
    for state in states:
        if state.finish is None:
            continue
        prompt_stats.setdefault(state.prompt_index, state.finish.stats)
        completion_tokens += state.finish.stats.completion_tokens
    prompt_tokens = sum(s.prompt_tokens for s in prompt_stats.values())
    cached_tokens = sum(s.cached_tokens for s in prompt_stats.values())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def record(ctx: RequestContext, states: Sequence[ChoiceState], cancelled: bool = False) -> None:
    """Feed finished choices into the metrics and the request log."""
    for state in states:
        if state.finish is not None:
            ctx.metrics.observe_generation(state.finish.stats)
    if cancelled:
        ctx.metrics.observe_client_gone()
    totals = usage(states)
    ttfts = [s.finish.stats.ttft_s for s in states if s.finish and s.finish.stats.completion_tokens]
    ctx.usage.update(
        prompt_tokens=totals["prompt_tokens"],
        cached_tokens=totals["prompt_tokens_details"]["cached_tokens"],
        completion_tokens=totals["completion_tokens"],
        ttft_s=min(ttfts) if ttfts else None,
    )
    if ctx.config.log_prompts:
        for state in states:
            log.info(
                "output %s[%d] tenant=%s: %r",
                ctx.request_id,
                state.index,
                ctx.tenant.name,
                state.text,
            )
