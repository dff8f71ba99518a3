"""Request bodies that Home Assistant's Ollama integration and Open WebUI's Ollama connection
send, replayed against the real server (tiny llama demo model). Each file in
``ollama_requests/`` was written from the shape that project's source builds: Home
Assistant's ``homeassistant/components/ollama/entity.py`` (``client.chat`` with its tools, a
``num_ctx`` option, ``keep_alive`` as ``-1`` or ``"300s"``, ``format`` from an AI task's
structure, tool results as JSON text), Open WebUI's ``utils/payload.py``
(``convert_payload_openai_to_ollama``: every option it forwards, load-time ones included,
tool calls with ``index``/``id``/``type``, titles asked as ``format: "json"``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import MODEL_ID, alice_headers, make_keys

from homelab.engine.engine import Engine
from homelab.server.config import ServerConfig
from homelab.server.runner import start_server
from homelab.settings import Settings

RECORDED = sorted((Path(__file__).parent / "ollama_requests").glob("*.json"))


@pytest.fixture(scope="module")
def http(demo_model: Callable[..., Path]) -> Iterator[httpx.Client]:
    """Room for Home Assistant's tools (~1,300 tokens rendered) in one slot."""
    settings = Settings(n_ctx=4096, n_ctx_per_slot=2048, n_parallel=2, n_threads=1)
    engine = Engine.load(demo_model("llama"), settings, record_calibration=False)
    config = ServerConfig(model_id=MODEL_ID, keys=make_keys(), default_max_tokens=24)
    handle = start_server(engine, config=config)
    with httpx.Client(base_url=handle.url, timeout=120) as client:
        yield client
    handle.stop()
    engine.close()


def replay(http: httpx.Client, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The last NDJSON line of a stream (every line checked), or the body; and the content."""
    with http.stream("POST", path, json=body, headers=alice_headers()) as response:
        raw = response.read()
    assert response.status_code == 200, raw
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert all("error" not in line for line in lines), lines[-1]
    assert all(line["done"] is False for line in lines[:-1])
    assert len(lines) == 1 or body.get("stream", True)
    return lines[-1], "".join(line["message"]["content"] for line in lines)


@pytest.mark.parametrize("recorded", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_client_requests_are_served(http: httpx.Client, recorded: Path) -> None:
    request = json.loads(recorded.read_text(encoding="utf-8"))
    last, content = replay(http, request["path"], request["body"])
    assert last["done"] is True and last["done_reason"] in ("stop", "length")
    assert last["eval_count"] > 0 and last["model"] == request["body"]["model"]
    fmt = request["body"].get("format")
    if isinstance(fmt, dict) and last["done_reason"] == "stop":  # an AI task's structure
        assert set(json.loads(content)) <= set(fmt["properties"])


def test_the_polling_open_webui_and_home_assistant_do(http: httpx.Client) -> None:
    """Connection checks: the version (Open WebUI), the model list (both), what is loaded."""
    for path in ("/api/version", "/api/tags", "/api/ps"):
        response = http.get(path, headers=alice_headers())
        assert response.status_code == 200 and response.json(), path
    shown = http.post("/api/show", json={"name": "tiny"}, headers=alice_headers())  # older clients
    assert shown.status_code == 200 and "model_info" in shown.json()
