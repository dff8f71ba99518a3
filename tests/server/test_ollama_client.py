"""The official ``ollama`` Python client, unmodified, against the real server and engine of the
session (tiny llama demo model, 512-token slots): chat and generate (whole and streamed as
NDJSON), ``format`` as "json" and as a schema (the JSON grammar path), ``options``, the
model listings with the slot's context, ``keep_alive``, the API key, and bad bodies answered
in Ollama's error shape (``{"error": "..."}``) while the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import ollama
import pytest
from server_helpers import ALICE_KEY, MODEL_ID, N_CTX_PER_SLOT, alice_headers, assert_still_serving

from homelab.server.runner import ServerHandle

ASK = [{"role": "user", "content": "hello world, tell me about the cache"}]
GREEDY = {"temperature": 0, "num_predict": 8}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
    "required": ["city"],
}


@pytest.fixture
def olla(server: ServerHandle) -> Iterator[ollama.Client]:
    client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {ALICE_KEY}"})
    yield client
    client._client.close()


def test_chat_whole_reply_with_timings(olla: ollama.Client) -> None:
    reply = olla.chat(model=MODEL_ID, messages=ASK, options=GREEDY, stream=False)
    assert reply.model == MODEL_ID and reply.done is True
    assert reply.message.role == "assistant" and isinstance(reply.message.content, str)
    assert reply.done_reason in ("stop", "length")
    assert 0 < (reply.eval_count or 0) <= 8
    assert (reply.prompt_eval_count or 0) > 0
    assert (reply.total_duration or 0) >= (reply.prompt_eval_duration or 0) > 0
    assert reply.load_duration is not None and reply.eval_duration is not None
    datetime.fromisoformat(str(reply.created_at).replace("Z", "+00:00"))


def test_chat_streamed_lines_join_to_the_whole_reply(olla: ollama.Client) -> None:
    whole = olla.chat(model=MODEL_ID, messages=ASK, options=GREEDY, stream=False)
    parts = list(olla.chat(model=MODEL_ID, messages=ASK, options=GREEDY, stream=True))
    assert all(not part.done for part in parts[:-1]) and parts[-1].done
    assert "".join(part.message.content or "" for part in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == whole.done_reason


def test_streamed_chat_is_ndjson(http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "messages": ASK, "options": GREEDY}  # stream: Ollama's default
    with http.stream("POST", "/api/chat", json=body, headers=alice_headers()) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[-1]["done"] is True and set(lines[-1]) >= {
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    }


def test_format_schema_answers_that_json(olla: ollama.Client) -> None:
    reply = olla.chat(
        model=MODEL_ID, messages=ASK, format=CITY, options={"temperature": 0, "num_predict": 64}
    )
    assert json.loads(reply.message.content or "")["city"] in ("Oslo", "Paris")


def test_format_json_answers_an_object(olla: ollama.Client) -> None:
    reply = olla.generate(
        model=MODEL_ID, prompt="a JSON object", format="json", options={"num_predict": 48}
    )
    if reply.done_reason == "stop":  # a random model may not close the object in 48 tokens
        assert isinstance(json.loads(reply.response or ""), dict)
    assert (reply.response or "").lstrip().startswith("{")


def test_generate_templated_raw_and_streamed(olla: ollama.Client) -> None:
    reply = olla.generate(model=MODEL_ID, prompt="the cache", system="Be terse.", options=GREEDY)
    assert reply.done and 0 < (reply.eval_count or 0) <= 8
    raw = olla.generate(model=MODEL_ID, prompt="the cache", raw=True, options=GREEDY)
    assert (raw.prompt_eval_count or 0) < (reply.prompt_eval_count or 0)  # no template around it
    streamed = list(
        olla.generate(model=MODEL_ID, prompt="the cache", raw=True, options=GREEDY, stream=True)
    )
    assert "".join(p.response or "" for p in streamed) == raw.response


def test_options_stop_and_seed(olla: ollama.Client) -> None:
    options = {"temperature": 0.8, "seed": 7, "top_k": 20, "top_p": 0.9, "min_p": 0.05}
    first = olla.chat(model=MODEL_ID, messages=ASK, options={**options, "num_predict": 6})
    again = olla.chat(model=MODEL_ID, messages=ASK, options={**options, "num_predict": 6})
    assert first.message.content == again.message.content  # the same seed, the same sample
    stop = (first.message.content or "")[2:4]
    if stop.strip():
        cut = olla.chat(
            model=MODEL_ID, messages=ASK, options={**options, "num_predict": 6, "stop": [stop]}
        )
        assert stop not in (cut.message.content or "")


def test_num_ctx_below_the_slot_bounds_the_reply(olla: ollama.Client, http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "messages": ASK, "max_tokens": 1}
    counted = http.post("/v1/chat/completions", json=body, headers=alice_headers()).json()
    window = counted["usage"]["prompt_tokens"] + 3  # the same prompt, three tokens of room
    reply = olla.chat(
        model=MODEL_ID,
        messages=ASK,
        options={"num_ctx": window, "num_predict": -1, "temperature": 0},
    )
    assert reply.eval_count == 3 and reply.done_reason == "length"


def test_list_show_and_ps_report_the_slot_context(olla: ollama.Client) -> None:
    listed = olla.list().models
    assert [m.model for m in listed] == [MODEL_ID]
    assert listed[0].details is not None and listed[0].details.format == "gguf"
    assert listed[0].details.family == "llama" and (listed[0].size or 0) > 0
    shown = olla.show(MODEL_ID)
    assert shown.modelinfo is not None
    assert shown.modelinfo["llama.context_length"] == N_CTX_PER_SLOT  # a slot's, not trained
    assert shown.modelinfo["general.architecture"] == "llama"
    assert "completion" in (shown.capabilities or []) and "tools" in (shown.capabilities or [])
    assert shown.template and shown.details is not None
    running = olla.ps().models
    assert [m.model for m in running] == [MODEL_ID]
    assert running[0].context_length == N_CTX_PER_SLOT and (running[0].size or 0) > 0
    assert running[0].expires_at is not None and running[0].size_vram is not None


def test_latest_tag_names_the_served_model(olla: ollama.Client) -> None:
    assert olla.show(f"{MODEL_ID}:latest").modelinfo is not None
    reply = olla.chat(model=f"{MODEL_ID}:latest", messages=ASK, options={"num_predict": 2})
    assert reply.model == f"{MODEL_ID}:latest" and reply.done


def test_version_and_an_empty_chat_loads(olla: ollama.Client, http: httpx.Client) -> None:
    version = http.get("/api/version", headers=alice_headers()).json()
    assert tuple(int(p) for p in version["version"].split(".")) >= (0, 9, 0)  # think, tools
    loaded = olla.chat(model=MODEL_ID, messages=[])
    assert loaded.done and loaded.done_reason == "load"
    loaded = olla.generate(model=MODEL_ID, prompt="", keep_alive="5m")
    assert loaded.done and loaded.done_reason == "load"


def test_pull_of_a_served_model_succeeds_and_of_another_says_why_not(olla: ollama.Client) -> None:
    assert olla.pull(MODEL_ID).status == "success"
    with pytest.raises(ollama.ResponseError) as refused:
        olla.pull("llama3.2:3b")
    assert refused.value.status_code == 403 and "homelab pull" in refused.value.error


def test_context_everywhere_a_client_looks(http: httpx.Client) -> None:
    props = http.get("/props", headers=alice_headers()).json()
    assert props["default_generation_settings"]["n_ctx"] == N_CTX_PER_SLOT == props["n_ctx"]
    card = http.get("/v1/models", headers=alice_headers()).json()["data"][0]
    assert card["loaded_context_length"] == card["context_length"] == N_CTX_PER_SLOT
    assert card["meta"]["n_ctx"] == card["max_model_len"] == N_CTX_PER_SLOT
    lmstudio = http.get("/api/v0/models", headers=alice_headers()).json()["data"][0]
    assert lmstudio["state"] == "loaded" and lmstudio["loaded_context_length"] == N_CTX_PER_SLOT
    assert lmstudio["max_context_length"] == N_CTX_PER_SLOT


# --- errors in Ollama's shape -----------------------------------------------------------------

BAD_BODIES: list[tuple[str, Any, int, str]] = [
    ("/api/chat", b"{not json", 400, "not valid JSON"),
    ("/api/chat", [1, 2], 400, "JSON object"),
    ("/api/chat", {"messages": ASK}, 400, "'model'"),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "role",
    ),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": ASK, "options": {"temperature": "hot"}},
        400,
        "temperature",
    ),
    ("/api/chat", {"model": MODEL_ID, "messages": ASK, "options": {"top_p": 7}}, 400, "top_p"),
    ("/api/chat", {"model": MODEL_ID, "messages": ASK, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"model": MODEL_ID, "messages": ASK, "think": "very"}, 400, "think"),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": ASK, "think": True},
        400,
        "does not support thinking",
    ),
    ("/api/chat", {"model": MODEL_ID, "messages": ASK, "keep_alive": "soon"}, 400, "keep_alive"),
    ("/api/chat", {"model": "nope", "messages": ASK}, 404, "nope"),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": [{"role": "user", "content": "x", "images": ["%%%"]}]},
        400,
        "base64",
    ),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": [{"role": "user", "content": "x", "images": ["aGVsbG8="]}]},
        400,
        "image",
    ),
    (
        "/api/chat",
        {
            "model": MODEL_ID,
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                }
            ],
        },
        400,
        "arguments",
    ),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": ASK, "options": {"stop": ["x" * 300]}},
        400,
        "stop",
    ),
    (
        "/api/chat",
        {"model": MODEL_ID, "messages": [{"role": "user", "content": "x " * 2000}]},
        400,
        "context",
    ),
    ("/api/generate", {"model": MODEL_ID, "prompt": "x", "context": [1, 2, 3]}, 400, "/api/chat"),
    ("/api/generate", {"model": MODEL_ID, "prompt": "x", "suffix": "y"}, 400, "suffix"),
    (
        "/api/generate",
        {"model": MODEL_ID, "prompt": "x", "template": "{{ .Prompt }}"},
        400,
        "template",
    ),
    (
        "/api/generate",
        {"model": MODEL_ID, "prompt": "x", "raw": True, "format": "json"},
        400,
        "raw",
    ),
    ("/api/embed", {"model": MODEL_ID, "input": "x"}, 400, "embeddings"),
    ("/api/embed", {"model": MODEL_ID, "input": []}, 400, "input"),
    ("/api/show", {}, 400, "name the model"),
    ("/api/show", {"model": "nope"}, 404, "not found"),
    ("/api/create", {"model": "x"}, 404, "Unknown route"),
]


@pytest.mark.parametrize(("path", "body", "status", "says"), BAD_BODIES)
def test_bad_bodies_answer_in_ollama_shape(
    http: httpx.Client, path: str, body: Any, status: int, says: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(path, content=content, headers=alice_headers())
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"error"} and isinstance(error["error"], str)
    assert says.lower() in error["error"].lower()
    assert_still_serving(http)


def test_a_missing_key_is_refused_in_ollama_shape(server: ServerHandle) -> None:
    client = ollama.Client(host=server.url)  # no Authorization header
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL_ID, messages=ASK)
    assert refused.value.status_code == 401 and "Authorization" in refused.value.error
    response = httpx.get(server.url + "/api/tags")
    assert response.status_code == 401 and set(response.json()) == {"error"}
