"""Ollama's model routes on ``homelab serve`` without MODEL (a fleet of two generated models in
a temporary library, real llama.cpp engines): ``/api/tags`` lists the library, ``/api/show``
of a model not loaded reports the context its plan would give (and loads nothing), ``/api/ps``
shows what is loaded with its context and expiry, ``keep_alive`` reaches the fleet (``0``
unloads), and ``/props`` / LM Studio's listing say the same context."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import ollama
import pytest

from benchmarks.hostile_inputs import ABSURD_KEEP_ALIVES, keep_alive_body
from homelab.cli import build_parser
from homelab.cli.serve import build_fleet
from homelab.models.launch import plan_file
from homelab.models.ref import resolve
from homelab.planner.search import PlanRequest
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server

ARCHS = ("llama", "qwen3")
PLAN_FLAGS = ["--goal", "quality", "--ctx", "1024", "--parallel", "2"]


def name_of(arch: str) -> str:
    return f"homelab-demo-{arch}-tiny-v2:F16"


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory, demo_model: Callable[..., Path]) -> Path:
    folder = tmp_path_factory.mktemp("library")
    for arch in ARCHS:
        shutil.copy(demo_model(arch), folder)
    return folder


@pytest.fixture(scope="module")
def fleet_server(library: Path) -> Iterator[ServerHandle]:
    patch = pytest.MonkeyPatch()
    patch.setenv("HOMELAB_MODEL_DIRS", str(library))
    args = build_parser(only="serve").parse_args(["serve", *PLAN_FLAGS, "--keep-alive", "-1"])
    fleet = build_fleet(args)
    handle = start_server(None, config=ServerConfig(default_max_tokens=4), fleet=fleet)
    yield handle
    handle.stop()
    fleet.close()
    patch.undo()


@pytest.fixture
def olla(fleet_server: ServerHandle) -> ollama.Client:
    return ollama.Client(host=fleet_server.url)  # loopback, no keys: no key needed


def planned_context(library: Path, arch: str) -> int:
    path = library / f"homelab-demo-{arch}-tiny-v2-F16.gguf"
    request = PlanRequest(goal="quality", ctx=1024, parallel=2)
    return plan_file(resolve(str(path)), request).settings.n_ctx_per_slot


def test_models_come_and_go_as_ollama_reports_them(
    olla: ollama.Client, fleet_server: ServerHandle, library: Path
) -> None:
    llama, qwen = name_of("llama"), name_of("qwen3")
    assert sorted(m.model for m in olla.list().models) == sorted([llama, qwen])
    assert olla.ps().models == []
    shown = olla.show(qwen)  # not loaded: the context of the plan it would get
    arch = shown.modelinfo["general.architecture"]  # type: ignore[index]
    assert shown.modelinfo[f"{arch}.context_length"] == planned_context(library, "qwen3")  # type: ignore[index]
    assert olla.ps().models == []  # showing loads nothing

    reply = olla.chat(model=llama, messages=[{"role": "user", "content": "hi"}], keep_alive="5m")
    assert reply.done and (reply.load_duration or 0) > 0  # it loaded for this request
    running = olla.ps().models
    assert [m.model for m in running] == [llama]
    assert running[0].context_length == planned_context(library, "llama")
    assert (running[0].size or 0) > 0 and running[0].expires_at is not None
    left_s = (running[0].expires_at - datetime.now(UTC)).total_seconds()
    assert 200 < left_s <= 300

    props = httpx.get(f"{fleet_server.url}/props", params={"model": llama}).json()
    assert props["n_ctx"] == running[0].context_length
    lmstudio = {m["id"]: m for m in httpx.get(f"{fleet_server.url}/api/v0/models").json()["data"]}
    assert lmstudio[llama]["state"] == "loaded" and lmstudio[qwen]["state"] == "not-loaded"
    assert lmstudio[llama]["loaded_context_length"] == running[0].context_length

    unloaded = olla.generate(model=llama, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    deadline = time.monotonic() + 10
    while olla.ps().models and time.monotonic() < deadline:
        time.sleep(0.1)
    assert olla.ps().models == []


def test_an_unknown_model_is_a_404_in_ollama_shape(olla: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        olla.chat(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 404 and "nope" in refused.value.error


@pytest.mark.parametrize(
    "keep_alive", ABSURD_KEEP_ALIVES, ids=["400-digits", "400-digit-text", "1e308", "99999999h"]
)
def test_an_absurd_keep_alive_is_a_400_and_the_fleet_still_reports(
    fleet_server: ServerHandle, keep_alive: object
) -> None:
    """A keep_alive of 400 digits was taken as the model's expiry: ``/admin/models`` and
    ``/api/ps`` then answered 500 for everyone (issue 39)."""
    with httpx.Client(base_url=fleet_server.url, timeout=120) as http:
        raw = keep_alive_body(name_of("llama"), keep_alive)
        response = http.post("/api/chat", content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert "keep_alive" in response.json()["error"]
        assert http.get("/admin/models").status_code == 200
        assert http.get("/api/ps").status_code == 200
