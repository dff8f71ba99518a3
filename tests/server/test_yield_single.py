"""Yield and resume for ``serve MODEL``'s one engine (``SingleResidency``), real llama.cpp:
the grace period ends a running stream with an error that says why, ``--sleep-after``
yields when idle and the next request resumes, and the engine's slots come back from the
prompt cache. No GPU here: the NVML double (yield_double.py) stands in for one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from yield_double import GIB, shared_double, start_named_process

from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.models.launch import load_plan, plan_file
from homelab.models.ref import resolve
from homelab.planner.budget import Hardware, resolve_hardware
from homelab.planner.plan import Plan
from homelab.planner.search import PlanRequest
from homelab.server.config import ServerConfig
from homelab.server.runner import EngineHolder, ServerHandle, start_server
from homelab.server.yield_targets import SingleResidency
from homelab.server.yield_watch import YieldTriggers, YieldWatcher
from homelab.server.yielding import YieldController
from homelab.units import MIB

REF = resolve("demo")
REQUEST = PlanRequest(ctx=8192, parallel=2)


@dataclass
class Single:
    handle: ServerHandle
    controller: YieldController
    holder: EngineHolder

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.handle.url, timeout=120)


def plan_now(hardware: Hardware) -> Plan:
    return plan_file(REF, REQUEST, hardware)


@pytest.fixture
def single(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Single]:
    triggers: YieldTriggers = getattr(request, "param", YieldTriggers())
    cache = PromptCache(CacheConfig(64 * MIB, 64 * MIB, tmp_path / "states", min_tokens=16))
    hardware = resolve_hardware(ram_bytes=8 * GIB)
    plan = plan_now(hardware)
    holder = EngineHolder(load_plan(REF, plan, prompt_cache=cache))

    def load(planned: Plan) -> object:
        return load_plan(REF, planned, prompt_cache=cache)

    residency = SingleResidency(holder, "tiny", plan, plan_now, load)
    _, _, read = shared_double(lambda: sum(residency.planned_bytes().values()))
    controller = YieldController(
        residency, lambda: hardware, gpus=read, prompt_cache=cache, grace_s=0.1, wait_s=60
    )
    if triggers.any:
        controller.watcher = YieldWatcher(controller, triggers)
    handle = start_server(holder, config=ServerConfig(model_id="tiny"), yielding=controller)
    try:
        yield Single(handle, controller, holder)
    finally:
        handle.stop()
        if holder.engine is not None:
            holder.engine.close()  # type: ignore[attr-defined]
        cache.close()


def test_a_stream_past_the_grace_period_ends_with_an_error_saying_why(single: Single) -> None:
    # 8,000 tokens outlast the grace period and the yield's own steps even at ~3,000 tok/s
    body = {"model": "tiny", "prompt": "once upon a time", "max_tokens": 8000, "stream": True}
    body |= {"ignore_eos": True, "temperature": 0}
    with single.http() as http, http.stream("POST", "/v1/completions", json=body) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))  # it is generating
        started = time.perf_counter()
        with single.http() as admin:
            report = admin.post("/admin/yield", json={"wait": True}).json()
        rest = "\n".join(lines)
    assert report["state"] == "yielded" and report["last"]["ended_requests"] == 1
    assert time.perf_counter() - started < 30  # generous: the machine may be loaded
    assert "gave its GPU back (asked to)" in rest and "0.1 s grace period" in rest
    assert single.holder.engine is None
    with single.http() as http:
        resumed = http.post("/admin/resume").json()
        assert resumed["state"] == "serving" and resumed["last"]["resume_s"] > 0
        answer = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("single", [YieldTriggers(sleep_after_s=0.4, poll_s=0.05)], indirect=True)
def test_sleep_after_idle_then_the_next_request_resumes(single: Single) -> None:
    prompt = "the same long system prompt, again and again. " * 40
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    with single.http() as http:
        first = http.post("/v1/completions", json=body).json()["usage"]
        deadline = time.monotonic() + 10
        while single.controller.state != "yielded":
            assert time.monotonic() < deadline, "never slept"
            time.sleep(0.05)
        assert single.controller.current is not None
        assert single.controller.current.cause == "idle"
        assert http.get("/health").json()["yield"]["resumes"] == "on the next request"
        again = http.post("/v1/completions", json=body)  # wakes it, then is served
        assert again.status_code == 200, again.text
    usage = again.json()["usage"]
    assert single.controller.state == "serving"
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * first["prompt_tokens"]


@pytest.mark.parametrize("single", [YieldTriggers(yield_to=("steam",), poll_s=0.05)], indirect=True)
def test_yield_to_a_named_process_while_it_runs(single: Single, tmp_path: Path) -> None:
    game = start_named_process(tmp_path, "steam")
    try:
        started = time.perf_counter()
        while single.controller.state != "yielded":
            assert time.perf_counter() - started < 2.0, "not yielded within 2 s of the start"
            time.sleep(0.02)
        event = single.controller.current
        assert event is not None and event.reason == "steam is running (--yield-to)"
        assert event.rss_freed_bytes > 0 and single.holder.engine is None
    finally:
        game.kill()
        game.wait()
    deadline = time.monotonic() + 30
    while single.controller.state != "serving":
        assert time.monotonic() < deadline, "not resumed after the game exited"
        time.sleep(0.05)
    assert single.holder.engine is not None
