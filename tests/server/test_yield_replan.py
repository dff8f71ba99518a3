"""Resuming re-plans for the VRAM free *now*: a program that still holds part of the GPU
leaves fewer layers (and a smaller K/V type) to us, and the plan's reasons say so. Driven by
``homelab yield --wait`` and ``homelab resume`` against the running server. The GPU is the
NVML double (yield_double.py): the planner plans for it as for a CUDA build; llama.cpp,
built for the CPU here, loads the same plan on the CPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from yield_double import CUDA_BUILD, DRIVER_USED_BYTES, GIB, MIB, SharedGpu, shared_double

from homelab.cli import build_parser, main
from homelab.cli.serve import build_fleet
from homelab.hardware.report import detect
from homelab.planner.budget import Hardware, hardware_from_report
from homelab.server.config import ServerConfig
from homelab.server.fleet import Fleet
from homelab.server.runner import ServerHandle, start_server
from homelab.server.yield_targets import FleetResidency
from homelab.server.yielding import YieldController

MODEL = "demo:bench"  # 13 layers: enough weight for a partial offload
COMFYUI_PID = 5151
FREE_LEFT_BYTES = 1000 * MIB  # what ComfyUI leaves free: 9 of the 13 layers fit


@dataclass
class Served:
    handle: ServerHandle
    fleet: Fleet
    gpu: SharedGpu


@pytest.fixture
def served() -> Iterator[Served]:
    argv = ["serve", "--models", MODEL, "--ram", str(8 * GIB), "--ctx", "2048", "--parallel", "2"]
    fleet = build_fleet(build_parser(only="serve").parse_args(argv), None)
    residency = FleetResidency(fleet)
    gpu, fake, read = shared_double(
        lambda: sum(n for d, n in residency.planned_bytes().items() if d != "CPU")
    )

    def hardware_now() -> Hardware:
        return hardware_from_report(detect(fake, build=CUDA_BUILD), ram_bytes=8 * GIB)

    fleet.hardware = hardware_now()  # an idle 4090 when the server starts
    controller = YieldController(residency, hardware_now, gpus=read, grace_s=1.0, wait_s=1.0)
    handle = start_server(None, config=ServerConfig(), fleet=fleet, yielding=controller)
    try:
        yield Served(handle, fleet, gpu)
    finally:
        handle.stop()
        fleet.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_resume_replans_for_the_vram_another_program_still_holds(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    url = served.handle.url
    loaded = served.fleet

    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200
    first = loaded.models[MODEL].plan
    assert first is not None and first.settings.n_gpu_layers == 13

    capsys.readouterr()
    yielded = cli(capsys, "yield", "--wait", "--url", url)
    assert yielded["state"] == "yielded" and yielded["cause"] == "asked"
    assert yielded["last"]["vram_freed_bytes"] == yielded["last"]["planned_gpu_bytes"] > 0
    assert main(["ps", "--url", url]) == 0
    assert "GPU yielded (asked to); resumes on `homelab resume`" in capsys.readouterr().out

    other = served.gpu.total_bytes - DRIVER_USED_BYTES - FREE_LEFT_BYTES
    served.gpu.take(COMFYUI_PID, other)  # ComfyUI keeps most of the card
    resumed = cli(capsys, "resume", "--url", url)
    assert resumed["state"] == "serving", resumed
    plan = resumed["last"]["resumed"][0]
    assert plan["model"] == MODEL and 0 < plan["n_gpu_layers"] < 13
    assert any(f"{plan['n_gpu_layers']} of 13 layers on the GPU" in r for r in plan["reasons"])
    assert plan["device_bytes"]["CUDA0"] <= FREE_LEFT_BYTES
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200
    assert main(["resume", "--url", url]) == 0  # serving already: nothing to do, says so
    assert "state: serving" in capsys.readouterr().out
