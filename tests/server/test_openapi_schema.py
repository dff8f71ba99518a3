"""The generated OpenAPI document is valid and names every route of every dialect, and fuzzing
the API it describes (schemathesis) finds no 5xx: on ``serve MODEL`` (the session's server)
and on a fleet (``serve`` without MODEL, two models), admin routes with an admin key.

Generated bodies name the served model most of the time (a random name is a 404 before any
of the request is read) and ask for at most 4 tokens: this is about input handling. A 5xx
after the headers went out is an error event in the stream: no body may carry the generic
500 message either. ``HOMELAB_FUZZ_EXAMPLES`` (default 10) sets the examples per operation.
"""

from __future__ import annotations

import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.config import SchemathesisConfig
from server_helpers import ADMIN_KEY, ALICE_KEY, MODEL_ID, make_keys

from homelab.cli import build_parser
from homelab.cli.serve import build_fleet
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.server.config import ServerConfig
from homelab.server.errors import GENERIC_500_MESSAGE
from homelab.server.runner import ServerHandle, start_server
from homelab.server.yield_targets import FleetResidency
from homelab.server.yielding import YieldController
from homelab.units import MIB

EXAMPLES = int(os.environ.get("HOMELAB_FUZZ_EXAMPLES", "10"))  # more for a deeper local run
FLEET_ARCHS = ("llama", "qwen3")
FLEET_MODELS = tuple(f"homelab-demo-{arch}-tiny-v2:F16" for arch in FLEET_ARCHS)

OPENAI = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
OPENAI |= {"/v1/models", "/v1/models/{model}", "/v1/responses/{response_id}"}
ANTHROPIC = {"/v1/messages", "/v1/messages/count_tokens"}
OLLAMA = {f"/api/{name}" for name in ("chat", "generate", "embed", "embeddings", "version")}
OLLAMA |= {f"/api/{name}" for name in ("tags", "ps", "show", "pull")}
SERVER = {"/health", "/metrics", "/props", "/api/v0/models", "/api/v0/models/{model}"}
ADMIN = {"/admin/slots", "/admin/slots/{slot_id}", "/admin/prompt-cache", "/admin/dashboard"}
FLEET_ADMIN = {"/admin/models", "/admin/models/load", "/admin/models/unload"}
FLEET_ADMIN |= {"/admin/yield", "/admin/resume"}
ROUTES = OPENAI | ANTHROPIC | OLLAMA | SERVER | ADMIN


ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def key_for(path: str) -> str:
    return ADMIN_KEY if path.startswith(("/admin/", "/metrics")) else ALICE_KEY


def fetch_document(server: ServerHandle) -> dict[str, Any]:
    response = httpx.get(
        server.url + "/openapi.json", headers={"Authorization": f"Bearer {ALICE_KEY}"}
    )
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


def test_openapi_document_is_valid(server: ServerHandle) -> None:
    document = fetch_document(server)
    validate(document)
    paths = document["paths"]
    assert set(paths) >= ROUTES, f"routes missing from the document: {ROUTES - set(paths)}"
    ollama_chat = paths["/api/chat"]["post"]["requestBody"]["content"]["application/json"]
    assert ollama_chat["schema"]["$ref"].endswith("/OllamaChatRequest")
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionRequest"
    )
    assert "messages" in document["components"]["schemas"]["ChatCompletionRequest"]["required"]
    for path, route in paths.items():  # every body a route reads is described
        if "post" in route and path != "/admin/resume":  # the one POST without a body
            assert "requestBody" in route["post"], f"POST {path} has no documented body"


def test_the_fleet_document_has_the_fleet_routes(fleet_server: ServerHandle) -> None:
    document = fetch_document(fleet_server)
    validate(document)
    assert set(document["paths"]) >= ROUTES | FLEET_ADMIN


def with_served_model(case: Any, models: tuple[str, ...]) -> None:
    """Most generated bodies name a served model; none asks for more than a few tokens."""
    for where in (case.query, case.body):
        if isinstance(where, dict) and isinstance(where.get("model"), str):
            where["model"] = served(where["model"], models)
    if isinstance((case.path_parameters or {}).get("slot_id"), int):  # a slot or two, or none
        case.path_parameters["slot_id"] %= 3
    if not isinstance(case.body, dict):
        return
    body = case.body
    for field in ("max_tokens", "max_output_tokens", "max_completion_tokens"):
        body[field] = capped(body.get(field))
    if body.get("options") is None:  # Ollama's
        body["options"] = {}
    if isinstance(body["options"], dict):
        body["options"]["num_predict"] = capped(body["options"].get("num_predict"))
    body["n"] = 1


def served(named: str, models: tuple[str, ...]) -> str:
    """A served model in place of a generated name, but for 1 in 4 of them."""
    draw = zlib.crc32(f"model {named}".encode())
    return models[draw % len(models)] if draw % 4 else named


def capped(tokens: Any, most: int = 4) -> Any:
    """At most ``most`` tokens; a value of the wrong type stays, for the validators."""
    return min(tokens, most) if isinstance(tokens, int) else most if tokens is None else tokens


def check_no_server_error(case: Any, server: ServerHandle, models: tuple[str, ...]) -> None:
    with_served_model(case, models)
    headers = {"Authorization": f"Bearer {key_for(case.path)}"}
    response = case.call(base_url=server.url, headers=headers, timeout=60)
    assert response.status_code < 500, response.text
    assert GENERIC_500_MESSAGE not in response.text, response.text
    if response.status_code < 400:
        return
    error = response.json()
    if case.path.startswith("/v1/messages"):  # Anthropic's shape
        assert error["type"] == "error"
        assert set(error["error"]) == {"type", "message"}
    elif case.path.startswith("/api/"):  # Ollama's shape
        assert set(error) == {"error"} and isinstance(error["error"], str)
    else:
        assert set(error["error"]) == {"message", "type", "param", "code"}


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def api_schema(server: ServerHandle) -> Any:
    return schemathesis.openapi.from_dict(fetch_document(server))


fuzzed = schemathesis.pytest.from_fixture("api_schema")


@fuzzed.parametrize()
@FUZZ_SETTINGS
def test_fuzzing_finds_no_server_errors(case: Any, server: ServerHandle) -> None:
    check_no_server_error(case, server, (MODEL_ID,))


# --- a fleet: serve without MODEL ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet_server(
    tmp_path_factory: pytest.TempPathFactory, demo_model: Callable[..., Path]
) -> Iterator[ServerHandle]:
    """Two models, a prompt cache in RAM and yield/resume (no GPU here: a yield unloads the
    models, a resume loads them again): every route ``serve`` can have."""
    library = tmp_path_factory.mktemp("fuzz-library")
    for arch in FLEET_ARCHS:
        shutil.copy(demo_model(arch), library)
    patch = pytest.MonkeyPatch()
    patch.setenv("HOMELAB_MODEL_DIRS", str(library))
    cache = PromptCache(CacheConfig(64 * MIB, 0, None, min_tokens=16))
    argv = ["serve", "--goal", "quality", "--ctx", "512", "--parallel", "2", "--keep-alive", "-1"]
    fleet = build_fleet(build_parser(only="serve").parse_args(argv), cache)
    hardware = fleet.hardware
    controller = YieldController(FleetResidency(fleet), lambda: hardware, grace_s=0.1, wait_s=1)
    config = ServerConfig(keys=make_keys(), default_max_tokens=4)
    handle = start_server(None, config=config, fleet=fleet, prompt_cache=cache, yielding=controller)
    yield handle
    handle.stop()
    fleet.close()
    cache.close()
    patch.undo()


@pytest.fixture
def fleet_schema(fleet_server: ServerHandle) -> Any:
    """Generated requests only: the coverage phase's boundary values reach the same
    validators as on the session's server."""
    config = SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}}})
    return schemathesis.openapi.from_dict(fetch_document(fleet_server), config=config)


fleet_fuzzed = schemathesis.pytest.from_fixture("fleet_schema")


@fleet_fuzzed.parametrize()
@FUZZ_SETTINGS
def test_fuzzing_a_fleet_finds_no_server_errors(case: Any, fleet_server: ServerHandle) -> None:
    check_no_server_error(case, fleet_server, FLEET_MODELS)
    if case.path == "/admin/yield" and case.method == "POST":  # serving again for the next
        resumed = httpx.post(fleet_server.url + "/admin/resume", headers=ADMIN_HEADERS, timeout=60)
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["state"] == "serving"
