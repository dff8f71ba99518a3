"""The generated OpenAPI document is valid, and fuzzing the API it describes finds no 500s."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from server_helpers import ALICE_KEY

from homelab.server.runner import ServerHandle

AUTH = {"Authorization": f"Bearer {ALICE_KEY}"}


def fetch_document(server: ServerHandle) -> dict[str, Any]:
    response = httpx.get(server.url + "/openapi.json", headers=AUTH)
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def test_openapi_document_is_valid(server: ServerHandle) -> None:
    document = fetch_document(server)
    validate(document)
    paths = document["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(
        paths
    )
    assert {"/api/chat", "/api/generate", "/api/embed", "/api/tags", "/api/show", "/props"} <= set(
        paths
    )
    ollama_chat = paths["/api/chat"]["post"]["requestBody"]["content"]["application/json"]
    assert ollama_chat["schema"]["$ref"].endswith("/OllamaChatRequest")
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionRequest"
    )
    assert "messages" in document["components"]["schemas"]["ChatCompletionRequest"]["required"]


@pytest.fixture
def api_schema(server: ServerHandle) -> Any:
    return schemathesis.openapi.from_dict(fetch_document(server))


fuzzed = schemathesis.pytest.from_fixture("api_schema")


@fuzzed.parametrize()
@settings(
    max_examples=int(os.environ.get("HOMELAB_FUZZ_EXAMPLES", "15")),  # more for a deeper local run
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_fuzzing_finds_no_server_errors(case: Any, server: ServerHandle) -> None:
    if isinstance(
        case.body, dict
    ):  # keep generated generations short: this is about input handling
        if isinstance(case.body.get("max_tokens"), int):
            case.body["max_tokens"] = min(case.body["max_tokens"], 4)
        case.body["max_completion_tokens"] = 4
        case.body["n"] = 1
    response = case.call(base_url=server.url, headers=AUTH)
    assert response.status_code < 500, response.text
    if response.status_code >= 400 and case.path.startswith("/v1/messages"):  # Anthropic's shape
        assert response.json()["type"] == "error"
        assert set(response.json()["error"]) == {"type", "message"}
    elif response.status_code >= 400 and case.path.startswith("/api/"):  # Ollama's shape
        assert set(response.json()) == {"error"} and isinstance(response.json()["error"], str)
    elif response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
