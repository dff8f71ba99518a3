"""``POST /v1/completions``: raw prompts (text or token ids, one or many), streaming and not."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.responses import Response

from homelab.engine.api import SamplingParams, TokenEvent
from homelab.server.engine_seam import HandleLike
from homelab.server.errors import api_error_from
from homelab.server.protocol import CompletionRequest
from homelab.server.serving import (
    ChoiceState,
    Prompt,
    RequestContext,
    SamplingKnobs,
    cancel_all,
    check_choices,
    check_finish,
    check_model_name,
    check_token_ids,
    max_tokens_for,
    merged_events,
    record,
    respond,
    sampling_params,
    submit_choices,
    tokenize,
    usage,
)
from homelab.server.streaming import (
    DONE,
    EventStreamResponse,
    next_event_ready,
    sse_error,
    sse_event,
    text_events,
)


async def text_completion(ctx: RequestContext, req: CompletionRequest) -> Response:
    prompts, sampling_for = await _prepare_all(ctx, req)
    ctx.new_id("cmpl-")
    handles, states = submit_choices(ctx, prompts, req.n, sampling_for)
    echoes = [_echo_text(ctx, prompts[s.prompt_index]) if req.echo else "" for s in states]
    if req.stream:
        return EventStreamResponse(
            _stream(ctx, req, handles, states, echoes), next_event_ready(handles), handles=handles
        )
    want_logprobs = req.logprobs is not None
    return await respond(
        ctx,
        handles,
        states,
        lambda: {
            **_header(ctx, req),
            "choices": [_choice(s, echoes[s.index], want_logprobs) for s in states],
            "usage": usage(states),
        },
    )


async def _prepare_all(
    ctx: RequestContext, req: CompletionRequest
) -> tuple[list[Prompt], Callable[[int, Prompt], SamplingParams]]:
    check_model_name(ctx.config, req.model)
    raw_prompts = req.prompts()
    check_choices(ctx.config, len(raw_prompts) * req.n)
    prompts = [await _prepare(ctx, raw) for raw in raw_prompts]
    longest = max(len(p.tokens) for p in prompts)
    default = ctx.config.default_completion_max_tokens
    max_tokens = max_tokens_for(ctx, req.max_tokens, default, longest, req.min_tokens)
    n_vocab = ctx.engine.model_info.n_vocab
    knobs = SamplingKnobs.of(req, req.logprobs)

    def sampling_for(index: int, _: Prompt) -> SamplingParams:
        return sampling_params(
            knobs, max_tokens=max_tokens, n_vocab=n_vocab, grammar=None, choice_index=index
        )

    return prompts, sampling_for


async def _prepare(ctx: RequestContext, raw: str | tuple[int, ...]) -> Prompt:
    if isinstance(raw, str):
        return Prompt(await tokenize(ctx.engine, raw, add_bos=True), raw)
    check_token_ids(raw, ctx.engine.model_info.n_vocab, param="prompt")
    return Prompt(raw, None)


def _echo_text(ctx: RequestContext, prompt: Prompt) -> str:
    if prompt.text is not None:
        return prompt.text
    return ctx.engine.detokenize(list(prompt.tokens))


def _header(ctx: RequestContext, req: CompletionRequest) -> dict[str, Any]:
    return {
        "id": ctx.request_id,
        "object": "text_completion",
        "created": ctx.created,
        "model": req.model,
        "system_fingerprint": None,
    }


def _choice(state: ChoiceState, echo: str, want_logprobs: bool) -> dict[str, Any]:
    finish = check_finish(state.finish)
    return {
        "index": state.index,
        "text": echo + state.text,
        "logprobs": completion_logprobs(state, len(echo)) if want_logprobs else None,
        "finish_reason": finish.reason,
    }


def completion_logprobs(state: ChoiceState, offset: int = 0, start: int = 0) -> dict[str, Any]:
    entries = state.logprobs[start:]
    return {
        "tokens": [lp.token for lp in entries],
        "token_logprobs": [lp.logprob for lp in entries],
        "top_logprobs": [dict(lp.top) for lp in entries],
        "text_offset": [offset + at for at in state.text_offsets[start:]],
    }


async def _stream(
    ctx: RequestContext,
    req: CompletionRequest,
    handles: Sequence[HandleLike],
    states: list[ChoiceState],
    echoes: list[str],
) -> AsyncIterator[bytes]:
    base = _header(ctx, req)
    if req.include_usage():
        base["usage"] = None
    want_logprobs = req.logprobs is not None

    def payload(
        index: int, text: str, finish_reason: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return {**base, "choices": [choice]}

    def chunk(
        index: int, text: str, finish_reason: str | None = None, logprobs: Any = None
    ) -> bytes:
        return sse_event(payload(index, text, finish_reason, logprobs))

    # a token's text alone (no log-probabilities): the chunk's bytes around it made once
    text_chunks = [text_events(functools.partial(payload, state.index)) for state in states]

    completed = False
    try:
        for state in states:
            if echoes[state.index]:
                yield chunk(state.index, echoes[state.index])
        async for index, event in merged_events(handles):
            state = states[index]
            seen = len(state.logprobs)
            state.add(event)
            if isinstance(event, TokenEvent):
                if not want_logprobs:
                    if event.text:
                        yield text_chunks[index](event.text)
                    continue
                logprobs = completion_logprobs(state, len(echoes[index]), seen)
                yield chunk(index, event.text, logprobs=logprobs)
                continue
            yield chunk(index, "", finish_reason=check_finish(event).reason)
        if req.include_usage():
            yield sse_event({**base, "choices": [], "usage": usage(states)})
        completed = True
        yield DONE
    except Exception as exc:
        completed = True
        yield sse_error(api_error_from(exc))
        yield DONE
    finally:
        cancel_all(handles)
        record(ctx, states, cancelled=not completed)
