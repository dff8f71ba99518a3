"""``homelab serve`` without MODEL: three generated models in a temporary library, a ``--ram``
budget that the plans say holds two of them at once, real llama.cpp engines.

The servers run in this process (``build_fleet`` from the serve verb's own arguments, then
``start_server``), except the end-to-end test of the verb and ``homelab ps``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from homelab.cli import build_parser, main
from homelab.cli.serve import build_fleet
from homelab.models.launch import load_plan, plan_file
from homelab.models.ref import resolve
from homelab.planner.budget import HOST_MARGIN_BYTES, resolve_hardware
from homelab.planner.search import PlanRequest
from homelab.server.config import ServerConfig
from homelab.server.runner import ServerHandle, start_server
from homelab.units import GIB

ARCHS = ("llama", "qwen3", "gemma3")
# the micro-batch fixed: without flash attention (every layer on the CPU) a smaller one
# shrinks the compute buffer, and a model squeezed in beside two others would evict nobody
PLAN_FLAGS = ["--goal", "quality", "--ctx", "1024", "--parallel", "2", "--n-ubatch", "512"]
REQUEST = PlanRequest(goal="quality", ctx=1024, parallel=2, n_ubatch=512)
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]


def name_of(arch: str) -> str:
    return f"homelab-demo-{arch}-tiny-v2:F16"


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory, demo_model: Callable[..., Path]) -> Path:
    folder = tmp_path_factory.mktemp("library")
    for arch in ARCHS:
        shutil.copy(demo_model(arch), folder)
    return folder


@pytest.fixture(autouse=True)
def only_this_library(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setenv("HOMELAB_MODEL_DIRS", str(library))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    yield


@pytest.fixture(scope="module")
def planned(library: Path) -> dict[str, int]:
    """Each model's planned bytes on its own (what the server must subtract)."""
    roomy = resolve_hardware(ram_bytes=64 * GIB)
    return {
        name_of(arch): plan_file(resolve(str(path)), REQUEST, roomy).memory.total_bytes
        for arch, path in ((a, library / f"homelab-demo-{a}-tiny-v2-F16.gguf") for a in ARCHS)
    }


@pytest.fixture(scope="module")
def two_fit_ram(planned: dict[str, int]) -> int:
    """Host RAM whose budget holds any two of the three plans, never all three."""
    sizes = sorted(planned.values())
    budget = sum(sizes) - sizes[0] // 2
    assert sum(sizes[1:]) <= budget < sum(sizes)
    return HOST_MARGIN_BYTES + budget


def serve_args(*extra: str) -> Any:
    return build_parser(only="serve").parse_args(["serve", *extra])


@pytest.fixture
def start(two_fit_ram: int) -> Iterator[Callable[..., ServerHandle]]:
    handles: list[ServerHandle] = []

    def make(
        *extra: str, keep_alive: str = "-1", aliases: tuple[tuple[str, str], ...] = ()
    ) -> ServerHandle:
        argv = ["--ram", str(two_fit_ram), *PLAN_FLAGS, "--keep-alive", keep_alive, *extra]
        fleet = build_fleet(serve_args(*argv))
        config = ServerConfig(default_max_tokens=16, aliases=aliases)
        handle = start_server(None, config=config, fleet=fleet)
        handles.append(handle)
        return handle

    yield make
    for handle in handles:
        handle.stop()
        handle.app.state.homelab.fleet.close()


def chat(http: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": PROMPT, "max_tokens": 12, "temperature": 0, **extra}
    return http.post("/v1/chat/completions", json=body, timeout=120)


def answer(http: httpx.Client, model: str) -> str:
    response = chat(http, model)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def ps(http: httpx.Client) -> dict[str, dict[str, Any]]:
    response = http.get("/admin/models")
    assert response.status_code == 200, response.text
    return {m["model"]: m for m in response.json()["data"]}


def loaded(http: httpx.Client) -> set[str]:
    return {name for name, m in ps(http).items() if m["status"] == "loaded"}


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def greedy_alone(model_path: Path, ram: int) -> str:
    """What a single-model server answers for ``model_path`` with the same plan."""
    ref = resolve(str(model_path))
    engine = load_plan(ref, plan_file(ref, REQUEST, resolve_hardware(ram_bytes=ram)))
    handle = start_server(engine, config=ServerConfig(model_id="alone"))
    try:
        with httpx.Client(base_url=handle.url) as http:
            return answer(http, "alone")
    finally:
        handle.stop()
        engine.close()


# --- residency -------------------------------------------------------------------------------


def test_the_third_model_evicts_the_least_recently_used_idle_one(
    start: Callable[..., ServerHandle], planned: dict[str, int], library: Path, two_fit_ram: int
) -> None:
    a, b, c = (name_of(arch) for arch in ARCHS)
    with httpx.Client(base_url=start().url, timeout=120) as http:
        listed = http.get("/v1/models").json()["data"]
        assert {m["id"]: m["status"] for m in listed} == dict.fromkeys((a, b, c), "unloaded")
        first_a, first_b = answer(http, a), answer(http, b)
        assert loaded(http) == {a, b}
        for name in (a, b):  # the server subtracts exactly what the planner gave each model
            assert ps(http)[name]["planned_bytes"] == planned[name]
            assert ps(http)[name]["actual_bytes"] > 0
        answer(http, c)  # a and b do not leave room for c: a, used least recently, goes
        state = ps(http)
        assert loaded(http) == {b, c} and state[a]["evictions"] == 1
        assert state[c]["planned_bytes"] == planned[c]
        assert {m["id"]: m["status"] for m in http.get("/v1/models").json()["data"]}[a] == (
            "unloaded"
        )
        assert answer(http, a) == first_a  # reloaded: the same greedy answer; b was LRU now
        assert loaded(http) == {c, a} and ps(http)[b]["evictions"] == 1
        assert answer(http, b) == first_b
        metrics = http.get("/metrics").text
        assert f'homelab_model_evictions_total{{model="{a}"}} 1' in metrics
        assert f'homelab_model_loads_total{{model="{a}"}} 2' in metrics
        assert f'homelab_model_loaded{{model="{b}"}} 1' in metrics
    path_a = library / "homelab-demo-llama-tiny-v2-F16.gguf"
    assert first_a == greedy_alone(path_a, two_fit_ram)


def stream_in_background(url: str, model: str, started: threading.Event) -> dict[str, Any]:
    """A long stream (4 choices of up to 800 tokens), read slowly, in a thread."""
    result: dict[str, Any] = {}

    def run() -> None:
        body = {"model": model, "messages": PROMPT, "max_tokens": 800, "n": 4, "stream": True}
        body |= {"temperature": 1.0, "seed": 1}
        with (
            httpx.Client(base_url=url, timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            result["status"] = response.status_code
            chunks = 0
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks += 1
                    if chunks == 2:
                        started.set()
                    time.sleep(0.002 if chunks > 2 else 0)
            result["chunks"] = chunks

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result["thread"] = thread
    return result


def test_a_model_with_a_stream_in_flight_is_never_evicted(
    start: Callable[..., ServerHandle],
) -> None:
    a, b, c = (name_of(arch) for arch in ARCHS)
    handle = start()
    with httpx.Client(base_url=handle.url, timeout=120) as http:
        answer(http, a)
        started = threading.Event()
        streaming = stream_in_background(handle.url, a, started)
        assert started.wait(60)
        answer(http, b)  # a is now the least recently used model, but it is streaming
        assert ps(http)[a]["requests_in_flight"] == 1
        answer(http, c)
        assert ps(http)[a]["requests_in_flight"] == 1, "the stream ended too early to tell"
        assert loaded(http) == {a, c}  # b went instead of a
        # both residents busy: nothing can be freed for b
        started_c = threading.Event()
        streaming_c = stream_in_background(handle.url, c, started_c)
        assert started_c.wait(60)
        refused = chat(http, b)
        assert ps(http)[a]["requests_in_flight"] == 1
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"].isdigit()
        assert b in refused.json()["error"]["message"]
        for run in (streaming, streaming_c):
            run["thread"].join(120)
            assert run["status"] == 200 and run["chunks"] > 8
        assert loaded(http) == {a, c}
        answer(http, b)  # idle now: the LRU of a and c makes room
        assert b in loaded(http) and len(loaded(http)) == 2


# --- loading ---------------------------------------------------------------------------------


def test_concurrent_first_requests_load_the_model_once(
    start: Callable[..., ServerHandle],
) -> None:
    a = name_of("llama")
    handle = start()
    answers: list[httpx.Response] = []

    def ask() -> None:
        with httpx.Client(base_url=handle.url, timeout=120) as http:
            answers.append(chat(http, a))

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [r.status_code for r in answers] == [200] * 6
    assert len({r.json()["choices"][0]["message"]["content"] for r in answers}) == 1
    with httpx.Client(base_url=handle.url) as http:
        assert ps(http)[a]["loads"] == 1


def test_keep_alive_unloads_idle_models(start: Callable[..., ServerHandle]) -> None:
    a, b, c = (name_of(arch) for arch in ARCHS)
    with httpx.Client(base_url=start(keep_alive="1s").url, timeout=120) as http:
        answer(http, a)
        assert loaded(http) == {a}
        assert 0 < ps(http)[a]["expires_in_s"] <= 1
        kept = chat(http, b, keep_alive=-1)  # Ollama's per-request keep_alive: never unload
        assert kept.status_code == 200
        wait_for(lambda: a not in loaded(http))
        assert ps(http)[b]["expires_in_s"] is None
        now = chat(http, c, keep_alive="0")  # unload as soon as the answer is out
        assert now.status_code == 200
        wait_for(lambda: c not in loaded(http), timeout_s=5)
        assert loaded(http) == {b}
        bad = chat(http, a, keep_alive="soon")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"
        for absurd in (int("9" * 400), "9" * 400 + "h", 1e308):  # bounded: /admin/models answers
            huge = chat(http, a, keep_alive=absurd)
            assert huge.status_code == 400 and "keep_alive" in huge.json()["error"]["message"]
        assert http.get("/admin/models").status_code == 200


def test_explicit_load_and_unload(start: Callable[..., ServerHandle]) -> None:
    a = name_of("qwen3")
    with httpx.Client(base_url=start().url, timeout=120) as http:
        assert http.post("/admin/models/load", json={"model": a}).json()["status"] == "loaded"
        assert loaded(http) == {a}
        assert http.post("/admin/models/unload", json={"model": a}).json()["unloaded"] is True
        assert loaded(http) == set()
        missing = http.post("/admin/models/load", json={"model": "nope"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


# --- faults ----------------------------------------------------------------------------------


def test_a_broken_file_fails_its_requests_and_the_others_keep_serving(
    start: Callable[..., ServerHandle], library: Path
) -> None:
    broken = library / "broken-Q8_0.gguf"
    shutil.copy(library / "homelab-demo-qwen3-tiny-v2-F16.gguf", broken)
    try:
        handle = start()
        with httpx.Client(base_url=handle.url, timeout=120) as http:
            name = next(n for n in ps(http) if n.startswith("broken"))
            with broken.open("r+b") as f:  # overwritten after the server listed it
                f.truncate(broken.stat().st_size // 2)
            failed = chat(http, name)
            assert failed.status_code == 500, failed.text
            assert name in failed.json()["error"]["message"]
            assert ps(http)[name]["status"] == "unloaded" and ps(http)[name]["last_error"]
            assert answer(http, name_of("llama"))
    finally:
        broken.unlink(missing_ok=True)


def test_a_deleted_file_serves_until_unloaded_then_leaves_the_list(
    start: Callable[..., ServerHandle], library: Path
) -> None:
    doomed = library / "doomed-F16.gguf"
    shutil.copy(library / "homelab-demo-gemma3-tiny-v2-F16.gguf", doomed)
    try:
        with httpx.Client(base_url=start().url, timeout=120) as http:
            name = next(n for n in ps(http) if n.startswith("doomed"))
            before = answer(http, name)
            doomed.unlink()
            assert answer(http, name) == before  # loaded: it keeps serving
            assert ps(http)[name]["on_disk"] is False
            assert http.post("/admin/models/unload", json={"model": name}).status_code == 200
            assert name not in {m["id"] for m in http.get("/v1/models").json()["data"]}
            assert chat(http, name).status_code == 404
    finally:
        doomed.unlink(missing_ok=True)


# --- clients ---------------------------------------------------------------------------------


def test_the_openai_sdk_lists_and_uses_every_model(start: Callable[..., ServerHandle]) -> None:
    handle = start()
    with openai.OpenAI(base_url=handle.base_url, api_key="none", max_retries=0) as client:
        names = [m.id for m in client.models.list()]
        assert sorted(names) == sorted(name_of(arch) for arch in ARCHS)
        replies = {}
        for name in names:
            completion = client.chat.completions.create(
                model=name,
                messages=PROMPT,
                max_tokens=8,
                temperature=0,  # type: ignore[arg-type]
            )
            assert completion.model == name
            replies[name] = completion.choices[0].message.content
        assert len(set(replies.values())) == 3  # three different models answered
        talkative = next(name for name in names if replies[name])
        stream = client.chat.completions.create(
            model=talkative,
            messages=PROMPT,
            max_tokens=8,
            temperature=0,  # greedy: a sampled first token may be EOS (random weights)
            stream=True,  # type: ignore[arg-type]
        )
        streamed = "".join(
            chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
        )
        assert streamed  # (a cached prefix may change the batch shape: no token-exact check)
        assert client.models.retrieve(names[1]).id == names[1]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="no-such-model",
                messages=PROMPT,  # type: ignore[arg-type]
            )


def test_homelab_serve_without_model_and_homelab_ps(
    library: Path,
    two_fit_ram: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {**os.environ, "HOMELAB_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "homelab.cli", "serve", "--json", "--port", "0"]
    command += ["--ram", str(two_fit_ram), *PLAN_FLAGS]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        announced = json.loads(process.stdout.readline())
        assert sorted(announced["models"]) == sorted(name_of(arch) for arch in ARCHS)
        with httpx.Client(base_url=announced["base_url"].removesuffix("/v1"), timeout=120) as http:
            answer(http, name_of("llama"))
        url = announced["base_url"]
        assert main(["ps", "--json", "--url", url]) == 0
        shown = {m["model"]: m for m in json.loads(capsys.readouterr().out)}
        assert shown[name_of("llama")]["status"] == "loaded"
        assert shown[name_of("qwen3")]["status"] == "unloaded"
        monkeypatch.setenv("HOMELAB_HOME", env["HOMELAB_HOME"])
        assert main(["ps"]) == 0  # the server found through its lock
        table = capsys.readouterr().out
        assert "MODEL" in table and name_of("llama") in table and "never" not in table
    finally:
        process.terminate()
        process.wait(30)


def test_every_dialect_serves_the_model_it_names(start: Callable[..., ServerHandle]) -> None:
    a, b = name_of("llama"), name_of("qwen3")
    with httpx.Client(base_url=start().url, timeout=120) as http:
        text = http.post("/v1/completions", json={"model": a, "prompt": "The sea", "max_tokens": 4})
        assert text.status_code == 200 and text.json()["model"] == a
        body = {"model": b, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        message = http.post("/v1/messages", json=body)
        assert message.status_code == 200, message.text
        assert message.json()["model"] == b
        assert loaded(http) == {a, b}
        missing = http.post("/v1/messages", json={**body, "model": "nope"})
        assert missing.status_code == 404 and missing.json()["type"] == "error"  # Anthropic's


def test_an_alias_pattern_reaches_the_fleet_model_it_names(
    start: Callable[..., ServerHandle],
) -> None:
    a, b = name_of("llama"), name_of("qwen3")
    handle = start(aliases=(("claude-*", b), ("gpt-*", a)))
    with httpx.Client(base_url=handle.url, timeout=120) as http:
        body = {"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": PROMPT}
        message = http.post("/v1/messages", json=body)
        assert message.status_code == 200, message.text
        assert loaded(http) == {b}  # only the model the alias names was loaded
        assert answer(http, "gpt-5-codex")  # the second pattern: the other model
        assert loaded(http) == {a, b}
        unmatched = chat(http, "o3-mini")
        assert unmatched.status_code == 404 and "o3-mini" in unmatched.text


def test_an_alias_to_a_model_the_fleet_lacks_stops_serve_before_it_listens() -> None:
    from homelab.cli.serve import _check_aliases
    from homelab.errors import ConfigError

    config = ServerConfig(aliases=(("claude-*", "missing-model"),))
    with pytest.raises(ConfigError, match="serves no model named 'missing-model'"):
        _check_aliases(config, [name_of("llama")])


def test_requests_waiting_for_loads_are_bounded(start: Callable[..., ServerHandle]) -> None:
    a = name_of("gemma3")
    handle = start()
    fleet = handle.app.state.homelab.fleet
    fleet.max_waiting = 2
    gate, real_load = threading.Event(), fleet.load_fn
    fleet.load_fn = lambda model, plan: gate.wait(60) and real_load(model, plan)
    answers: list[httpx.Response] = []

    def ask() -> None:
        with httpx.Client(base_url=handle.url, timeout=120) as http:
            answers.append(chat(http, a))

    waiting = [threading.Thread(target=ask) for _ in range(2)]
    for thread in waiting:
        thread.start()
    with httpx.Client(base_url=handle.url, timeout=120) as http:
        wait_for(lambda: fleet.models[a].waiting == 2)
        assert ps(http)[a]["status"] == "loading"
        refused = chat(http, a)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "load_queue_full"
        assert "retry-after" in refused.headers
        gate.set()
        for thread in waiting:
            thread.join(120)
        assert [r.status_code for r in answers] == [200, 200]
        assert ps(http)[a]["loads"] == 1
