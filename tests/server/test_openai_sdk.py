"""The official ``openai`` SDK, unmodified, against the real server (sync and async,
streaming and not): what a chat UI, a coding agent or a script would do."""

from __future__ import annotations

import json

import openai
import pytest
from server_helpers import ALICE_KEY, MODEL_ID, N_CTX_PER_SLOT

from homelab.server.protocol import ChatCompletion, Completion, ModelList
from homelab.server.runner import ServerHandle

USER = [{"role": "user", "content": "hello world, tell me about the cache"}]


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_completion_shape_and_usage(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=8, temperature=0
    )
    ChatCompletion.model_validate(response.model_dump())  # our documented schema
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage is not None and usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert (
        usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens >= 0
    )


def test_max_tokens_and_max_completion_tokens_cap_the_output(client: openai.OpenAI) -> None:
    for params in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        response = client.chat.completions.create(
            model=MODEL_ID, messages=USER, temperature=0, logit_bias={"2": -100}, **params
        )  # logit_bias bans </s> so the model cannot stop early
        assert response.usage is not None and response.usage.completion_tokens == 3
        assert response.choices[0].finish_reason == "length"


def test_greedy_is_deterministic_and_seed_reproduces(client: openai.OpenAI) -> None:
    def run(**params: object) -> str:
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=USER, max_tokens=12, **params
        )
        return reply.choices[0].message.content or ""

    assert run(temperature=0) == run(temperature=0)
    assert run(temperature=1.0, seed=1234) == run(temperature=1.0, seed=1234)


def test_stop_string_ends_the_output_before_it(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=16, temperature=0
    )
    text = base.choices[0].message.content or ""
    stop = text[3:5] if len(text) >= 5 and text[3:5].strip() else text[:2]
    stopped = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=16, temperature=0, stop=[stop]
    )
    content = stopped.choices[0].message.content or ""
    assert stop not in content and text.startswith(content)
    assert stopped.choices[0].finish_reason == "stop"


def test_streaming_chat_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=USER,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes in (["length"], ["stop"])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    whole = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=6, temperature=0
    )
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_n_returns_that_many_choices(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=4, n=3, seed=7
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=4, n=2, stream=True
    )
    finished = {c.choices[0].index for c in stream if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = response.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries is not None and len(entries) == response.usage.completion_tokens  # type: ignore[union-attr]
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob


def test_json_object_mode_returns_json(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL_ID,
        messages=USER,
        max_tokens=48,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if response.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(response.choices[0].message.content or ""), dict)
    else:  # a random-weights model may run out of tokens mid-object; what it wrote is JSON so far
        assert (response.choices[0].message.content or "").lstrip().startswith("{")


def test_json_schema_mode_follows_the_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = client.chat.completions.create(
        model=MODEL_ID,
        messages=USER,
        max_tokens=32,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": schema},
        },
    )
    assert json.loads(response.choices[0].message.content or "")["answer"] in ("yes", "no")


def test_text_completion_and_echo(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL_ID, prompt="the cache", max_tokens=5, temperature=0
    )
    Completion.model_validate(response.model_dump())
    assert response.object == "text_completion" and response.usage is not None
    echoed = client.completions.create(
        model=MODEL_ID, prompt="the cache", max_tokens=5, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "the cache" + response.choices[0].text


def test_text_completion_batch_and_token_prompt_and_logprobs(client: openai.OpenAI) -> None:
    batch = client.completions.create(
        model=MODEL_ID, prompt=["one", "two"], max_tokens=3, n=2, logprobs=2
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    logprobs = batch.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    by_ids = client.completions.create(model=MODEL_ID, prompt=[1, 300, 301], max_tokens=2)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == 3


def test_streaming_text_completion(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL_ID, prompt="the cache", max_tokens=5, temperature=0, stream=True
        )
    )
    whole = client.completions.create(
        model=MODEL_ID, prompt="the cache", max_tokens=5, temperature=0
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_errors_are_the_sdks_typed_exceptions(client: openai.OpenAI, server: ServerHandle) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "robot", "content": "x"}])  # type: ignore[misc,list-item]
    assert bad.value.body["param"] == "messages[0].role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "the " * 2 * N_CTX_PER_SLOT}]
        )
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=USER)
    with (
        openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.models.list()


async def test_async_client_chat_and_stream(server: ServerHandle) -> None:
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key=ALICE_KEY, max_retries=0
    ) as sdk:
        whole = await sdk.chat.completions.create(
            model=MODEL_ID, messages=USER, max_tokens=5, temperature=0
        )
        stream = await sdk.chat.completions.create(
            model=MODEL_ID, messages=USER, max_tokens=5, temperature=0, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == whole.choices[0].message.content
        with pytest.raises(openai.BadRequestError):
            await sdk.completions.create(model=MODEL_ID, prompt="x", max_tokens=10**9)


def test_models_response_matches_documented_schema(client: openai.OpenAI) -> None:
    ModelList.model_validate(client.models.list().model_dump())
