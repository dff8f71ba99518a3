"""The official ``openai`` SDK, unmodified, against the real server (sync and async,
streaming and not): what a chat UI, a coding agent or a script would do."""

from __future__ import annotations

import json
import string
from collections.abc import Callable

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


class _EndOfText(Exception):
    """The text ran out where more JSON could still follow: a valid prefix so far."""


class _JsonPrefixChecker:
    """Recursive descent over JSON that accepts running out of text anywhere, and rejects
    the first character no JSON document could have there."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def next_char(self) -> str:
        """The next non-blank character, not consumed."""
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1
        if self.pos == len(self.text):
            raise _EndOfText
        return self.text[self.pos]

    def take(self, expected: str) -> None:
        if self.next_char() not in expected:
            raise ValueError(f"expected one of {expected!r} at {self.pos}")
        self.pos += 1

    def value(self) -> None:
        first = self.next_char()
        if first == "{":
            self.container("}", self.member)
        elif first == "[":
            self.container("]", self.value)
        elif first == '"':
            self.string()
        elif first in "tfn":
            self.literal({"t": "true", "f": "false", "n": "null"}[first])
        elif first == "-" or first.isdigit():
            self.number()
        else:
            raise ValueError(f"no JSON value starts with {first!r} at {self.pos}")

    def container(self, closer: str, item: Callable[[], None]) -> None:
        self.pos += 1  # the opener
        if self.next_char() == closer:
            self.pos += 1
            return
        while True:
            item()
            self.take("," + closer)
            if self.text[self.pos - 1] == closer:
                return

    def member(self) -> None:
        if self.next_char() != '"':
            raise ValueError(f"expected a key at {self.pos}")
        self.string()
        self.take(":")
        self.value()

    def literal(self, word: str) -> None:
        for expected in word:
            if self.pos == len(self.text):
                raise _EndOfText
            if self.text[self.pos] != expected:
                raise ValueError(f"expected {word} at {self.pos}")
            self.pos += 1

    def string(self) -> None:
        self.pos += 1  # the opening quote
        while True:
            char = self.read_char()
            if char == '"':
                return
            if char == "\\":
                escape = self.read_char()
                if escape == "u":
                    if any(self.read_char() not in string.hexdigits for _ in range(4)):
                        raise ValueError(f"bad \\u escape before {self.pos}")
                elif escape not in '"\\/bfnrt':
                    raise ValueError(f"bad escape before {self.pos}")
            elif ord(char) < 0x20:
                raise ValueError(f"raw control character before {self.pos}")

    def read_char(self) -> str:
        if self.pos == len(self.text):
            raise _EndOfText
        self.pos += 1
        return self.text[self.pos - 1]

    def number(self) -> None:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "+-.eE0123456789":
            self.pos += 1
        token = self.text[start : self.pos]
        endings = ("", "0") if self.pos == len(self.text) else ("",)  # "1." or "-" may go on
        if not any(_is_json_number(token + ending) for ending in endings):
            raise ValueError(f"{token!r} is not a JSON number")


def _is_json_number(token: str) -> bool:
    try:
        return isinstance(json.loads(token), int | float)
    except ValueError:
        return False


def is_json_object_prefix(text: str) -> bool:
    """True when ``text`` is the start of some JSON object (or a whole one, then blanks)."""
    checker = _JsonPrefixChecker(text)
    try:
        checker.take("{")
        checker.pos -= 1
        checker.value()
        checker.next_char()  # anything but blanks after the object is wrong
    except _EndOfText:
        return True
    except ValueError:
        return False
    return False


@pytest.mark.parametrize(
    "text",
    [
        "{",
        ' {"a',
        '{"a": 1',
        '{"a": -',
        '{"a": 1.',
        '{"a": 1e+',
        '{"a": [tr',
        '{"a": "\\u00',
        '{"a": {"b": null}, "c": [1, "x"]',
        '{"a": "b"} \n',
    ],
)
def test_json_prefix_checker_accepts_unfinished_json(text: str) -> None:
    assert is_json_object_prefix(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": x',
        "[1",
        "hello {",
        '{"a" 1',
        '{"a": 01',
        '{"a": tru,',
        "{a",
        '{"a": 1,}',
        '{"a": "\\q"',
        '{"a": 1]',
        '{"a": 1} x',
        '{"a": 1.e',
        '{"a": "\x01"',
    ],
)
def test_json_prefix_checker_rejects_what_no_json_starts_with(text: str) -> None:
    assert not is_json_object_prefix(text)


def test_json_object_mode_returns_json(client: openai.OpenAI) -> None:
    # greedy, the demo model closes the object at once; sampled with these seeds it writes
    # one long key and runs out of tokens: the first checks whole JSON, the others prefixes
    for sampling in (
        {"temperature": 0},
        {"temperature": 1.0, "seed": 0},
        {"temperature": 1.0, "seed": 1},
    ):
        response = client.chat.completions.create(
            model=MODEL_ID,
            messages=USER,
            max_tokens=96,
            response_format={"type": "json_object"},
            **sampling,  # type: ignore[arg-type]
        )
        content = response.choices[0].message.content or ""
        if response.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict), content
        else:  # out of tokens mid-object: what it wrote must still be JSON so far
            assert response.choices[0].finish_reason == "length"
            assert is_json_object_prefix(content), content


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
