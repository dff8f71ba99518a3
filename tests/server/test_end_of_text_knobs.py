"""``ignore_eos`` and ``min_tokens`` (llama-server's and vLLM's extensions, sent by benchmark
clients) on chat and text completions, through the unmodified ``openai`` SDK and the real
engine. A logit bias of +100 on both end-of-text tokens of the demo vocabulary (``</s>`` = 2,
``<|im_end|>`` = 4) makes the model want to stop at once, so each knob's effect is exact."""

from __future__ import annotations

import openai
import pytest
from server_helpers import MODEL_ID

WANTS_TO_STOP = {"2": 100, "4": 100}
USER = [{"role": "user", "content": "hello world, tell me about the cache"}]


def chat(client: openai.OpenAI, **extra: object) -> tuple[int, str]:
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=USER,
        max_tokens=8,
        temperature=0,
        logit_bias=WANTS_TO_STOP,
        logprobs=True,
        extra_body=extra,
    )
    logprobs = reply.choices[0].logprobs
    tokens = len(logprobs.content or []) if logprobs is not None else 0
    return tokens, str(reply.choices[0].finish_reason)


def complete(client: openai.OpenAI, **extra: object) -> tuple[int, str]:
    reply = client.completions.create(
        model=MODEL_ID,
        prompt="The cache",
        max_tokens=8,
        temperature=0,
        logit_bias=WANTS_TO_STOP,
        logprobs=0,
        extra_body=extra,
    )
    logprobs = reply.choices[0].logprobs
    tokens = len(logprobs.tokens or []) if logprobs is not None else 0
    return tokens, str(reply.choices[0].finish_reason)


@pytest.mark.parametrize("call", [chat, complete], ids=["chat", "completions"])
def test_without_knobs_the_model_stops_at_once(client: openai.OpenAI, call: object) -> None:
    tokens, finish = call(client)  # type: ignore[operator]
    assert finish == "stop" and tokens <= 1  # the end-of-text token itself, at most


@pytest.mark.parametrize("call", [chat, complete], ids=["chat", "completions"])
def test_ignore_eos_generates_to_max_tokens(client: openai.OpenAI, call: object) -> None:
    tokens, finish = call(client, ignore_eos=True)  # type: ignore[operator]
    assert (tokens, finish) == (8, "length")


@pytest.mark.parametrize("call", [chat, complete], ids=["chat", "completions"])
def test_min_tokens_holds_the_end_back(client: openai.OpenAI, call: object) -> None:
    tokens, finish = call(client, min_tokens=5)  # type: ignore[operator]
    assert finish == "stop"
    assert tokens in (5, 6)  # five tokens, then the end-of-text token (with its logprob)


def test_min_tokens_above_max_tokens_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        chat(client, min_tokens=9)


def test_min_tokens_raises_the_default_budget(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL_ID,
        prompt="The cache",
        temperature=0,
        logit_bias={"2": -100, "4": -100},
        extra_body={"min_tokens": 40},
    )  # no max_tokens: the default (16 for completions, as OpenAI) is raised to min_tokens
    assert reply.usage is not None and reply.usage.completion_tokens == 40
