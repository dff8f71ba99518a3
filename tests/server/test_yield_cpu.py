"""``--yield-to-cpu``: while the GPU is given back, ``serve MODEL`` answers from a CPU-only
plan, and the resume loads the GPU plan again. The GPU is the NVML double (yield_double.py):
the planner plans for it as for a CUDA build; llama.cpp, built for the CPU here, loads both
plans on the CPU — what differs is the plan (GPU layers, devices), which the test reads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from yield_double import CUDA_BUILD, GIB, shared_double

from homelab.cli import main
from homelab.engine.prompt_cache.key import layout_of
from homelab.engine.prompt_cache.store import CacheConfig, PromptCache
from homelab.errors import PlanError
from homelab.hardware.report import detect
from homelab.models.launch import load_plan, plan_file
from homelab.models.ref import resolve
from homelab.planner.budget import Hardware, hardware_from_report
from homelab.planner.plan import Plan
from homelab.planner.search import PlanRequest
from homelab.server.config import ServerConfig
from homelab.server.runner import EngineHolder, ServerHandle, start_server
from homelab.server.yield_targets import SingleResidency, plan_for_cpu
from homelab.server.yielding import YieldController
from homelab.units import MIB

REF = resolve("demo:bench")  # 13 layers
REQUEST = PlanRequest(ctx=2048, parallel=2)
PROMPT = "the same long system prompt, again and again. " * 40


@dataclass
class Served:
    handle: ServerHandle
    controller: YieldController
    residency: SingleResidency

    def complete(self) -> httpx.Response:
        body = {"model": "bench", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        return httpx.post(f"{self.handle.url}/v1/completions", json=body, timeout=120)

    def get(self, path: str) -> dict:  # type: ignore[type-arg]
        return httpx.get(f"{self.handle.url}{path}", timeout=30).json()  # type: ignore[no-any-return]


def plan_gpu(hardware: Hardware) -> Plan:
    return plan_file(REF, REQUEST, hardware)


def plan_cpu(host_only: Hardware, like: Plan) -> Plan:
    return plan_for_cpu(lambda asked: plan_file(REF, asked, host_only), REQUEST, like)


def plan_nothing(host_only: Hardware, like: Plan) -> Plan:
    raise PlanError("nothing fits the host (a test's CPU plan)", hint="Give it more RAM.")


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    cpu_plan_fn = getattr(request, "param", plan_cpu)
    cache = PromptCache(CacheConfig(64 * MIB, 64 * MIB, tmp_path / "states", min_tokens=16))
    holder = EngineHolder()

    def load(planned: Plan) -> object:
        return load_plan(REF, planned, prompt_cache=cache)

    made: list[SingleResidency] = []  # the double reads what its plan holds on the GPU

    def ours() -> int:
        return sum(n for r in made for d, n in r.planned_bytes().items() if d != "CPU")

    _, fake, read = shared_double(ours)

    def hardware_now() -> Hardware:
        return hardware_from_report(detect(fake, build=CUDA_BUILD), ram_bytes=8 * GIB)

    plan = plan_gpu(hardware_now())
    holder.engine = load(plan)  # type: ignore[assignment]
    residency = SingleResidency(holder, "bench", plan, plan_gpu, load, cpu_plan_fn)
    made.append(residency)
    controller = YieldController(
        residency, hardware_now, gpus=read, prompt_cache=cache, grace_s=1.0, wait_s=1.0
    )
    config = ServerConfig(model_id="bench")
    handle = start_server(holder, config=config, prompt_cache=cache, yielding=controller)
    try:
        yield Served(handle, controller, residency)
    finally:
        handle.stop()
        if holder.engine is not None:
            holder.engine.close()  # type: ignore[attr-defined]
        cache.close()


def test_yielded_to_the_cpu_answers_from_a_cpu_plan_then_resumes_on_the_gpu(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    first = served.complete()
    assert first.status_code == 200, first.text
    gpu_plan = served.residency.plan
    assert gpu_plan is not None and gpu_plan.settings.n_gpu_layers == 13
    url = served.handle.url

    assert main(["yield", "--wait", "--url", url]) == 0
    shown = capsys.readouterr().out
    assert "serving from the CPU meanwhile:" in shown and "0 GPU layers" in shown
    status = served.get("/admin/yield")
    assert status["state"] == "yielded" and status["serving_from_cpu"] is True
    assert status["last"]["vram_freed_bytes"] == status["last"]["planned_gpu_bytes"] > 0
    assert served.get("/health")["status"] == "yielded (serving from CPU)"
    assert served.get("/v1/models")["data"][0]["status"] == "yielded (serving from CPU)"
    assert main(["ps", "--url", url]) == 0
    assert "GPU yielded (serving from CPU): asked to" in capsys.readouterr().out

    cpu_plan = served.residency.plan
    assert cpu_plan is not None and cpu_plan is not gpu_plan
    s = cpu_plan.settings
    assert (s.n_gpu_layers, s.split_mode, s.main_gpu) == (0, "none", -1)  # no GPU device
    assert not cpu_plan.hardware.has_gpu
    g = gpu_plan.settings  # the GPU plan's cache layout: what a saved state's key holds
    assert layout_of(s, s.n_ctx_per_slot, s.n_parallel) == layout_of(g, g.n_ctx_per_slot, 2)
    assert served.residency.planned_bytes().keys() == {"CPU"}  # nothing on the GPU (NVML)
    during = served.complete()  # not a 503: the CPU plan answers
    assert during.status_code == 200, during.text
    cached = during.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    prompt_tokens = during.json()["usage"]["prompt_tokens"]
    assert cached >= 0.9 * prompt_tokens  # the state saved at the yield restored on the CPU

    resumed = served.get("/admin/yield")  # (GET) then resume through the CLI
    assert resumed["serving_from_cpu"]
    assert main(["resume", "--url", url]) == 0
    capsys.readouterr()
    assert served.controller.state == "serving" and not served.controller.on_cpu
    back = served.residency.plan
    assert back is not None and back.settings.n_gpu_layers == 13 and back.hardware.has_gpu
    assert served.get("/health")["status"] == "ok"
    after = served.complete()
    assert after.status_code == 200, after.text
    assert after.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached


@pytest.mark.parametrize("served", [plan_nothing], indirect=True)
def test_a_cpu_plan_that_cannot_load_leaves_the_server_yielded_saying_why(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["yield", "--wait", "--url", served.handle.url]) == 0
    assert "cannot serve from the CPU meanwhile: nothing fits the host" in capsys.readouterr().out
    assert served.get("/health")["status"] == "yielded" and not served.controller.on_cpu
    refused = served.complete()  # after the 1 s --yield-wait
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_yielded"
    assert main(["resume", "--url", served.handle.url]) == 0
    assert served.complete().status_code == 200
