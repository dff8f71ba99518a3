"""The engine's public contract: what callers (CLI, server, TUI, bench) submit and receive.

A caller builds a :class:`GenerationRequest`, calls ``Engine.submit`` and gets a
:class:`RequestHandle`; the handle yields :class:`TokenEvent` items and ends with exactly one
:class:`FinishEvent` (iterate it in a thread, or ``async for`` it in asyncio). ``submit``
raises ``ContextLengthError`` / ``BusyError`` synchronously, before any compute.
The tenant is always set by the caller (the server derives it from the API key), never from
request fields.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from homelab.engine.image_prompt import ImagePrompt

FinishReason = Literal["stop", "length", "cancelled", "error"]


DEFAULT_TEMPERATURE = 0.8  # sampling when a request names none (0 = greedy)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = DEFAULT_TEMPERATURE  # 0 => greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None  # None => random per request
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # never emitted; matched across token boundaries
    logprobs: int | None = None  # None => off; N => chosen token's logprob + top N alternatives
    grammar: str | None = None  # GBNF (e.g. from a JSON schema); size/nesting bounded
    ignore_eos: bool = False  # end-of-generation tokens are never sampled; max_tokens ends it
    min_tokens: int = 0  # end-of-generation tokens are not sampled before this many tokens


@dataclass(frozen=True)
class GenerationRequest:
    tenant: str
    prompt: str | tuple[int, ...]  # text (special tokens parsed) or token ids
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""
    add_bos: bool = True  # for text prompts; chat prompts rendered from the template set this
    # a prompt with images (from ``Engine.tokenize_images``): its tokens are the prompt
    images: ImagePrompt | None = None


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


class TokenEvent(NamedTuple):
    """One generated token (a named tuple, not a dataclass: one is made per token on the
    compute lane, and a frozen dataclass costs 3x as much to build)."""

    text: str  # complete UTF-8 text released by this step (may be "" while bytes are pending)
    token_id: int
    logprob: TokenLogprob | None = None


# ``new_token_event((text, token_id, logprob))``: the same TokenEvent, built without calling
# NamedTuple's ``__new__`` (a Python function: the compute lane builds one event per token)
new_token_event = functools.partial(tuple.__new__, TokenEvent)


@dataclass(frozen=True)
class RequestStats:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from this tenant's prefix cache
    completion_tokens: int
    ttft_s: float  # submit -> first token
    prefill_tok_s: float
    decode_tok_s: float
    queue_s: float
    evaluated_tokens: int = 0  # prompt tokens actually evaluated (prompt_tokens - cached_tokens)
    draft_tokens: int = 0  # tokens drafted for it (speculative decoding), verified or not
    accepted_draft_tokens: int = 0  # completion tokens that came from an accepted draft


@dataclass(frozen=True)
class FinishEvent:
    reason: FinishReason
    stats: RequestStats
    error: str | None = None  # set when reason == "error" (safe to show the user)
    fatal: bool = False  # the engine can serve nothing more (a lost RPC worker): see error


@dataclass(frozen=True)
class EngineMetrics:
    """An engine-wide snapshot published to subscribers at a steady rate."""

    prefill_tok_s: float  # rolling
    decode_tok_s: float  # rolling
    active_slots: int
    n_slots: int
    queue_depth: int
    kv_cells_used: int
    kv_cells_total: int
    requests_total: int
    requests_by_status: Mapping[str, int]
    last_ttft_s: float | None
    steps_total: int = 0  # scheduler steps (llama_decode calls) so far
    prefill_tokens_total: int = 0
    decode_tokens_total: int = 0
    speculation: str | None = None  # "ngram" or "draft" when the engine speculates
    draft_tokens_total: int = 0  # drafted tokens the target verified
    accepted_draft_tokens_total: int = 0
    acceptance_rate: float | None = None  # rolling accepted / drafted (None: nothing drafted)
    step_phases_us: Mapping[str, float] | None = None  # mean µs per step and phase (profiled)
    tokens_per_target_step: float | None = None  # rolling tokens a generating sequence gains
    # per target step: 1.0 without speculation, up to 1 + max_draft_tokens with it
